//! `bench` and `topk`: timing helpers, the attention shapes' benchmark and the top-k kernels'.

use std::io::Write;
use std::time::Instant;

use burn_tensor::{backend::Backend, Distribution, Int, Tensor, TensorData};
use dustin_kernels::cuda::{self, AttentionKernel};
use dustin_kernels::prelude::*;
use dustin_kernels::reference;
use dustin_kernels::Keep;

use crate::check::Report;
use crate::op_checks::topk_check_one;
use crate::{config, dev, to_f32, tweak, upload, B};

/// Microseconds per call, averaged over `iters` after `warm` warm-up calls.
/// Prints each JSON line it is given, and appends it to `json` when given (a file that
/// cannot be created is skipped: the lines still print).
pub(crate) fn emitter(json: Option<&str>) -> impl FnMut(String) {
    let mut out = json.and_then(|p| std::fs::File::create(p).ok());
    move |v: String| {
        println!("{v}");
        if let Some(f) = out.as_mut() {
            let _ = writeln!(f, "{v}");
        }
    }
}

pub(crate) fn time_us(warm: usize, iters: usize, mut f: impl FnMut()) -> f64 {
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

/// `topk`: GPU time of [`SelectionOps::top_k_positions`] at the selectors' shapes (4 sinks, 64
/// window, budget 1024 + 68), each row also checked against the float64-ordered
/// [`reference::top_k`]. Two score distributions: uniform in [0, 1), and clustered like the
/// normalised attention mass the selectors rank (`exp(2 u)` over the row's sum, `u` uniform
/// in [-1, 1): every value within a few binary exponents of `1 / ctx`). Rows `batch x kv_heads`: the 7B
/// target's layer at B 1, 8, 16; 28 such layers stacked (one call for a whole verification);
/// the 0.5B draft's 24 layers stacked; 72B at B 16. bf16 scores, and f32 for one shape.
pub(crate) fn topk_bench(json: Option<&str>) -> usize {
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

pub(crate) fn selection(
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

pub(crate) fn bench(json: Option<&str>, quick: bool, kern: AttentionKernel) {
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
