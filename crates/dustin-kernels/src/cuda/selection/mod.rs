//! Head-subset scoring launches and [`SelectionOps`] on CUDA (scores, the estimator's fold and mix, Quest, top-k).

mod kernels;

use super::*;

/// What the score mode of `flash_kernel` (or the split kernel's) leaves for
/// `score_reduce_kernel`: partial maxima and sums `[b, slots, splits, rpad]` and the scaled,
/// masked logits `[b, slots, rpad, lmax]` (f32; row `e * n_new + i` of a slot is its `e`-th
/// query head's token `i`; `lmax` at least the keys, the row stride). `splits` counts
/// partials: on the flash kernel 4 per split of the keys (one per warp).
pub(super) struct FlashScores {
    pub(super) pm: Ct,
    pub(super) pl: Ct,
    pub(super) logits: Ct,
    pub(super) splits: usize,
    pub(super) rpad: usize,
    pub(super) lmax: usize,
}

/// The grid of `flash_kernel`'s score mode for the rows of each slot of `table` (`slots` of
/// them, at most `max_heads` query heads each): blocks of 16 rows over every key of the
/// context and the new tokens, the keys split as dense verification's are
/// (`split_plan::verify_splits`), each split leaving 4 partials (one per warp, each warp
/// taking 16 keys of every tile); with `wide`, blocks of 64 rows (each warp its own 16 over
/// every key of the tile), one partial a split.
struct ScoreGrid {
    rowblocks: usize,
    rpad: usize,
    splits: usize,
    chunk: usize,
    wide: bool,
}

impl ScoreGrid {
    /// Partials per (sequence, slot, row): 4 a split, or 1 with `wide`.
    fn partials(&self) -> usize {
        if self.wide {
            self.splits
        } else {
            4 * self.splits
        }
    }

    /// The partial maxima and sums of one score pass, `[b, slots, partials, rpad]` f32 each.
    fn partial_buffers(&self, q: &Ct, b: usize, slots: usize) -> (Ct, Ct) {
        let shape = vec![b, slots, self.partials(), self.rpad];
        (
            empty(q, shape.clone(), DType::F32),
            empty(q, shape, DType::F32),
        )
    }

    /// Row groups of 16 per (sequence, slot): the mass pass writes one key mass each.
    fn groups(&self) -> usize {
        if self.wide {
            4 * self.rowblocks
        } else {
            self.rowblocks
        }
    }
}

fn score_grid(q: &Ct, slots: usize, max_heads: usize, dims: &AttnDims, wide: bool) -> ScoreGrid {
    let rows = max_heads * dims.n_new;
    let block_rows = if wide { 64 } else { 16 };
    let rowblocks = rows.div_ceil(block_rows);
    let per = dims.batch * slots * rowblocks;
    let (splits, chunk) = crate::split_plan::verify_splits(
        per,
        dims.keys,
        sm_count(q),
        MIN_CHUNK,
        crate::split_plan::FLASH_WAVES,
    );
    ScoreGrid {
        rowblocks,
        rpad: rowblocks * block_rows,
        splits,
        chunk,
        wide,
    }
}

/// One launch of `flash_kernel`'s score mode on grid `gr`, writing what `smode` says
/// (`SCORE_LOGITS`, `SCORE_STATS`, `SCORE_MASS`) into `pm`, `pl`, `logits` (rows `lmax`
/// apart, `lmax >= dims.keys`); only K is read.
#[allow(clippy::too_many_arguments)]
fn launch_score_pass(
    q: &Ct,
    k: &Ct,
    ctx: &Ct,
    table: &Ct,
    slots: usize,
    gr: &ScoreGrid,
    dims: &AttnDims,
    scale: f32,
    bufs: [&Ct; 3],
    smode: usize,
    lmax: usize,
) {
    let [pm, pl, logits] = bufs;
    let a = FlashLaunch {
        grid: (gr.splits * gr.rowblocks, slots, dims.batch),
        idx: ctx.clone(),
        counts: ctx.clone(),
        out: empty(q, vec![1], q.dtype),
        pm: pm.clone(),
        pl: pl.clone(),
        pacc: pm.clone(),
        table: table.clone(),
        logits: logits.clone(),
        lmax,
        rowblocks: gr.rowblocks,
        chunk: gr.chunk,
        splits: gr.splits,
        rpad: gr.rpad,
        verify: true,
        sparse: false,
        score: true,
        smode,
        wide: gr.wide,
        warps: 4,
    };
    launch_flash(q.clone(), k.clone(), k.clone(), ctx.clone(), dims, scale, a);
}

/// Head-subset logits through `flash_kernel` in score mode ([`score_grid`]), for
/// `score_reduce_kernel`. `k` ready by [`rows_ready`].
///
/// The logits are as wide as the cache (`lmax = dims.capacity`, not the keys of this call)
/// and sit in an exact-size persistent buffer ([`empty_persistent`]): one buffer of one size
/// per batch and cache, reused by every layer and verification. At the pair's shapes (B=16,
/// 32k, 2 slots of 16 rows) they take 67 MB, which CubeCL 0.10's dynamic pool serves from a
/// page of 1.33 GB that then stays reserved (its log of every reservation, `docs/perf.md`,
/// "Memory"); sized by the keys, each verification's 8 more keys would ask for a new size.
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_scores(
    q: Ct,
    k: Ct,
    ctx: Ct,
    table: Ct,
    slots: usize,
    max_heads: usize,
    dims: &AttnDims,
    scale: f32,
) -> FlashScores {
    let b = dims.batch;
    let gr = score_grid(&q, slots, max_heads, dims, false);
    let (pm, pl) = gr.partial_buffers(&q, b, slots);
    let lmax = dims.capacity.max(dims.keys);
    let logits = empty_persistent(&q, vec![b, slots, gr.rpad, lmax], DType::F32);
    launch_score_pass(
        &q,
        &k,
        &ctx,
        &table,
        slots,
        &gr,
        dims,
        scale,
        [&pm, &pl, &logits],
        SCORE_LOGITS,
        lmax,
    );
    FlashScores {
        pm,
        pl,
        logits,
        splits: gr.partials(),
        rpad: gr.rpad,
        lmax,
    }
}

/// Head-subset scores `[b, kv_heads, capacity]` into `out` without the logits in memory
/// ([`KernelConfig::score_mass`]): `flash_kernel`'s score mode twice over the keys, first
/// each row's partial maxima and sums (`SCORE_STATS`), then each row block's probability
/// mass per key (`SCORE_MASS`, `[b, slots, groups, keys]`, a group 16 rows), which
/// `mass_sum_kernel` sums over the groups into `out` (0 past each sequence's `ctx + n_new`).
/// `k` ready by [`rows_ready`].
#[allow(clippy::too_many_arguments)]
fn flash_mass(
    q: Ct,
    k: Ct,
    ctx: Ct,
    table: Ct,
    kv2slot: Ct,
    slots: usize,
    max_heads: usize,
    dims: &AttnDims,
    scale: f32,
    out: &Ct,
    wide: bool,
) {
    let b = dims.batch;
    // a slot of more rows than one 16-row block: 64 rows a block, the keys read once per 64
    let gr = score_grid(
        &q,
        slots,
        max_heads,
        dims,
        wide && max_heads * dims.n_new > 16,
    );
    let (pm, pl) = gr.partial_buffers(&q, b, slots);
    let part = empty(&q, vec![b, slots, gr.groups(), dims.keys], DType::F32);
    let none = empty(&q, vec![1], DType::F32);
    for (smode, sink) in [(SCORE_STATS, &none), (SCORE_MASS, &part)] {
        launch_score_pass(
            &q,
            &k,
            &ctx,
            &table,
            slots,
            &gr,
            dims,
            scale,
            [&pm, &pl, sink],
            smode,
            dims.keys,
        );
    }
    let client = out.client.clone();
    let id = table.dtype;
    let width = out.meta.shape()[2];
    kernels::mass_sum_kernel::launch::<CudaRuntime>(
        &client,
        CubeCount::Static(
            width.div_ceil(kernels::SCORE_BLOCK_POSITIONS) as u32,
            dims.kv_heads as u32,
            b as u32,
        ),
        CubeDim::new_1d(256),
        part.into_tensor_arg(),
        table.into_tensor_arg(),
        kv2slot.into_tensor_arg(),
        ctx.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        dims.n_new as u32,
        gr.groups() as u32,
        slots as u32,
        dims.keys as u32,
        width as u32,
        id.into(),
    );
}

/// Head-subset probabilities of [`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores) (`per_row` false:
/// `[b, kv_heads, capacity]`) or [`KernelOps::head_subset_row_scores`](crate::SelectionOps::head_subset_row_scores) (`per_row`:
/// `[b, kv_heads, n_new, capacity]`), f32, 0 past each sequence's `ctx + n_new`.
pub(super) fn subset_scores<F: FloatElement, I: IntElement, BT: BoolElement>(
    q: Tensor<Cube<F, I, BT>, 4>,
    k: Tensor<Cube<F, I, BT>, 4>,
    ctx_lens: &[usize],
    heads: &[usize],
    scale: f32,
    per_row: bool,
) -> Result<Ct> {
    let dims = check_attn(q.dims(), k.dims(), ctx_lens)?;
    check_kernel_dims(&dims)?;
    check_heads(heads, dims.q_heads)?;
    let device = q.device();
    let (q, k) = (float_prim(q).tensor(), float_prim(k).tensor());
    check_dtype("q", q.dtype)?;
    check_dtype("k", k.dtype)?;
    if k.dtype != q.dtype {
        return Err(KernelError::Unsupported("q, k of different dtypes".into()));
    }
    let k = rows_ready(k);
    let g = dims.group();
    let mut slots: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut kv2slot = vec![-1i64; dims.kv_heads];
    for (kv, slot) in kv2slot.iter_mut().enumerate() {
        let hs: Vec<usize> = heads.iter().copied().filter(|&h| h / g == kv).collect();
        if !hs.is_empty() {
            *slot = slots.len() as i64;
            slots.push((kv, hs));
        }
    }
    let max_heads = slots.iter().map(|s| s.1.len()).max().unwrap_or(1);
    let (tv, ts) = slot_table(&slots);
    let table = int_tensor::<F, I, BT, 2>(tv, ts, &device);
    let kv2slot = int_tensor::<F, I, BT, 1>(kv2slot, [dims.kv_heads], &device);
    let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
    let b = dims.batch;
    // as wide as `k` (the trait's contract): positions `keys ..` are written 0
    let shape = if per_row {
        vec![b, dims.kv_heads, dims.n_new, dims.capacity]
    } else {
        vec![b, dims.kv_heads, dims.capacity]
    };
    let out = empty(&q, shape, DType::F32);
    let nslots = slots.len();
    let cfg = config_of(&q);
    // the probabilities summed in the kernel, no logits in memory (`KernelConfig::score_mass`)
    if !per_row && use_flash_scores(&cfg) && cfg.score_mass.resolve(true) {
        let wide = cfg.score_wide.resolve(false);
        flash_mass(
            q, k, ctx, table, kv2slot, nslots, max_heads, &dims, scale, &out, wide,
        );
        return Ok(out);
    }
    // the flash kernel's score mode or the split kernel's (`KernelConfig::score_kernel`)
    let parts = if use_flash_scores(&cfg) {
        flash_scores(
            q,
            k,
            ctx.clone(),
            table.clone(),
            nslots,
            max_heads,
            &dims,
            scale,
        )
    } else {
        let s = run_split(
            SplitArgs {
                q,
                k: k.clone(),
                v: k,
                ctx: ctx.clone(),
                table: table.clone(),
                idx: ctx.clone(),
                counts: ctx.clone(),
                slots: nslots,
                max_rows: max_heads * dims.n_new,
                max_keys: dims.keys,
                n_new: dims.n_new,
                head_dim: dims.head_dim,
                scale,
                sparse: false,
                score: true,
            },
            b,
        );
        FlashScores {
            pm: s.pm,
            pl: s.pl,
            logits: s.logits,
            splits: s.plan.splits,
            rpad: s.rpad,
            lmax: dims.keys,
        }
    };
    let client = out.client.clone();
    let id = table.dtype;
    kernels::score_reduce_kernel::launch::<CudaRuntime>(
        &client,
        CubeCount::Static(
            dims.capacity.div_ceil(kernels::SCORE_BLOCK_POSITIONS) as u32,
            dims.kv_heads as u32,
            b as u32,
        ),
        CubeDim::new_1d(256),
        parts.pm.into_tensor_arg(),
        parts.pl.into_tensor_arg(),
        parts.logits.into_tensor_arg(),
        table.into_tensor_arg(),
        kv2slot.into_tensor_arg(),
        ctx.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        dims.n_new as u32,
        parts.splits as u32,
        parts.rpad as u32,
        nslots as u32,
        parts.lmax as u32,
        dims.capacity as u32,
        parts.rpad,
        per_row,
        id.into(),
    );
    Ok(out)
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> SelectionOps for Cube<F, I, BT> {
    const SELECTION_KERNELS: bool = true;

    fn estimator_kernels(device: &Self::Device) -> EstimatorKernels {
        config(device).estimator_kernels
    }

    fn head_subset_scores(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        heads: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 3>> {
        let out = subset_scores(q, k, ctx_lens, heads, scale, false)?;
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn head_subset_row_scores(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        heads: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        let out = subset_scores(q, k, ctx_lens, heads, scale, true)?;
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn fold_rows(
        hist: Option<Tensor<Self, 3>>,
        factor: &[f32],
        rows: Tensor<Self, 4>,
        w: &[f32],
        own: &[f32],
        all: &[f32],
    ) -> Result<Tensor<Self, 3>> {
        check_fold(
            hist.as_ref().map(Tensor::dims),
            factor,
            rows.dims(),
            w,
            own,
            all,
        )?;
        let [b, kvh, n, l] = rows.dims();
        let device = rows.device();
        let rows = float_prim(rows).tensor();
        let hist = hist.map(|h| h.into_primitive().tensor());
        // one upload: factor | w | own | all
        let params: Vec<f32> = [factor, w, own, all].concat();
        let np = params.len();
        let params = <Self as burn_tensor::ops::FloatTensorOps<Self>>::float_from_data(
            TensorData::new(params, [np]),
            &device,
        );
        let out = empty(&rows, vec![b, kvh, l], DType::F32);
        if b * kvh * l > 0 {
            let lr = rows.meta.strides().to_vec();
            let (h, lh, has_hist) = match hist {
                Some(h) => {
                    let s = h.meta.strides().to_vec();
                    (h, s, true)
                }
                None => (rows.clone(), vec![0, 0, 0], false),
            };
            let (fd, hd) = (rows.dtype, h.dtype);
            let client = rows.client.clone();
            kernels::fold_rows_kernel::launch::<CudaRuntime>(
                &client,
                CubeCount::Static(
                    l.div_ceil(kernels::FOLD_THREADS) as u32,
                    kvh as u32,
                    b as u32,
                ),
                CubeDim::new_1d(kernels::FOLD_THREADS as u32),
                rows.into_array_arg(),
                h.into_array_arg(),
                params.into_array_arg(),
                out.clone().into_array_arg(),
                lr[0] as u32,
                lr[1] as u32,
                lr[2] as u32,
                lr[3] as u32,
                lh[0] as u32,
                lh[1] as u32,
                lh[2] as u32,
                b as u32,
                n as u32,
                kvh as u32,
                l as u32,
                has_hist,
                [fd.into(), hd.into()],
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn mix_scores(
        hist: Tensor<Self, 3>,
        la: Option<Tensor<Self, 2>>,
        free: &[(usize, usize)],
        alpha: f32,
        width: usize,
    ) -> Result<Tensor<Self, 3>> {
        let [b, kvh, hl] = hist.dims();
        check_mix(b, la.as_ref().map(Tensor::dims), free, alpha)?;
        let device = hist.device();
        let hist = hist.into_primitive().tensor();
        let la = la.map(|t| t.into_primitive().tensor());
        let fv: Vec<i64> = free
            .iter()
            .flat_map(|&(lo, hi)| [lo as i64, hi as i64])
            .collect();
        let free = int_tensor::<F, I, BT, 1>(fv, [2 * b], &device);
        let out = empty(&hist, vec![b, kvh, width], hist.dtype);
        if b * kvh * width > 0 {
            let lh = hist.meta.strides().to_vec();
            let (lt, ll, la_len, has_la) = match la {
                Some(t) => {
                    let s = t.meta.strides().to_vec();
                    let len = t.meta.shape()[1];
                    (t, s, len, true)
                }
                None => (hist.clone(), vec![0, 0], 0, false),
            };
            let (hd, ld, id) = (hist.dtype, lt.dtype, free.dtype);
            let client = hist.client.clone();
            kernels::mix_scores_kernel::launch::<CudaRuntime>(
                &client,
                CubeCount::Static(kvh as u32, b as u32, 1),
                CubeDim::new_1d(kernels::MIX_THREADS as u32),
                hist.into_array_arg(),
                lt.into_array_arg(),
                free.into_array_arg(),
                out.clone().into_array_arg(),
                lh[0] as u32,
                lh[1] as u32,
                lh[2] as u32,
                ll[0] as u32,
                ll[1] as u32,
                hl as u32,
                la_len as u32,
                kvh as u32,
                width as u32,
                alpha,
                has_la,
                [hd.into(), ld.into(), id.into()],
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn quest_page_bounds(
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        page_size: usize,
    ) -> Result<(Tensor<Self, 4>, Tensor<Self, 4>)> {
        let [b, kvh, cap, d] = k.dims();
        let pages = check_pages(ctx_lens, b, cap, page_size)?;
        let device = k.device();
        let k = float_prim(k).tensor();
        let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
        let fd = k.dtype;
        let kmin = empty(&k, vec![b, kvh, pages, d], fd);
        let kmax = empty(&k, vec![b, kvh, pages, d], fd);
        let client = k.client.clone();
        let id = ctx.dtype;
        kernels::page_bounds_kernel::launch::<CudaRuntime>(
            &client,
            CubeCount::Static(pages as u32, kvh as u32, b as u32),
            CubeDim::new_1d(d.min(128) as u32),
            k.into_tensor_arg(),
            ctx.into_tensor_arg(),
            kmin.clone().into_tensor_arg(),
            kmax.clone().into_tensor_arg(),
            page_size as u32,
            d,
            [fd.into(), id.into()],
        );
        Ok((
            Tensor::from_primitive(TensorPrimitive::Float(kmin)),
            Tensor::from_primitive(TensorPrimitive::Float(kmax)),
        ))
    }

    fn quest_page_scores(
        q: Tensor<Self, 4>,
        kmin: Tensor<Self, 4>,
        kmax: Tensor<Self, 4>,
        ctx_lens: &[usize],
        page_size: usize,
    ) -> Result<Tensor<Self, 3>> {
        let pages =
            crate::check_quest_scores(q.dims(), kmin.dims(), kmax.dims(), ctx_lens, page_size)?;
        let [b, hq, n, d] = q.dims();
        let kvh = kmin.dims()[1];
        let g = hq / kvh;
        if g * n * d * 4 + kernels::PAGE_TILE_BYTES > 160 * 1024 {
            return Err(KernelError::Unsupported(format!(
                "{} query rows of width {d} per KV head (shared memory)",
                g * n
            )));
        }
        let device = q.device();
        let q = float_prim(q).tensor();
        let (kmin, kmax) = (float_prim(kmin).tensor(), float_prim(kmax).tensor());
        let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
        let out = empty(&q, vec![b, kvh, pages], DType::F32);
        let client = q.client.clone();
        let (fd, id) = (q.dtype, ctx.dtype);
        if kmin.dtype != fd || kmax.dtype != fd {
            return Err(KernelError::Unsupported(
                "q and bounds of different dtypes".into(),
            ));
        }
        kernels::page_scores_kernel::launch::<CudaRuntime>(
            &client,
            CubeCount::Static(
                pages.div_ceil(kernels::PAGE_BLOCK) as u32,
                kvh as u32,
                b as u32,
            ),
            CubeDim::new_1d(kernels::PAGE_BLOCK as u32),
            q.into_tensor_arg(),
            kmin.into_tensor_arg(),
            kmax.into_tensor_arg(),
            ctx.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            page_size as u32,
            pages as u32,
            g,
            n,
            d,
            [fd.into(), id.into()],
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn top_k_positions(
        scores: Tensor<Self, 3>,
        ctx_lens: &[usize],
        keep: Keep,
    ) -> Result<Positions<Self>> {
        let dims = scores.dims();
        let (counts, kk) = check_top_k(dims, ctx_lens, keep)?;
        let device = scores.device();
        let s = match scores.into_primitive() {
            TensorPrimitive::Float(t) => t,
            TensorPrimitive::QFloat(_) => {
                return Err(KernelError::Unsupported("quantized scores".into()))
            }
        };
        let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
        let [b, h, _] = dims;
        let out = empty_device_dtype(
            s.client.clone(),
            s.device.clone(),
            Shape::from(vec![b, h, kk]),
            I::dtype(),
        );
        if kk > 0 {
            let client = s.client.clone();
            let (fd, id) = (s.dtype, ctx.dtype);
            let (ls, lo) = (s.meta.strides().to_vec(), out.meta.strides().to_vec());
            // 16-bit scores: the key's low byte follows from the byte above it
            let passes = if s.dtype.size() == 2 { 3 } else { 4 };
            if config_of(&s).topk_kernel == TopkKernel::Block {
                kernels::topk_block_kernel::launch::<CudaRuntime>(
                    &client,
                    CubeCount::Static(1, h as u32, b as u32),
                    CubeDim::new_1d(256),
                    s.into_tensor_arg(),
                    ctx.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    keep.budget as u32,
                    keep.n_sink as u32,
                    keep.window as u32,
                    kk as u32,
                    [fd.into(), id.into()],
                );
                return Ok(Positions {
                    indices: Tensor::from_primitive(out),
                    counts,
                });
            }
            kernels::topk_kernel::launch::<CudaRuntime>(
                &client,
                CubeCount::Static(1, h as u32, b as u32),
                CubeDim::new_1d(kernels::TOPK_THREADS as u32),
                s.into_array_arg(),
                ctx.into_array_arg(),
                out.clone().into_array_arg(),
                ls[0] as u32,
                ls[1] as u32,
                ls[2] as u32,
                lo[0] as u32,
                lo[1] as u32,
                lo[2] as u32,
                keep.budget as u32,
                keep.n_sink as u32,
                keep.window as u32,
                kk as u32,
                passes,
                [fd.into(), id.into()],
            );
        }
        Ok(Positions {
            indices: Tensor::from_primitive(out),
            counts,
        })
    }
}
