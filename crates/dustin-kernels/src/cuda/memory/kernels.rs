//! Buffer fills and KV cache writes.

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::prelude::*;

/// Fills a float tensor with `value` (used to poison outputs before a checked run).
#[cube(launch)]
pub fn fill_kernel<F: Float>(
    out: &mut Tensor<F>,
    value: f32,
    len: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < len as usize {
        out[i] = F::cast_from(value);
    }
}

/// Cache write of a ragged batch: one block per (new row `i`, KV head `h`, sequence `b`), one
/// thread per column: `dst[b, h, starts[b] + i, c] = src[b, h, i, c]`, both through their
/// strides (the cache is written in place).
#[cube(launch)]
pub fn kv_write_kernel<F: Float, I: Int>(
    src: &Tensor<F>,
    starts: &Tensor<I>,
    dst: &mut Tensor<F>,
    #[comptime] d: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let i = CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let c = UNIT_POS as usize;
    if c < d {
        let p = u32::cast_from(starts[b]) as usize + i;
        dst[b * dst.stride(0) + h * dst.stride(1) + p * dst.stride(2) + c * dst.stride(3)] =
            src[b * src.stride(0) + h * src.stride(1) + i * src.stride(2) + c * src.stride(3)];
    }
}

/// Element strides of [`kv_write_pair_kernel`]'s four tensors, `[batch, kv_heads, seq,
/// head_dim]` each (`sk`, `sv` the new keys and values, `dk`, `dv` the caches).
#[derive(CubeLaunch, CubeType)]
pub struct KvPairStrides {
    pub sk0: u32,
    pub sk1: u32,
    pub sk2: u32,
    pub sk3: u32,
    pub sv0: u32,
    pub sv1: u32,
    pub sv2: u32,
    pub sv3: u32,
    pub dk0: u32,
    pub dk1: u32,
    pub dk2: u32,
    pub dk3: u32,
    pub dv0: u32,
    pub dv1: u32,
    pub dv2: u32,
    pub dv3: u32,
}

/// Cache write of a layer's keys and values in one launch: one block per (new row `i`, KV
/// head `h`, sequence `b`), one thread per column: `dk[b, h, p + i, c] = sk[b, h, i, c]` and
/// `dv[..] = sv[..]` with `p = starts[b]` (`ragged`) or `start` (every sequence at the same
/// length: no `starts` upload). Array arguments, strides in `st` (no per-launch metadata
/// upload); the caches are written in place.
#[cube(launch)]
pub fn kv_write_pair_kernel<F: Float, I: Int>(
    sk: &Array<F>,
    sv: &Array<F>,
    starts: &Array<I>,
    dk: &mut Array<F>,
    dv: &mut Array<F>,
    st: &KvPairStrides,
    start: u32,
    #[comptime] ragged: bool,
    #[comptime] d: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let i = CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let c = UNIT_POS as usize;
    if c < d {
        let mut p = start as usize + i;
        if comptime![ragged] {
            p = u32::cast_from(starts[b]) as usize + i;
        }
        dk[b * st.dk0 as usize + h * st.dk1 as usize + p * st.dk2 as usize + c * st.dk3 as usize] =
            sk[b * st.sk0 as usize
                + h * st.sk1 as usize
                + i * st.sk2 as usize
                + c * st.sk3 as usize];
        dv[b * st.dv0 as usize + h * st.dv1 as usize + p * st.dv2 as usize + c * st.dv3 as usize] =
            sv[b * st.sv0 as usize
                + h * st.sv1 as usize
                + i * st.sv2 as usize
                + c * st.sv3 as usize];
    }
}

/// Element strides of [`rope_kv_write_kernel`]'s queries `q` `[batch, heads, n, d]` and RoPE
/// tables `cos` / `sin` `[batch, 1, n, d]` (dims 0, 2 and 3).
#[derive(CubeLaunch, CubeType)]
pub struct RopeStrides {
    pub q0: u32,
    pub q1: u32,
    pub q2: u32,
    pub q3: u32,
    pub c0: u32,
    pub c2: u32,
    pub c3: u32,
    pub s0: u32,
    pub s2: u32,
    pub s3: u32,
}

/// Rotate-half RoPE of a layer's new queries and keys and the cache write of its keys and
/// values in one launch: one block per (new row `i`, head `y` of `heads + kv_heads`, sequence
/// `b`), one thread per column `c`. Blocks `y < heads` write `qo[b, y, i, c] = q[c] cos[c] +
/// q[c +- d/2] sin[c]` (`qo` contiguous); blocks `y = heads + h` rotate key head `h` the same
/// way into `ko[b, h, i, c]` (contiguous) and `dk[b, h, p + i, c]`, and copy `dv[b, h, p + i,
/// c] = v[b, h, i, c]`, `p = starts[b]` (`ragged`) or `start`. `cos` holds `[cos, cos]` and
/// `sin` `[-sin, sin]` at each token's position (as `rope_kernel` takes them); the products
/// and their sum are rounded to the dtype as there. The caches are written in place.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write_kernel<F: Float, I: Int>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    cos: &Array<F>,
    sin: &Array<F>,
    starts: &Array<I>,
    qo: &mut Array<F>,
    ko: &mut Array<F>,
    dk: &mut Array<F>,
    dv: &mut Array<F>,
    rs: &RopeStrides,
    st: &KvPairStrides,
    heads: u32,
    start: u32,
    #[comptime] ragged: bool,
    #[comptime] d: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let i = CUBE_POS_X as usize;
    let y = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let c = UNIT_POS as usize;
    let n = CUBE_COUNT_X as usize;
    if c < d {
        let half = comptime![d / 2];
        let mut other = c + half;
        if c >= half {
            other = c - half;
        }
        let cs = cos[b * rs.c0 as usize + i * rs.c2 as usize + c * rs.c3 as usize];
        let sn = sin[b * rs.s0 as usize + i * rs.s2 as usize + c * rs.s3 as usize];
        let nh = heads as usize;
        if y < nh {
            let base = b * rs.q0 as usize + y * rs.q1 as usize + i * rs.q2 as usize;
            let a = q[base + c * rs.q3 as usize] * cs;
            let r = q[base + other * rs.q3 as usize] * sn;
            qo[((b * nh + y) * n + i) * d + c] = a + r;
        } else {
            let h = y - nh;
            let kvh = CUBE_COUNT_Y as usize - nh;
            let base = b * st.sk0 as usize + h * st.sk1 as usize + i * st.sk2 as usize;
            let a = k[base + c * st.sk3 as usize] * cs;
            let r = k[base + other * st.sk3 as usize] * sn;
            let kr = a + r;
            ko[((b * kvh + h) * n + i) * d + c] = kr;
            let mut p = start as usize + i;
            if comptime![ragged] {
                p = u32::cast_from(starts[b]) as usize + i;
            }
            dk[b * st.dk0 as usize
                + h * st.dk1 as usize
                + p * st.dk2 as usize
                + c * st.dk3 as usize] = kr;
            dv[b * st.dv0 as usize
                + h * st.dv1 as usize
                + p * st.dv2 as usize
                + c * st.dv3 as usize] = v[b * st.sv0 as usize
                + h * st.sv1 as usize
                + i * st.sv2 as usize
                + c * st.sv3 as usize];
        }
    }
}
