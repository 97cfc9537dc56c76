//! Head-subset attention probabilities, the `dustin` estimator's fold and mix, and the top-k
//! of positions on the CPU, on f32 host memory:
//! [`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores) (the draft's
//! lookahead, `dustin`'s and the oracle's scores) and
//! [`KernelOps::head_subset_row_scores`](crate::SelectionOps::head_subset_row_scores) (the
//! `dustin` estimator heads' rows) for `burn_flex::Flex`.
//!
//! The plain path (Burn ops) gathers the keys once per chosen query head (a copy of the
//! whole context per head), builds a causal mask and the score matrix, takes the softmax and
//! sums the heads with a matrix product. Here one task per `(sequence, KV head)` reads each
//! key row where the cache holds it, once for all the chosen heads of that KV head and all
//! the new tokens, and builds nothing but one score buffer:
//! - scores `scale q.k` of every row (chosen head `e`, new token `i`, row `e n + i`) against
//!   the keys it sees (positions `0 ..= ctx + i`, the causal rule of the crate docs), a block
//!   of 32 keys at a time held in L1 while every row passes over it, with the
//!   vector products of [`crate::cpu_attn`] (AVX-512F, AVX2 with FMA or scalar, chosen at run
//!   time);
//! - each row's softmax (`exp` by [`exp_approx`], a relative error under `2e-7`);
//! - the rows added into the output in row order: per position for the scores, per position
//!   and new token for the row scores. Positions past `ctx + n_new` and KV heads without a
//!   chosen head stay 0.
//!
//! The `dustin` estimator's next two steps, [`KernelOps::fold_rows`](crate::SelectionOps::fold_rows)
//! and [`KernelOps::mix_scores`](crate::SelectionOps::mix_scores), are loops over the same
//! rows here ([`fold_rows`], [`mix_scores`]), one task per `(sequence, KV head)`, where the
//! plain path builds a weight tensor per factor and a mask. The top-k step that follows every
//! selector ([`KernelOps::top_k_positions`](crate::SelectionOps::top_k_positions), [`top_k`])
//! selects per row (`select_nth_unstable`) where the plain path sorts the whole context.
//! Quest's page scores ([`KernelOps::quest_page_scores`](crate::SelectionOps::quest_page_scores),
//! [`quest_page_scores`]) read each page's bounds once for all the group's query rows, where
//! the plain path runs two batched matrix products and a maximum over a `[rows, pages]`
//! matrix.

use rayon::prelude::*;

use crate::cpu_attn::{
    exp_approx, score_block, sum16, Isa, Scalar, Shape, Simd, Strided, KEY_BLOCK,
};

/// The output of [`head_subset_scores`].
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Positions per row (the keys view's length, at least every `ctx_lens[b] + n_new`).
    pub width: usize,
    /// One sum per new token (`[batch, kv_heads, n_new, width]`) or one over them all
    /// (`[batch, kv_heads, width]`).
    pub per_row: bool,
}

/// The chosen heads' probabilities, summed per KV head, row-major in `out`'s [`Layout`].
///
/// `q` is `[batch, q_heads, n_new, head_dim]` contiguous; `k` is read at positions below
/// `ctx_lens[b] + n_new`, which the caller has checked are at most `out.width`
/// ([`crate::check_attn`], [`crate::check_heads`]: `heads` distinct and below `q_heads`).
pub fn head_subset_scores(
    q: &[f32],
    k: Strided<'_>,
    shape: Shape,
    ctx_lens: &[usize],
    heads: &[usize],
    scale: f32,
    out: Layout,
) -> Vec<f32> {
    let Layout { width, per_row } = out;
    let Shape {
        batch,
        q_heads,
        kv_heads,
        n_new: n,
        head_dim: d,
    } = shape;
    let g = q_heads / kv_heads.max(1);
    let per = if per_row { n * width } else { width };
    let mut out = vec![0f32; batch * kv_heads * per];
    if per == 0 {
        return out;
    }
    let isa = Isa::detect();
    out.par_chunks_mut(per).enumerate().for_each(|(bh, dst)| {
        let (b, h) = (bh / kv_heads, bh % kv_heads);
        let chosen: Vec<usize> = heads.iter().copied().filter(|&x| x / g == h).collect();
        if chosen.is_empty() {
            return;
        }
        let job = Job {
            q,
            k: &k,
            b,
            h,
            heads: &chosen,
            q_heads,
            n,
            d,
            ctx: ctx_lens[b],
            scale,
            width,
            per_row,
        };
        run(isa, &job, dst);
    });
    out
}

/// One `(sequence, KV head)`'s rows.
struct Job<'a> {
    q: &'a [f32],
    k: &'a Strided<'a>,
    b: usize,
    h: usize,
    /// Chosen query heads of KV head `h`.
    heads: &'a [usize],
    q_heads: usize,
    n: usize,
    d: usize,
    ctx: usize,
    scale: f32,
    width: usize,
    per_row: bool,
}

/// A job of one `(sequence, KV head)` written for any vector width ([`Simd`]): [`run`] picks
/// the instruction set.
trait SimdJob {
    /// The head width the vector products run over.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the vector paths' choice
    fn head_dim(&self) -> usize;

    /// The job into `dst`.
    ///
    /// # Safety
    /// `S`'s instruction set is available and divides [`SimdJob::head_dim`].
    unsafe fn run_in<S: Simd>(&self, dst: &mut [f32]);
}

/// `job` in the best instruction set `isa` allows for its head width.
fn run<J: SimdJob>(isa: Isa, job: &J, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    let d = job.head_dim();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F was detected at run time (`Isa::detect`)
        Isa::Avx512 if d.is_multiple_of(16) => unsafe { run_avx512(job, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA were detected at run time (`Isa::detect`)
        Isa::Avx512 | Isa::Avx2Fma if d.is_multiple_of(8) => unsafe { run_avx2(job, dst) },
        // SAFETY: the scalar path needs no feature
        _ => unsafe { job.run_in::<Scalar>(dst) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn run_avx512<J: SimdJob>(job: &J, dst: &mut [f32]) {
    // SAFETY: as this function's
    unsafe { job.run_in::<crate::cpu_attn::x86::Avx512>(dst) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<J: SimdJob>(job: &J, dst: &mut [f32]) {
    // SAFETY: as this function's
    unsafe { job.run_in::<crate::cpu_attn::x86::Avx2>(dst) }
}

impl SimdJob for Job<'_> {
    fn head_dim(&self) -> usize {
        self.d
    }

    #[inline(always)]
    unsafe fn run_in<S: Simd>(&self, dst: &mut [f32]) {
        // SAFETY: the caller's
        unsafe { job_in::<S>(self, dst) }
    }
}

/// Scores, softmax and sums of one job into `dst` (its `[width]` or `[n_new, width]` part
/// of the output, zeroed).
///
/// # Safety
/// `S`'s instruction set is available and divides the head width.
#[inline(always)]
unsafe fn job_in<S: Simd>(job: &Job<'_>, dst: &mut [f32]) {
    let (n, d) = (job.n, job.d);
    let keys = job.ctx + n;
    let rows = job.heads.len() * n;
    // row r = (chosen head r / n, new token r % n) sees keys 0 ..= ctx + r % n
    let limit = |r: usize| job.ctx + r % n + 1;
    let mut s = vec![0f32; rows * keys];
    let mut ks: [&[f32]; KEY_BLOCK] = [&[]; KEY_BLOCK];
    for k0 in (0..keys).step_by(KEY_BLOCK) {
        let k1 = keys.min(k0 + KEY_BLOCK);
        for (j, slot) in (k0..k1).zip(ks.iter_mut()) {
            *slot = job.k.row_at(job.b, job.h, j);
        }
        for r in 0..rows {
            let lim = limit(r).min(k1);
            if lim <= k0 {
                continue;
            }
            let head = job.heads[r / n];
            let at = ((job.b * job.q_heads + head) * n + r % n) * d;
            let qr = &job.q[at..at + d];
            let sr = &mut s[r * keys..(r + 1) * keys];
            // SAFETY: as this function's
            unsafe { score_block::<S>(qr, &ks, k0, lim, job.scale, sr) };
        }
    }
    for r in 0..rows {
        let sr = &mut s[r * keys..r * keys + limit(r)];
        let m = sr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for x in sr.iter_mut() {
            *x = exp_approx(*x - m);
        }
        let inv = 1.0 / sum16(sr);
        let o = if job.per_row {
            &mut dst[(r % n) * job.width..][..sr.len()]
        } else {
            &mut dst[..sr.len()]
        };
        for (o, &p) in o.iter_mut().zip(sr.iter()) {
            *o += p * inv;
        }
    }
}

/// [`KernelOps::fold_rows`](crate::SelectionOps::fold_rows) on host memory (the checks of
/// [`crate::check_fold`] passed): `rows` `[b, kv_heads, n, len]` and `hist` `[b, kv_heads,
/// len]` contiguous; returns `[b, kv_heads, len]`. One task per `(sequence, KV head)`.
pub fn fold_rows(
    hist: Option<&[f32]>,
    factor: &[f32],
    rows: &[f32],
    dims: [usize; 4],
    w: &[f32],
    own: &[f32],
    all: &[f32],
) -> Vec<f32> {
    let [b, kvh, n, l] = dims;
    let mut out = vec![0f32; b * kvh * l];
    if l == 0 {
        return out;
    }
    out.par_chunks_mut(l).enumerate().for_each(|(bh, o)| {
        let (b, h) = (bh / kvh, bh % kvh);
        if let Some(hs) = hist {
            let f = factor[b];
            for (o, &x) in o.iter_mut().zip(&hs[bh * l..(bh + 1) * l]) {
                *o = f * x;
            }
        }
        for i in 0..n {
            let wi = w[b * n + i];
            let row = |g: usize| &rows[((b * kvh + g) * n + i) * l..][..l];
            if own[h] != 0.0 {
                let c = wi * own[h];
                for (o, &x) in o.iter_mut().zip(row(h)) {
                    *o += c * x;
                }
            }
            if all[h] != 0.0 {
                let c = wi * all[h];
                for g in 0..kvh {
                    for (o, &x) in o.iter_mut().zip(row(g)) {
                        *o += c * x;
                    }
                }
            }
        }
    });
    out
}

/// [`KernelOps::mix_scores`](crate::SelectionOps::mix_scores) on host memory (the checks of
/// [`crate::check_mix`] passed): `hist` `[b, kv_heads, hist_len]` and `la` `[b, la_len]`
/// contiguous (each read as 0 past its length); returns `[b, kv_heads, width]`, 0 outside
/// each sequence's free range.
pub fn mix_scores(
    hist: &[f32],
    dims: [usize; 3],
    la: Option<(&[f32], usize)>,
    free: &[(usize, usize)],
    alpha: f32,
    width: usize,
) -> Vec<f32> {
    let [b, kvh, hl] = dims;
    let mut out = vec![0f32; b * kvh * width];
    if width == 0 {
        return out;
    }
    out.par_chunks_mut(width).enumerate().for_each(|(bh, o)| {
        let s = bh / kvh;
        let (lo, hi) = (free[s].0.min(width), free[s].1.min(width));
        if lo >= hi {
            return;
        }
        let (hp, hs) = scaled(&hist[bh * hl..(bh + 1) * hl], lo, hi);
        let dst = &mut o[lo..lo + hp.len()];
        match la {
            None => {
                for (o, &x) in dst.iter_mut().zip(hp) {
                    *o = x * hs;
                }
            }
            Some((la, ll)) => {
                for (o, &x) in dst.iter_mut().zip(hp) {
                    *o = (1.0 - alpha) * (x * hs);
                }
                let (lp, ls) = scaled(&la[s * ll..(s + 1) * ll], lo, hi);
                for (o, &x) in o[lo..lo + lp.len()].iter_mut().zip(lp) {
                    *o += alpha * (x * ls);
                }
            }
        }
    });
    out
}

/// `x`'s values on `lo .. hi` (those past its end are 0) and the reciprocal of their sum,
/// the sum clamped below at 1e-30 (as [`crate::plain::mix_scores`]).
fn scaled(x: &[f32], lo: usize, hi: usize) -> (&[f32], f32) {
    let part = &x[lo.min(x.len())..hi.min(x.len())];
    (part, 1.0 / sum16(part).max(1e-30))
}

/// [`KernelOps::top_k_positions`](crate::SelectionOps::top_k_positions) on host memory (the
/// checks of [`crate::check_top_k`] passed): per row of `scores` `[batch, heads, c]` the
/// sinks and the window, and the highest scores among the other positions below `ctx_b`
/// (NaN lowest, `+-inf` as the finite extremes, ties to the lower position) up to
/// `min(budget, ctx_b)`, ascending; rows of `[batch, heads, kk]`, short rows padded with 0.
/// A selection (`select_nth_unstable`) per row instead of a sort of the whole context.
pub fn top_k(
    scores: &[f32],
    dims: [usize; 3],
    ctx_lens: &[usize],
    keep: crate::Keep,
    kk: usize,
) -> Vec<i64> {
    let [_, h, c] = dims;
    let mut out = vec![0i64; dims[0] * h * kk];
    if kk == 0 {
        return out;
    }
    out.par_chunks_mut(kk).enumerate().for_each(|(bh, dst)| {
        let cb = ctx_lens[bh / h];
        let want = keep.budget.min(cb);
        let row = &scores[bh * c..bh * c + cb];
        // forced: [0, n_sink) and [cb - window, cb)
        let sinks = keep.n_sink.min(cb);
        let tail = cb.saturating_sub(keep.window).max(sinks);
        let mut kept: Vec<usize> = (0..sinks).chain(tail..cb).collect();
        let free = want.saturating_sub(kept.len());
        if free > 0 {
            let key = |p: usize| {
                let s = row[p];
                if s.is_nan() {
                    f32::MIN
                } else {
                    s.clamp(f32::MIN, f32::MAX)
                }
            };
            // higher score first, then the lower position (no key is NaN, and -0 ties +0)
            let order = |a: &usize, b: &usize| {
                key(*b)
                    .partial_cmp(&key(*a))
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.cmp(b))
            };
            let mut cand: Vec<usize> = (sinks..tail).collect();
            if free < cand.len() {
                cand.select_nth_unstable_by(free - 1, order);
                cand.truncate(free);
            }
            kept.extend(cand);
        }
        kept.sort_unstable();
        for (d, &p) in dst.iter_mut().zip(&kept) {
            *d = p as i64;
        }
    });
    out
}

/// Quest's page scores (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient
/// Long-Context LLM Inference"): per `(sequence, KV head)` and page, the largest over the
/// group's query rows (query head `h g + r / n_new`, new token `r % n_new`) of
/// `sum_d max(q_d min_d, q_d max_d)`, computed as `relu(q) . max + min(q, 0) . min` (the same
/// value). Row-major `[batch, kv_heads, pages]`; pages that start at or past `ctx_lens[b]`
/// are 0.
///
/// `q` is `[batch, q_heads, n_new, head_dim]` contiguous; `kmin` and `kmax` are `[batch,
/// kv_heads, >= pages, head_dim]`, read at pages below `ctx_lens[b].div_ceil(page_size)`,
/// which the caller has checked are at most `pages` (and `q_heads` a multiple of
/// `kv_heads`, `page_size` at least 1: [`crate::check_quest_scores`]).
///
/// One task per `(sequence, KV head)` reads each page's bounds where the buffer holds them,
/// four pages at a time for all the group's rows, with the vector products of
/// [`crate::cpu_attn`].
pub fn quest_page_scores(
    q: &[f32],
    bounds: [Strided<'_>; 2],
    shape: Shape,
    pages: usize,
    ctx_lens: &[usize],
    page_size: usize,
) -> Vec<f32> {
    let Shape {
        batch,
        q_heads,
        kv_heads,
        n_new: n,
        head_dim: d,
    } = shape;
    let g = q_heads / kv_heads.max(1);
    let mut out = vec![0f32; batch * kv_heads * pages];
    if pages == 0 || g * n * d == 0 {
        return out;
    }
    let isa = Isa::detect();
    out.par_chunks_mut(pages).enumerate().for_each(|(bh, dst)| {
        let (b, h) = (bh / kv_heads, bh % kv_heads);
        let live = ctx_lens[b].div_ceil(page_size).min(pages);
        // the group's rows, contiguous in `q`: heads h g .. (h + 1) g, every new token
        let rows = &q[(b * q_heads + h * g) * n * d..][..g * n * d];
        let pos: Vec<f32> = rows.iter().map(|&x| x.max(0.0)).collect();
        let neg: Vec<f32> = rows.iter().map(|&x| x.min(0.0)).collect();
        let job = QuestJob {
            pos: &pos,
            neg: &neg,
            d,
            bounds: &bounds,
            b,
            h,
        };
        run(isa, &job, &mut dst[..live]);
    });
    out
}

/// One `(sequence, KV head)`'s page scores: the group's rows split into their positive and
/// negative parts (`[rows, head_dim]` each), and the bounds `[kmin, kmax]`.
struct QuestJob<'a> {
    pos: &'a [f32],
    neg: &'a [f32],
    d: usize,
    bounds: &'a [Strided<'a>; 2],
    b: usize,
    h: usize,
}

impl SimdJob for QuestJob<'_> {
    fn head_dim(&self) -> usize {
        self.d
    }

    #[inline(always)]
    unsafe fn run_in<S: Simd>(&self, dst: &mut [f32]) {
        // SAFETY: the caller's
        unsafe { quest_in::<S>(self, dst) }
    }
}

/// The scores of pages `0 .. dst.len()` of one job, four pages per pass over each row (a
/// short last group repeats its last page and drops the extra sums).
///
/// # Safety
/// `S`'s instruction set is available and divides the head width.
#[inline(always)]
unsafe fn quest_in<S: Simd>(job: &QuestJob<'_>, dst: &mut [f32]) {
    let d = job.d;
    let [kmin, kmax] = job.bounds;
    for (c, out) in dst.chunks_mut(4).enumerate() {
        let p = |t: usize| 4 * c + t.min(out.len() - 1);
        let lo = [0, 1, 2, 3].map(|t| kmin.row_at(job.b, job.h, p(t)));
        let hi = [0, 1, 2, 3].map(|t| kmax.row_at(job.b, job.h, p(t)));
        let mut best = [f32::NEG_INFINITY; 4];
        for (qp, qn) in job.pos.chunks_exact(d).zip(job.neg.chunks_exact(d)) {
            // SAFETY: the caller's; every row and bound is `d` long
            let (up, down) = unsafe { (S::dot4(qp, hi), S::dot4(qn, lo)) };
            for t in 0..4 {
                best[t] = best[t].max(up[t] + down[t]);
            }
        }
        out.copy_from_slice(&best[..out.len()]);
    }
}
