//! One case's checks of every op against the float64 references, and the top-k checks of
//! both kernels.

use burn_tensor::{Int, Tensor, TensorData};
use dustin_kernels::cuda::{self, AttentionKernel};
use dustin_kernels::prelude::*;
use dustin_kernels::reference::{self, Dims, Sel};
use dustin_kernels::{Keep, MAX_NEW};

use crate::check::{Case, Report};
use crate::prefill::{reset_prefill_variant, set_prefill_variant, EAGER, RUN};
use crate::{config, dev, to_f32, tweak, upload, B, BOUND};

pub(crate) fn check_case(c: &Case, seed: u64, op: &str, rep: &mut Report) {
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
        // every head (the draft's lookahead mass, `Qwen2::key_mass`): a slot's rows are a
        // whole group of query heads x the new tokens, several of the flash score mode's
        // 16-row blocks and one or more of the split kernel's 64-row blocks; and the
        // in-kernel probability sums (`score_mass`) for every head and for the subset
        let all: Vec<usize> = (0..c.q_heads).collect();
        let ra = reference::head_scores(&q, &k, &dims, &c.ctx, &all, scale);
        // (tag, kernel, summed in the kernel, 64-row blocks, heads, reference)
        let runs = [
            (" split", AttentionKernel::Split, false, false, &all, &ra),
            (" flash", AttentionKernel::Flash, false, false, &all, &ra),
            (
                " flash mass",
                AttentionKernel::Flash,
                true,
                false,
                &all,
                &ra,
            ),
            (
                " flash mass wide",
                AttentionKernel::Flash,
                true,
                true,
                &all,
                &ra,
            ),
            (
                " subset flash mass",
                AttentionKernel::Flash,
                true,
                false,
                &heads,
                &rs,
            ),
            (
                " subset flash mass wide",
                AttentionKernel::Flash,
                true,
                true,
                &heads,
                &rs,
            ),
        ];
        for (tag, kern, mass, wide, hs, r) in runs {
            tweak(|c| c.score_kernel = kern);
            tweak(|c| c.score_mass = mass.into());
            tweak(|c| c.score_wide = wide.into());
            let what = if hs.len() == all.len() {
                "all-head"
            } else {
                "head-subset"
            };
            match B::head_subset_scores(qt.clone(), kt.clone(), &c.ctx, hs, scale as f32) {
                Ok(s) => rep.add(
                    c.name,
                    &format!("{what} scores{tag}"),
                    reference::rel_err(&to_f32(s), r),
                    BOUND,
                ),
                Err(e) => rep.add(
                    c.name,
                    &format!("{what} scores{tag} error {e}"),
                    f64::INFINITY,
                    BOUND,
                ),
            }
        }
        tweak(|c| c.score_kernel = AttentionKernel::Auto);
        tweak(|c| c.score_mass = dustin_kernels::Switch::Auto);
        tweak(|c| c.score_wide = dustin_kernels::Switch::Auto);
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
pub(crate) fn topk_check(
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

/// One run of the top-k kernel
/// [`KernelConfig::topk_kernel`](dustin_kernels::KernelConfig::topk_kernel) of the device
/// against `want` (per row, the kept positions ascending).
#[allow(clippy::too_many_arguments)]
pub(crate) fn topk_check_one(
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
