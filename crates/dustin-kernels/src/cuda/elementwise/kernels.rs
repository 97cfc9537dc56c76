//! RMSNorm (with the residual add), the SwiGLU product, RoPE and dequantization.

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::prelude::*;

/// Threads per block of the element-wise and row kernels below.
pub const ELEM_THREADS: usize = 256;

/// RMSNorm, one block per row of `x` `[rows, hidden]` (any strides: element `(r, c)` at `r
/// ldx0 + c ldx1`; array arguments with the strides as scalars, as the skinny GEMMs, which
/// saves the per-launch upload of tensor metadata): the sum of squares in
/// f32 (each warp's partial sums added across its lanes, then the 8 warp sums in shared
/// memory), then
/// `out = dtype(x * inv) * weight` in the dtype (HF `Qwen2RMSNorm`'s order).
#[cube(launch)]
pub fn rms_norm_kernel<F: Float>(
    x: &Array<F>,
    w: &Array<F>,
    out: &mut Array<F>,
    ldx0: u32,
    ldx1: u32,
    ldw: u32,
    eps: f32,
    inv_hidden: f32,
    #[comptime] hidden: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = CUBE_POS_X as usize;
    let tid = UNIT_POS as usize;
    let mut part = SharedMemory::<f32>::new(ELEM_THREADS / 32);
    let base = row * ldx0 as usize;
    let mut s = 0.0f32;
    let mut c = tid;
    while c < hidden {
        let v = f32::cast_from(x[base + c * ldx1 as usize]);
        s += v * v;
        c += ELEM_THREADS;
    }
    // one sum per warp (plane of 32 lanes), then every thread adds the 8 warp sums
    let ws = plane_sum(s);
    let lane = tid % 32;
    if lane == 0 {
        part[tid / 32] = ws;
    }
    sync_cube();
    let mut total = 0.0f32;
    for w in 0..ELEM_THREADS / 32 {
        total += part[w];
    }
    let inv = 1.0f32 / (total * inv_hidden + eps).sqrt();
    let mut c = tid;
    while c < hidden {
        let v = f32::cast_from(x[base + c * ldx1 as usize]);
        let t = F::cast_from(v * inv);
        out[row * hidden + c] = t * w[c * ldw as usize];
        c += ELEM_THREADS;
    }
}

/// Residual add and RMSNorm of one row (one block per row): `s = a + x` rounded to `F` and
/// written to `sum`, then `out = F(s * inv) * w` with `inv` from the mean of the rounded
/// `s^2` in f32 (as [`rms_norm_kernel`] over the stored sum). Each thread reads back only the
/// sums it wrote itself. `a`, `x` rows and columns `lda0`, `lda1` and `ldx0`, `ldx1` apart;
/// array arguments (as [`rms_norm_kernel`]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_kernel<F: Float>(
    a: &Array<F>,
    x: &Array<F>,
    w: &Array<F>,
    sum: &mut Array<F>,
    out: &mut Array<F>,
    lda0: u32,
    lda1: u32,
    ldx0: u32,
    ldx1: u32,
    ldw: u32,
    eps: f32,
    inv_hidden: f32,
    #[comptime] hidden: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = CUBE_POS_X as usize;
    let tid = UNIT_POS as usize;
    let mut part = SharedMemory::<f32>::new(ELEM_THREADS / 32);
    let abase = row * lda0 as usize;
    let xbase = row * ldx0 as usize;
    let mut s = 0.0f32;
    let mut c = tid;
    while c < hidden {
        let t = a[abase + c * lda1 as usize] + x[xbase + c * ldx1 as usize];
        sum[row * hidden + c] = t;
        let v = f32::cast_from(t);
        s += v * v;
        c += ELEM_THREADS;
    }
    let ws = plane_sum(s);
    let lane = tid % 32;
    if lane == 0 {
        part[tid / 32] = ws;
    }
    sync_cube();
    let mut total = 0.0f32;
    for wi in 0..ELEM_THREADS / 32 {
        total += part[wi];
    }
    let inv = 1.0f32 / (total * inv_hidden + eps).sqrt();
    let mut c = tid;
    while c < hidden {
        let v = f32::cast_from(sum[row * hidden + c]);
        let t = F::cast_from(v * inv);
        out[row * hidden + c] = t * w[c * ldw as usize];
        c += ELEM_THREADS;
    }
}

/// `out = dtype(silu(gate)) * up` element-wise over `[rows, cols]` (any strides; `out`
/// contiguous), `silu` in f32.
#[cube(launch)]
pub fn silu_mul_kernel<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    out: &mut Tensor<F>,
    total: u32,
    #[comptime] cols: usize,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let r = i / cols;
        let c = i % cols;
        let g = f32::cast_from(gate[r * gate.stride(0) + c * gate.stride(1)]);
        let s = F::cast_from(g / (1.0f32 + (-g).exp()));
        out[i] = s * up[r * up.stride(0) + c * up.stride(1)];
    }
}

/// Rotate-half RoPE element-wise: `out[b, h, t, i] = x[i] cos[i] + x[i +- d/2] sin[i]` in the
/// dtype, `x` `[batch, heads, n, d]` (any strides: `x0 .. x3`), `cos` / `sin` `[batch, 1, n,
/// d]` (`sin` signed; strides of dims 0, 2, 3 given), `out` contiguous. Array arguments with
/// the strides as scalars (as [`rms_norm_kernel`]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn rope_kernel<F: Float>(
    x: &Array<F>,
    cos: &Array<F>,
    sin: &Array<F>,
    out: &mut Array<F>,
    x0: u32,
    x1: u32,
    x2: u32,
    x3: u32,
    cos0: u32,
    cos2: u32,
    cos3: u32,
    sin0: u32,
    sin2: u32,
    sin3: u32,
    total: u32,
    heads: u32,
    n: u32,
    #[comptime] d: usize,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let half = comptime![d / 2];
        let c = i % d;
        let t = (i / d) % (n as usize);
        let h = (i / (d * n as usize)) % (heads as usize);
        let b = i / (d * n as usize * heads as usize);
        let xb = b * x0 as usize + h * x1 as usize + t * x2 as usize;
        let mut other = c + half;
        if c >= half {
            other = c - half;
        }
        let tb = b * cos0 as usize + t * cos2 as usize + c * cos3 as usize;
        let sb = b * sin0 as usize + t * sin2 as usize + c * sin3 as usize;
        let a = x[xb + c * x3 as usize] * cos[tb];
        let r = x[xb + other * x3 as usize] * sin[sb];
        out[i] = a + r;
    }
}

/// Dequantization of a packed matrix, one thread per output element `(r, c)` of `[rows,
/// cols]`: the code is bits `k * bits ..` of word `(g, r_in_group / per, c)`; `out = code *
/// scale + min` in the dtype (each op rounded, as the plain path's).
#[cube(launch)]
pub fn dequant_kernel<F: Float, I: Int>(
    words: &Tensor<I>,
    scale: &Tensor<F>,
    min: &Tensor<F>,
    out: &mut Tensor<F>,
    total: u32,
    bits: u32,
    #[comptime] cols: usize,
    #[comptime] group: usize,
    #[comptime] per: usize,
    #[comptime] wpg: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let r = i / cols;
        let c = i % cols;
        let g = r / group;
        let rr = r % group;
        let w = rr / per;
        let k = rr % per;
        let word = u32::cast_from(words[(g * wpg + w) * cols + c]);
        let mask = (1u32 << bits) - 1u32;
        let code = (word >> (k as u32 * bits)) & mask;
        let q = F::cast_from(code);
        out[i] = q * scale[g * cols + c] + min[g * cols + c];
    }
}
