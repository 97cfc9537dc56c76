//! Shape and argument checks of the kernels' inputs: each returns the
//! [`KernelError`] that names the first input that is wrong and what was expected, before any
//! kernel runs. Every backend's op calls its check first, so the CPU and CUDA paths reject the
//! same inputs with the same errors.

use crate::{Keep, KernelError, Result, MAX_NEW};

/// Checks a tensor-parallel device group: at least two devices, none twice.
///
/// # Errors
/// [`KernelError::InvalidInput`] naming the group.
pub fn check_group<D: PartialEq + std::fmt::Debug>(group: &[D]) -> Result<()> {
    if group.len() < 2 {
        return Err(KernelError::invalid(
            "all-reduce group",
            "at least two devices",
            format!("{group:?}"),
        ));
    }
    for (i, d) in group.iter().enumerate() {
        if group[..i].contains(d) {
            return Err(KernelError::invalid(
                "all-reduce group",
                "each device once",
                format!("{group:?} (device {d:?} twice)"),
            ));
        }
    }
    Ok(())
}

/// Shapes of a verify-attention call, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
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
    /// Cache capacity per sequence.
    pub capacity: usize,
    /// Keys of the longest sequence, `max ctx + n_new`.
    pub keys: usize,
}

impl AttnDims {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }
}

/// Checks `q` `[batch, q_heads, n_new, head_dim]` against a cache `[batch, kv_heads,
/// capacity, head_dim]` and `ctx_lens`.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::InvalidInput`] naming the first problem.
pub fn check_attn(q: [usize; 4], k: [usize; 4], ctx_lens: &[usize]) -> Result<AttnDims> {
    check_attn_upto(q, k, ctx_lens, MAX_NEW)
}

/// [`check_attn`] with `n_new` allowed up to `max_new`
/// ([`MAX_PREFILL_NEW`](crate::MAX_PREFILL_NEW) for
/// [`KernelOps::prefill_attention`](crate::AttentionOps::prefill_attention)).
///
/// # Errors
/// As [`check_attn`].
pub fn check_attn_upto(
    q: [usize; 4],
    k: [usize; 4],
    ctx_lens: &[usize],
    max_new: usize,
) -> Result<AttnDims> {
    let [b, hq, n, d] = q;
    let [kb, kvh, cap, kd] = k;
    if kb != b || kd != d || kvh == 0 {
        return Err(KernelError::Shape {
            name: "k",
            expected: vec![b, kvh.max(1), cap, d],
            found: k.to_vec(),
        });
    }
    if hq == 0 || hq % kvh != 0 {
        return Err(KernelError::invalid(
            "q_heads",
            format!("a positive multiple of kv_heads = {kvh}"),
            hq,
        ));
    }
    if n == 0 || n > max_new {
        return Err(KernelError::invalid("n_new", format!("1 ..= {max_new}"), n));
    }
    if d == 0 {
        return Err(KernelError::invalid("head_dim", "at least 1", d));
    }
    if ctx_lens.len() != b {
        return Err(KernelError::invalid(
            "ctx_lens",
            format!("{b} lengths"),
            ctx_lens.len(),
        ));
    }
    if let Some((s, &l)) = ctx_lens.iter().enumerate().find(|(_, &l)| l + n > cap) {
        return Err(KernelError::invalid(
            "ctx_lens",
            format!("ctx + n_new <= capacity {cap} (sequence {s})"),
            l,
        ));
    }
    let keys = ctx_lens.iter().copied().max().unwrap_or(0) + n;
    Ok(AttnDims {
        batch: b,
        q_heads: hq,
        kv_heads: kvh,
        n_new: n,
        head_dim: d,
        capacity: cap,
        keys,
    })
}

/// Checks a [`KernelOps::kv_write`](crate::MemoryOps::kv_write): `src` `[batch, kv_heads, n, head_dim]` against `dst`
/// `[batch, kv_heads, capacity, head_dim]` and one start per sequence with room for `n`.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::InvalidInput`] naming the first problem.
pub fn check_kv_write(dst: [usize; 4], src: [usize; 4], starts: &[usize]) -> Result<()> {
    let [b, h, cap, d] = dst;
    let [sb, sh, n, sd] = src;
    if (sb, sh, sd) != (b, h, d) {
        return Err(KernelError::Shape {
            name: "src",
            expected: vec![b, h, n, d],
            found: src.to_vec(),
        });
    }
    if starts.len() != b {
        return Err(KernelError::invalid(
            "starts",
            format!("{b} starts (one per sequence)"),
            starts.len(),
        ));
    }
    if let Some((s, &st)) = starts
        .iter()
        .enumerate()
        .find(|(_, &st)| st.checked_add(n).is_none_or(|end| end > cap))
    {
        return Err(KernelError::invalid(
            "starts",
            format!("start + {n} new <= capacity {cap} (sequence {s})"),
            st,
        ));
    }
    Ok(())
}

/// Checks [`KernelOps::kv_write_pair`](crate::MemoryOps::kv_write_pair)'s inputs: `dst` `[k, v]` caches of one shape, `src`
/// `[k, v]` new rows of one shape, and those as [`check_kv_write`] wants them.
///
/// # Errors
/// [`KernelError::Shape`] naming `v_dst` or `v_src`, else as [`check_kv_write`].
pub fn check_kv_write_pair(
    dst: [[usize; 4]; 2],
    src: [[usize; 4]; 2],
    starts: &[usize],
) -> Result<()> {
    check_same("v_dst", dst[0], dst[1])?;
    check_same("v_src", src[0], src[1])?;
    check_kv_write(dst[0], src[0], starts)
}

/// Checks a sparse selection `[batch, kv_heads, budget]` and its counts against `dims`.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::InvalidInput`].
pub fn check_selection(dims: &AttnDims, idx: [usize; 3], counts: &[usize]) -> Result<()> {
    let [b, h, budget] = idx;
    if b != dims.batch || h != dims.kv_heads {
        return Err(KernelError::Shape {
            name: "indices",
            expected: vec![dims.batch, dims.kv_heads, budget],
            found: idx.to_vec(),
        });
    }
    if counts.len() != b {
        return Err(KernelError::invalid(
            "counts",
            format!("{b} counts"),
            counts.len(),
        ));
    }
    if let Some(&c) = counts.iter().find(|&&c| c > budget) {
        return Err(KernelError::invalid(
            "counts",
            format!("at most the budget {budget}"),
            c,
        ));
    }
    Ok(())
}

/// Checks a packed matrix ([`KernelOps::dequantize_packed`](crate::ElementwiseOps::dequantize_packed)) and returns `32 / bits`, the
/// codes per word.
///
/// # Errors
/// [`KernelError::InvalidInput`] naming `bits`, `group` or `rows`; [`KernelError::Shape`]
/// naming `scale` or `min`.
pub fn check_packed(
    words: [usize; 3],
    scale: [usize; 3],
    min: [usize; 3],
    bits: u32,
    group: usize,
    rows: usize,
) -> Result<usize> {
    if !(1..=8).contains(&bits) {
        return Err(KernelError::invalid("bits", "1 ..= 8", bits));
    }
    let per = (32 / bits) as usize;
    let [groups, wpg, cols] = words;
    if wpg == 0 {
        return Err(KernelError::invalid(
            "words",
            "at least one word per group",
            0,
        ));
    }
    if group == 0 || wpg * per < group {
        return Err(KernelError::invalid(
            "group",
            format!("1 ..= {} (codes per group the words hold)", wpg * per),
            group,
        ));
    }
    if rows > groups * group || rows + group <= groups * group {
        return Err(KernelError::invalid(
            "rows",
            format!(
                "{} ..= {} ({groups} groups of {group})",
                (groups.max(1) - 1) * group + 1,
                groups * group
            ),
            rows,
        ));
    }
    check_same("scale", [groups, 1, cols], scale)?;
    check_same("min", [groups, 1, cols], min)?;
    Ok(per)
}

/// Checks `w_gate` and `w_up` `[k, inter]` against `x` `[m, k]` and each other
/// ([`KernelOps::skinny_swiglu`](crate::LinearOps::skinny_swiglu)).
///
/// # Errors
/// [`KernelError::Shape`] naming `w_gate` or `w_up`.
pub fn check_swiglu(x: [usize; 2], w_gate: [usize; 2], w_up: [usize; 2]) -> Result<()> {
    if w_gate[0] != x[1] {
        return Err(KernelError::Shape {
            name: "w_gate",
            expected: vec![x[1], w_gate[1]],
            found: w_gate.to_vec(),
        });
    }
    check_same("w_up", w_gate, w_up)
}

/// Checks `w` `[k, n]` and `bias` `[n]` against `x` `[m, k]` ([`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear)).
///
/// # Errors
/// [`KernelError::Shape`] naming `w` or `bias`.
pub fn check_skinny(x: [usize; 2], w: [usize; 2], bias: Option<[usize; 1]>) -> Result<()> {
    if w[0] != x[1] {
        return Err(KernelError::Shape {
            name: "w",
            expected: vec![x[1], w[1]],
            found: w.to_vec(),
        });
    }
    if let Some(b) = bias {
        check_same("bias", [w[1]], b)?;
    }
    Ok(())
}

/// Checks `weight` `[hidden]` against `x` `[batch, n, hidden]` and `eps`
/// ([`KernelOps::rms_norm`](crate::ElementwiseOps::rms_norm)).
///
/// # Errors
/// [`KernelError::Shape`] naming `weight`; [`KernelError::InvalidInput`] naming `eps` when it
/// is negative or not finite.
pub fn check_rms_norm(x: [usize; 3], weight: [usize; 1], eps: f64) -> Result<()> {
    if !eps.is_finite() || eps < 0.0 {
        return Err(KernelError::invalid("eps", "a finite value >= 0", eps));
    }
    if weight[0] != x[2] {
        return Err(KernelError::Shape {
            name: "weight",
            expected: vec![x[2]],
            found: weight.to_vec(),
        });
    }
    Ok(())
}

/// Checks that `found` has the shape `expected` ([`KernelOps::silu_mul`](crate::ElementwiseOps::silu_mul)).
///
/// # Errors
/// [`KernelError::Shape`] naming the argument.
pub fn check_same<const D: usize>(
    name: &'static str,
    expected: [usize; D],
    found: [usize; D],
) -> Result<()> {
    if expected != found {
        return Err(KernelError::Shape {
            name,
            expected: expected.to_vec(),
            found: found.to_vec(),
        });
    }
    Ok(())
}

/// Checks the RoPE tables `[batch, 1, n, head_dim]` against `x` `[batch, heads, n,
/// head_dim]` and that `head_dim` is even ([`KernelOps::rope`](crate::ElementwiseOps::rope)).
///
/// # Errors
/// [`KernelError::Shape`] naming `cos` or `sin`; [`KernelError::InvalidInput`] naming `x`.
pub fn check_rope(x: [usize; 4], cos: [usize; 4], sin: [usize; 4]) -> Result<()> {
    let [b, _, n, d] = x;
    if d % 2 != 0 {
        return Err(KernelError::invalid("x", "an even head_dim", d));
    }
    check_same("cos", [b, 1, n, d], cos)?;
    check_same("sin", [b, 1, n, d], sin)
}

/// Checks [`KernelOps::fold_rows`](crate::SelectionOps::fold_rows)'s arguments against `rows` `[batch, kv_heads, n, len]`.
///
/// # Errors
/// [`KernelError::InvalidInput`] naming the first argument that does not match.
pub fn check_fold(
    hist: Option<[usize; 3]>,
    factor: &[f32],
    rows: [usize; 4],
    w: &[f32],
    own: &[f32],
    all: &[f32],
) -> Result<()> {
    let [b, kvh, n, l] = rows;
    if let Some(h) = hist {
        if h != [b, kvh, l] {
            return Err(KernelError::invalid(
                "hist",
                format!("[{b}, {kvh}, {l}] (rows' batch, kv_heads, len)"),
                format!("{h:?}"),
            ));
        }
    }
    for (name, got, want) in [
        ("factor", factor.len(), b),
        ("w", w.len(), b * n),
        ("own", own.len(), kvh),
        ("all", all.len(), kvh),
    ] {
        if got != want {
            return Err(KernelError::invalid(
                name,
                format!("{want} values (rows {rows:?})"),
                got,
            ));
        }
    }
    Ok(())
}

/// Checks [`KernelOps::mix_scores`](crate::SelectionOps::mix_scores)'s arguments for `batch` sequences.
///
/// # Errors
/// [`KernelError::InvalidInput`] naming the first argument that does not match.
pub fn check_mix(
    batch: usize,
    la: Option<[usize; 2]>,
    free: &[(usize, usize)],
    alpha: f32,
) -> Result<()> {
    if free.len() != batch {
        return Err(KernelError::invalid(
            "free",
            format!("{batch} ranges (one per sequence)"),
            free.len(),
        ));
    }
    if let Some((b, &(lo, hi))) = free.iter().enumerate().find(|(_, r)| r.0 > r.1) {
        return Err(KernelError::invalid(
            "free",
            format!("lo <= hi (sequence {b})"),
            format!("({lo}, {hi})"),
        ));
    }
    if let Some([lb, _]) = la {
        if lb != batch {
            return Err(KernelError::invalid("la", format!("batch {batch}"), lb));
        }
    }
    if !(0.0..=1.0).contains(&alpha) {
        return Err(KernelError::invalid("alpha", "a weight in [0, 1]", alpha));
    }
    Ok(())
}

/// Checks a head list for [`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores).
///
/// # Errors
/// [`KernelError::InvalidInput`] naming `heads`.
pub fn check_heads(heads: &[usize], q_heads: usize) -> Result<()> {
    if heads.is_empty() {
        return Err(KernelError::invalid("heads", "at least one head", 0));
    }
    for (i, &h) in heads.iter().enumerate() {
        if h >= q_heads {
            return Err(KernelError::invalid(
                "heads",
                format!("heads < {q_heads}"),
                h,
            ));
        }
        if heads[..i].contains(&h) {
            return Err(KernelError::invalid("heads", "distinct heads", h));
        }
    }
    Ok(())
}

/// Checks the keep rule and the scores' shape for [`KernelOps::top_k_positions`](crate::SelectionOps::top_k_positions); returns
/// `(counts, k)`.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::InvalidInput`].
pub fn check_top_k(
    scores: [usize; 3],
    ctx_lens: &[usize],
    keep: Keep,
) -> Result<(Vec<usize>, usize)> {
    let [b, h, c] = scores;
    let cmax = ctx_lens.iter().copied().max().unwrap_or(0);
    if b != ctx_lens.len() || c < cmax {
        return Err(KernelError::Shape {
            name: "scores",
            expected: vec![ctx_lens.len(), h, cmax],
            found: scores.to_vec(),
        });
    }
    if keep.budget == 0 {
        return Err(KernelError::invalid("budget", "at least 1", 0));
    }
    // saturating: a sum past usize::MAX is refused, not wrapped to a small one
    if keep.budget < keep.always_kept() {
        return Err(KernelError::invalid(
            "budget",
            format!("at least n_sink + window = {}", keep.always_kept_exact()),
            keep.budget,
        ));
    }
    let counts: Vec<usize> = ctx_lens.iter().map(|&l| l.min(keep.budget)).collect();
    let k = counts.iter().copied().max().unwrap_or(0);
    Ok((counts, k))
}

/// Checks `page_size` and the contexts for the Quest ops; returns the number of pages.
///
/// # Errors
/// [`KernelError::InvalidInput`].
pub fn check_pages(
    ctx_lens: &[usize],
    batch: usize,
    capacity: usize,
    page_size: usize,
) -> Result<usize> {
    if page_size == 0 {
        return Err(KernelError::invalid("page_size", "at least 1", 0));
    }
    if ctx_lens.len() != batch {
        return Err(KernelError::invalid(
            "ctx_lens",
            format!("{batch} lengths"),
            ctx_lens.len(),
        ));
    }
    let c = ctx_lens.iter().copied().max().unwrap_or(0);
    if c > capacity {
        return Err(KernelError::invalid(
            "ctx_lens",
            format!("at most the capacity {capacity}"),
            c,
        ));
    }
    Ok(c.div_ceil(page_size).max(1))
}

/// Checks a call of [`KernelOps::quest_page_scores`](crate::SelectionOps::quest_page_scores):
/// `q` `[batch, q_heads, n_new, head_dim]` with `n_new >= 1`, bounds `kmin` and `kmax` of one
/// shape `[batch, kv_heads, pages, head_dim]` with `q_heads` a multiple of `kv_heads`, and
/// `pages` at least the pages of the longest context (`ctx_lens`, one per sequence).
/// Returns `pages`.
///
/// # Errors
/// [`KernelError::Shape`] for bounds of another batch, head width or shape than `q` and
/// each other; [`KernelError::InvalidInput`] naming `q` for its heads or `n_new`, and as
/// [`check_pages`], or naming `kmin` when it has fewer pages than the contexts need.
pub fn check_quest_scores(
    q: [usize; 4],
    kmin: [usize; 4],
    kmax: [usize; 4],
    ctx_lens: &[usize],
    page_size: usize,
) -> Result<usize> {
    let [b, hq, n, d] = q;
    let [kb, kvh, pages, kd] = kmin;
    if kb != b || kd != d || kvh == 0 || kmax != kmin {
        return Err(KernelError::Shape {
            name: "kmin/kmax",
            expected: vec![b, kvh.max(1), pages, d],
            found: kmax.to_vec(),
        });
    }
    if hq % kvh != 0 || n == 0 {
        return Err(KernelError::invalid(
            "q",
            format!("heads a multiple of {kvh}, n_new >= 1"),
            format!("{hq} heads, n_new {n}"),
        ));
    }
    let need = check_pages(ctx_lens, b, usize::MAX, page_size)?;
    if need > pages {
        return Err(KernelError::invalid(
            "kmin",
            format!("at least {need} pages"),
            pages,
        ));
    }
    Ok(pages)
}
