//! The CPU path (`burn_flex::Flex`, f32) against the float64 references, on random inputs
//! (bf16-rounded, never zero) with ragged contexts, group sizes 5 and 7, n_new 1 / 5 / 16,
//! NaN in the stale cache slots. f32 path: bound 1e-4 (normwise relative).

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Int, Tensor, TensorData};
use dustin_kernels::prelude::*;
use dustin_kernels::reference::{self, Dims, Sel};
use dustin_kernels::{Keep, KernelError};

const BOUND: f64 = 1e-4;

fn dev() -> FlexDevice {
    FlexDevice
}

fn host<const D: usize>(t: Tensor<Flex, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 data")
}

struct Inputs {
    dims: Dims,
    ctx: Vec<usize>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Inputs {
    fn new(
        batch: usize,
        q_heads: usize,
        kv_heads: usize,
        n: usize,
        d: usize,
        ctx: &[usize],
        seed: u64,
    ) -> Self {
        let cap = ctx.iter().max().copied().unwrap_or(0) + n + 3;
        let dims = Dims {
            batch,
            q_heads,
            kv_heads,
            n_new: n,
            head_dim: d,
            capacity: cap,
        };
        let q = reference::random_bf16(batch * q_heads * n * d, 2.0, seed);
        let mut k = reference::random_bf16(batch * kv_heads * cap * d, 2.0, seed + 1);
        let mut v = reference::random_bf16(batch * kv_heads * cap * d, 1.0, seed + 2);
        for (b, &cb) in ctx.iter().enumerate().take(batch) {
            for h in 0..kv_heads {
                for p in cb + n..cap {
                    let o = ((b * kv_heads + h) * cap + p) * d;
                    k[o..o + d].fill(f32::NAN);
                    v[o..o + d].fill(f32::NAN);
                }
            }
        }
        Self {
            dims,
            ctx: ctx.to_vec(),
            q,
            k,
            v,
        }
    }

    fn tensors(&self) -> (Tensor<Flex, 4>, Tensor<Flex, 4>, Tensor<Flex, 4>) {
        let d = &self.dims;
        let q = Tensor::from_data(
            TensorData::new(self.q.clone(), [d.batch, d.q_heads, d.n_new, d.head_dim]),
            &dev(),
        );
        let k = Tensor::from_data(
            TensorData::new(
                self.k.clone(),
                [d.batch, d.kv_heads, d.capacity, d.head_dim],
            ),
            &dev(),
        );
        let v = Tensor::from_data(
            TensorData::new(
                self.v.clone(),
                [d.batch, d.kv_heads, d.capacity, d.head_dim],
            ),
            &dev(),
        );
        (q, k, v)
    }

    fn scale(&self) -> f64 {
        1.0 / (self.dims.head_dim as f64).sqrt()
    }
}

fn cases() -> Vec<Inputs> {
    vec![
        Inputs::new(3, 14, 2, 1, 16, &[40, 7, 65], 1),
        Inputs::new(2, 10, 2, 5, 32, &[33, 0], 2),
        Inputs::new(2, 7, 1, 16, 8, &[20, 51], 3),
        // contexts over several of the CPU kernel's chunks of 512 keys
        Inputs::new(2, 12, 2, 5, 64, &[1100, 530], 4),
    ]
}

#[test]
fn dense_reads_a_strided_cache_view() {
    // the model passes a prefix of the whole cache (a view whose head stride is the
    // capacity's), as KernelOps::kv_prefix cuts it
    let c = Inputs::new(2, 12, 2, 5, 128, &[700, 90], 5);
    let (q, k, v) = c.tensors();
    let keys = 700 + 5;
    let (k, v) = (k.narrow(2, 0, keys), v.narrow(2, 0, keys));
    let out = Flex::verify_attention(q, k, v, &c.ctx, c.scale() as f32).expect("dense");
    let r = reference::attention(&c.q, &c.k, &c.v, &c.dims, &c.ctx, c.scale(), None);
    let e = reference::rel_err(&host(out), &r);
    assert!(e < BOUND, "strided view: rel err {e}");
}

#[test]
fn a_verified_row_has_the_bits_of_the_same_row_decoded_alone() {
    // speculative decoding's greedy output equals autoregressive decoding's only if a
    // token's attention does not depend on how many tokens are verified with it
    let (n, ctx) = (5, 1030);
    let c = Inputs::new(1, 14, 2, n, 64, &[ctx], 6);
    let (q, k, v) = c.tensors();
    let all =
        host(Flex::verify_attention(q.clone(), k.clone(), v.clone(), &c.ctx, 0.125).expect("rows"));
    let d = c.dims.head_dim;
    for i in 0..n {
        let qi = q.clone().narrow(2, i, 1);
        let one =
            host(Flex::verify_attention(qi, k.clone(), v.clone(), &[ctx + i], 0.125).expect("row"));
        for h in 0..c.dims.q_heads {
            let want = &all[(h * n + i) * d..][..d];
            let got = &one[h * d..][..d];
            let same = want
                .iter()
                .zip(got)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "row {i} head {h}: {:?} vs {:?}",
                &want[..4],
                &got[..4]
            );
        }
    }
}

#[test]
fn dense_matches_f64_reference() {
    for c in cases() {
        let (q, k, v) = c.tensors();
        let out = Flex::verify_attention(q, k, v, &c.ctx, c.scale() as f32).expect("dense");
        let r = reference::attention(&c.q, &c.k, &c.v, &c.dims, &c.ctx, c.scale(), None);
        let e = reference::rel_err(&host(out), &r);
        assert!(e < BOUND, "dense {:?}: rel err {e}", c.dims);
    }
}

#[test]
fn sparse_matches_f64_reference_budget_below_and_above_context() {
    for (i, c) in cases().into_iter().enumerate() {
        let cmax = c.ctx.iter().max().copied().unwrap_or(0);
        for budget in [cmax / 3 + 1, cmax + 9] {
            let (mut idx, counts) = reference::random_selection(
                c.dims.batch,
                c.dims.kv_heads,
                budget,
                &c.ctx,
                10 + i as u64,
            );
            // an out-of-range entry inside the counted part is skipped by both sides
            if counts[0] > 1 {
                idx[0] = (c.ctx[0] + 2) as i64;
            }
            let (q, k, v) = c.tensors();
            let it = Tensor::<Flex, 3, Int>::from_data(
                TensorData::new(idx.clone(), [c.dims.batch, c.dims.kv_heads, budget]),
                &dev(),
            );
            let out = Flex::sparse_verify_attention(q, k, v, &c.ctx, it, &counts, c.scale() as f32)
                .expect("sparse");
            let sel = Sel {
                indices: &idx,
                budget,
                counts: &counts,
            };
            let r = reference::attention(&c.q, &c.k, &c.v, &c.dims, &c.ctx, c.scale(), Some(sel));
            let e = reference::rel_err(&host(out), &r);
            assert!(
                e < BOUND,
                "sparse budget {budget} {:?}: rel err {e}",
                c.dims
            );
        }
    }
}

#[test]
fn sparse_with_everything_selected_equals_dense() {
    let c = Inputs::new(2, 14, 2, 5, 16, &[30, 12], 7);
    let budget = 30;
    let mut idx = vec![0i64; 2 * 2 * budget];
    for b in 0..2 {
        for h in 0..2 {
            for s in 0..c.ctx[b] {
                idx[(b * 2 + h) * budget + s] = s as i64;
            }
        }
    }
    let (q, k, v) = c.tensors();
    let it = Tensor::<Flex, 3, Int>::from_data(TensorData::new(idx, [2, 2, budget]), &dev());
    let out = Flex::sparse_verify_attention(q, k, v, &c.ctx, it, &c.ctx, c.scale() as f32)
        .expect("sparse");
    let r = reference::attention(&c.q, &c.k, &c.v, &c.dims, &c.ctx, c.scale(), None);
    assert!(reference::rel_err(&host(out), &r) < BOUND);
}

#[test]
fn head_subset_scores_match_f64_reference() {
    for c in cases() {
        let g = c.dims.q_heads / c.dims.kv_heads;
        let mut heads = vec![1 % g, c.dims.q_heads - 1];
        heads.dedup();
        let (q, k, _) = c.tensors();
        let out = Flex::head_subset_scores(q, k, &c.ctx, &heads, c.scale() as f32).expect("scores");
        let r = reference::head_scores(&c.q, &c.k, &c.dims, &c.ctx, &heads, c.scale());
        let e = reference::rel_err(&host(out), &r);
        assert!(e < BOUND, "scores {:?}: rel err {e}", c.dims);
        // each chosen head's row of probabilities sums to 1 per query: n_new per head
        let total: f64 = r.iter().sum();
        assert!((total - (heads.len() * c.dims.n_new * c.dims.batch) as f64).abs() < 1e-9);
    }
}

#[test]
fn head_subset_row_scores_match_f64_reference() {
    for c in cases() {
        let g = c.dims.q_heads / c.dims.kv_heads;
        let mut heads = vec![c.dims.q_heads - 1, 1 % g];
        heads.dedup();
        let (q, k, _) = c.tensors();
        let out = Flex::head_subset_row_scores(q, k, &c.ctx, &heads, c.scale() as f32)
            .expect("row scores");
        let r = reference::head_row_scores(&c.q, &c.k, &c.dims, &c.ctx, &heads, c.scale());
        let e = reference::rel_err(&host(out), &r);
        assert!(e < BOUND, "row scores {:?}: rel err {e}", c.dims);
        // every (sequence, chosen head, row) distributes probability 1
        let total: f64 = r.iter().sum();
        assert!((total - (heads.len() * c.dims.n_new * c.dims.batch) as f64).abs() < 1e-9);
    }
}

#[test]
fn head_subset_scores_read_a_strided_view_at_any_head_width() {
    // a prefix of the cache (the view the model passes, its head stride the capacity's) and
    // head widths no vector path divides (12) or only AVX2's does (24)
    for d in [12, 24, 128] {
        let c = Inputs::new(2, 12, 2, 3, d, &[600, 41], 9);
        let keys = 600 + 3;
        let heads = [0, 5, 7];
        let (q, k, _) = c.tensors();
        let k = k.narrow(2, 0, keys);
        let cap = c.dims.capacity;
        let r = reference::head_scores(&c.q, &c.k, &c.dims, &c.ctx, &heads, c.scale());
        let rows = reference::head_row_scores(&c.q, &c.k, &c.dims, &c.ctx, &heads, c.scale());
        // the reference is as wide as the whole cache: its first `keys` positions per row
        let cut =
            |v: &[f64]| -> Vec<f64> { v.chunks(cap).flat_map(|r| r[..keys].to_vec()).collect() };
        let out = Flex::head_subset_scores(q.clone(), k.clone(), &c.ctx, &heads, c.scale() as f32)
            .expect("scores");
        assert_eq!(out.dims(), [2, 2, keys]);
        let e = reference::rel_err(&host(out), &cut(&r));
        assert!(e < BOUND, "scores, head width {d}: rel err {e}");
        let out = Flex::head_subset_row_scores(q, k, &c.ctx, &heads, c.scale() as f32)
            .expect("row scores");
        assert_eq!(out.dims(), [2, 2, 3, keys]);
        let e = reference::rel_err(&host(out), &cut(&rows));
        assert!(e < BOUND, "row scores, head width {d}: rel err {e}");
    }
}

/// Quest's page bounds (the plain path) and page scores: the CPU's host kernel, also over
/// bounds that are a view of a wider buffer (as the estimator passes them), and the plain
/// path's matrix products, against float64 loops. The extra cases reach the scalar loop
/// (head width 12) and the model's head width (128, group 6).
#[test]
fn quest_bounds_and_scores_match_f64_reference() {
    let mut all = cases();
    all.push(Inputs::new(2, 6, 2, 3, 12, &[45, 29], 7));
    all.push(Inputs::new(1, 12, 2, 5, 128, &[301], 8));
    for c in all {
        let page = 4;
        let cmax = c.ctx.iter().max().copied().unwrap_or(0);
        let pages = cmax.div_ceil(page).max(1);
        let (q, k, _) = c.tensors();
        let (mn, mx) = Flex::quest_page_bounds(k, &c.ctx, page).expect("bounds");
        let (rmn, rmx) = reference::page_bounds(&c.k, &c.dims, &c.ctx, page, pages);
        assert_eq!(reference::rel_err(&host(mn.clone()), &rmn), 0.0);
        assert_eq!(reference::rel_err(&host(mx.clone()), &rmx), 0.0);
        let r = reference::page_scores(&c.q, &rmn, &rmx, &c.dims, &c.ctx, page, pages);
        // bounds in a buffer 3 pages wider, its first `pages` pages passed as a view
        let wide = |t: Tensor<Flex, 4>| {
            let [b, h, _, d] = t.dims();
            let filler = Tensor::<Flex, 4>::full([b, h, 3, d], 1e6, &dev());
            Tensor::cat(vec![t, filler], 2).narrow(2, 0, pages)
        };
        let runs = [
            (
                "host kernel",
                Flex::quest_page_scores(q.clone(), mn.clone(), mx.clone(), &c.ctx, page),
            ),
            (
                "host kernel, views",
                Flex::quest_page_scores(
                    q.clone(),
                    wide(mn.clone()),
                    wide(mx.clone()),
                    &c.ctx,
                    page,
                ),
            ),
            (
                "plain path",
                dustin_kernels::plain::quest_page_scores(q.clone(), mn, mx, &c.ctx, page),
            ),
        ];
        for (what, s) in runs {
            let got = host(s.expect("scores"));
            assert_eq!(got.len(), r.len(), "{what} {:?}", c.dims);
            let e = reference::rel_err(&got, &r);
            assert!(e < BOUND, "quest {what} {:?}: rel err {e}", c.dims);
        }
    }
}

#[test]
fn top_k_hand_worked_example() {
    // one row, ctx 10: sinks {0}, window {8, 9}, budget 5 -> two free picks among 1..8;
    // scores 0.5 at 3 and 6 (tie -> lower first), 0.9 at 5, NaN at 2 (lowest)
    let s = vec![0.0, 0.1, f32::NAN, 0.5, 0.2, 0.9, 0.5, 0.3, 0.0, 0.0, 7.0];
    let t = Tensor::<Flex, 3>::from_data(TensorData::new(s, [1, 1, 11]), &dev());
    let keep = Keep {
        budget: 5,
        n_sink: 1,
        window: 2,
    };
    let p = Flex::top_k_positions(t, &[10], keep).expect("top-k");
    assert_eq!(p.counts, vec![5]);
    let got = p
        .indices
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .expect("ints");
    assert_eq!(got, vec![0, 3, 5, 8, 9]);
}

#[test]
fn top_k_matches_the_reference_on_ties_nan_and_infinities() {
    // scores on a coarse grid (many ties), some NaN and infinite; ragged contexts around the
    // budget, one shorter than the sinks and the window together
    let (b, h) = (4, 3);
    let ctx = [300, 97, 5, 160];
    let c = 310;
    let raw = reference::random_bf16(b * h * c, 4.0, 77);
    let scores: Vec<f32> = raw
        .iter()
        .enumerate()
        .map(|(i, &x)| match i % 41 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => -0.0,
            _ => (x * 2.0).round() / 2.0,
        })
        .collect();
    for keep in [
        Keep {
            budget: 100,
            n_sink: 4,
            window: 16,
        },
        Keep {
            budget: 20,
            n_sink: 4,
            window: 16,
        },
        Keep {
            budget: 400,
            n_sink: 1,
            window: 8,
        },
    ] {
        let t = Tensor::<Flex, 3>::from_data(TensorData::new(scores.clone(), [b, h, c]), &dev());
        let p = Flex::top_k_positions(t, &ctx, keep).expect("top-k");
        let kk = keep.budget.min(300);
        assert_eq!(p.indices.dims(), [b, h, kk]);
        let got: Vec<i64> = p
            .indices
            .into_data()
            .convert::<i64>()
            .to_vec()
            .expect("ints");
        let want = reference::top_k(&scores, b, h, c, &ctx, keep);
        for (r, row) in want.iter().enumerate() {
            assert_eq!(p.counts[r / h], row.len(), "row {r}");
            let g: Vec<usize> = got[r * kk..r * kk + row.len()]
                .iter()
                .map(|&x| x as usize)
                .collect();
            assert_eq!(&g, row, "row {r}, {keep:?}");
            assert!(got[r * kk + row.len()..(r + 1) * kk]
                .iter()
                .all(|&x| x == 0));
        }
    }
}

#[test]
fn top_k_pads_short_rows_with_zero() {
    let s = vec![0.3f32, 0.1, 0.2, 0.9, 0.8, 0.7, 0.6, 0.5];
    let t = Tensor::<Flex, 3>::from_data(TensorData::new(s, [2, 1, 4]), &dev());
    let keep = Keep {
        budget: 3,
        n_sink: 0,
        window: 0,
    };
    let p = Flex::top_k_positions(t, &[4, 2], keep).expect("top-k");
    assert_eq!(p.counts, vec![3, 2]);
    let got = p
        .indices
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .expect("ints");
    assert_eq!(got, vec![0, 2, 3, 0, 1, 0]);
}

#[test]
fn prefill_attention_matches_f64_reference_past_the_verify_limit() {
    // prefill chunks longer than MAX_NEW: the first chunk of a prompt (ctx 0) next to a
    // later one, and a chunk that is its sequence's whole prompt
    // from `cpu_prefill::MIN_NEW` new tokens on, the tiles: the 1.5B's heads (12 / 2 x 128,
    // AVX-512 where present) over ragged contexts with a last block of 4 tokens, the 0.5B's
    // (14 / 2 x 64) with blocks of 14 tokens, one head per KV head at width 32 (AVX2), and a
    // width the tiles do not take (16: the chunked kernel)
    for c in [
        Inputs::new(2, 14, 2, 40, 16, &[0, 23], 11),
        Inputs::new(1, 6, 3, 70, 8, &[130], 12),
        Inputs::new(2, 12, 2, 100, 128, &[0, 37], 13),
        Inputs::new(1, 14, 2, 130, 64, &[200], 14),
        Inputs::new(1, 4, 4, 64, 32, &[5], 15),
        Inputs::new(2, 8, 2, 70, 16, &[3, 90], 16),
        // three ragged sequences at width 96 (AVX2 tiles where AVX-512 needs 64), one head a
        // KV head with a last block of 1 token, and a width of 80 (the chunked kernel)
        Inputs::new(3, 8, 2, 64, 96, &[0, 5, 300], 17),
        Inputs::new(1, 5, 5, 97, 64, &[10], 18),
        Inputs::new(1, 2, 1, 64, 80, &[7], 19),
    ] {
        let (q, k, v) = c.tensors();
        let out = Flex::prefill_attention(q, k, v, &c.ctx, c.scale() as f32).expect("prefill");
        let r = reference::attention(&c.q, &c.k, &c.v, &c.dims, &c.ctx, c.scale(), None);
        let e = reference::rel_err(&host(out), &r);
        assert!(e < BOUND, "prefill {:?}: rel err {e}", c.dims);
    }
    // more new tokens than a prefill call takes
    let n = dustin_kernels::MAX_PREFILL_NEW + 1;
    let q = Tensor::<Flex, 4>::zeros([1, 2, n, 8], &dev());
    let k = Tensor::<Flex, 4>::zeros([1, 1, n, 8], &dev());
    assert!(matches!(
        Flex::prefill_attention(q, k.clone(), k, &[0], 1.0),
        Err(KernelError::InvalidInput { name: "n_new", .. })
    ));
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let c = Inputs::new(1, 4, 2, 2, 8, &[5], 9);
    let (q, k, v) = c.tensors();
    // 17 new tokens
    let q17 = Tensor::<Flex, 4>::zeros([1, 4, 17, 8], &dev()) + 1.0;
    assert!(matches!(
        Flex::verify_attention(q17, k.clone(), v.clone(), &[5], 1.0),
        Err(KernelError::InvalidInput { name: "n_new", .. })
    ));
    // context past the capacity
    assert!(matches!(
        Flex::verify_attention(q.clone(), k.clone(), v.clone(), &[1000], 1.0),
        Err(KernelError::InvalidInput {
            name: "ctx_lens",
            ..
        })
    ));
    // heads not a multiple of kv heads
    let q3 = Tensor::<Flex, 4>::zeros([1, 3, 2, 8], &dev()) + 1.0;
    assert!(Flex::verify_attention(q3, k.clone(), v.clone(), &[5], 1.0).is_err());
    // budget 0 and budget under sinks + window
    let s = Tensor::<Flex, 3>::zeros([1, 2, 5], &dev()) + 1.0;
    let keep = Keep {
        budget: 0,
        n_sink: 0,
        window: 0,
    };
    assert!(matches!(
        Flex::top_k_positions(s.clone(), &[5], keep),
        Err(KernelError::InvalidInput { name: "budget", .. })
    ));
    let keep = Keep {
        budget: 3,
        n_sink: 2,
        window: 2,
    };
    assert!(Flex::top_k_positions(s.clone(), &[5], keep).is_err());
    // sinks and window whose sum passes usize::MAX: refused, the message giving the exact sum
    let keep = Keep {
        budget: 3,
        n_sink: usize::MAX,
        window: 2,
    };
    match Flex::top_k_positions(s, &[5], keep) {
        Err(KernelError::InvalidInput { name, expected, .. }) => {
            assert_eq!(name, "budget");
            assert!(expected.ends_with("= 18446744073709551617"), "{expected}");
        }
        other => panic!("expected an invalid budget, got {other:?}"),
    }
    // counts over the budget, repeated heads, page size 0
    let it = Tensor::<Flex, 3, Int>::zeros([1, 2, 3], &dev());
    assert!(matches!(
        Flex::sparse_verify_attention(q.clone(), k.clone(), v, &[5], it, &[4], 1.0),
        Err(KernelError::InvalidInput { name: "counts", .. })
    ));
    // cache writes: a start with no room for the new rows, a missing start, another width
    let cache = Tensor::<Flex, 4>::zeros([2, 2, 10, 8], &dev());
    let rows = Tensor::<Flex, 4>::zeros([2, 2, 3, 8], &dev());
    assert!(matches!(
        Flex::kv_write(cache.clone(), rows.clone(), &[0, 8]),
        Err(KernelError::InvalidInput { name: "starts", .. })
    ));
    assert!(matches!(
        Flex::kv_write(cache.clone(), rows, &[0]),
        Err(KernelError::InvalidInput { name: "starts", .. })
    ));
    assert!(matches!(
        Flex::kv_write(
            cache,
            Tensor::<Flex, 4>::zeros([2, 2, 3, 4], &dev()),
            &[0, 1]
        ),
        Err(KernelError::Shape { name: "src", .. })
    ));
    assert!(Flex::head_subset_scores(q, k.clone(), &[5], &[1, 1], 1.0).is_err());
    // Quest's page scores (the host kernel): bounds of another shape, too few pages for the
    // context, page size 0, a query group that does not divide
    let (q, _, _) = c.tensors();
    let b4 = |pages: usize, d: usize| Tensor::<Flex, 4>::zeros([1, 2, pages, d], &dev());
    let qd = q.dims()[3];
    assert!(matches!(
        Flex::quest_page_scores(q.clone(), b4(3, qd), b4(4, qd), &[5], 2),
        Err(KernelError::Shape {
            name: "kmin/kmax",
            ..
        })
    ));
    assert!(matches!(
        Flex::quest_page_scores(q.clone(), b4(2, qd), b4(2, qd), &[5], 2),
        Err(KernelError::InvalidInput { name: "kmin", .. })
    ));
    assert!(matches!(
        Flex::quest_page_scores(q.clone(), b4(3, qd), b4(3, qd), &[5], 0),
        Err(KernelError::InvalidInput {
            name: "page_size",
            ..
        })
    ));
    let odd = Tensor::<Flex, 4>::zeros([1, 3, 3, qd], &dev());
    assert!(matches!(
        Flex::quest_page_scores(q, odd.clone(), odd, &[5], 2),
        Err(KernelError::InvalidInput { name: "q", .. })
    ));
    assert!(Flex::quest_page_bounds(k, &[5], 0).is_err());
}

/// RMSNorm (alone and after a residual add), the SwiGLU product, RoPE (strided input, ragged large positions) and packed
/// dequantization (4 and 3 bits, a short last group), the skinny GEMM (15 shapes, 1 to 128
/// rows, with and without bias) and its grouped forms (three weights of one `x`: 15 rows, two of
/// the five cases split over `k` with biases on some weights; SwiGLU: 5),
/// the prefill GEMM (4 rows, a transposed weight view among them) and three products of one
/// `x` together (3 rows: `prefill_linear_many`), the cache writes (2 rows
/// of `kv_write`, 4 of `kv_write_pair`), RoPE with the cache write (8 rows of
/// `rope_kv_write`), the `dustin` fold and mix (2 rows each) of the plain
/// path against float64 loops; f32, so within 1e-5.
#[test]
fn elementwise_ops_match_float64() {
    let rows = dustin_kernels::check::check_elementwise::<Flex>(&dev(), 1e-5);
    assert_eq!(rows.len(), 82, "{rows:?}");
    assert_eq!(
        rows.iter()
            .filter(|r| r.op.starts_with("rope_kv_write"))
            .count(),
        8
    );
    assert_eq!(rows.iter().filter(|r| r.op == "prefill_gemm").count(), 4);
    assert_eq!(
        rows.iter().filter(|r| r.op == "prefill_gemm_many").count(),
        3
    );
    assert_eq!(rows.iter().filter(|r| r.op == "skinny3").count(), 15);
    assert_eq!(rows.iter().filter(|r| r.op == "swiglu").count(), 5);
    // 15 skinny shapes: 1 to 128 rows, the ring kernel's 80-128-row cases included
    assert_eq!(rows.iter().filter(|r| r.op == "skinny").count(), 15);
    for op in [
        "skinny3",
        "swiglu",
        "add_rms_norm",
        "add_rms_norm sum",
        "kv_write",
        "kv_write_pair k",
        "kv_write_pair v",
        "rope_kv_write q",
        "rope_kv_write k cache",
        "rope_kv_write v cache",
        "fold_rows",
        "mix_scores",
    ] {
        assert!(rows.iter().any(|r| r.op == op), "no {op} rows");
    }
    for r in &rows {
        eprintln!("{r}");
        assert!(r.ok(), "{r}");
        // a bf16 scale times a code of at most 8 bits, plus a bf16 min, is exact in f32, so
        // is the sum of two bf16 values, and a cache write is a copy
        if ![
            "dequant",
            "add_rms_norm sum",
            "kv_write",
            "kv_write_pair k",
            "kv_write_pair v",
            "rope_kv_write v cache",
        ]
        .contains(&r.op)
        {
            assert!(r.err > 0.0, "f32 rounding leaves some error: {r}");
        }
    }
}

#[test]
fn elementwise_ops_name_bad_shapes() {
    let x = Tensor::<Flex, 3>::ones([2, 3, 8], &dev());
    let err = Flex::rms_norm(x.clone(), Tensor::ones([7], &dev()), 1e-6).unwrap_err();
    assert!(
        matches!(err, KernelError::Shape { name: "weight", .. }),
        "{err}"
    );
    let err = Flex::silu_mul(x.clone(), Tensor::ones([2, 3, 9], &dev())).unwrap_err();
    assert!(
        matches!(err, KernelError::Shape { name: "up", .. }),
        "{err}"
    );
    let odd = Tensor::<Flex, 4>::ones([1, 2, 3, 5], &dev());
    let t = Tensor::<Flex, 4>::ones([1, 1, 3, 5], &dev());
    let err = Flex::rope(odd, t.clone(), t).unwrap_err();
    assert!(err.to_string().contains("even head_dim"), "{err}");
    let x4 = Tensor::<Flex, 4>::ones([1, 2, 3, 4], &dev());
    let err = Flex::rope(
        x4,
        Tensor::ones([1, 1, 2, 4], &dev()),
        Tensor::ones([1, 1, 3, 4], &dev()),
    )
    .unwrap_err();
    assert!(
        matches!(err, KernelError::Shape { name: "cos", .. }),
        "{err}"
    );
    // the cache-write pair: values of another length than the keys, a value cache of another
    // shape, a start past the capacity
    let cache = || Tensor::<Flex, 4>::zeros([2, 1, 8, 4], &dev());
    let rows = |n: usize| Tensor::<Flex, 4>::ones([2, 1, n, 4], &dev());
    let err = Flex::kv_write_pair(cache(), cache(), rows(2), rows(3), &[0, 0]).unwrap_err();
    assert!(
        matches!(err, KernelError::Shape { name: "v_src", .. }),
        "{err}"
    );
    let small = Tensor::<Flex, 4>::zeros([2, 1, 6, 4], &dev());
    let err = Flex::kv_write_pair(cache(), small, rows(2), rows(2), &[0, 0]).unwrap_err();
    assert!(
        matches!(err, KernelError::Shape { name: "v_dst", .. }),
        "{err}"
    );
    let err = Flex::kv_write_pair(cache(), cache(), rows(2), rows(2), &[0, 7]).unwrap_err();
    assert!(
        matches!(err, KernelError::InvalidInput { name: "starts", .. }),
        "{err}"
    );
    // RoPE with the cache write: keys of another length than the queries, a cos table of
    // another length, a start past the capacity
    let q = || Tensor::<Flex, 4>::ones([2, 3, 2, 4], &dev());
    let table = |n: usize| Tensor::<Flex, 4>::ones([2, 1, n, 4], &dev());
    let rkw = |k, cos, starts: &[usize]| {
        Flex::rope_kv_write(q(), k, rows(2), cos, table(2), cache(), cache(), starts).unwrap_err()
    };
    let err = rkw(rows(3), table(2), &[0, 0]);
    assert!(matches!(err, KernelError::Shape { name: "k", .. }), "{err}");
    let err = rkw(rows(2), table(3), &[0, 0]);
    assert!(
        matches!(err, KernelError::Shape { name: "cos", .. }),
        "{err}"
    );
    for starts in [[0, 7], [0, usize::MAX]] {
        let err = rkw(rows(2), table(2), &starts);
        assert!(
            matches!(err, KernelError::InvalidInput { name: "starts", .. }),
            "{err}"
        );
    }
}

#[test]
fn packed_layouts_the_words_do_not_cover_are_named() {
    let words = Tensor::<Flex, 3, Int>::zeros([2, 8, 5], &dev());
    let sm = || Tensor::<Flex, 3>::ones([2, 1, 5], &dev());
    let run = |bits, group, rows| {
        Flex::dequantize_packed(words.clone(), sm(), sm(), bits, group, rows)
            .unwrap_err()
            .to_string()
    };
    assert!(run(0, 64, 100).contains("bits"), "{}", run(0, 64, 100));
    assert!(run(9, 64, 100).contains("bits"));
    // 8 words of 8 four-bit codes hold 64 rows per group, not 65
    assert!(run(4, 65, 100).contains("group"));
    // two groups of 64 hold 65 ..= 128 rows
    assert!(run(4, 64, 129).contains("rows"));
    assert!(run(4, 64, 64).contains("rows"));
    let err = Flex::dequantize_packed(
        words.clone(),
        sm(),
        Tensor::ones([2, 1, 4], &dev()),
        4,
        64,
        100,
    )
    .unwrap_err();
    assert!(
        matches!(err, KernelError::Shape { name: "min", .. }),
        "{err}"
    );
    assert_eq!(
        Flex::dequantize_packed(words, sm(), sm(), 4, 64, 100)
            .unwrap()
            .dims(),
        [100, 5]
    );
}

/// Zero-sized inputs give empty results, not panics; a bad `eps` is named.
#[test]
fn elementwise_ops_take_empty_inputs() {
    let x = Tensor::<Flex, 3>::zeros([2, 3, 0], &dev());
    let out = Flex::rms_norm(x, Tensor::zeros([0], &dev()), 1e-6).unwrap();
    assert_eq!(out.dims(), [2, 3, 0]);
    let x = Tensor::<Flex, 3>::ones([1, 1, 4], &dev());
    for eps in [-1.0, f64::NAN, f64::INFINITY] {
        let err = Flex::rms_norm(x.clone(), Tensor::ones([4], &dev()), eps).unwrap_err();
        assert!(err.to_string().contains("eps"), "{err}");
    }
    // no columns; no groups and no rows
    let w = Tensor::<Flex, 3, Int>::zeros([2, 1, 0], &dev());
    let sm = Tensor::<Flex, 3>::zeros([2, 1, 0], &dev());
    let out = Flex::dequantize_packed(w, sm.clone(), sm, 4, 8, 10).unwrap();
    assert_eq!(out.dims(), [10, 0]);
    let w = Tensor::<Flex, 3, Int>::zeros([0, 1, 3], &dev());
    let sm = Tensor::<Flex, 3>::zeros([0, 1, 3], &dev());
    let out = Flex::dequantize_packed(w, sm.clone(), sm, 4, 8, 0).unwrap();
    assert_eq!(out.dims(), [0, 3]);
    // no words per group
    let w = Tensor::<Flex, 3, Int>::zeros([1, 0, 3], &dev());
    let sm = Tensor::<Flex, 3>::zeros([1, 1, 3], &dev());
    let err = Flex::dequantize_packed(w, sm.clone(), sm, 4, 8, 8).unwrap_err();
    assert!(err.to_string().contains("words"), "{err}");
}
