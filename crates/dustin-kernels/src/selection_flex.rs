//! [`SelectionOps`] on [`Flex`]: the head-subset scores, the `dustin` estimator's fold and
//! mix, Quest's page scores and the top-k of [`crate::cpu_scores`] on the f32 storage of
//! Burn-flex tensors (Quest's page bounds take the plain path).

use burn_flex::Flex;
use burn_tensor::{Int, Tensor, TensorData};

use crate::attn_flex::{prim, readable, strided, tensor};
use crate::cpu_attn::Shape;
use crate::cpu_scores;
use crate::quant_flex::host_f32;
use crate::{EstimatorKernels, Keep, KernelError, Positions, Result, SelectionOps};

impl SelectionOps for burn_flex::Flex {
    const SELECTION_KERNELS: bool = true;

    fn estimator_kernels(_device: &Self::Device) -> EstimatorKernels {
        EstimatorKernels::ALL
    }

    fn top_k_positions(
        scores: Tensor<Self, 3>,
        ctx_lens: &[usize],
        keep: Keep,
    ) -> Result<Positions<Self>> {
        top_k_positions(scores, ctx_lens, keep)
    }

    fn fold_rows(
        hist: Option<Tensor<Self, 3>>,
        factor: &[f32],
        rows: Tensor<Self, 4>,
        w: &[f32],
        own: &[f32],
        all: &[f32],
    ) -> Result<Tensor<Self, 3>> {
        fold_rows(hist, factor, rows, w, own, all)
    }

    fn mix_scores(
        hist: Tensor<Self, 3>,
        la: Option<Tensor<Self, 2>>,
        free: &[(usize, usize)],
        alpha: f32,
        width: usize,
    ) -> Result<Tensor<Self, 3>> {
        mix_scores(hist, la, free, alpha, width)
    }

    fn head_subset_scores(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        heads: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 3>> {
        let (v, [b, h, _, l]) = head_subset_scores(q, k, ctx_lens, heads, scale, false)?;
        Ok(tensor(v, [b, h, l]))
    }

    fn head_subset_row_scores(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        heads: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        let (v, shape) = head_subset_scores(q, k, ctx_lens, heads, scale, true)?;
        Ok(tensor(v, shape))
    }

    fn quest_page_scores(
        q: Tensor<Self, 4>,
        kmin: Tensor<Self, 4>,
        kmax: Tensor<Self, 4>,
        ctx_lens: &[usize],
        page_size: usize,
    ) -> Result<Tensor<Self, 3>> {
        quest_page_scores(q, kmin, kmax, ctx_lens, page_size)
    }
}

/// [`KernelOps::quest_page_scores`](crate::SelectionOps::quest_page_scores) on the CPU
/// ([`cpu_scores::quest_page_scores`]): f32 `[batch, kv_heads, pages]`.
///
/// # Errors
/// As the trait method: [`crate::check_quest_scores`].
fn quest_page_scores(
    q: Tensor<Flex, 4>,
    kmin: Tensor<Flex, 4>,
    kmax: Tensor<Flex, 4>,
    ctx_lens: &[usize],
    page_size: usize,
) -> Result<Tensor<Flex, 3>> {
    let [b, q_heads, n_new, head_dim] = q.dims();
    let kv_heads = kmin.dims()[1];
    let pages = crate::check_quest_scores(q.dims(), kmin.dims(), kmax.dims(), ctx_lens, page_size)?;
    let qs = host_f32(prim(q));
    let (lo, hi) = (readable(prim(kmin)), readable(prim(kmax)));
    let (Some(lo_view), Some(hi_view)) = (strided(&lo), strided(&hi)) else {
        return Err(KernelError::Unsupported(
            "page bounds of this layout".into(),
        ));
    };
    let shape = Shape {
        batch: b,
        q_heads,
        kv_heads,
        n_new,
        head_dim,
    };
    let out = cpu_scores::quest_page_scores(
        qs.as_slice::<f32>().unwrap_or(&[]),
        [lo_view, hi_view],
        shape,
        pages,
        ctx_lens,
        page_size,
    );
    Ok(tensor(out, [b, kv_heads, pages]))
}

/// [`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores) (`per_row`
/// false) and [`KernelOps::head_subset_row_scores`](crate::SelectionOps::head_subset_row_scores)
/// (`per_row` true) on the CPU ([`cpu_scores::head_subset_scores`]): the values and
/// `[batch, kv_heads, n_new, capacity]` (`n_new` summed away when `per_row` is false).
///
/// # Errors
/// As the trait methods: [`crate::check_attn`], [`crate::check_heads`].
pub(crate) fn head_subset_scores(
    q: Tensor<Flex, 4>,
    k: Tensor<Flex, 4>,
    ctx_lens: &[usize],
    heads: &[usize],
    scale: f32,
    per_row: bool,
) -> Result<(Vec<f32>, [usize; 4])> {
    let dims = crate::check_attn(q.dims(), k.dims(), ctx_lens)?;
    crate::check_heads(heads, dims.q_heads)?;
    let qs = host_f32(prim(q));
    let ks = readable(prim(k));
    let Some(kv) = strided(&ks) else {
        return Err(KernelError::Unsupported(
            "cache views of this layout".into(),
        ));
    };
    let shape = Shape::from(dims);
    let q_host = qs.as_slice::<f32>().unwrap_or(&[]);
    let out = cpu_scores::head_subset_scores(
        q_host,
        kv,
        shape,
        ctx_lens,
        heads,
        scale,
        cpu_scores::Layout {
            width: dims.capacity,
            per_row,
        },
    );
    Ok((out, [dims.batch, dims.kv_heads, dims.n_new, dims.capacity]))
}

/// [`KernelOps::fold_rows`](crate::SelectionOps::fold_rows) on the CPU
/// ([`cpu_scores::fold_rows`]).
///
/// # Errors
/// As [`crate::check_fold`].
pub(crate) fn fold_rows(
    hist: Option<Tensor<Flex, 3>>,
    factor: &[f32],
    rows: Tensor<Flex, 4>,
    w: &[f32],
    own: &[f32],
    all: &[f32],
) -> Result<Tensor<Flex, 3>> {
    let dims = rows.dims();
    crate::check_fold(hist.as_ref().map(Tensor::dims), factor, dims, w, own, all)?;
    let rows = host_f32(prim(rows));
    let hist = hist.map(|h| host_f32(prim(h)));
    let out = cpu_scores::fold_rows(
        hist.as_ref().and_then(|h| h.as_slice::<f32>()),
        factor,
        rows.as_slice::<f32>().unwrap_or(&[]),
        dims,
        w,
        own,
        all,
    );
    Ok(tensor(out, [dims[0], dims[1], dims[3]]))
}

/// [`KernelOps::mix_scores`](crate::SelectionOps::mix_scores) on the CPU
/// ([`cpu_scores::mix_scores`]).
///
/// # Errors
/// As [`crate::check_mix`].
pub(crate) fn mix_scores(
    hist: Tensor<Flex, 3>,
    la: Option<Tensor<Flex, 2>>,
    free: &[(usize, usize)],
    alpha: f32,
    width: usize,
) -> Result<Tensor<Flex, 3>> {
    let dims = hist.dims();
    crate::check_mix(dims[0], la.as_ref().map(Tensor::dims), free, alpha)?;
    let hist = host_f32(prim(hist));
    let la = la.map(|l| {
        let len = l.dims()[1];
        (host_f32(prim(l)), len)
    });
    let out = cpu_scores::mix_scores(
        hist.as_slice::<f32>().unwrap_or(&[]),
        dims,
        la.as_ref()
            .map(|(l, len)| (l.as_slice::<f32>().unwrap_or(&[]), *len)),
        free,
        alpha,
        width,
    );
    Ok(tensor(out, [dims[0], dims[1], width]))
}

/// [`KernelOps::top_k_positions`](crate::SelectionOps::top_k_positions) on the CPU
/// ([`cpu_scores::top_k`]).
///
/// # Errors
/// As [`crate::check_top_k`].
pub(crate) fn top_k_positions(
    scores: Tensor<Flex, 3>,
    ctx_lens: &[usize],
    keep: crate::Keep,
) -> Result<crate::Positions<Flex>> {
    let dims = scores.dims();
    let (counts, kk) = crate::check_top_k(dims, ctx_lens, keep)?;
    let s = host_f32(prim(scores));
    let idx = cpu_scores::top_k(s.as_slice::<f32>().unwrap_or(&[]), dims, ctx_lens, keep, kk);
    // through the backend's own conversion to its integer dtype, as the plain path
    let indices = Tensor::<Flex, 3, Int>::from_data(
        TensorData::new(idx, [dims[0], dims[1], kk]),
        &Default::default(),
    );
    Ok(crate::Positions { indices, counts })
}
