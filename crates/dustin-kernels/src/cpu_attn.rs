//! Decode and verification attention on the CPU, dense or over a selection, on f32 host
//! memory: [`KernelOps::verify_attention`](crate::AttentionOps::verify_attention) and
//! [`KernelOps::sparse_verify_attention`](crate::AttentionOps::sparse_verify_attention) for
//! `burn_flex::Flex`.
//!
//! What the plain path (Burn ops) costs on the CPU is not the arithmetic but the tensors it
//! builds: a mask and a score matrix, a gather of the selected rows, copies of strided views,
//! one allocation per op. Here each query row reads its keys and values where the cache holds
//! them and nothing is built but a score buffer per task.
//!
//! How:
//! - **Keys as a list of entries.** For sequence `b` and KV head `h` the keys are the context
//!   entries (all positions `0 .. ctx_lens[b]` when dense; the valid selected positions, in
//!   the selection's order, when sparse) followed by the new tokens `ctx_lens[b] + i`. Query
//!   row `i` sees the context entries and the new tokens up to its own (the causal rule of
//!   the crate docs); a selection entry is valid when its slot is below the sequence's count
//!   and its position in `0 .. ctx_lens[b]` (as [`crate::plain::sparse_verify_attention`]).
//! - **Tasks.** The entries of each `(b, h)` split into chunks of [`CHUNK`]; a chunk is one
//!   rayon task that computes, for each of the `group * n_new` query rows of the KV head, the
//!   scores `scale q.k` of the entries the row sees, their maximum `m`, `l = sum exp(s - m)`
//!   and `o = sum exp(s - m) v` (the flash-decoding split). Each key and value row is read
//!   once per chunk for all the rows of its KV head.
//! - **Merge**: the chunks of a row combine left to right (`m = max(m1, m2)`,
//!   `l = l1 e^(m1 - m) + l2 e^(m2 - m)`, the same for `o`), then `o / l`.
//! - **Batch invariance.** Chunks sit on a fixed grid of entry indices and every row's
//!   arithmetic is its own, in a fixed order: a row's output does not depend on the other
//!   rows, on `n_new` or on the threads: decoding one token and verifying it among others
//!   give the same bits, so the attention adds no difference between speculative and
//!   autoregressive greedy outputs.
//! - **SIMD.** The two products of a chunk (`Simd::dot4`, four keys per pass over a query
//!   row, and `Simd::pv`, a segment of the output row held in registers over a block of
//!   `KEY_BLOCK` (32) value rows) use AVX-512F intrinsics where the head width is a multiple
//!   of 16, AVX2 with FMA where it is a multiple of 8 (chosen at run time), else scalar
//!   loops with separate multiplies and adds. `exp` is [`exp_approx`], a polynomial the
//!   compiler vectorizes. The instruction sets round differently (fused or not); on one
//!   machine a row's result depends on nothing but its own inputs.

use rayon::prelude::*;

/// Entries of one task (keys of one `(sequence, KV head)` per chunk). 512 keys of 128 f32
/// are 256 KiB of keys and values, which the L2 holds while all query rows pass over them.
pub const CHUNK: usize = 512;

/// Keys a score block holds while every query row is scored against it: 32 keys of 128 f32
/// (16 KiB) stay in L1.
pub(crate) const KEY_BLOCK: usize = 32;

/// A `[batch, heads, positions, head_dim]` f32 view with a contiguous last dimension.
#[derive(Debug, Clone, Copy)]
pub struct Strided<'a> {
    /// The storage the view indexes.
    pub data: &'a [f32],
    /// Index of element `[0, 0, 0, 0]`.
    pub offset: usize,
    /// Strides of the first three dimensions, in elements.
    pub strides: [usize; 3],
    /// Head width (the contiguous last dimension).
    pub head_dim: usize,
}

impl Strided<'_> {
    /// Row `[b, h, p, ..]` (`head_dim` values).
    #[inline(always)]
    pub fn row_at(&self, b: usize, h: usize, p: usize) -> &[f32] {
        let o = self.offset + b * self.strides[0] + h * self.strides[1] + p * self.strides[2];
        &self.data[o..o + self.head_dim]
    }
}

/// Sizes of an attention call (the checks of [`crate::check_attn`] already passed).
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Sequences.
    pub batch: usize,
    /// Query heads.
    pub q_heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// New tokens per sequence.
    pub n_new: usize,
    /// Head width.
    pub head_dim: usize,
}

impl From<crate::AttnDims> for Shape {
    /// The sizes of a checked call ([`crate::check_attn`]).
    fn from(d: crate::AttnDims) -> Self {
        Self {
            batch: d.batch,
            q_heads: d.q_heads,
            kv_heads: d.kv_heads,
            n_new: d.n_new,
            head_dim: d.head_dim,
        }
    }
}

/// The context entries of each `(sequence, KV head)`.
#[derive(Debug, Clone, Copy)]
pub enum Context<'a> {
    /// Positions `0 .. ctx_lens[b]`.
    Dense,
    /// Selected positions `indices` `[batch, kv_heads, budget]` (row-major) with `counts`
    /// `[batch]` valid slots.
    Selected {
        /// Positions, row-major `[batch, kv_heads, budget]`.
        indices: &'a [i64],
        /// Columns of `indices`.
        budget: usize,
        /// Valid slots per sequence.
        counts: &'a [usize],
    },
}

/// Softmax attention of `q` `[batch, q_heads, n_new, head_dim]` (contiguous) over the keys
/// and values `k`, `v` `[batch, kv_heads, capacity, head_dim]` that `ctx` and `ctx_lens`
/// name: `[batch, q_heads, n_new, head_dim]` (contiguous), `softmax(scale q k^T) v` per row.
///
/// The caller has checked the shapes ([`crate::check_attn`], [`crate::check_selection`]);
/// `k` and `v` hold at least `ctx_lens[b] + n_new` positions per sequence.
pub fn attention(
    q: &[f32],
    k: Strided<'_>,
    v: Strided<'_>,
    shape: Shape,
    ctx_lens: &[usize],
    ctx: Context<'_>,
    scale: f32,
) -> Vec<f32> {
    let Shape {
        batch,
        q_heads,
        kv_heads,
        n_new: n,
        head_dim: d,
    } = shape;
    let g = q_heads / kv_heads;
    let rows = g * n;
    // the entries of every (b, h): context positions then the new tokens
    let mut lists: Vec<(Vec<u32>, usize)> = Vec::with_capacity(batch * kv_heads);
    for (b, &c) in ctx_lens.iter().enumerate().take(batch) {
        for h in 0..kv_heads {
            let mut list: Vec<u32> = match ctx {
                Context::Dense => (0..c as u32).collect(),
                Context::Selected {
                    indices,
                    budget,
                    counts,
                } => {
                    let row = &indices[(b * kv_heads + h) * budget..][..counts[b].min(budget)];
                    row.iter()
                        .filter(|&&p| p >= 0 && (p as usize) < c)
                        .map(|&p| p as u32)
                        .collect()
                }
            };
            let n_ctx = list.len();
            list.extend((c..c + n).map(|p| p as u32));
            lists.push((list, n_ctx));
        }
    }
    // one task per chunk of entries of one (b, h)
    let tasks: Vec<(usize, usize)> = lists
        .iter()
        .enumerate()
        .flat_map(|(bh, (list, _))| (0..list.len().div_ceil(CHUNK)).map(move |c| (bh, c)))
        .collect();
    let isa = Isa::detect();
    let partials: Vec<Partial> = tasks
        .par_iter()
        .map(|&(bh, c)| {
            let (b, h) = (bh / kv_heads, bh % kv_heads);
            let (list, n_ctx) = &lists[bh];
            let lo = c * CHUNK;
            let entries = &list[lo..list.len().min(lo + CHUNK)];
            // row r = (group member gi, new token i) = gi * n + i sees entries < n_ctx + i + 1
            let limits: Vec<usize> = (0..rows)
                .map(|r| (n_ctx + r % n + 1).saturating_sub(lo).min(entries.len()))
                .collect();
            let qh = &q[(b * q_heads + h * g) * n * d..][..rows * d];
            let job = Job {
                q: qh,
                k: &k,
                v: &v,
                b,
                h,
                entries,
                limits: &limits,
                d,
                scale,
            };
            run_chunk(isa, &job)
        })
        .collect();
    // merge the chunks of each row in order, then normalise
    let mut out = vec![0f32; batch * q_heads * n * d];
    let mut t = 0;
    for (bh, (list, _)) in lists.iter().enumerate() {
        let chunks = list.len().div_ceil(CHUNK);
        let (b, h) = (bh / kv_heads, bh % kv_heads);
        let dst = &mut out[(b * q_heads + h * g) * n * d..][..rows * d];
        let mut m = vec![f32::NEG_INFINITY; rows];
        let mut l = vec![0f32; rows];
        for p in &partials[t..t + chunks] {
            for r in 0..rows {
                let (pm, pl) = (p.m[r], p.l[r]);
                if pl == 0.0 {
                    continue;
                }
                let o = &mut dst[r * d..(r + 1) * d];
                let po = &p.o[r * d..(r + 1) * d];
                if m[r] == f32::NEG_INFINITY {
                    m[r] = pm;
                    l[r] = pl;
                    o.copy_from_slice(po);
                    continue;
                }
                let mm = m[r].max(pm);
                let (a, c) = (exp_approx(m[r] - mm), exp_approx(pm - mm));
                l[r] = l[r] * a + pl * c;
                for (x, &y) in o.iter_mut().zip(po) {
                    *x = *x * a + y * c;
                }
                m[r] = mm;
            }
        }
        for r in 0..rows {
            let inv = 1.0 / l[r];
            for x in &mut dst[r * d..(r + 1) * d] {
                *x *= inv;
            }
        }
        t += chunks;
    }
    out
}

/// One chunk's work: the query rows of one KV head against some of its entries.
struct Job<'a> {
    /// Query rows `[rows, head_dim]`.
    q: &'a [f32],
    k: &'a Strided<'a>,
    v: &'a Strided<'a>,
    b: usize,
    h: usize,
    /// Cache positions of the chunk's entries.
    entries: &'a [u32],
    /// Entries of the chunk each row sees (a prefix).
    limits: &'a [usize],
    d: usize,
    scale: f32,
}

/// A chunk's result per row: score maximum `m`, `l = sum exp(s - m)` (0 when the row sees
/// none of the chunk) and `o = sum exp(s - m) v` `[rows, head_dim]`.
struct Partial {
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
}

/// The instruction sets [`chunk`] is compiled for, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// the vector kinds exist on x86-64 only
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Isa {
    /// AVX-512F: 16-lane vectors, fused multiply-adds.
    Avx512,
    /// AVX2 and FMA: 8-lane vectors, fused multiply-adds.
    Avx2Fma,
    /// The baseline target, separate multiplies and adds.
    Portable,
}

impl Isa {
    /// The best instruction set of this CPU.
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Self::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Self::Avx2Fma;
            }
        }
        Self::Portable
    }
}

/// One chunk with `isa` (detected); head widths the vector paths do not divide run the
/// portable path.
fn run_chunk(isa: Isa, job: &Job<'_>) -> Partial {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F was detected at run time (`Isa::detect`)
        Isa::Avx512 if job.d.is_multiple_of(16) => unsafe { chunk_avx512(job) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA were detected at run time (`Isa::detect`)
        Isa::Avx512 | Isa::Avx2Fma if job.d.is_multiple_of(8) => unsafe { chunk_avx2(job) },
        // SAFETY: the scalar path needs no feature
        _ => unsafe { chunk::<Scalar>(job) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn chunk_avx512(job: &Job<'_>) -> Partial {
    // SAFETY: as this function's
    unsafe { chunk::<x86::Avx512>(job) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk_avx2(job: &Job<'_>) -> Partial {
    // SAFETY: as this function's
    unsafe { chunk::<x86::Avx2>(job) }
}

/// The two products of a chunk in one instruction set.
pub(crate) trait Simd {
    /// `[q . k_0, .., q . k_3]` over `q.len()` values (each `k_t` at least as long).
    ///
    /// # Safety
    /// The instruction set is available; `q.len()` is a multiple of its vector width.
    unsafe fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4];

    /// `o += sum_j p_j v_j` over `o.len()` values, `j` in order (each `v_j` at least as long).
    ///
    /// # Safety
    /// As [`Simd::dot4`], for `o.len()`.
    unsafe fn pv(o: &mut [f32], p: &[f32], v: &[&[f32]]);
}

/// The baseline target: one lane at a time, separate multiplies and adds.
pub(crate) struct Scalar;

impl Simd for Scalar {
    #[inline(always)]
    unsafe fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        k.map(|k| {
            let mut acc = [0f32; 16];
            for (i, (&x, &y)) in q.iter().zip(k).enumerate() {
                acc[i % 16] += x * y;
            }
            fold16(acc)
        })
    }

    #[inline(always)]
    unsafe fn pv(o: &mut [f32], p: &[f32], v: &[&[f32]]) {
        for (&pj, vj) in p.iter().zip(v) {
            for (x, &y) in o.iter_mut().zip(*vj) {
                *x += pj * y;
            }
        }
    }
}

/// `sr[j] = scale * (q . keys[j - k0])` for `j` in `k0 .. lim`, the keys of one block
/// (`keys[t]` is entry `k0 + t`), four keys per pass over the query row; a short last group
/// repeats its last key (a product computed and dropped).
///
/// # Safety
/// `S`'s instruction set is available and divides `q.len()`; `k0 < lim <= k0 + keys.len()`.
#[inline(always)]
pub(crate) unsafe fn score_block<S: Simd>(
    q: &[f32],
    keys: &[&[f32]],
    k0: usize,
    lim: usize,
    scale: f32,
    sr: &mut [f32],
) {
    let mut j = k0;
    while j < lim {
        let at = |t: usize| keys[(j + t).min(lim - 1) - k0];
        // SAFETY: as this function's
        let dots = unsafe { S::dot4(q, [at(0), at(1), at(2), at(3)]) };
        for (t, &x) in dots.iter().enumerate().take(lim - j) {
            sr[j + t] = x * scale;
        }
        j += 4;
    }
}

/// Scores, softmax numerators and weighted values of one chunk in the instruction set of `S`.
///
/// # Safety
/// `S`'s instruction set is available and divides the head width.
#[inline(always)]
unsafe fn chunk<S: Simd>(job: &Job<'_>) -> Partial {
    let d = job.d;
    let (rows, e) = (job.limits.len(), job.entries.len());
    let mut s = vec![0f32; rows * e];
    let mut vs: [&[f32]; KEY_BLOCK] = [&[]; KEY_BLOCK];
    // scores, a block of keys at a time so that the block stays in L1 across the rows; four
    // keys per pass over a query row
    for k0 in (0..e).step_by(KEY_BLOCK) {
        let k1 = e.min(k0 + KEY_BLOCK);
        for (j, slot) in (k0..k1).zip(vs.iter_mut()) {
            *slot = job.k.row_at(job.b, job.h, job.entries[j] as usize);
        }
        for r in 0..rows {
            let lim = job.limits[r].min(k1);
            if lim <= k0 {
                continue;
            }
            let qr = &job.q[r * d..(r + 1) * d];
            // SAFETY: as this function's
            unsafe { score_block::<S>(qr, &vs, k0, lim, job.scale, &mut s[r * e..(r + 1) * e]) };
        }
    }
    // softmax numerators per row
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0f32; rows];
    for r in 0..rows {
        let sr = &mut s[r * e..r * e + job.limits[r]];
        if sr.is_empty() {
            continue;
        }
        let mr = sr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for x in sr.iter_mut() {
            *x = exp_approx(*x - mr);
        }
        m[r] = mr;
        l[r] = sum16(sr);
    }
    // weighted values, a block of value rows at a time
    let mut o = vec![0f32; rows * d];
    for k0 in (0..e).step_by(KEY_BLOCK) {
        let k1 = e.min(k0 + KEY_BLOCK);
        for (j, slot) in (k0..k1).zip(vs.iter_mut()) {
            *slot = job.v.row_at(job.b, job.h, job.entries[j] as usize);
        }
        for r in 0..rows {
            let lim = job.limits[r].min(k1);
            if lim <= k0 {
                continue;
            }
            // SAFETY: as this function's
            unsafe {
                S::pv(
                    &mut o[r * d..(r + 1) * d],
                    &s[r * e + k0..r * e + lim],
                    &vs[..lim - k0],
                )
            };
        }
    }
    Partial { m, l, o }
}

/// The 16 lanes added pairwise: `((l0 + l8) + (l4 + l12)) + ...`, a fixed order.
#[inline(always)]
fn fold16(mut a: [f32; 16]) -> f32 {
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for t in 0..w {
            a[t] += a[t + w];
        }
    }
    a[0]
}

/// `sum x` in 16 lanes (lane `i mod 16`), folded by [`fold16`].
#[inline(always)]
pub(crate) fn sum16(x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let c = x.chunks_exact(16);
    let rest = c.remainder();
    for v in c {
        for t in 0..16 {
            acc[t] += v[t];
        }
    }
    for (t, &v) in rest.iter().enumerate() {
        acc[t] += v;
    }
    fold16(acc)
}

/// The vector products: AVX-512F (16 lanes) and AVX2 with FMA (8 lanes), fused
/// multiply-adds, one accumulator per key in [`Simd::dot4`] and a segment of the output row
/// held in registers across the value rows in [`Simd::pv`].
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::Simd;

    /// AVX-512F.
    pub(crate) struct Avx512;
    /// AVX2 with FMA.
    pub(crate) struct Avx2;

    impl Simd for Avx512 {
        #[inline(always)]
        unsafe fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
            let d = q.len();
            let k = k.map(|k| &k[..d]);
            // SAFETY: AVX-512F is available (the caller's contract); every load reads 16
            // values inside `q` or a `k[..d]`, `d` a multiple of 16
            unsafe {
                let mut a = [_mm512_setzero_ps(); 4];
                for c in (0..d).step_by(16) {
                    let qv = _mm512_loadu_ps(q.as_ptr().add(c));
                    for t in 0..4 {
                        a[t] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k[t].as_ptr().add(c)), a[t]);
                    }
                }
                // no closure: it would not inherit this function's target features
                [
                    _mm512_reduce_add_ps(a[0]),
                    _mm512_reduce_add_ps(a[1]),
                    _mm512_reduce_add_ps(a[2]),
                    _mm512_reduce_add_ps(a[3]),
                ]
            }
        }

        #[inline(always)]
        unsafe fn pv(o: &mut [f32], p: &[f32], v: &[&[f32]]) {
            let d = o.len();
            // SAFETY: as `dot4`'s, for `o` and each `v[j][..d]`
            unsafe {
                match d {
                    128 => pv_512::<8>(o, p, v, 0),
                    64 => pv_512::<4>(o, p, v, 0),
                    _ => {
                        for seg in (0..d).step_by(16) {
                            pv_512::<1>(o, p, v, seg);
                        }
                    }
                }
            }
        }
    }

    /// `o[seg .. seg + 16 R] += sum_j p_j v_j[seg ..]` with the segment in `R` registers.
    ///
    /// # Safety
    /// AVX-512F; `seg + 16 R <= o.len()` and every `v[j]` as long as `o`.
    #[inline(always)]
    unsafe fn pv_512<const R: usize>(o: &mut [f32], p: &[f32], v: &[&[f32]], seg: usize) {
        let d = o.len();
        // SAFETY: as this function's
        unsafe {
            let op = o.as_mut_ptr().add(seg);
            let mut acc = [_mm512_setzero_ps(); R];
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(op.add(16 * r));
            }
            for (&pj, vj) in p.iter().zip(v) {
                let vj = &vj[..d];
                let pb = _mm512_set1_ps(pj);
                let vp = vj.as_ptr().add(seg);
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(pb, _mm512_loadu_ps(vp.add(16 * r)), *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(op.add(16 * r), *a);
            }
        }
    }

    impl Simd for Avx2 {
        #[inline(always)]
        unsafe fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
            let d = q.len();
            let k = k.map(|k| &k[..d]);
            // SAFETY: AVX2 and FMA are available (the caller's contract); every load reads 8
            // values inside `q` or a `k[..d]`, `d` a multiple of 8
            unsafe {
                let mut a = [_mm256_setzero_ps(); 4];
                for c in (0..d).step_by(8) {
                    let qv = _mm256_loadu_ps(q.as_ptr().add(c));
                    for t in 0..4 {
                        a[t] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[t].as_ptr().add(c)), a[t]);
                    }
                }
                [hsum256(a[0]), hsum256(a[1]), hsum256(a[2]), hsum256(a[3])]
            }
        }

        #[inline(always)]
        unsafe fn pv(o: &mut [f32], p: &[f32], v: &[&[f32]]) {
            let d = o.len();
            // SAFETY: as `dot4`'s, for `o` and each `v[j][..d]`
            unsafe {
                if d.is_multiple_of(64) {
                    for seg in (0..d).step_by(64) {
                        pv_256::<8>(o, p, v, seg);
                    }
                } else {
                    for seg in (0..d).step_by(8) {
                        pv_256::<1>(o, p, v, seg);
                    }
                }
            }
        }
    }

    /// `o[seg .. seg + 8 R] += sum_j p_j v_j[seg ..]` with the segment in `R` registers.
    ///
    /// # Safety
    /// AVX2 and FMA; `seg + 8 R <= o.len()` and every `v[j]` as long as `o`.
    #[inline(always)]
    unsafe fn pv_256<const R: usize>(o: &mut [f32], p: &[f32], v: &[&[f32]], seg: usize) {
        let d = o.len();
        // SAFETY: as this function's
        unsafe {
            let op = o.as_mut_ptr().add(seg);
            let mut acc = [_mm256_setzero_ps(); R];
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(op.add(8 * r));
            }
            for (&pj, vj) in p.iter().zip(v) {
                let vj = &vj[..d];
                let pb = _mm256_set1_ps(pj);
                let vp = vj.as_ptr().add(seg);
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vp.add(8 * r)), *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(op.add(8 * r), *a);
            }
        }
    }

    /// The 8 lanes of `v` added: halves, then pairs, then the last two.
    ///
    /// # Safety
    /// AVX is available.
    #[inline(always)]
    unsafe fn hsum256(v: __m256) -> f32 {
        // SAFETY: as this function's
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }
}

/// `e^x` for `x <= 0` (and small positive `x`), relative error under `2e-7`: `x = k ln 2 +
/// r` with `|r| <= ln 2 / 2` (Cody-Waite split of `ln 2`), `e^r` by the degree-7 polynomial
/// of Cephes' `expf`, `2^k` through the exponent bits. Inputs below `-87` give about `1e-38`
/// instead of 0 (a weight no sum notices). Plain arithmetic, so the compiler vectorizes it.
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 = C1 + C2 with C1 exact in few bits (Cephes)
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let k = (x * LOG2E + 0.5).floor();
    let r = x - k * C1 - k * C2;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    // Cephes' 5.0000001201e-1 is 0.5 in f32
    p = p * r + 0.5;
    let er = p * (r * r) + r + 1.0;
    // 2^k: k + 127 (in 1 ..= 254) lands in the low mantissa bits of k + 127 + 2^23, and the
    // shift leaves those as the exponent (no float-to-int cast, which would not vectorize)
    let bits = (k + (127.0 + 8_388_608.0)).to_bits() << 23;
    er * f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_approx_matches_f64_exp() {
        // every 1/64 from -90 to 2, against f64's exp: relative error under 2e-7 where the
        // result is normal
        let mut worst = 0f64;
        for i in -90 * 64..=2 * 64 {
            let x = i as f32 / 64.0;
            let want = (x as f64).exp();
            let got = exp_approx(x) as f64;
            if want > 1e-37 {
                worst = worst.max(((got - want) / want).abs());
            }
        }
        assert!(worst < 2e-7, "worst relative error {worst}");
    }
}
