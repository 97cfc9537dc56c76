//! GPU check and benchmark of the dustin-kernels CUDA ops (built with `--features cuda`,
//! staged by `cargo run -p xtask -- gpu-kernels`).
//!
//! - `check`: every op against the float64 references of `dustin_kernels::reference` on fresh
//!   random bf16 inputs, outputs poisoned with NaN first, stale cache slots NaN, odd sizes.
//!   Bound: normwise relative error `max|out - ref| / max|ref| < 1e-2`; top-k must match
//!   exactly. Exit code 1 on any failure.
//! - `bench`: Qwen2.5-7B / 72B attention shapes with 5 query tokens, and the 0.5B draft's
//!   (14 query / 2 KV heads, head_dim 64) with 1, batch 1 / 8 / 16, context 8k / 16k / 32k:
//!   dense, sparse at budgets 512 / 1024 / 2048 (+4 sinks +64 window), head-subset scoring
//!   of two query heads over one KV head's keys, top-k; microseconds per layer and TB/s of
//!   KV read. JSON lines go to `--json PATH` as well. `--verify-kernel auto|flash|split` and
//!   `--flash-buffers 1|2|3` pick the attention kernel and the flash kernel's tile buffers.
//! - `topk`: GPU time of both top-k kernels (`cuda::TopkKernel`) side by side at the
//!   selectors' shapes, each run checked against the float64-ordered reference; `check --op
//!   topk` checks both kernels too.
//! - `ktime --op OP [--model 7B|72B]`: one op of `bench` at B=8, 32k alone (2 warm-up calls,
//!   then 5), for a trace of its kernels' GPU time (`scripts/gpu_prefill.sh ktime`).
//! - `--score-buffers 1|2|3`, `--sparse-waves 1..8` and `--dense-waves 1..16` (any
//!   command): the flash kernel's K tile buffers in score mode, and the waves of blocks
//!   sparse and dense verification's splits aim for.
//! - `check --op skinny`: the skinny GEMMs alone (decode and verify rows, three weights of one
//!   `x`, SwiGLU), with the default kernel choice and with the ring kernel forced, each with
//!   the split reduction in its own reduce kernel and inside the GEMM's launch.
//! - `--split-reduce fused|kernel` (any command): where the skinny GEMMs sum their splits
//!   (`cuda::SplitReduce`; `kernel`, a reduce kernel after the GEMM, by default).
//! - `gemm [--decode-only] [--no-burn] [--ring-configs 64x32x4,128x64x3]`: the projections'
//!   GEMMs (see [`gemm`]), the ring kernel once per listed block shape.
//! - `--ring-config COLSxKCxBUFS` (any command): the ring kernel's block shape
//!   (`cuda::RingConfig`).

use std::io::Write;
use std::time::Instant;

use burn_tensor::{backend::Backend, Distribution, Int, Tensor, TensorData};
use dustin_kernels::cuda::{self, AttentionKernel, RingConfig};
use dustin_kernels::prelude::*;
use dustin_kernels::reference::{self, Dims, Sel};
use dustin_kernels::{Keep, KernelConfig, MAX_NEW};

type B = burn_cuda::Cuda<half::bf16, i32>;

const BOUND: f64 = 1e-2;

fn dev() -> burn_cuda::CudaDevice {
    burn_cuda::CudaDevice::default()
}

/// The kernel choices installed for the device the checks run on.
fn config() -> KernelConfig {
    cuda::config(&dev())
}

/// Changes the kernel choices of the device the checks run on ([`cuda::update_config`]).
fn tweak(change: impl FnOnce(&mut KernelConfig)) {
    cuda::update_config(&dev(), change)
}

fn to_f32<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .unwrap_or_default()
}

fn upload<const D: usize>(v: Vec<f32>, shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v, shape), &dev())
}

struct Case {
    name: &'static str,
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    n: usize,
    d: usize,
    ctx: Vec<usize>,
    /// key scale grows along the context (exercises the rare rescale path)
    ramp: bool,
}

struct Report {
    failures: usize,
    lines: Vec<String>,
}

impl Report {
    fn add(&mut self, case: &str, op: &str, err: f64, bound: f64) {
        let ok = err < bound;
        if !ok {
            self.failures += 1;
        }
        let line = format!(
            "{case:<28} {op:<26} max rel err {err:>10.3e}  bound {bound:.0e}  {}",
            if ok { "ok" } else { "FAIL" }
        );
        println!("{line}");
        self.lines.push(line);
    }
}

fn check_case(c: &Case, seed: u64, op: &str, rep: &mut Report) {
    let want = |name: &str| op == "all" || op == name;
    let cap = c.ctx.iter().max().copied().unwrap_or(0) + c.n + 7;
    let dims = Dims {
        batch: c.batch,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        n_new: c.n,
        head_dim: c.d,
        capacity: cap,
    };
    let scale = 1.0 / (c.d as f64).sqrt();
    let q = reference::random_bf16(c.batch * c.q_heads * c.n * c.d, 2.0, seed);
    let mut k = reference::random_bf16(c.batch * c.kv_heads * cap * c.d, 2.0, seed + 1);
    let mut v = reference::random_bf16(c.batch * c.kv_heads * cap * c.d, 1.0, seed + 2);
    for b in 0..c.batch {
        for h in 0..c.kv_heads {
            for p in 0..cap {
                let o = ((b * c.kv_heads + h) * cap + p) * c.d;
                for x in 0..c.d {
                    if p >= c.ctx[b] + c.n {
                        // stale slots: must never be read
                        k[o + x] = f32::NAN;
                        v[o + x] = f32::NAN;
                    } else if c.ramp {
                        let f = 1.0 + 6.0 * p as f32 / cap as f32;
                        k[o + x] = half::bf16::from_f32(k[o + x] * f).to_f32();
                    }
                }
            }
        }
    }
    let qt = upload(q.clone(), [c.batch, c.q_heads, c.n, c.d]);
    let kt = upload(k.clone(), [c.batch, c.kv_heads, cap, c.d]);
    let vt = upload(v.clone(), [c.batch, c.kv_heads, cap, c.d]);

    // prefill chunks: only the prefill op takes more than MAX_NEW new tokens
    if c.n > MAX_NEW {
        if want("prefill") {
            let r = reference::attention(&q, &k, &v, &dims, &c.ctx, scale, None);
            // both kernels, each forced (the automatic choice depends on the block count)
            // (label, kernel, flash tile buffers, flash prefill warps, m-tiles a warp)
            for (name, kern, bufs, warps, tiles) in [
                ("prefill flash", AttentionKernel::Flash, 2, 4, 1),
                ("prefill flash 3buf", AttentionKernel::Flash, 3, 4, 1),
                ("prefill flash sync", AttentionKernel::Flash, 1, 4, 1),
                ("prefill flash w8", AttentionKernel::Flash, 2, 8, 1),
                ("prefill flash w8 3buf", AttentionKernel::Flash, 3, 8, 1),
                ("prefill flash w8 sync", AttentionKernel::Flash, 1, 8, 1),
                ("prefill flash x2", AttentionKernel::Flash, 2, 4, 2),
                ("prefill flash x2 sync", AttentionKernel::Flash, 1, 4, 2),
                ("prefill flash x2 kv", AttentionKernel::Flash, 1, 4, 3),
                (
                    "prefill flash x2 run1",
                    AttentionKernel::Flash,
                    2,
                    4,
                    2 + RUN,
                ),
                // runs spanning two KV heads and smaller than a group (the g7 row has 14 q
                // heads, 2 KV heads: the default run is 7; g5 falls back to 5)
                (
                    "prefill flash x2 kv run14",
                    AttentionKernel::Flash,
                    1,
                    4,
                    3 + 14 * RUN,
                ),
                (
                    "prefill flash x2 kv run2",
                    AttentionKernel::Flash,
                    1,
                    4,
                    3 + 2 * RUN,
                ),
                (
                    "prefill flash x2 kv run1",
                    AttentionKernel::Flash,
                    1,
                    4,
                    3 + RUN,
                ),
                (
                    "prefill flash x2 eager",
                    AttentionKernel::Flash,
                    2,
                    4,
                    2 + EAGER,
                ),
                (
                    "prefill flash x2 kv eager",
                    AttentionKernel::Flash,
                    1,
                    4,
                    3 + EAGER,
                ),
                ("prefill flash x2 k32", AttentionKernel::Flash, 2, 4, 32),
                (
                    "prefill flash x2 k32 sync",
                    AttentionKernel::Flash,
                    1,
                    4,
                    32,
                ),
                ("prefill split", AttentionKernel::Split, 2, 4, 1),
            ] {
                set_prefill_variant(kern, bufs, warps, tiles);
                let o =
                    B::prefill_attention(qt.clone(), kt.clone(), vt.clone(), &c.ctx, scale as f32);
                match o {
                    Ok(o) => rep.add(c.name, name, reference::rel_err(&to_f32(o), &r), BOUND),
                    Err(e) => rep.add(c.name, &format!("{name} error {e}"), f64::INFINITY, BOUND),
                }
            }
            reset_prefill_variant();
        }
        return;
    }

    // dense
    // both verification kernels, each forced: the flash kernel (2 tile buffers, the
    // default; a ring of 3; tiles staged without cp.async) and the split kernel
    let kernels = [
        ("", AttentionKernel::Flash, 2),
        (" flash 3buf", AttentionKernel::Flash, 3),
        (" flash sync", AttentionKernel::Flash, 1),
        (" split", AttentionKernel::Split, 2),
    ];
    if want("dense") {
        let r = reference::attention(&q, &k, &v, &dims, &c.ctx, scale, None);
        for (tag, kern, bufs) in kernels {
            tweak(|c| c.verify_kernel = kern);
            tweak(|c| c.flash_buffers = bufs);
            let op = format!("dense{tag}");
            match B::verify_attention(qt.clone(), kt.clone(), vt.clone(), &c.ctx, scale as f32) {
                Ok(o) => rep.add(c.name, &op, reference::rel_err(&to_f32(o), &r), BOUND),
                Err(e) => rep.add(c.name, &format!("{op} error {e}"), f64::INFINITY, BOUND),
            }
        }
        tweak(|c| c.verify_kernel = AttentionKernel::Auto);
        tweak(|c| c.flash_buffers = dustin_kernels::cuda::FLASH_BUFFERS);
    }

    // sparse: a budget below the contexts and one above all of them
    let cmax = c.ctx.iter().max().copied().unwrap_or(0);
    for budget in [cmax / 3 + 1, cmax + 50] {
        if !want("sparse") {
            break;
        }
        let (mut idx, counts) =
            reference::random_selection(c.batch, c.kv_heads, budget, &c.ctx, seed + 3);
        // entries outside the context are skipped (the trait's contract): one negative and
        // one past the context in every row of 3 or more
        for bb in 0..c.batch {
            if counts[bb] >= 3 {
                for h in 0..c.kv_heads {
                    let row = (bb * c.kv_heads + h) * budget;
                    idx[row + 1] = -1;
                    idx[row + counts[bb] - 1] = (c.ctx[bb] + 2) as i64;
                }
            }
        }
        let r = reference::attention(
            &q,
            &k,
            &v,
            &dims,
            &c.ctx,
            scale,
            Some(Sel {
                indices: &idx,
                budget,
                counts: &counts,
            }),
        );
        let it = Tensor::<B, 3, Int>::from_data(
            TensorData::new(idx.clone(), [c.batch, c.kv_heads, budget]),
            &dev(),
        );
        for (tag, kern, bufs) in kernels {
            tweak(|c| c.verify_kernel = kern);
            tweak(|c| c.flash_buffers = bufs);
            let op = format!("sparse budget {budget}{tag}");
            match B::sparse_verify_attention(
                qt.clone(),
                kt.clone(),
                vt.clone(),
                &c.ctx,
                it.clone(),
                &counts,
                scale as f32,
            ) {
                Ok(o) => rep.add(c.name, &op, reference::rel_err(&to_f32(o), &r), BOUND),
                Err(e) => rep.add(c.name, &format!("{op} error {e}"), f64::INFINITY, BOUND),
            }
        }
        tweak(|c| c.verify_kernel = AttentionKernel::Auto);
        tweak(|c| c.flash_buffers = dustin_kernels::cuda::FLASH_BUFFERS);
    }

    // head-subset scores: a head of KV head 0, two of the last KV head
    let g = c.q_heads / c.kv_heads;
    let mut heads = vec![1 % g, c.q_heads - 1, c.q_heads - g];
    heads.dedup();
    if want("scores") {
        // the split kernel's score mode, then the flash kernel's (the default), whose scores
        // the top-k row takes
        let r = reference::head_row_scores(&q, &k, &dims, &c.ctx, &heads, scale);
        let rs = reference::head_scores(&q, &k, &dims, &c.ctx, &heads, scale);
        for (tag, kern) in [
            (" split", AttentionKernel::Split),
            ("", AttentionKernel::Flash),
        ] {
            tweak(|c| c.verify_kernel = kern);
            match B::head_subset_row_scores(qt.clone(), kt.clone(), &c.ctx, &heads, scale as f32) {
                Ok(s) => rep.add(
                    c.name,
                    &format!("head-subset row scores{tag}"),
                    reference::rel_err(&to_f32(s), &r),
                    BOUND,
                ),
                Err(e) => rep.add(
                    c.name,
                    &format!("row scores{tag} error {e}"),
                    f64::INFINITY,
                    BOUND,
                ),
            }
            match B::head_subset_scores(qt.clone(), kt.clone(), &c.ctx, &heads, scale as f32) {
                Ok(s) => {
                    let host = to_f32(s.clone());
                    rep.add(
                        c.name,
                        &format!("head-subset scores{tag}"),
                        reference::rel_err(&host, &rs),
                        BOUND,
                    );
                    if kern == AttentionKernel::Flash {
                        // top-k of those f32 scores, exact; the scores span the keys' whole
                        // width (capacity), not cmax + n
                        let keep = Keep {
                            budget: (cmax / 4).max(80),
                            n_sink: 4,
                            window: 16,
                        };
                        topk_check(
                            c.name,
                            "top-k (f32 scores)",
                            s,
                            &host,
                            c.batch,
                            c.kv_heads,
                            cap,
                            &c.ctx,
                            keep,
                            rep,
                        );
                    }
                }
                Err(e) => rep.add(
                    c.name,
                    &format!("scores{tag} error {e}"),
                    f64::INFINITY,
                    BOUND,
                ),
            }
        }
        tweak(|c| c.verify_kernel = AttentionKernel::Auto);
    }

    // quest
    let page = 16;
    let pages = cmax.div_ceil(page).max(1);
    if want("quest") {
        let (mn, mx) = reference::page_bounds(&k, &dims, &c.ctx, page, pages);
        match B::quest_page_bounds(kt.clone(), &c.ctx, page) {
            Ok((a, bnd)) => {
                let (ha, hb) = (to_f32(a.clone()), to_f32(bnd.clone()));
                let e = reference::rel_err(&ha, &mn).max(reference::rel_err(&hb, &mx));
                rep.add(c.name, "quest page bounds", e, 1e-6);
                let r = reference::page_scores(&q, &mn, &mx, &dims, &c.ctx, page, pages);
                match B::quest_page_scores(qt.clone(), a, bnd, &c.ctx, page) {
                    Ok(s) => rep.add(
                        c.name,
                        "quest page scores",
                        reference::rel_err(&to_f32(s), &r),
                        BOUND,
                    ),
                    Err(e) => rep.add(
                        c.name,
                        &format!("quest scores error {e}"),
                        f64::INFINITY,
                        BOUND,
                    ),
                }
            }
            Err(e) => rep.add(
                c.name,
                &format!("quest bounds error {e}"),
                f64::INFINITY,
                BOUND,
            ),
        }
    }

    // top-k of bf16 scores: many ties (bf16 has 8 mantissa bits), some NaN and inf
    if !want("topk") {
        return;
    }
    let l = cmax + 3;
    let mut s = reference::random_bf16(c.batch * c.kv_heads * l, 1.0, seed + 9);
    for (i, x) in s.iter_mut().enumerate() {
        *x = (*x * 8.0).round() / 8.0;
        if i % 97 == 5 {
            *x = f32::NAN;
        }
        if i % 89 == 7 {
            *x = f32::INFINITY;
        }
    }
    let st = upload(s.clone(), [c.batch, c.kv_heads, l]);
    let keep = Keep {
        budget: cmax / 2 + 5,
        n_sink: 4,
        window: 64,
    };
    topk_check(
        c.name,
        "top-k (bf16, ties, NaN)",
        st,
        &s,
        c.batch,
        c.kv_heads,
        l,
        &c.ctx,
        keep,
        rep,
    );
}

#[allow(clippy::too_many_arguments)]
fn topk_check(
    case: &str,
    op: &str,
    scores: Tensor<B, 3>,
    host: &[f32],
    batch: usize,
    heads: usize,
    l: usize,
    ctx: &[usize],
    keep: Keep,
    rep: &mut Report,
) {
    let want = reference::top_k(host, batch, heads, l, ctx, keep);
    // both kernels (cuda::TopkKernel), the default's setting restored after
    let before = config().topk_kernel;
    for (kname, kernel) in [
        ("block", cuda::TopkKernel::Block),
        ("warp", cuda::TopkKernel::Warp),
    ] {
        tweak(|c| c.topk_kernel = kernel);
        let op = format!("{op} [{kname}]");
        topk_check_one(case, &op, scores.clone(), &want, heads, ctx, keep, rep);
    }
    tweak(|c| c.topk_kernel = before);
}

/// One run of the top-k kernel [`KernelConfig::topk_kernel`] of the device against `want` (per row, the
/// kept positions ascending).
#[allow(clippy::too_many_arguments)]
fn topk_check_one(
    case: &str,
    op: &str,
    scores: Tensor<B, 3>,
    want: &[Vec<usize>],
    heads: usize,
    ctx: &[usize],
    keep: Keep,
    rep: &mut Report,
) {
    match B::top_k_positions(scores, ctx, keep) {
        Ok(p) => {
            let kk = p.indices.dims()[2];
            let got: Vec<i64> = p
                .indices
                .into_data()
                .convert::<i64>()
                .to_vec::<i64>()
                .unwrap_or_default();
            let mut bad = 0usize;
            for (r, w) in want.iter().enumerate() {
                let b = r / heads;
                let row = &got[r * kk..(r + 1) * kk];
                let cnt = p.counts[b];
                let ok = cnt == w.len()
                    && row[..cnt].iter().zip(w).all(|(&g, &x)| g as usize == x)
                    && row[cnt..].iter().all(|&g| g == 0);
                if !ok {
                    bad += 1;
                }
            }
            rep.add(
                case,
                &format!("{op}: {bad} bad rows"),
                if bad == 0 { 0.0 } else { 1.0 },
                0.5,
            );
        }
        Err(e) => rep.add(case, &format!("{op} error {e}"), f64::INFINITY, 0.5),
    }
}

fn check(op: &str) -> usize {
    dustin_kernels::cuda::set_poison_outputs(true);
    let cases = [
        Case {
            name: "g7 n1 d128 ragged",
            batch: 3,
            q_heads: 14,
            kv_heads: 2,
            n: 1,
            d: 128,
            ctx: vec![1000, 77, 2049],
            ramp: false,
        },
        Case {
            name: "g7 n5 d128 ragged",
            batch: 3,
            q_heads: 14,
            kv_heads: 2,
            n: 5,
            d: 128,
            ctx: vec![1000, 77, 2049],
            ramp: false,
        },
        Case {
            name: "g7 n16 d128 (2 row blocks)",
            batch: 2,
            q_heads: 14,
            kv_heads: 2,
            n: 16,
            d: 128,
            ctx: vec![1500, 0],
            ramp: false,
        },
        Case {
            name: "g5 n5 d128 ramp (rescale)",
            batch: 2,
            q_heads: 20,
            kv_heads: 4,
            n: 5,
            d: 128,
            ctx: vec![3001, 130],
            ramp: true,
        },
        Case {
            // 15 splits of 576 keys (split_plan::verify_splits(32, 8197, 132)): 9 tiles a
            // split, so both buffers of the flash kernel and both parities of their
            // barriers are used several times
            name: "g7 n5 d128 B8 8k (8 tiles a split)",
            batch: 8,
            q_heads: 28,
            kv_heads: 4,
            n: 5,
            d: 128,
            ctx: vec![8192, 8000, 7000, 8100, 5000, 8192, 100, 8191],
            ramp: false,
        },
        Case {
            // the 0.5B draft's decoding (7 rows of one warp's tile), 33 splits of 256 keys
            // (split_plan::verify_splits(8, 8193, 132)); an empty context
            name: "g7 n1 d64 B4 ramp (draft decode)",
            batch: 4,
            q_heads: 14,
            kv_heads: 2,
            n: 1,
            d: 64,
            ctx: vec![8192, 3001, 0, 6000],
            ramp: true,
        },
        Case {
            // 28 rows: two warps' row tiles, the second partly filled
            name: "g4 n7 d64 (28 rows)",
            batch: 2,
            q_heads: 8,
            kv_heads: 2,
            n: 7,
            d: 64,
            ctx: vec![2500, 64],
            ramp: false,
        },
        Case {
            name: "g8 n16 d128 (72B rows)",
            batch: 1,
            q_heads: 16,
            kv_heads: 2,
            n: 16,
            d: 128,
            ctx: vec![4099],
            ramp: false,
        },
        Case {
            name: "g7 n100 d128 prefill ragged",
            batch: 2,
            q_heads: 14,
            kv_heads: 2,
            n: 100,
            d: 128,
            ctx: vec![0, 333],
            ramp: false,
        },
        Case {
            name: "g7 n512 d128 prefill",
            batch: 1,
            q_heads: 14,
            kv_heads: 2,
            n: 512,
            d: 128,
            ctx: vec![1000],
            ramp: false,
        },
        Case {
            name: "g5 n37 d64 prefill ramp",
            batch: 2,
            q_heads: 10,
            kv_heads: 2,
            n: 37,
            d: 64,
            ctx: vec![700, 5],
            ramp: true,
        },
        Case {
            name: "g3 n5 d64",
            batch: 2,
            q_heads: 9,
            kv_heads: 3,
            n: 5,
            d: 64,
            ctx: vec![500, 33],
            ramp: false,
        },
    ];
    let mut rep = Report {
        failures: 0,
        lines: Vec::new(),
    };
    for (i, c) in cases.iter().enumerate() {
        check_case(c, 1000 * i as u64 + 17, op, &mut rep);
    }
    if op == "dustin" {
        for r in dustin_kernels::check::check_dustin_ops::<B>(&dev(), BOUND) {
            rep.add(&r.case, r.op, r.err, r.bound);
        }
    }
    if op == "all" || op == "elementwise" {
        for r in dustin_kernels::check::check_elementwise::<B>(&dev(), BOUND) {
            rep.add(&r.case, r.op, r.err, r.bound);
        }
    }
    if op == "all" || op == "elementwise" || op == "skinny" {
        use dustin_kernels::cuda::SkinnyKernel;
        // the skinny GEMM rows (with the SwiGLU and three-weight ones) with each kernel
        // forced wherever it takes the shape (the elementwise pass ran the default choice):
        // the tensor-core kernel, the ring kernel (in the `--ring-config` shape), and CUDA
        // cores only (rows past 16 on Burn's matmul, whose autotuning makes it the slow pass);
        // with `skinny` alone the default and the ring kernel only, each with the split
        // reduction as `--split-reduce` says (a reduce kernel by default) and then inside the
        // GEMM's launch
        use dustin_kernels::cuda::SplitReduce;
        let split_default = config().split_reduce;
        let kernels = if op == "skinny" {
            vec![
                (SkinnyKernel::Auto, split_default, "auto"),
                (SkinnyKernel::Ring, split_default, "ring"),
                (
                    SkinnyKernel::Auto,
                    SplitReduce::Fused,
                    "auto, fused reduction",
                ),
                (
                    SkinnyKernel::Ring,
                    SplitReduce::Fused,
                    "ring, fused reduction",
                ),
            ]
        } else {
            vec![
                (SkinnyKernel::Mma, split_default, "mma"),
                (SkinnyKernel::Ring, split_default, "ring"),
                (SkinnyKernel::Cores, split_default, "cores"),
            ]
        };
        for (kernel, split, label) in kernels {
            tweak(|c| c.skinny_kernel = kernel);
            tweak(|c| c.split_reduce = split);
            for r in dustin_kernels::check::check_skinny_gemms::<B>(&dev(), BOUND) {
                rep.add(&format!("{} ({label})", r.case), r.op, r.err, r.bound);
            }
        }
        tweak(|c| c.skinny_kernel = SkinnyKernel::Auto);
        tweak(|c| c.split_reduce = split_default);
    }
    dustin_kernels::cuda::set_poison_outputs(false);
    println!(
        "check: {} results, {} failures",
        rep.lines.len(),
        rep.failures
    );
    rep.failures
}

/// Microseconds per call, averaged over `iters` after `warm` warm-up calls.
/// Prints each JSON line it is given, and appends it to `json` when given (a file that
/// cannot be created is skipped: the lines still print).
fn emitter(json: Option<&str>) -> impl FnMut(String) {
    let mut out = json.and_then(|p| std::fs::File::create(p).ok());
    move |v: String| {
        println!("{v}");
        if let Some(f) = out.as_mut() {
            let _ = writeln!(f, "{v}");
        }
    }
}

fn time_us(warm: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warm {
        f();
    }
    let _ = B::sync(&dev());
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    let _ = B::sync(&dev());
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

/// `topk`: GPU time of [`KernelOps::top_k_positions`](crate::SelectionOps::top_k_positions) at the selectors' shapes (4 sinks, 64
/// window, budget 1024 + 68), each row also checked against the float64-ordered
/// [`reference::top_k`]. Two score distributions: uniform in [0, 1), and clustered like the
/// normalised attention mass the selectors rank (`exp(2 u)` over the row's sum, `u` uniform
/// in [-1, 1): every value within a few binary exponents of `1 / ctx`). Rows `batch x kv_heads`: the 7B
/// target's layer at B 1, 8, 16; 28 such layers stacked (one call for a whole verification);
/// the 0.5B draft's 24 layers stacked; 72B at B 16. bf16 scores, and f32 for one shape.
fn topk_bench(json: Option<&str>) -> usize {
    let mut emit = emitter(json);
    let keep = Keep {
        budget: 1024 + 68,
        n_sink: 4,
        window: 64,
    };
    let shapes: [(&str, usize, usize, usize); 7] = [
        ("7B layer B1", 1, 4, 32768),
        ("7B layer B8", 8, 4, 32768),
        ("7B layer B16", 16, 4, 32768),
        ("7B layer B8 8k", 8, 4, 8192),
        ("7B 28 layers B8", 28 * 8, 4, 32768),
        ("0.5B 24 layers B8", 24 * 8, 2, 32768),
        ("72B layer B16", 16, 8, 32768),
    ];
    let mut failures = 0;
    println!("| shape | rows | ctx | scores | dtype | kernel | us | rows/ms | check |");
    println!("|---|---:|---:|---|---|---|---:|---:|---|");
    for (si, &(name, batch, heads, ctx)) in shapes.iter().enumerate() {
        for dist in ["uniform", "clustered"] {
            let n = batch * heads * ctx;
            let u = reference::random_bf16(n, 1.0, 40 + si as u64);
            let mut host: Vec<f32> = if dist == "uniform" {
                u.into_iter().map(|x| 0.5 * (x + 1.0)).collect()
            } else {
                u.into_iter().map(|x| (2.0 * x).exp()).collect()
            };
            if dist == "clustered" {
                for row in host.chunks_mut(ctx) {
                    let sum: f32 = row.iter().sum();
                    row.iter_mut().for_each(|x| *x /= sum);
                }
            }
            let lens = vec![ctx; batch];
            let dtypes: &[&str] = if si == 1 { &["bf16", "f32"] } else { &["bf16"] };
            for &dt in dtypes {
                let t = upload(host.clone(), [batch, heads, ctx]);
                let t = if dt == "f32" {
                    t.cast(burn_tensor::DType::F32)
                } else {
                    t
                };
                // what the kernel sees: the scores as uploaded (rounded to the backend's bf16)
                let seen = to_f32(t.clone());
                let want = reference::top_k(&seen, batch, heads, ctx, &lens, keep);
                // both kernels side by side, the default restored after
                let before = config().topk_kernel;
                for (kname, kernel) in [
                    ("block", cuda::TopkKernel::Block),
                    ("warp", cuda::TopkKernel::Warp),
                ] {
                    tweak(|c| c.topk_kernel = kernel);
                    let us = time_us(3, 20, || {
                        let _ = B::top_k_positions(t.clone(), &lens, keep);
                    });
                    let mut rep = Report {
                        failures: 0,
                        lines: Vec::new(),
                    };
                    topk_check_one(
                        name,
                        "top-k",
                        t.clone(),
                        &want,
                        heads,
                        &lens,
                        keep,
                        &mut rep,
                    );
                    let bad = rep.failures;
                    failures += bad;
                    let rows = batch * heads;
                    println!(
                        "| {name} | {rows} | {ctx} | {dist} | {dt} | {kname} | {us:.1} | {:.1} | {} |",
                        rows as f64 / us * 1e3,
                        if bad == 0 { "ok" } else { "FAIL" }
                    );
                    emit(format!(
                        "{{\"shape\":\"{name}\",\"rows\":{rows},\"ctx\":{ctx},\"scores\":\"{dist}\",\"dtype\":\"{dt}\",\"kernel\":\"{kname}\",\"us\":{us:.2},\"ok\":{}}}",
                        bad == 0
                    ));
                }
                tweak(|c| c.topk_kernel = before);
            }
        }
    }
    failures
}

fn selection(
    batch: usize,
    kvh: usize,
    ctx: usize,
    budget: usize,
    seed: u64,
) -> (Tensor<B, 3, Int>, Vec<usize>) {
    // 4 sinks, 64 window, `budget` others at random (ascending)
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let cnt = (budget + 68).min(ctx);
    let mut idx = Vec::with_capacity(batch * kvh * cnt);
    for _ in 0..batch * kvh {
        let mut row: Vec<i64> = (0..4).chain(ctx as i64 - 64..ctx as i64).collect();
        let mut seen: std::collections::HashSet<i64> = row.iter().copied().collect();
        while row.len() < cnt {
            let p = rng.random_range(4..ctx as i64 - 64);
            if seen.insert(p) {
                row.push(p);
            }
        }
        row.sort_unstable();
        idx.extend(row);
    }
    (
        Tensor::from_data(TensorData::new(idx, [batch, kvh, cnt]), &dev()),
        vec![cnt; batch],
    )
}

fn bench(json: Option<&str>, quick: bool, kern: AttentionKernel) {
    tweak(|c| c.verify_kernel = kern);
    let mut out = json.and_then(|p| std::fs::File::create(p).ok());
    // (model, query heads, KV heads, head_dim, new tokens): the published configs; the
    // 0.5B draft decodes one token a step (its attention during drafting)
    let models = [
        ("7B", 28usize, 4usize, 128usize, 5usize),
        ("72B", 64, 8, 128, 5),
        ("0.5B draft", 14, 2, 64, 1),
    ];
    let batches: &[usize] = if quick { &[8] } else { &[1, 8, 16] };
    let ctxs: &[usize] = if quick {
        &[32768]
    } else {
        &[8192, 16384, 32768]
    };
    println!("| model | B | ctx | dense us | dense TB/s | sparse 512 us | sparse 1024 us | sparse 2048 us | dense/sparse1024 | score 1 kv head us | dense/score | top-k us |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, hq, kvh, d, n) in models {
        let scale = 1.0 / (d as f32).sqrt();
        for &b in batches {
            for &ctx in ctxs {
                let cap = ctx + n;
                let q =
                    Tensor::<B, 4>::random([b, hq, n, d], Distribution::Uniform(-1.0, 1.0), &dev());
                let k = Tensor::<B, 4>::random(
                    [b, kvh, cap, d],
                    Distribution::Uniform(-1.0, 1.0),
                    &dev(),
                );
                let v = Tensor::<B, 4>::random(
                    [b, kvh, cap, d],
                    Distribution::Uniform(-1.0, 1.0),
                    &dev(),
                );
                let lens = vec![ctx; b];
                let kv_bytes = |keys: usize| (2 * b * kvh * keys * d * 2) as f64;
                let iters = 20;
                let dense = time_us(3, iters, || {
                    let _ = B::verify_attention(q.clone(), k.clone(), v.clone(), &lens, scale);
                });
                let mut sparse = Vec::new();
                for budget in [512usize, 1024, 2048] {
                    let (idx, counts) = selection(b, kvh, ctx, budget, budget as u64);
                    let t = time_us(3, iters, || {
                        let _ = B::sparse_verify_attention(
                            q.clone(),
                            k.clone(),
                            v.clone(),
                            &lens,
                            idx.clone(),
                            &counts,
                            scale,
                        );
                    });
                    sparse.push((budget, counts[0], t));
                }
                let heads = [0usize, 1];
                let score = time_us(3, iters, || {
                    let _ = B::head_subset_scores(q.clone(), k.clone(), &lens, &heads, scale);
                });
                let sc =
                    Tensor::<B, 3>::random([b, kvh, ctx], Distribution::Uniform(0.0, 1.0), &dev());
                let keep = Keep {
                    budget: 1024 + 68,
                    n_sink: 4,
                    window: 64,
                };
                let topk = time_us(2, 10, || {
                    let _ = B::top_k_positions(sc.clone(), &lens, keep);
                });
                let dense_tbs = kv_bytes(ctx + n) / dense / 1e6;
                println!(
                    "| {name} | {b} | {ctx} | {dense:.1} | {dense_tbs:.2} | {:.1} | {:.1} | {:.1} | {:.1}x | {score:.1} | {:.1}x | {topk:.1} |",
                    sparse[0].2,
                    sparse[1].2,
                    sparse[2].2,
                    dense / sparse[1].2,
                    dense / score
                );
                if let Some(f) = out.as_mut() {
                    let sp: Vec<String> = sparse
                        .iter()
                        .map(|(bu, cnt, t)| {
                            format!(
                                "{{\"budget\":{bu},\"count\":{cnt},\"us\":{t:.2},\"tbs\":{:.3}}}",
                                kv_bytes(cnt + n) / t / 1e6
                            )
                        })
                        .collect();
                    let _ = writeln!(
                        f,
                        "{{\"model\":\"{name}\",\"q_heads\":{hq},\"kv_heads\":{kvh},\"batch\":{b},\"ctx\":{ctx},\"n_new\":{n},\"dense_us\":{dense:.2},\"dense_tbs\":{dense_tbs:.3},\"sparse\":[{}],\"score_us\":{score:.2},\"score_k_tbs\":{:.3},\"topk_us\":{topk:.2}}}",
                        sp.join(","),
                        kv_bytes(ctx + n) / (2.0 * kvh as f64) / score / 1e6
                    );
                }
            }
        }
    }
}

/// "Measure first": Burn's autotuned bf16 matmul (this binary is built without
/// fusion) at the projection shapes of Qwen2.5-7B and 72B (and their LM head, decode rows
/// only), prefill rows (4k..32k tokens) and decode / verify rows (1, 8, 16, 40, 80, 128;
/// also our skinny GEMMs, `KernelOps::skinny_linear`: the tensor-core kernel up to 128 rows,
/// op `skinny_mma`, the ring kernel up to 128, `skinny_ring`, and the CUDA-core one up to 16,
/// op `skinny`), 30 untimed calls first
/// (autotuning), then the mean of 10; beside each, `KernelOps::prefill_linear` (cuBLAS, `op`
/// `cublas`: each call waits for cubecl's queue before and for cuBLAS after, as the model
/// runs it); then the causal prefill
/// attention of [`prefill_attention`]. With `no_burn`, neither Burn's matmul nor the attention
/// (the cuBLAS and skinny rows only); with `decode_only`, the decode / verify rows only; with
/// `model` (`7B` or `72B`), that model's shapes only. One JSON line a shape; TFLOP/s count
/// `2 m k n`, TB/s the weight read.
fn gemm(
    json: Option<&str>,
    quick: bool,
    no_burn: bool,
    decode_only: bool,
    model: Option<&str>,
    ring_configs: &[RingConfig],
) {
    let dev = Default::default();
    let mut emit = emitter(json);
    let prefill: &[usize] = if decode_only {
        &[]
    } else if quick {
        &[16384]
    } else {
        &[4096, 16384, 32768]
    };
    // 40 and 80: verification at batch 8 and 16, gamma 4
    let decode: &[usize] = &[1, 8, 16, 40, 80, 128];
    // (model, hidden, intermediate, q/o width, k/v width): the published configs
    for (name, h, inter, qo, kvo) in [
        ("7B", 3584usize, 18944usize, 3584usize, 512usize),
        ("72B", 8192, 29568, 8192, 1024),
    ] {
        if model.is_some_and(|m| m != name) {
            continue;
        }
        for (k, n, what) in [
            (h, qo, "q/o"),
            (h, kvo, "k/v"),
            (h, inter, "gate/up"),
            (inter, h, "down"),
            // the LM head, vocab_size 152,064 in both configs (decode rows only: prefill
            // computes the last position's logits)
            (h, 152_064, "lm_head"),
        ] {
            let prefill: &[usize] = if what == "lm_head" { &[] } else { prefill };
            let w = Tensor::<B, 2>::random([k, n], Distribution::Normal(0.0, 0.02), &dev);
            for &m in prefill.iter().chain(decode) {
                let x = Tensor::<B, 2>::random([m, k], Distribution::Normal(0.0, 1.0), &dev);
                let flops = 2.0 * (m * k * n) as f64;
                let reps = 10;
                let lib = B::prefill_gemm_name(&dev);
                let run = || B::prefill_linear(x.clone(), w.clone(), None);
                match run() {
                    Ok(_) => {
                        let us = time_us(3, reps, || {
                            let _ = run();
                        });
                        emit(format!(
                            "{{\"op\":\"{lib}\",\"model\":\"{name}\",\"proj\":\"{what}\",\"m\":{m},\"k\":{k},\"n\":{n},\"us\":{us:.2},\"tflops\":{:.2},\"weight_tbps\":{:.3}}}",
                            flops / us / 1e6,
                            (2 * k * n) as f64 / us / 1e6
                        ));
                    }
                    Err(e) => emit(
                        serde_json::json!({"op": lib, "m": m, "error": e.to_string()}).to_string(),
                    ),
                }
                if !no_burn {
                    let us = time_us(30, reps, || {
                        let _ = x.clone().matmul(w.clone());
                    });
                    emit(format!(
                        "{{\"op\":\"matmul\",\"model\":\"{name}\",\"proj\":\"{what}\",\"m\":{m},\"k\":{k},\"n\":{n},\"us\":{us:.2},\"tflops\":{:.2},\"weight_tbps\":{:.3}}}",
                        flops / us / 1e6,
                        (2 * k * n) as f64 / us / 1e6
                    ));
                }
                // our split-K skinny GEMMs on the same operands (decode / verify rows): the
                // tensor-core kernel and the ring kernel (up to MMA_MAX_ROWS rows) and the
                // CUDA-core one (up to SKINNY_MAX_ROWS)
                use dustin_kernels::cuda::SkinnyKernel;
                // the ring kernel in its current shape, then each of `ring_configs`
                let ring_default = config().ring;
                let mut runs: Vec<(SkinnyKernel, String, usize, Option<RingConfig>)> = vec![(
                    SkinnyKernel::Mma,
                    "skinny_mma".into(),
                    dustin_kernels::cuda::MMA_MAX_ROWS,
                    None,
                )];
                if ring_configs.is_empty() {
                    runs.push((
                        SkinnyKernel::Ring,
                        "skinny_ring".into(),
                        dustin_kernels::cuda::MMA_MAX_ROWS,
                        None,
                    ));
                }
                for &c in ring_configs {
                    runs.push((
                        SkinnyKernel::Ring,
                        format!("skinny_ring_{c}"),
                        dustin_kernels::cuda::MMA_MAX_ROWS,
                        Some(c),
                    ));
                }
                runs.push((
                    SkinnyKernel::Cores,
                    "skinny".into(),
                    dustin_kernels::SKINNY_MAX_ROWS,
                    None,
                ));
                // the tensor-core kernels again with the split reduction inside the GEMM's
                // launch (`_fused`), where the default runs a reduce kernel after it
                use dustin_kernels::cuda::SplitReduce;
                let split_default = config().split_reduce;
                let mut runs: Vec<_> = runs
                    .into_iter()
                    .map(|(kernel, label, max, ring)| (kernel, label, max, ring, split_default))
                    .collect();
                if split_default == SplitReduce::Kernel {
                    for (kernel, label) in [
                        (SkinnyKernel::Mma, "skinny_mma_fused"),
                        (SkinnyKernel::Ring, "skinny_ring_fused"),
                    ] {
                        let max = dustin_kernels::cuda::MMA_MAX_ROWS;
                        runs.push((kernel, label.into(), max, None, SplitReduce::Fused));
                    }
                }
                for (kernel, label, max, ring, split) in runs {
                    if m > max {
                        continue;
                    }
                    tweak(|c| c.skinny_kernel = kernel);
                    tweak(|c| c.ring = ring.unwrap_or(ring_default));
                    tweak(|c| c.split_reduce = split);
                    let run = || B::skinny_linear(x.clone(), w.clone(), None);
                    match run() {
                        Ok(_) => {
                            let us = time_us(5, reps, || {
                                let _ = run();
                            });
                            emit(format!(
                                "{{\"op\":\"{label}\",\"model\":\"{name}\",\"proj\":\"{what}\",\"m\":{m},\"k\":{k},\"n\":{n},\"us\":{us:.2},\"weight_tbps\":{:.3}}}",
                                (2 * k * n) as f64 / us / 1e6
                            ));
                        }
                        Err(e) => emit(
                            serde_json::json!({"op": label, "m": m, "error": e.to_string()})
                                .to_string(),
                        ),
                    }
                }
                tweak(|c| c.ring = ring_default);
                tweak(|c| c.skinny_kernel = dustin_kernels::cuda::SkinnyKernel::Auto);
                tweak(|c| c.split_reduce = split_default);
            }
        }
        // the products of one input as the model issues them at prefill rows
        // (`prefill_linear_many`: one pair of device waits) against the same products one
        // call each, in the same process: q+k+v (with Qwen2.5's q/k/v biases) and gate+up
        for (what, widths, bias) in [
            ("q+k+v", vec![qo, kvo, kvo], true),
            ("gate+up", vec![inter, inter], false),
        ] {
            let parts: Vec<(Tensor<B, 2>, Option<Tensor<B, 1>>)> = widths
                .iter()
                .map(|&n| {
                    let w = Tensor::<B, 2>::random([h, n], Distribution::Normal(0.0, 0.02), &dev);
                    let b = bias.then(|| {
                        Tensor::<B, 1>::random([n], Distribution::Normal(0.0, 0.02), &dev)
                    });
                    (w, b)
                })
                .collect();
            let n_sum: usize = widths.iter().sum();
            for &m in prefill {
                let x = Tensor::<B, 2>::random([m, h], Distribution::Normal(0.0, 1.0), &dev);
                let flops = 2.0 * (m * h * n_sum) as f64;
                let together = || B::prefill_linear_many(x.clone(), parts.clone());
                let apart = || -> dustin_kernels::Result<()> {
                    for (w, b) in &parts {
                        B::prefill_linear(x.clone(), w.clone(), b.clone())?;
                    }
                    Ok(())
                };
                match together().and_then(|_| apart()) {
                    Ok(()) => {
                        for (label, us) in [
                            ("cublas_many", time_us(3, 10, || {
                                let _ = together();
                            })),
                            ("cublas_each", time_us(3, 10, || {
                                let _ = apart();
                            })),
                        ] {
                            emit(format!(
                                "{{\"op\":\"{label}\",\"model\":\"{name}\",\"proj\":\"{what}\",\"m\":{m},\"k\":{h},\"n\":{n_sum},\"us\":{us:.2},\"tflops\":{:.2}}}",
                                flops / us / 1e6
                            ));
                        }
                    }
                    Err(e) => emit(
                        serde_json::json!({"op": "cublas_many", "model": name, "proj": what, "m": m, "error": e.to_string()})
                            .to_string(),
                    ),
                }
            }
        }
    }
    if !no_burn && !decode_only {
        prefill_attention(&mut emit, quick);
    }
}

/// Causal prefill attention at 4k, 16k, 32k tokens (28 heads, d 128: Qwen2.5-7B): ours in
/// chunks against the cache so far (4 KV heads): `flash_kernel` in chunks of
/// [`PREFILL_CHUNK`], 2048 and 4096; `prefill_kernel` with one K/V buffer (`x2-sync`), a
/// ring of two (`x2`) and K and V staged apart (`x2-kv`) in chunks of 2048 to the whole
/// prompt (the model's CUDA chunk is 16384), and `x2-kv` again with the grid in runs of 1
/// and 28 heads (`-run1`, `-run28`; the default is 7) and with eager rescaling (`-eager`)
/// in chunks of 512, 2048, 16384 and the whole prompt; the split kernel and (up to 16k) the
/// plain path in chunks of [`PREFILL_CHUNK`]; then Burn's attention op at 4k (K/V expanded to 28
/// heads: the op wants equal head counts). One JSON line a shape to `emit`; TFLOP/s count the causal
/// half, `2 * 2 * heads * d * n^2 / 2`.
fn prefill_attention(emit: &mut dyn FnMut(String), quick: bool) {
    let dev = dev();
    let (heads, d) = (28usize, 128usize);
    // the causal half of `2 * 2 * heads * d * n^2`
    let causal_flops = |n: usize| 2.0 * 2.0 * (heads * d) as f64 * (n as f64) * (n as f64) / 2.0;
    let sizes: &[usize] = if quick {
        &[16384]
    } else {
        &[4096, 16384, 32768]
    };
    for &n in sizes {
        let flops = causal_flops(n);
        // ours: the same causal prefill as the model runs it, chunks of PREFILL_CHUNK queries
        // against the cache so far, GQA (7B: 4 KV heads, nothing expanded), through
        // `prefill_attention` (the kernel) and, up to 16k, the plain path (Burn ops; about
        // 1.6 s a pass at 32k)
        // (label, chunk, plain path, kernel, flash tile buffers: 1 = no cp.async, flash
        // prefill warps, m-tiles a warp: 2 = prefill_kernel, 32 rows a warp, 3 = the same with
        // K and V staged apart by cp.async)
        let pc = PREFILL_CHUNK;
        let mut rows = vec![
            ("flash", pc, false, AttentionKernel::Flash, 2, 4, 1),
            ("flash-x2-kv", pc, false, AttentionKernel::Flash, 1, 4, 3),
            ("flash", 2048, false, AttentionKernel::Flash, 2, 4, 1),
            (
                "flash-x2-sync",
                2048,
                false,
                AttentionKernel::Flash,
                1,
                4,
                2,
            ),
            ("flash-x2-kv", 2048, false, AttentionKernel::Flash, 1, 4, 3),
            ("flash-x2", 2048, false, AttentionKernel::Flash, 2, 4, 2),
            ("flash", 4096, false, AttentionKernel::Flash, 2, 4, 1),
        ];
        // larger chunks (up to the whole prompt in one call, as SDPA's row takes it)
        for c in [4096, 8192, 16384, 32768] {
            if c <= n {
                rows.push(("flash-x2-sync", c, false, AttentionKernel::Flash, 1, 4, 2));
                rows.push(("flash-x2-kv", c, false, AttentionKernel::Flash, 1, 4, 3));
                rows.push(("flash-x2", c, false, AttentionKernel::Flash, 2, 4, 2));
            }
        }
        // head runs of prefill_kernel's grid (automatic: one KV head's query heads, 7 here;
        // 1 = row blocks along x; 28 = all heads) and rescaling wherever a maximum moves, K
        // and V staged apart (the automatic choice), at the model's chunkings
        for c in [512, 2048, 16384, 32768] {
            if c > n {
                continue;
            }
            for (run, path) in [(1, "flash-x2-kv-run1"), (28, "flash-x2-kv-run28")] {
                rows.push((path, c, false, AttentionKernel::Flash, 1, 4, 3 + run * RUN));
            }
            rows.push((
                "flash-x2-kv-eager",
                c,
                false,
                AttentionKernel::Flash,
                1,
                4,
                3 + EAGER,
            ));
        }
        rows.push(("split", pc, false, AttentionKernel::Split, 2, 4, 1));
        rows.push(("plain", pc, true, AttentionKernel::Auto, 2, 4, 1));
        for (path, chunk, plain, kern, bufs, warps, tiles) in rows {
            if plain && n > 16384 {
                continue;
            }
            set_prefill_variant(kern, bufs, warps, tiles);
            let r = prefill_chunks(n, chunk, heads, 4, d, plain);
            reset_prefill_variant();
            match r {
                Ok(us) => emit(format!(
                    "{{\"op\":\"prefill-attention-chunked\",\"path\":\"{path}\",\"heads\":{heads},\"kv_heads\":4,\"d\":{d},\"n\":{n},\"chunk\":{chunk},\"us\":{us:.1},\"tflops\":{:.2}}}",
                    flops / us / 1e6
                )),
                Err(e) => emit(
                    serde_json::json!({
                        "op": "prefill-attention-chunked",
                        "path": path,
                        "n": n,
                        "error": e.to_string(),
                    })
                    .to_string(),
                ),
            }
        }
    }
    // Burn's attention op last, at 4k only: its autotuning at 16k did not finish in 100 s on
    // the H200 (2026-11-30); ../shared/docs/GPU.md has 184 ms at 16k
    for &n in sizes.iter().filter(|&&n| n <= 4096) {
        let mk = || Tensor::<B, 4>::random([1, heads, n, d], Distribution::Normal(0.0, 1.0), &dev);
        let (q, k, v) = (mk(), mk(), mk());
        let opts = burn_tensor::ops::AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: true,
        };
        let run =
            || burn_tensor::module::attention(q.clone(), k.clone(), v.clone(), None, None, opts);
        for _ in 0..3 {
            let o = run();
            let _ = o.slice([0..1, 0..1, 0..1, 0..1]).into_data();
        }
        let reps = 3;
        let t = Instant::now();
        let mut o = run();
        for _ in 1..reps {
            o = run();
        }
        let _ = o.slice([0..1, 0..1, 0..1, 0..1]).into_data();
        let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
        let flops = causal_flops(n);
        emit(format!(
            "{{\"op\":\"attention-causal-prefill\",\"heads\":{heads},\"d\":{d},\"n\":{n},\"us\":{us:.1},\"tflops\":{:.2}}}",
            flops / us / 1e6
        ));
    }
}

/// Times this, added to a prefill variant's m-tile code (`tiles`, [`set_prefill_variant`]):
/// the query heads per run of `prefill_kernel`'s grid (`KernelConfig::prefill_head_run`; none
/// added: automatic).
const RUN: usize = 1000;

/// Added to a prefill variant's m-tile code: `prefill_kernel` rescales wherever a maximum
/// moves (`KernelConfig::prefill_lazy_rescale` false).
const EAGER: usize = 500;

/// Forces one causal-prefill variant: `kern`, `bufs` flash tile buffers (1: plain copies),
/// `warps` flash prefill warps, and `tiles` the m-tiles a warp (1 `flash_kernel`; 2
/// `prefill_kernel`; 3 the same with K and V staged apart; 32 `prefill_kernel` in 32-key
/// steps) plus a head run times [`RUN`] and / or [`EAGER`].
fn set_prefill_variant(kern: AttentionKernel, bufs: usize, warps: usize, tiles: usize) {
    let (run, eager, t) = (tiles / RUN, tiles % RUN >= EAGER, tiles % EAGER);
    tweak(|c| c.prefill_lazy_rescale = !eager);
    tweak(|c| c.prefill_kernel = kern);
    tweak(|c| c.flash_buffers = bufs);
    tweak(|c| c.prefill_warps = warps);
    tweak(|c| c.prefill_tiles = if t == 32 { 2 } else { t });
    tweak(|c| c.prefill_key_step = if t == 32 { 32 } else { 64 });
    tweak(|c| c.prefill_head_run = run);
}

/// Puts every causal-prefill setting back to its default.
fn reset_prefill_variant() {
    tweak(|c| c.prefill_kernel = AttentionKernel::Auto);
    tweak(|c| c.flash_buffers = dustin_kernels::cuda::FLASH_BUFFERS);
    tweak(|c| c.prefill_warps = dustin_kernels::cuda::PREFILL_WARPS);
    tweak(|c| c.prefill_tiles = dustin_kernels::cuda::PREFILL_TILES);
    tweak(|c| c.prefill_key_step = dustin_kernels::cuda::PREFILL_KEY_STEP);
    tweak(|c| c.prefill_head_run = 0);
    tweak(|c| c.prefill_lazy_rescale = dustin_kernels::cuda::PREFILL_LAZY_RESCALE);
}

/// Query tokens per prefill chunk of the first rows: the model's chunk where a hook wants
/// the probabilities, an offloaded model's and the CPU's (`DEFAULT_PREFILL_CHUNK`).
const PREFILL_CHUNK: usize = 512;

/// Microseconds of one causal prefill of `n` tokens, attention only, one layer: chunks of
/// `chunk` queries each attending to the cache before it and causally to itself,
/// the cache `[1, kv_heads, n, d]` filled beforehand (random). One warm-up pass, then the
/// mean of two, the device waited for at the end of each.
fn prefill_chunks(
    n: usize,
    chunk: usize,
    heads: usize,
    kvh: usize,
    d: usize,
    plain: bool,
) -> Result<f64, dustin_kernels::KernelError> {
    let dev = dev();
    let k = Tensor::<B, 4>::random([1, kvh, n, d], Distribution::Normal(0.0, 1.0), &dev);
    let v = Tensor::<B, 4>::random([1, kvh, n, d], Distribution::Normal(0.0, 1.0), &dev);
    let q = Tensor::<B, 4>::random([1, heads, chunk, d], Distribution::Normal(0.0, 1.0), &dev);
    let scale = 1.0 / (d as f32).sqrt();
    let pass = || -> Result<Tensor<B, 4>, dustin_kernels::KernelError> {
        let mut last = None;
        let mut start = 0;
        while start < n {
            let m = chunk.min(n - start);
            let qc = q.clone().slice([0..1, 0..heads, 0..m, 0..d]);
            // the keys up to the chunk's end, padded to 64 like the model's KV view
            let keys = (start + m).next_multiple_of(64).min(n);
            let (kc, vc) = (B::kv_prefix(k.clone(), keys), B::kv_prefix(v.clone(), keys));
            let o = if plain {
                dustin_kernels::plain::prefill_attention(qc, kc, vc, &[start], scale)?
            } else {
                B::prefill_attention(qc, kc, vc, &[start], scale)?
            };
            last = Some(o);
            start += m;
        }
        Ok(last.expect("n > 0"))
    };
    let wait = |o: Tensor<B, 4>| {
        let _ = o.slice([0..1, 0..1, 0..1, 0..1]).into_data();
    };
    wait(pass()?);
    let reps = 2;
    let t = Instant::now();
    for _ in 0..reps {
        wait(pass()?);
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / reps as f64)
}

/// One op at B=8, 32k context, 5 query tokens, for a GPU-time trace (`gpu_prefill.sh ktime`
/// runs it under Nsight Compute, which times every kernel alone): 2 warm-up calls, then 5
/// calls. `op`: `dense`, `sparse512`, `sparse1024`, `sparse2048` (+4 sinks +64 window, as in
/// `bench`) or `score` (two query heads over one KV head's keys); `model`: `7B` or `72B`
/// (their published attention shapes). Prints the host time per call as well.
fn ktime(op: &str, model: &str) -> Result<(), String> {
    let (hq, kvh) = match model {
        "7B" => (28usize, 4usize),
        "72B" => (64, 8),
        other => return Err(format!("--model: expected 7B or 72B, got {other:?}")),
    };
    let (b, ctx, n, d) = (8usize, 32768usize, 5usize, 128usize);
    let scale = 1.0 / (d as f32).sqrt();
    let q = Tensor::<B, 4>::random([b, hq, n, d], Distribution::Uniform(-1.0, 1.0), &dev());
    let k = Tensor::<B, 4>::random(
        [b, kvh, ctx + n, d],
        Distribution::Uniform(-1.0, 1.0),
        &dev(),
    );
    let v = Tensor::<B, 4>::random(
        [b, kvh, ctx + n, d],
        Distribution::Uniform(-1.0, 1.0),
        &dev(),
    );
    let lens = vec![ctx; b];
    let budget = match op {
        "dense" | "score" => 0,
        "sparse512" => 512,
        "sparse1024" => 1024,
        "sparse2048" => 2048,
        other => {
            return Err(format!(
                "--op: expected dense, sparse512, sparse1024, sparse2048 or score, got {other:?}"
            ))
        }
    };
    // only the sparse ops read a selection
    let (idx, counts) = if budget > 0 {
        selection(b, kvh, ctx, budget, budget as u64)
    } else {
        (Tensor::<B, 3, Int>::zeros([b, kvh, 1], &dev()), vec![0; b])
    };
    let heads = [0usize, 1];
    let call = || match op {
        "dense" => {
            let _ = B::verify_attention(q.clone(), k.clone(), v.clone(), &lens, scale);
        }
        "score" => {
            let _ = B::head_subset_scores(q.clone(), k.clone(), &lens, &heads, scale);
        }
        _ => {
            let _ = B::sparse_verify_attention(
                q.clone(),
                k.clone(),
                v.clone(),
                &lens,
                idx.clone(),
                &counts,
                scale,
            );
        }
    };
    let us = time_us(2, 5, call);
    println!("ktime {model} {op} B={b} ctx={ctx}: {us:.1} us per call from the host (5 calls)");
    Ok(())
}

/// Host time per launch (`launchcost`): streams of launches timed from the first to the
/// GPU's last completion, so a figure is the host's cost per launch unless the GPU is slower.
/// The draft's shapes (Qwen2.5-0.5B: hidden 896, 8 rows): the probe kernel with tensor
/// arguments (shapes and strides uploaded per launch) and with array arguments (none), Burn's
/// own add (an allocation and a tensor-argument kernel), and the q projection through
/// `KernelOps::skinny_linear` (2 launches and 2 allocations a call).
fn launch_cost(json: Option<&str>) {
    use dustin_kernels::cuda::{launch_probe, LaunchProbe};
    let dev = dev();
    let mut emit = emitter(json);
    let (m, h) = (8usize, 896usize);
    // flat: CUDA allocations of 2-d tensors are pitched (896 bf16 rows 1024 apart), and the
    // probe kernels index flat
    let a = Tensor::<B, 1>::random([m * h], Distribution::Normal(0.0, 1.0), &dev);
    let b = Tensor::<B, 1>::random([m * h], Distribution::Normal(0.0, 1.0), &dev);
    let o = Tensor::<B, 1>::zeros([m * h], &dev);
    let x = Tensor::<B, 2>::random([m, h], Distribution::Normal(0.0, 1.0), &dev);
    let w = Tensor::<B, 2>::random([h, h], Distribution::Normal(0.0, 0.02), &dev);
    let bias = Tensor::<B, 1>::random([h], Distribution::Normal(0.0, 0.02), &dev);
    let n = 20_000;
    for round in 0..2 {
        for probe in [LaunchProbe::Tensor, LaunchProbe::Array] {
            let us = time_us(1, 1, || {
                if let Err(e) = launch_probe(&a, &b, &o, probe, n) {
                    eprintln!("launch_probe: {e}");
                }
            });
            emit(format!(
                "{{\"op\":\"launch_probe\",\"args\":\"{probe:?}\",\"round\":{round},\"launches\":{n},\"us_per_launch\":{:.2}}}",
                us / n as f64
            ));
        }
        let us = time_us(200, n, || {
            let _ = a.clone() + b.clone();
        });
        emit(format!(
            "{{\"op\":\"burn_add\",\"round\":{round},\"launches\":{n},\"us_per_launch\":{us:.2}}}"
        ));
        let calls = n / 4;
        let us = time_us(200, calls, || {
            let _ = B::skinny_linear(x.clone(), w.clone(), Some(bias.clone()));
        });
        emit(format!(
            "{{\"op\":\"skinny_linear\",\"m\":{m},\"k\":{h},\"n\":{h},\"round\":{round},\"calls\":{calls},\"us_per_call\":{us:.2}}}"
        ));
    }
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    let quick = args.iter().any(|a| a == "--quick");
    let verify_kernel = match args
        .iter()
        .position(|a| a == "--verify-kernel")
        .map(|i| args.get(i + 1).map(String::as_str))
    {
        None | Some(Some("auto")) => AttentionKernel::Auto,
        Some(Some("flash")) => AttentionKernel::Flash,
        Some(Some("split")) => AttentionKernel::Split,
        Some(other) => {
            eprintln!("--verify-kernel: expected auto, flash or split, got {other:?}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match args
        .iter()
        .position(|a| a == "--flash-buffers")
        .map(|i| args.get(i + 1).and_then(|s| s.parse::<usize>().ok()))
    {
        None => {}
        Some(Some(n)) if (1..=3).contains(&n) => tweak(|c| c.flash_buffers = n),
        Some(other) => {
            eprintln!("--flash-buffers: expected 1, 2 or 3, got {other:?}");
            return std::process::ExitCode::FAILURE;
        }
    }
    for (flag, most, set) in [
        (
            "--score-buffers",
            3,
            (|c, n| c.score_buffers = n) as fn(&mut KernelConfig, usize),
        ),
        ("--sparse-waves", 8, |c, n| c.sparse_waves = n),
        ("--dense-waves", 16, |c, n| c.dense_waves = n),
    ] {
        match args
            .iter()
            .position(|a| a == flag)
            .map(|i| args.get(i + 1).and_then(|s| s.parse::<usize>().ok()))
        {
            None => {}
            Some(Some(n)) if (1..=most).contains(&n) => tweak(|c| set(c, n)),
            Some(other) => {
                eprintln!("{flag}: expected a number from 1 to {most}, got {other:?}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    // the ring kernel's block shape for every command; `gemm --ring-configs` times a list
    let ring_list = |flag: &str| -> Result<Vec<RingConfig>, String> {
        match args.iter().position(|a| a == flag) {
            None => Ok(Vec::new()),
            Some(i) => {
                let v = args
                    .get(i + 1)
                    .ok_or_else(|| format!("{flag}: expected COLSxKCxBUFS[,..], got nothing"))?;
                v.split(',')
                    .map(|c| RingConfig::parse(c).map_err(|e| format!("{flag}: {e}")))
                    .collect()
            }
        }
    };
    let (ring_one, ring_configs) = match (ring_list("--ring-config"), ring_list("--ring-configs")) {
        (Ok(one), Ok(many)) if one.len() <= 1 => (one, many),
        (Ok(_), Ok(_)) => {
            eprintln!("--ring-config: expected one COLSxKCxBUFS (--ring-configs takes a list)");
            return std::process::ExitCode::FAILURE;
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if let Some(&c) = ring_one.first() {
        tweak(|k| k.ring = c);
    }
    // where the skinny GEMMs sum their splits, for every command
    if let Some(i) = args.iter().position(|a| a == "--split-reduce") {
        use dustin_kernels::cuda::SplitReduce;
        match args.get(i + 1).map(String::as_str) {
            Some("fused") => tweak(|c| c.split_reduce = SplitReduce::Fused),
            Some("kernel") => tweak(|c| c.split_reduce = SplitReduce::Kernel),
            other => {
                eprintln!("--split-reduce: expected fused or kernel, got {other:?}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    let op = args
        .iter()
        .position(|a| a == "--op")
        .and_then(|i| args.get(i + 1))
        .map_or("all", String::as_str);
    let mut failures = 0;
    match args.get(1).map(String::as_str) {
        Some("check") => failures = check(op),
        Some("bench") => bench(json, quick, verify_kernel),
        Some("gemm") => gemm(
            json,
            quick,
            args.iter().any(|a| a == "--no-burn"),
            args.iter().any(|a| a == "--decode-only"),
            args.iter()
                .position(|a| a == "--model")
                .and_then(|i| args.get(i + 1))
                .map(String::as_str),
            &ring_configs,
        ),
        Some("prefill") => {
            let mut emit = emitter(json);
            prefill_attention(&mut emit, quick);
        }
        Some("launchcost") => launch_cost(json),
        Some("topk") => failures = topk_bench(json),
        Some("ktime") => {
            let model = args
                .iter()
                .position(|a| a == "--model")
                .and_then(|i| args.get(i + 1))
                .map_or("7B", String::as_str);
            if let Err(e) = ktime(op, model) {
                eprintln!("{e}");
                return std::process::ExitCode::from(2);
            }
        }
        Some("all") => {
            failures = check(op);
            bench(json, quick, verify_kernel);
        }
        _ => {
            eprintln!("usage: dustin-kernels-gpu check [--op dense|prefill|sparse|scores|quest|topk|elementwise|skinny|dustin] | bench [--quick] [--verify-kernel auto|flash|split] [--flash-buffers 1|2|3] [--json PATH] | gemm [--quick] [--no-burn] [--decode-only] [--model 7B|72B] [--ring-configs COLSxKCxBUFS,..] [--json PATH] | prefill [--quick] [--json PATH] | ktime --op dense|sparse512|sparse1024|sparse2048|score [--model 7B|72B] | launchcost [--json PATH] | topk [--json PATH] | all; any of them [--score-buffers 1|2|3] [--sparse-waves 1..8] [--dense-waves 1..16] [--ring-config COLSxKCxBUFS] [--split-reduce fused|kernel]");
            return std::process::ExitCode::from(2);
        }
    }
    if failures == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
