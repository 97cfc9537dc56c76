//! [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear) and
//! [`KernelOps::prefill_linear_many`](crate::LinearOps::prefill_linear_many) on CUDA through cuBLAS
//! (`cublasGemmEx`, reached through the `cudarc` bindings cubecl-cuda already links; the
//! library is loaded at run time, so nothing is needed at build time).
//!
//! cubecl-cuda 0.10 keeps its streams private, so the GEMM cannot be queued behind the
//! kernels that produce its inputs. Each call binds its buffers (which orders cubecl's stream
//! after any other stream that used them), waits for cubecl's queue to drain, runs the GEMM
//! on the legacy stream of the device's primary context (the context cubecl runs in) and
//! waits for it, then hands the output back to cubecl. Two host waits per call: worth it for
//! prefill chunks (milliseconds of GEMM each), not for decode steps (docs/decisions.md).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor};
use burn_tensor::{DType, Shape};
use cubecl::cuda::CudaRuntime;
use cudarc::cublas::{result as blas, sys};

use crate::cuda::{driver, empty, make_current, Ct, ELEM_THREADS};
use crate::{KernelError, Result};

/// One cuBLAS handle per device ordinal, made on first use and kept for the process (a
/// handle owns its workspace; making one costs milliseconds).
struct BlasHandle(sys::cublasHandle_t);

// SAFETY: a cuBLAS handle may be used from any thread as long as calls on it do not overlap
// (cuBLAS docs, "Thread Safety"); every use holds the table's lock.
unsafe impl Send for BlasHandle {}

static HANDLES: OnceLock<Mutex<HashMap<usize, BlasHandle>>> = OnceLock::new();

/// Whether `libcublas` loads on this machine (checked once).
pub(crate) fn available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library by its usual names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn blas_err(what: &str, e: impl std::fmt::Debug) -> KernelError {
    driver(&format!("cuBLAS {what}"), e)
}

/// How cuBLAS reads a row-major `[k, n]` weight given its strides: `(transpose, leading
/// dimension)`, or `None` when it must be copied first. Row-major `[k, n]` (strides
/// `[n, 1]`) is column-major `[n, k]`, the `W^T` the column-major product wants as is; a
/// transposed view of a row-major `[n, k]` (strides `[1, k]`) is column-major `[k, n]`.
fn weight_layout(w: &Ct, k: usize, n: usize) -> Option<(sys::cublasOperation_t, usize)> {
    let s = w.meta.strides();
    if (s[1] == 1 || n == 1) && s[0] >= n.max(1) {
        Some((sys::cublasOperation_t::CUBLAS_OP_N, s[0]))
    } else if (s[0] == 1 || k == 1) && s[1] >= k.max(1) {
        Some((sys::cublasOperation_t::CUBLAS_OP_T, s[1]))
    } else {
        None
    }
}

/// One weight's share of [`linear_many`]: the weight as cuBLAS reads it, and the output it
/// writes (the broadcast bias with `beta = 1`, or uninitialised with `beta = 0`).
struct Gemm {
    w: Ct,
    op_w: sys::cublasOperation_t,
    ldw: i32,
    n: usize,
    c: Ct,
    beta: f32,
}

/// `x [m, k] . w_i [k, n_i] (+ bias_i [n_i])` for each `(w_i, bias_i)` of `ws`, into fresh
/// `[m, n_i]` of `x`'s dtype, as one wait for cubecl's queue, the GEMMs back to back on the
/// legacy stream, and one wait for them (the two host waits of a call shared by the
/// products of one input, such as the q, k and v projections); `None` (the caller then
/// takes Burn's matmul for every weight) when the dtype is not bf16 or f16 for all of them,
/// a size is zero, or a size or row stride does not fit cuBLAS's 32-bit integers.
///
/// Row-major `C = X W` is column-major `C^T = W^T X^T`, so cuBLAS computes an `n x m`
/// product with `W^T` first: `gemm(op_w, N, n, m, k, W, ld_w, X, k, C, n)`.
pub(crate) fn linear_many(x: Ct, ws: Vec<(Ct, Option<Ct>)>) -> Result<Option<Vec<Ct>>> {
    let (dtype, cuda_type) = match x.dtype {
        DType::BF16 => (DType::BF16, sys::cudaDataType::CUDA_R_16BF),
        DType::F16 => (DType::F16, sys::cudaDataType::CUDA_R_16F),
        _ => return Ok(None),
    };
    if ws
        .iter()
        .any(|(w, b)| w.dtype != dtype || b.as_ref().is_some_and(|b| b.dtype != dtype))
    {
        return Ok(None);
    }
    let (m, k) = (x.meta.shape()[0], x.meta.shape()[1]);
    let fits = |v: usize| i32::try_from(v).ok().filter(|&v| v > 0);
    let (Some(mi), Some(ki)) = (fits(m), fits(k)) else {
        return Ok(None);
    };
    if ws.iter().any(|(w, _)| fits(w.meta.shape()[1]).is_none()) {
        return Ok(None);
    }
    // x row-major with unit column stride; its row stride is cuBLAS's ldb
    let x = {
        let s = x.meta.strides();
        if s[1] == 1 && s[0] >= k.max(1) {
            x
        } else {
            into_contiguous(x)
        }
    };
    let Some(ldx) = fits(x.meta.strides()[0]) else {
        return Ok(None);
    };
    let mut gemms = Vec::with_capacity(ws.len());
    for (w, bias) in ws {
        let n = w.meta.shape()[1];
        let (w, (op_w, ldw)) = match weight_layout(&w, k, n) {
            Some(l) => (w, l),
            None => {
                let w = into_contiguous(w);
                let l = weight_layout(&w, k, n).unwrap_or((sys::cublasOperation_t::CUBLAS_OP_N, n));
                (w, l)
            }
        };
        let Some(ldw) = fits(ldw) else {
            return Ok(None);
        };
        // the output: the bias broadcast over the rows (beta = 1), or uninitialised (beta =
        // 0); always a fresh contiguous buffer only this call holds
        let (c, beta) = match bias {
            Some(b) => {
                let out = empty(&x, vec![m, n], dtype);
                let client = x.client.clone();
                super::kernels::broadcast_rows_kernel::launch::<CudaRuntime>(
                    &client,
                    super::elementwise_count(m * n)?,
                    cubecl::prelude::CubeDim::new_1d(ELEM_THREADS as u32),
                    b.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    (m * n) as u32,
                    n as u32,
                    dtype.into(),
                );
                (out, 1.0f32)
            }
            None => (empty(&x, vec![m, n], dtype), 0.0f32),
        };
        gemms.push(Gemm {
            w,
            op_w,
            ldw,
            n,
            c,
            beta,
        });
    }
    let client = x.client.clone();
    let index = x.device.index;
    let bind = |t: &Ct, name| {
        client
            .get_resource(t.handle.clone())
            .map_err(|e| driver(&format!("{name} buffer"), e))
    };
    let rx = bind(&x, "x")?;
    let mut bound = Vec::with_capacity(gemms.len());
    for g in &gemms {
        bound.push((bind(&g.w, "w")?, bind(&g.c, "output")?));
    }
    // the inputs (and the bias fills) are queued on cubecl's stream: wait for them
    cubecl::future::block_on(client.sync()).map_err(|e| driver("stream sync", e))?;
    make_current(index)?;
    let handles = HANDLES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut table = handles
        .lock()
        .map_err(|_| blas_err("handle table", "poisoned"))?;
    let handle = match table.get(&index) {
        Some(h) => h.0,
        None => {
            let h = blas::create_handle().map_err(|e| blas_err("cublasCreate", e))?;
            table.insert(index, BlasHandle(h));
            h
        }
    };
    let alpha = 1.0f32;
    // the first refused GEMM stops the rest; the stream is waited on either way, so no
    // buffer goes back to cubecl while a queued GEMM may still use it
    let mut refused = None;
    for (g, (rw, rc)) in gemms.iter().zip(&bound) {
        let ni = g.n as i32;
        // SAFETY: the three pointers are live device buffers of the sizes the leading
        // dimensions and shapes describe (held by the bindings until the end of this call),
        // the handle belongs to this context and its lock is held; the legacy stream is
        // waited on before the buffers go back to cubecl.
        let r = unsafe {
            blas::gemm_ex(
                handle,
                g.op_w,
                sys::cublasOperation_t::CUBLAS_OP_N,
                ni,
                mi,
                ki,
                (&alpha as *const f32).cast::<c_void>(),
                rw.resource().ptr as *const c_void,
                cuda_type,
                g.ldw,
                rx.resource().ptr as *const c_void,
                cuda_type,
                ldx,
                (&g.beta as *const f32).cast::<c_void>(),
                rc.resource().ptr as *mut c_void,
                cuda_type,
                ni,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        let r = r.map_err(|e| blas_err(&format!("cublasGemmEx [{m}, {k}] x [{k}, {}]", g.n), e));
        if let Err(e) = r {
            refused = Some(e);
            break;
        }
    }
    drop(table);
    // SAFETY: waits for the legacy stream of the current context.
    unsafe { cudarc::driver::result::stream::synchronize(std::ptr::null_mut()) }
        .map_err(|e| driver("cuStreamSynchronize after cuBLAS", e))?;
    drop((rx, bound));
    if let Some(e) = refused {
        return Err(e);
    }
    Ok(Some(
        gemms
            .into_iter()
            .map(|g| {
                CubeTensor::new_contiguous(
                    g.c.client,
                    g.c.device,
                    Shape::new([m, g.n]),
                    g.c.handle,
                    dtype,
                )
            })
            .collect(),
    ))
}
