//! The skinny GEMMs' split reductions: the reduce kernels and the fused tail (`split_tail`).

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::prelude::*;

#[cfg(doc)]
use super::*;

/// Sum of the skinny GEMM's partial products over the splits, plus the bias, rounded once:
/// `out[m, c] = dtype(sum_s part[s, m, c] + bias[c])`, one thread per output element. All
/// contiguous, passed as arrays (no per-launch metadata upload; [`skinny_gemm_kernel`]).
#[cube(launch)]
pub fn skinny_reduce_kernel<F: Float>(
    part: &Array<f32>,
    bias: &Array<F>,
    out: &mut Array<F>,
    total: u32,
    n: u32,
    splits: u32,
    #[comptime] has_bias: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let mut s = 0.0f32;
        for sp in 0..splits as usize {
            s += part[sp * total as usize + i];
        }
        if has_bias {
            s += f32::cast_from(bias[i % n as usize]);
        }
        out[i] = F::cast_from(s);
    }
}

/// `out [m, n]` (contiguous, `total = m * n`) filled with `bias [n]` on every row, one thread
/// per element: the starting value of the cuBLAS GEMM that adds its product into it
/// (`beta = 1`, [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear)).
#[cube(launch)]
pub fn broadcast_rows_kernel<F: Float>(
    bias: &Tensor<F>,
    out: &mut Tensor<F>,
    total: u32,
    n: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        out[i] = bias[(i % n as usize) * bias.stride(0)];
    }
}

/// The sums of three skinny GEMMs sharing `part [splits, m, ldp]` (columns `0 .. n0`, `n0 ..
/// n0 + n1`, `n0 + n1 .. ldp`), each plus its bias and rounded once into `out0 [m, n0]`,
/// `out1 [m, n1]`, `out2 [m, ldp - n0 - n1]` (contiguous), one thread per element of `[m,
/// ldp]`; as [`skinny_reduce_kernel`] per weight.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn skinny_reduce3_kernel<F: Float>(
    part: &Array<f32>,
    b0: &Array<F>,
    b1: &Array<F>,
    b2: &Array<F>,
    out0: &mut Array<F>,
    out1: &mut Array<F>,
    out2: &mut Array<F>,
    total: u32,
    ldp: u32,
    n0: u32,
    n1: u32,
    splits: u32,
    #[comptime] bias0: bool,
    #[comptime] bias1: bool,
    #[comptime] bias2: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let mut s = 0.0f32;
        for sp in 0..splits as usize {
            s += part[sp * total as usize + i];
        }
        let r = i / ldp as usize;
        let c = i % ldp as usize;
        let e0 = n0 as usize;
        let e1 = (n0 + n1) as usize;
        if c < e0 {
            if bias0 {
                s += f32::cast_from(b0[c]);
            }
            out0[r * e0 + c] = F::cast_from(s);
        } else if c < e1 {
            let cc = c - e0;
            if bias1 {
                s += f32::cast_from(b1[cc]);
            }
            out1[r * n1 as usize + cc] = F::cast_from(s);
        } else {
            let cc = c - e1;
            let n2 = ldp as usize - e1;
            if bias2 {
                s += f32::cast_from(b2[cc]);
            }
            out2[r * n2 + cc] = F::cast_from(s);
        }
    }
}

/// SwiGLU from two skinny GEMMs sharing `part [splits, m, 2 inter]` (gate at columns `0 ..
/// inter`, up at `inter .. 2 inter`): `out[r, c] = dtype(silu(gate)) * up` `[m, inter]`
/// (contiguous), with `gate` and `up` each summed in f32 and rounded once to the dtype first,
/// silu in f32 (as [`skinny_reduce_kernel`] then `silu_mul_kernel` in `cuda::elementwise`); one thread per output.
#[cube(launch)]
pub fn skinny_reduce_swiglu_kernel<F: Float>(
    part: &Array<f32>,
    out: &mut Array<F>,
    total: u32,
    inter: u32,
    splits: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let w = inter as usize;
        let r = i / w;
        let c = i % w;
        let rows = total as usize / w;
        let mut sg = 0.0f32;
        let mut su = 0.0f32;
        for sp in 0..splits as usize {
            let base = (sp * rows + r) * 2 * w;
            sg += part[base + c];
            su += part[base + w + c];
        }
        let g = f32::cast_from(F::cast_from(sg));
        let up = F::cast_from(su);
        let act = F::cast_from(g / (1.0f32 + (-g).exp()));
        out[i] = act * up;
    }
}

/// Where a skinny GEMM launch leaves its sums: [`SPLIT_PARTIALS`] (only `part`, finished by
/// a reduce kernel) or, finished inside the launch by [`split_tail`], [`SPLIT_OUTPUTS`] (each
/// weight's own `[m, n_i]` output plus its bias) or [`SPLIT_SWIGLU`] (SwiGLU of the two
/// weights, gate and up, into `[m, n]`).
pub const SPLIT_PARTIALS: u32 = 0;
/// See [`SPLIT_PARTIALS`].
pub const SPLIT_OUTPUTS: u32 = 1;
/// See [`SPLIT_PARTIALS`].
pub const SPLIT_SWIGLU: u32 = 2;

/// `__threadfence()`: orders this thread's global-memory writes before its later ones for
/// every thread of the device (PTX `fence.sc.gpu`; CUDA C++ Programming Guide, "Memory Fence
/// Functions", whose example is this use: the last block of a grid reads what the others
/// wrote). cubecl 0.10's frontend has no fence (its C++ compiler knows
/// `Instruction::ThreadFence` but nothing emits it), and it writes a comment that has a line
/// break as `/* ... */`, so this comment closes itself, puts the fence on its own line and
/// opens a comment again. The GPU check of the fused split reduction (`dustin-kernels-gpu
/// check --op skinny`) is what shows it in effect.
#[cube]
fn grid_fence() {
    comment!("grid fence (cubecl 0.10 has no frontend for it)\n*/ __threadfence(); /*");
}

/// The split reduction of a skinny GEMM inside its own launch (one launch where a GEMM and
/// a reduce kernel took two). Called by every block after its partial sums are in `part
/// [splits, m, ldp]` (f32) and its block-wide barrier: the block counts itself in
/// `counters[slot]` (zero before the launch), and the block that completes the count (the
/// last of the slot's `splits` blocks, `2 splits` with [`SPLIT_SWIGLU`], where the gate's and
/// the up projection's tile `tile` share a slot) sums the slot's columns over the splits and
/// writes them as the matching reduce kernel does, then sets the counter back to zero for the
/// next launch. The writes before the count and the reads after it are ordered by
/// [`grid_fence`] (the "last block" pattern of the CUDA C++ Programming Guide, "Memory Fence
/// Functions").
///
/// - [`SPLIT_OUTPUTS`]: columns `tile * cols .. + cols` (below `n`) of weight `wi`, which
///   start at column `coff` of `part`, into `out_wi [m, n]` as `dtype(sum + bias_wi)`
///   (`bias_mask` bit `i`: weight `i` has a bias), as [`skinny_reduce_kernel`] and
///   [`skinny_reduce3_kernel`];
/// - [`SPLIT_SWIGLU`]: columns `c` of that range of the gate (`part` columns `0 .. n`) and
///   up (`n .. 2 n`), `out0[r, c] = dtype(silu(dtype(gate))) * dtype(up)`, as
///   [`skinny_reduce_swiglu_kernel`].
///
/// Uniform over the block; `threads` is the block's size.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn split_tail<F: Float>(
    part: &Array<f32>,
    counters: &mut Array<Atomic<u32>>,
    out0: &mut Array<F>,
    out1: &mut Array<F>,
    out2: &mut Array<F>,
    b0: &Array<F>,
    b1: &Array<F>,
    b2: &Array<F>,
    bias_mask: u32,
    slot: usize,
    wi: usize,
    tile: usize,
    n: usize,
    coff: usize,
    rows: usize,
    ldp: usize,
    splits: usize,
    tid: usize,
    #[comptime] cols: usize,
    #[comptime] threads: usize,
    #[comptime] mode: u32,
) {
    let mut flag = SharedMemory::<u32>::new(1usize);
    if tid == 0 {
        // this block's partial sums (every thread's, ordered before this one's by the
        // caller's barrier) before its count
        grid_fence();
        let mut expect = splits as u32;
        if comptime![mode == SPLIT_SWIGLU] {
            expect = 2u32 * splits as u32;
        }
        let old = counters[slot].fetch_add(1u32);
        let mut last = 0u32;
        if old + 1u32 == expect {
            last = 1u32;
            counters[slot].store(0u32);
        }
        // the count before the other blocks' partial sums are read
        grid_fence();
        flag[0] = last;
    }
    sync_cube();
    if flag[0] == 1u32 {
        // 8 consecutive columns a thread and step (`n` and the tile start are multiples of 8,
        // so a group is all inside `n` or all past it): 8 (SwiGLU: 16) independent loads a
        // split in flight, where one column a step left the block waiting on one load chain
        // per element (40 rows of a 128-column tile: 40 steps of 128 threads)
        let cbase = tile * cols;
        let groups = comptime![cols / 8];
        let mut e = tid;
        while e < rows * groups {
            let r = e / groups;
            let c = cbase + (e % groups) * 8usize;
            if c < n {
                if comptime![mode == SPLIT_SWIGLU] {
                    let mut sg = Array::<f32>::new(8usize);
                    let mut su = Array::<f32>::new(8usize);
                    #[unroll]
                    for j in 0..8usize {
                        sg[j] = 0.0f32;
                        su[j] = 0.0f32;
                    }
                    // four splits a step: their loads are independent, so all are in
                    // flight before the sums wait on them
                    let mut sp = 0usize;
                    while sp + 4usize <= splits {
                        #[unroll]
                        for u in 0..4usize {
                            let base = ((sp + u) * rows + r) * ldp + c;
                            #[unroll]
                            for j in 0..8usize {
                                sg[j] += part[base + j];
                                su[j] += part[base + n + j];
                            }
                        }
                        sp += 4usize;
                    }
                    while sp < splits {
                        let base = (sp * rows + r) * ldp + c;
                        #[unroll]
                        for j in 0..8usize {
                            sg[j] += part[base + j];
                            su[j] += part[base + n + j];
                        }
                        sp += 1usize;
                    }
                    #[unroll]
                    for j in 0..8usize {
                        let g = f32::cast_from(F::cast_from(sg[j]));
                        let up = F::cast_from(su[j]);
                        let act = F::cast_from(g / (1.0f32 + (-g).exp()));
                        out0[r * n + c + j] = act * up;
                    }
                } else {
                    let mut acc = Array::<f32>::new(8usize);
                    #[unroll]
                    for j in 0..8usize {
                        acc[j] = 0.0f32;
                    }
                    // four splits a step, as above
                    let mut sp = 0usize;
                    while sp + 4usize <= splits {
                        #[unroll]
                        for u in 0..4usize {
                            let base = ((sp + u) * rows + r) * ldp + coff + c;
                            #[unroll]
                            for j in 0..8usize {
                                acc[j] += part[base + j];
                            }
                        }
                        sp += 4usize;
                    }
                    while sp < splits {
                        let base = (sp * rows + r) * ldp + coff + c;
                        #[unroll]
                        for j in 0..8usize {
                            acc[j] += part[base + j];
                        }
                        sp += 1usize;
                    }
                    if wi == 0 {
                        let hb = bias_mask % 2u32 == 1u32;
                        #[unroll]
                        for j in 0..8usize {
                            let mut v = acc[j];
                            if hb {
                                v += f32::cast_from(b0[c + j]);
                            }
                            out0[r * n + c + j] = F::cast_from(v);
                        }
                    } else if wi == 1 {
                        let hb = (bias_mask / 2u32) % 2u32 == 1u32;
                        #[unroll]
                        for j in 0..8usize {
                            let mut v = acc[j];
                            if hb {
                                v += f32::cast_from(b1[c + j]);
                            }
                            out1[r * n + c + j] = F::cast_from(v);
                        }
                    } else {
                        let hb = (bias_mask / 4u32) % 2u32 == 1u32;
                        #[unroll]
                        for j in 0..8usize {
                            let mut v = acc[j];
                            if hb {
                                v += f32::cast_from(b2[c + j]);
                            }
                            out2[r * n + c + j] = F::cast_from(v);
                        }
                    }
                }
            }
            e += comptime![threads];
        }
    }
}
