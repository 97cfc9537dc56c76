//! Attention launches: the split kernel's plan and launch, the flash kernel in verification and prefill, `prefill_kernel`, and [`AttentionOps`] on CUDA.

mod kernels;

pub(super) use kernels::{SCORE_LOGITS, SCORE_MASS, SCORE_STATS};

use super::*;

pub use kernels::{RESCALE_SLACK, THREADS, TILE};

/// Blocks (row blocks x query heads x sequences) from which [`AttentionKernel::Auto`] takes
/// the flash kernel for a prefill chunk: one per SM of an H200 (132). Fewer leave SMs idle,
/// where the split kernel parallelises over the context instead.
pub const FLASH_MIN_BLOCKS: usize = 132;

/// Fewest new tokens of a chunk the automatic choice ([`PREFILL_TILES`] 0) sends to
/// `prefill_kernel` (K and V staged apart); `flash_kernel` below. In chunks of 512 it was
/// faster than `flash_kernel` at 4k, 16k and 32k in every run that timed it on the H200
/// (135.1 / 195.6 / 209.1 against 105.5 / 180.4 / 189.0 TFLOP/s,
/// `docs/perf/prefill-softmax-chunks-2026-12-03/softmax-fewer-instructions/`; 133.3 / 206.2 /
/// 217.5 against 107.8 / 179.5 / 188.8, `docs/perf/prefill-head-runs-gemm-many-2026-12-04/
/// head-runs-rescale/`); smaller chunks were not timed.
pub const PREFILL2_KV_MIN_NEW: usize = 512;

/// Query heads per run of `prefill_kernel`'s grid ([`KernelConfig::prefill_head_run`]) for
/// `dims`.
pub(super) fn prefill_head_run(cfg: &KernelConfig, dims: &AttnDims) -> usize {
    let forced = cfg.prefill_head_run;
    if forced > 0 && dims.q_heads.is_multiple_of(forced) {
        forced
    } else {
        dims.group()
    }
}

/// Whether verification runs on the flash kernel.
pub(super) fn use_flash_verify(cfg: &KernelConfig) -> bool {
    cfg.verify_kernel.flash(|| true)
}

/// Whether attention scores run on the flash kernel's score mode
/// ([`KernelConfig::score_kernel`]; by default as verification does).
pub(super) fn use_flash_scores(cfg: &KernelConfig) -> bool {
    cfg.score_kernel.flash(|| use_flash_verify(cfg))
}

/// SMs assumed where the device does not say (an H200 has 132).
pub(super) const DEFAULT_SMS: usize = 132;

/// Whether a prefill chunk of these dimensions runs on the flash kernel.
pub(super) fn use_flash(cfg: &KernelConfig, dims: &AttnDims) -> bool {
    let blocks = dims.n_new.div_ceil(kernels::FLASH_ROWS) * dims.q_heads * dims.batch;
    cfg.prefill_kernel
        .flash(|| dims.n_new > MAX_NEW && blocks >= FLASH_MIN_BLOCKS)
}

/// Slot table `[slots, 2 + max_heads]`: KV head, head count, query heads.
pub(super) fn slot_table(slots: &[(usize, Vec<usize>)]) -> (Vec<i64>, [usize; 2]) {
    let w = 2 + slots.iter().map(|s| s.1.len()).max().unwrap_or(0);
    let mut t = vec![0i64; slots.len() * w];
    for (i, (kv, hs)) in slots.iter().enumerate() {
        t[i * w] = *kv as i64;
        t[i * w + 1] = hs.len() as i64;
        for (j, &h) in hs.iter().enumerate() {
            t[i * w + 2 + j] = h as i64;
        }
    }
    (t, [slots.len(), w])
}

/// Launch geometry of the split kernel.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) mt: usize,
    pub(super) rowblocks: usize,
    pub(super) splits: usize,
    pub(super) chunk: usize,
}

/// The split kernel's plan for `rows` rows per slot over `max_keys` keys on `sms` SMs.
pub(super) fn plan(batch: usize, slots: usize, rows: usize, max_keys: usize, sms: usize) -> Plan {
    let tiles = rows.div_ceil(16).max(1);
    let mt = tiles.min(4);
    let rowblocks = tiles.div_ceil(mt);
    let per = batch * slots * rowblocks;
    let want = (SPLIT_BLOCKS_PER_SM * sms.max(1))
        .div_ceil(per.max(1))
        .max(1);
    let most = max_keys.div_ceil(MIN_CHUNK).max(1);
    let splits = want.min(most);
    let chunk = max_keys.div_ceil(splits).div_ceil(TILE).max(1) * TILE;
    let splits = max_keys.div_ceil(chunk).max(1);
    Plan {
        mt,
        rowblocks,
        splits,
        chunk,
    }
}

/// Everything the split kernel reads for one call.
pub(super) struct SplitArgs {
    pub(super) q: Ct,
    pub(super) k: Ct,
    pub(super) v: Ct,
    pub(super) ctx: Ct,
    pub(super) table: Ct,
    pub(super) idx: Ct,
    pub(super) counts: Ct,
    pub(super) slots: usize,
    pub(super) max_rows: usize,
    pub(super) max_keys: usize,
    pub(super) n_new: usize,
    pub(super) head_dim: usize,
    pub(super) scale: f32,
    pub(super) sparse: bool,
    pub(super) score: bool,
}

/// Partial results of the split kernel.
pub(super) struct Partials {
    pub(super) pm: Ct,
    pub(super) pl: Ct,
    pub(super) pacc: Ct,
    pub(super) logits: Ct,
    pub(super) plan: Plan,
    pub(super) rpad: usize,
}

pub(super) fn run_split(a: SplitArgs, batch: usize) -> Partials {
    let plan = plan(batch, a.slots, a.max_rows, a.max_keys, sm_count(&a.q));
    let rpad = plan.rowblocks * plan.mt * 16;
    let d = a.head_dim;
    let pm = empty(&a.q, vec![batch, a.slots, plan.splits, rpad], DType::F32);
    let pl = empty(&a.q, vec![batch, a.slots, plan.splits, rpad], DType::F32);
    let pacc = if a.score {
        empty(&a.q, vec![1], DType::F32)
    } else {
        empty(&a.q, vec![batch, a.slots, plan.splits, rpad, d], DType::F32)
    };
    let lmax = if a.score { a.max_keys } else { 1 };
    let logits = if a.score {
        empty(&a.q, vec![batch, a.slots, rpad, lmax], DType::F32)
    } else {
        empty(&a.q, vec![1], DType::F32)
    };
    let client = a.q.client.clone();
    let (fd, id) = (a.q.dtype, a.ctx.dtype);
    let count = CubeCount::Static(
        (plan.splits * plan.rowblocks) as u32,
        a.slots as u32,
        batch as u32,
    );
    // SAFETY: shapes were validated by the caller; every index the kernel forms is inside
    // the tensors (positions < ctx + n_new <= capacity, rows < rpad, splits * chunk covers
    // max_keys, shared tiles sized from the same comptime values).
    unsafe {
        kernels::split_kernel::launch_unchecked::<CudaRuntime>(
            &client,
            count,
            CubeDim::new_1d(THREADS as u32),
            NV,
            a.q.into_tensor_arg(),
            a.k.into_tensor_arg(),
            a.v.into_tensor_arg(),
            a.ctx.into_tensor_arg(),
            a.table.into_tensor_arg(),
            a.idx.into_tensor_arg(),
            a.counts.into_tensor_arg(),
            pm.clone().into_tensor_arg(),
            pl.clone().into_tensor_arg(),
            pacc.clone().into_tensor_arg(),
            logits.clone().into_tensor_arg(),
            a.scale,
            a.n_new as u32,
            plan.chunk as u32,
            plan.splits as u32,
            plan.rowblocks as u32,
            a.slots as u32,
            lmax as u32,
            plan.mt,
            d,
            NV,
            a.sparse,
            a.score,
            [fd.into(), id.into()],
        );
    }
    Partials {
        pm,
        pl,
        pacc,
        logits,
        plan,
        rpad,
    }
}

/// Head widths the CUDA attention kernels take (their shared-memory tiles and `ldmatrix`
/// layouts are built for these; `KernelOps::PREFILL_HEAD_DIMS` on CUDA).
pub(super) const KERNEL_HEAD_DIMS: &[usize] = &[64, 128];

pub(super) fn check_kernel_dims(dims: &AttnDims) -> Result<()> {
    if !KERNEL_HEAD_DIMS.contains(&dims.head_dim) {
        return Err(KernelError::Unsupported(format!(
            "head_dim {} (the CUDA attention kernels take 64 or 128)",
            dims.head_dim
        )));
    }
    Ok(())
}

/// A sparse selection: indices `[batch, kv_heads, budget]` and counts.
pub(super) type Selection<'a, F, I, BT> = (Tensor<Cube<F, I, BT>, 3, Int>, &'a [usize]);

pub(super) fn attention<F: FloatElement, I: IntElement, BT: BoolElement>(
    q: Tensor<Cube<F, I, BT>, 4>,
    k: Tensor<Cube<F, I, BT>, 4>,
    v: Tensor<Cube<F, I, BT>, 4>,
    ctx_lens: &[usize],
    sel: Option<Selection<'_, F, I, BT>>,
    scale: f32,
    max_new: usize,
) -> Result<Tensor<Cube<F, I, BT>, 4>> {
    let dims = check_attn_upto(q.dims(), k.dims(), ctx_lens, max_new)?;
    if v.dims() != k.dims() {
        return Err(KernelError::Shape {
            name: "v",
            expected: k.dims().to_vec(),
            found: v.dims().to_vec(),
        });
    }
    check_kernel_dims(&dims)?;
    if let Some((idx, counts)) = &sel {
        check_selection(&dims, idx.dims(), counts)?;
    }
    let device = q.device();
    let (q, k, v) = (
        float_prim(q).tensor(),
        float_prim(k).tensor(),
        float_prim(v).tensor(),
    );
    check_dtype("q", q.dtype)?;
    check_dtype("k", k.dtype)?;
    check_dtype("v", v.dtype)?;
    if k.dtype != q.dtype || v.dtype != q.dtype {
        return Err(KernelError::Unsupported(
            "q, k, v of different dtypes".into(),
        ));
    }
    let (k, v) = (rows_ready(k), rows_ready(v));
    let g = dims.group();
    let cfg = config_of(&q);
    if sel.is_none() && max_new == MAX_PREFILL_NEW && use_flash(&cfg, &dims) {
        let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
        let out = flash_prefill(q, k, v, ctx, &dims, scale);
        return Ok(Tensor::from_primitive(TensorPrimitive::Float(out)));
    }
    let slots: Vec<(usize, Vec<usize>)> = (0..dims.kv_heads)
        .map(|h| (h, (h * g..(h + 1) * g).collect()))
        .collect();
    let (tv, ts) = slot_table(&slots);
    let table = int_tensor::<F, I, BT, 2>(tv, ts, &device);
    let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
    let (sparse, idx, counts, max_keys) = match sel {
        Some((idx, counts)) => {
            let cv = counts.iter().map(|&c| c as i64).collect();
            let ct = int_tensor::<F, I, BT, 1>(cv, [counts.len()], &device);
            let mk = counts.iter().copied().max().unwrap_or(0) + dims.n_new;
            (true, idx.into_primitive(), ct, mk)
        }
        None => (false, ctx.clone(), ctx.clone(), dims.keys),
    };
    if max_new == MAX_NEW && use_flash_verify(&cfg) {
        let sel = sparse.then_some((idx, counts, max_keys));
        let out = flash_verify(q, k, v, ctx, table, sel, &dims, scale);
        return Ok(Tensor::from_primitive(TensorPrimitive::Float(out)));
    }
    let b = dims.batch;
    let out_shape = vec![b, dims.q_heads, dims.n_new, dims.head_dim];
    let fd = q.dtype;
    let out = empty(&q, out_shape, fd);
    let parts = run_split(
        SplitArgs {
            q,
            k,
            v,
            ctx,
            table: table.clone(),
            idx,
            counts,
            slots: dims.kv_heads,
            max_rows: g * dims.n_new,
            max_keys,
            n_new: dims.n_new,
            head_dim: dims.head_dim,
            scale,
            sparse,
            score: false,
        },
        b,
    );
    let client = out.client.clone();
    let id = table.dtype;
    kernels::combine_kernel::launch::<CudaRuntime>(
        &client,
        CubeCount::Static((g * dims.n_new) as u32, dims.kv_heads as u32, b as u32),
        CubeDim::new_1d(dims.head_dim as u32),
        parts.pm.into_array_arg(),
        parts.pl.into_array_arg(),
        parts.pacc.into_array_arg(),
        table.clone().into_array_arg(),
        out.clone().into_array_arg(),
        table.meta.strides()[0] as u32,
        out.meta.strides()[0] as u32,
        out.meta.strides()[1] as u32,
        out.meta.strides()[2] as u32,
        out.meta.strides()[3] as u32,
        dims.n_new as u32,
        parts.plan.splits as u32,
        parts.rpad as u32,
        dims.kv_heads as u32,
        dims.head_dim,
        [fd.into(), id.into()],
    );
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// What one launch of `flash_kernel` takes besides `q`, `k`, `v`, `ctx`.
pub(super) struct FlashLaunch {
    pub(super) grid: (usize, usize, usize),
    pub(super) idx: Ct,
    pub(super) counts: Ct,
    pub(super) out: Ct,
    pub(super) pm: Ct,
    pub(super) pl: Ct,
    pub(super) pacc: Ct,
    pub(super) rowblocks: usize,
    pub(super) chunk: usize,
    /// Slot table of verification `[slots, 2 + heads]` (KV head, head count, query heads):
    /// block y is a slot.
    pub(super) table: Ct,
    /// Score mode's logits `[b, slots, rpad, lmax]` (f32).
    pub(super) logits: Ct,
    pub(super) lmax: usize,
    /// Splits of the keys, one partial each per (sequence, slot) row block.
    pub(super) splits: usize,
    pub(super) rpad: usize,
    pub(super) verify: bool,
    pub(super) sparse: bool,
    /// Score mode (verification only): logits and (max, sum) partials, no `P V`.
    pub(super) score: bool,
    /// What score mode writes: `kernels::SCORE_LOGITS`, `SCORE_STATS` or `SCORE_MASS`
    /// ([`kernels::flash_kernel`]); ignored outside score mode.
    pub(super) smode: usize,
    /// Score mode with 64 rows a block, each warp its own 16 (`flash_kernel`'s `wide`);
    /// ignored outside score mode.
    pub(super) wide: bool,
    /// Warps per block (4; prefill 4 or 8).
    pub(super) warps: usize,
}

/// Launches `flash_kernel` (shapes checked by the caller: `n_new >= 1`,
/// `ctx + n_new <= capacity`, `head_dim` 64 or 128, rows of `k` and `v` ready by
/// [`rows_ready`], a selection's counts at most its width).
pub(super) fn launch_flash(
    q: Ct,
    k: Ct,
    v: Ct,
    ctx: Ct,
    dims: &AttnDims,
    scale: f32,
    a: FlashLaunch,
) {
    let client = q.client.clone();
    let (fd, id) = (q.dtype, ctx.dtype);
    let (gx, gy, gz) = a.grid;
    // element strides of the first dims (a tensor of lower rank than the kernel reads, as
    // prefill's unused `idx` and `table`, has zeros there: never read)
    let sd = |t: &Ct, i: usize| t.meta.strides().get(i).copied().unwrap_or(0) as u32;
    let st = kernels::FlashStridesLaunch::new(
        sd(&q, 0),
        sd(&q, 1),
        sd(&q, 2),
        sd(&q, 3),
        sd(&k, 0),
        sd(&k, 1),
        sd(&k, 2),
        sd(&v, 0),
        sd(&v, 1),
        sd(&v, 2),
        sd(&a.idx, 0),
        sd(&a.idx, 1),
        sd(&a.idx, 2),
        sd(&a.out, 0),
        sd(&a.out, 1),
        sd(&a.out, 2),
        sd(&a.table, 0),
    );
    // SAFETY: every key the kernel reads is a virtual key below `vctx + n_new` of its
    // sequence (clamped), mapped to a slot below `ctx + n_new <= capacity` (selections:
    // listed positions outside the context read slot 0); rows written are below
    // `rtot <= rpad` (verify) or `n_new` (prefill), query heads read are the slot table's;
    // score mode's logits are written at keys below `kend <= ctx + n_new <= lmax`; shared
    // tiles are sized from the same comptime values.
    unsafe {
        kernels::flash_kernel::launch_unchecked::<CudaRuntime>(
            &client,
            CubeCount::Static(gx as u32, gy as u32, gz as u32),
            CubeDim::new_1d(32 * a.warps as u32),
            NV,
            q.clone().into_array_arg(),
            k.clone().into_array_arg(),
            v.clone().into_array_arg(),
            ctx.into_array_arg(),
            a.idx.clone().into_array_arg(),
            a.counts.into_array_arg(),
            a.table.clone().into_array_arg(),
            a.out.clone().into_array_arg(),
            a.pm.into_array_arg(),
            a.pl.into_array_arg(),
            a.pacc.into_array_arg(),
            a.logits.into_array_arg(),
            st,
            scale,
            dims.n_new as u32,
            dims.group() as u32,
            a.rowblocks as u32,
            a.chunk as u32,
            a.splits as u32,
            a.rpad as u32,
            a.lmax as u32,
            dims.head_dim,
            NV,
            if a.score {
                config_of(&a.out).score_buffers
            } else {
                config_of(&a.out).flash_buffers
            },
            a.verify,
            a.sparse,
            a.score,
            a.smode,
            a.wide,
            a.warps,
            [fd.into(), id.into()],
        );
    }
}

/// Causal prefill attention through `flash_kernel`: `q` `[b, q_heads, n_new, d]`
/// (any strides), `k`, `v` `[b, kv_heads, capacity, d]` ready by [`rows_ready`], `ctx`
/// `[b]`; returns `[b, q_heads, n_new, d]` in `q`'s dtype. Shapes and dtypes checked by the
/// caller.
pub(super) fn flash_prefill(q: Ct, k: Ct, v: Ct, ctx: Ct, dims: &AttnDims, scale: f32) -> Ct {
    let b = dims.batch;
    let out = empty(
        &q,
        vec![b, dims.q_heads, dims.n_new, dims.head_dim],
        q.dtype,
    );
    let cfg = config_of(&q);
    match cfg.prefill_tiles {
        2 => {
            let nbuf = cfg.flash_buffers.min(2);
            launch_prefill2(q, k, v, ctx, dims, scale, out.clone(), nbuf, false);
            return out;
        }
        3 => {
            launch_prefill2(q, k, v, ctx, dims, scale, out.clone(), 1, true);
            return out;
        }
        0 if dims.n_new >= PREFILL2_KV_MIN_NEW => {
            launch_prefill2(q, k, v, ctx, dims, scale, out.clone(), 1, true);
            return out;
        }
        _ => {}
    }
    let warps = cfg.prefill_warps;
    let rowblocks = dims.n_new.div_ceil(16 * warps);
    let one = empty(&q, vec![1], DType::F32);
    let a = FlashLaunch {
        grid: (rowblocks, dims.q_heads, b),
        idx: ctx.clone(),
        counts: ctx.clone(),
        out: out.clone(),
        pm: one.clone(),
        pl: one.clone(),
        pacc: one.clone(),
        table: ctx.clone(),
        logits: one,
        lmax: 1,
        rowblocks,
        chunk: 1,
        splits: 1,
        rpad: 1,
        verify: false,
        sparse: false,
        score: false,
        smode: kernels::SCORE_LOGITS,
        wide: false,
        warps,
    };
    launch_flash(q, k, v, ctx, dims, scale, a);
    out
}

/// Launches `prefill_kernel` (two m-tiles a warp) into `out` `[b, q_heads, n_new, d]` with
/// `nbuf` (1 or 2) K/V tile buffers, or with `kv_apart` one K and one V buffer staged apart
/// by `cp.async` (`nbuf` then 1); shapes as [`flash_prefill`]'s. A ring of more than two
/// buffers would leave one block an SM (Q takes 34 KB of shared memory at d 128).
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_prefill2(
    q: Ct,
    k: Ct,
    v: Ct,
    ctx: Ct,
    dims: &AttnDims,
    scale: f32,
    out: Ct,
    nbuf: usize,
    kv_apart: bool,
) {
    let client = q.client.clone();
    let (fd, id) = (q.dtype, ctx.dtype);
    let rowblocks = dims.n_new.div_ceil(kernels::PREFILL2_ROWS);
    // the kernel's softmax takes the maxima of raw scores
    debug_assert!(scale > 0.0, "prefill_kernel needs a positive scale");
    // K and V staged apart compute each tile in one step, from one buffer each
    debug_assert!(
        !kv_apart || nbuf == 1,
        "kv_apart stages one K and one V buffer"
    );
    let cfg = config_of(&q);
    let kstep = if kv_apart { 64 } else { cfg.prefill_key_step };
    let sd = |t: &Ct, i: usize| t.meta.strides().get(i).copied().unwrap_or(0) as u32;
    let st = kernels::FlashStridesLaunch::new(
        sd(&q, 0),
        sd(&q, 1),
        sd(&q, 2),
        sd(&q, 3),
        sd(&k, 0),
        sd(&k, 1),
        sd(&k, 2),
        sd(&v, 0),
        sd(&v, 1),
        sd(&v, 2),
        0,
        0,
        0,
        sd(&out, 0),
        sd(&out, 1),
        sd(&out, 2),
        0,
    );
    // prefill_stage's vector offsets (K and V staged apart) take element offsets over NV
    debug_assert!(
        [0usize, 1, 2].iter().all(|&i| {
            k.meta.strides().get(i).is_none_or(|s| s % NV == 0)
                && v.meta.strides().get(i).is_none_or(|s| s % NV == 0)
        }),
        "prefill_kernel needs K/V strides that are multiples of {NV}"
    );
    let run = prefill_head_run(&cfg, dims);
    // the slack in raw-score units (the kernel's maxima are of raw scores)
    let slack = if cfg.prefill_lazy_rescale {
        kernels::RESCALE_SLACK / scale
    } else {
        0.0
    };
    let grid = CubeCount::Static(
        (rowblocks * run) as u32,
        (dims.q_heads / run) as u32,
        dims.batch as u32,
    );
    // SAFETY: every key read is below `ctx + n_new <= capacity` of its sequence (tile slots
    // clamped to the block's last key), rows written are below `n_new`, query heads
    // `x % run + y run` below `q_heads` (`run` divides it; the grid), KV heads `qh / group`
    // below `kv_heads`; shared tiles are sized from the same comptime values.
    unsafe {
        kernels::prefill_kernel::launch_unchecked::<CudaRuntime>(
            &client,
            grid,
            CubeDim::new_1d(128),
            NV,
            q.into_array_arg(),
            k.into_array_arg(),
            v.into_array_arg(),
            ctx.into_array_arg(),
            out.into_array_arg(),
            st,
            scale,
            slack,
            dims.n_new as u32,
            dims.group() as u32,
            rowblocks as u32,
            run as u32,
            dims.head_dim,
            NV,
            nbuf,
            kstep,
            kv_apart,
            [fd.into(), id.into()],
        );
    }
}

/// Dense or sparse verification through `flash_kernel` and
/// `combine_kernel`: the rows `e * n_new + i` of each KV head's group in blocks
/// of 64, the virtual keys (context or selection, then the new tokens) split so the grid
/// fills at most two waves of resident blocks (`split_plan::verify_splits`), with at most
/// one split per [`MIN_CHUNK`] keys (each split a multiple of 64 keys); a selection in
/// splits of at least one tile over [`KernelConfig::sparse_waves`] waves. `table` is the
/// identity slot table of the dense path, `sel` the selection (indices, counts tensor,
/// most keys). Returns `[b, q_heads, n_new, d]` in `q`'s dtype.
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_verify(
    q: Ct,
    k: Ct,
    v: Ct,
    ctx: Ct,
    table: Ct,
    sel: Option<(Ct, Ct, usize)>,
    dims: &AttnDims,
    scale: f32,
) -> Ct {
    let b = dims.batch;
    let rows = dims.group() * dims.n_new;
    let rowblocks = rows.div_ceil(kernels::FLASH_ROWS);
    let rpad = rowblocks * kernels::FLASH_ROWS;
    let (sparse, idx, counts, max_keys) = match sel {
        Some((idx, counts, mk)) => (true, idx, counts, mk),
        None => (false, ctx.clone(), ctx.clone(), dims.keys),
    };
    let per = b * dims.kv_heads * rowblocks;
    let cfg = config_of(&q);
    let (min_chunk, waves) = if sparse {
        (crate::split_plan::SPARSE_MIN_CHUNK, cfg.sparse_waves)
    } else {
        (MIN_CHUNK, cfg.dense_waves)
    };
    let (splits, chunk) =
        crate::split_plan::verify_splits(per, max_keys, sm_count(&q), min_chunk, waves);
    let pm = empty(&q, vec![b, dims.kv_heads, splits, rpad], DType::F32);
    let pl = empty(&q, vec![b, dims.kv_heads, splits, rpad], DType::F32);
    let pacc = empty(
        &q,
        vec![b, dims.kv_heads, splits, rpad, dims.head_dim],
        DType::F32,
    );
    let fd = q.dtype;
    let out = empty(&q, vec![b, dims.q_heads, dims.n_new, dims.head_dim], fd);
    let a = FlashLaunch {
        grid: (splits * rowblocks, dims.kv_heads, b),
        idx,
        counts,
        out: out.clone(),
        pm: pm.clone(),
        pl: pl.clone(),
        pacc: pacc.clone(),
        table: table.clone(),
        logits: pm.clone(),
        lmax: 1,
        rowblocks,
        chunk,
        splits,
        rpad,
        verify: true,
        sparse,
        score: false,
        smode: kernels::SCORE_LOGITS,
        wide: false,
        warps: 4,
    };
    launch_flash(q, k, v, ctx, dims, scale, a);
    let client = out.client.clone();
    let id = table.dtype;
    kernels::combine_kernel::launch::<CudaRuntime>(
        &client,
        CubeCount::Static(rows as u32, dims.kv_heads as u32, b as u32),
        CubeDim::new_1d(dims.head_dim as u32),
        pm.into_array_arg(),
        pl.into_array_arg(),
        pacc.into_array_arg(),
        table.clone().into_array_arg(),
        out.clone().into_array_arg(),
        table.meta.strides()[0] as u32,
        out.meta.strides()[0] as u32,
        out.meta.strides()[1] as u32,
        out.meta.strides()[2] as u32,
        out.meta.strides()[3] as u32,
        dims.n_new as u32,
        splits as u32,
        rpad as u32,
        dims.kv_heads as u32,
        dims.head_dim,
        [fd.into(), id.into()],
    );
    out
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> AttentionOps for Cube<F, I, BT> {
    const PREFILL_CHUNK: usize = 16384;

    const PREFILL_HEAD_DIMS: &'static [usize] = KERNEL_HEAD_DIMS;

    fn verify_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        attention(q, k, v, ctx_lens, None, scale, MAX_NEW)
    }

    fn prefill_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        attention(q, k, v, ctx_lens, None, scale, MAX_PREFILL_NEW)
    }

    fn sparse_verify_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        indices: Tensor<Self, 3, Int>,
        counts: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        attention(q, k, v, ctx_lens, Some((indices, counts)), scale, MAX_NEW)
    }
}
