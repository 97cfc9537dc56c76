//! The CUDA driver calls of pinned uploads and [`MemoryOps`] on CUDA (KV writes, memory, page-locked uploads).

mod kernels;

use super::*;

pub(super) use kernels::fill_kernel;

/// `cuMemHostAlloc` flag: the block is page-locked for every CUDA context, not only the one
/// current when it was made (CUDA driver API, `CU_MEMHOSTALLOC_PORTABLE`).
pub(super) const HOST_ALLOC_PORTABLE: u32 = 0x01;

pub(super) fn driver(what: &str, e: impl std::fmt::Debug) -> KernelError {
    KernelError::Driver(format!("{what}: {e:?}"))
}

/// Makes GPU `index`'s primary context current on the calling thread: the context cubecl-cuda
/// 0.10 runs in (`runtime.rs` retains the primary context of each device), so pointers and
/// page-locked blocks are shared with it.
pub(crate) fn make_current(index: usize) -> Result<()> {
    use cudarc::driver::result::{ctx, device, init, primary_ctx};
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    /// Primary contexts retained by this process, by device ordinal (pointers as usize):
    /// retained once each, never released while the process runs.
    static RETAINED: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    let c = {
        let mut map = RETAINED
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .map_err(|_| driver("context table", "poisoned"))?;
        match map.get(&index) {
            Some(&c) => c,
            None => {
                init().map_err(|e| driver("cuInit", e))?;
                let ordinal = i32::try_from(index).map_err(|e| driver("device ordinal", e))?;
                let dev = device::get(ordinal).map_err(|e| driver("cuDeviceGet", e))?;
                // SAFETY: `dev` is a valid device handle from `cuDeviceGet`.
                let c = unsafe { primary_ctx::retain(dev) }
                    .map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
                map.insert(index, c as usize);
                c as usize
            }
        }
    };
    // SAFETY: `c` is a primary context retained above and never released.
    unsafe { ctx::set_current(c as cudarc::driver::sys::CUcontext) }
        .map_err(|e| driver("cuCtxSetCurrent", e))
}

/// Element strides of a 4-D tensor, as the kernels take them.
fn strides4(t: &Ct) -> [u32; 4] {
    let s = t.meta.strides();
    [s[0] as u32, s[1] as u32, s[2] as u32, s[3] as u32]
}

/// What [`kernels::kv_write_pair_kernel`] and [`kernels::rope_kv_write_kernel`] take for the
/// cache write: the caches to write in place, the starts binding, whether it is read, and
/// the strides.
struct KvPairArgs {
    dk: Ct,
    dv: Ct,
    starts: Ct,
    ragged: bool,
    strides: kernels::KvPairStridesLaunch<CudaRuntime>,
}

/// [`KvPairArgs`] for caches `dk` / `dv` and new rows `sk` / `sv`. The caches are written in
/// place, as Burn's slice-assign: a shared or overlapping cache is copied first. Equal starts
/// go as one scalar (`sk` stands in for the unread `starts` binding); a ragged batch uploads
/// its starts.
fn kv_pair_args<F: FloatElement, I: IntElement, BT: BoolElement>(
    dk: Ct,
    dv: Ct,
    sk: &Ct,
    sv: &Ct,
    starts: &[usize],
) -> KvPairArgs {
    let own = |t: Ct| {
        if t.can_mut() && t.is_nonoverlapping() {
            t
        } else {
            t.copy()
        }
    };
    let (dk, dv) = (own(dk), own(dv));
    let ragged = !starts.windows(2).all(|w| w[0] == w[1]);
    let st = if ragged {
        ctx_tensor::<F, I, BT>(starts, &dk.device)
    } else {
        sk.clone()
    };
    let ([a0, a1, a2, a3], [b0, b1, b2, b3]) = (strides4(sk), strides4(sv));
    let ([c0, c1, c2, c3], [e0, e1, e2, e3]) = (strides4(&dk), strides4(&dv));
    let strides = kernels::KvPairStridesLaunch::new(
        a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, e0, e1, e2, e3,
    );
    KvPairArgs {
        dk,
        dv,
        starts: st,
        ragged,
        strides,
    }
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> MemoryOps for Cube<F, I, BT> {
    fn kv_write(
        dst: Tensor<Self, 4>,
        src: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<Tensor<Self, 4>> {
        check_kv_write(dst.dims(), src.dims(), starts)?;
        let [b, h, n, d] = src.dims();
        // equal starts: Burn's one slice-assign launch already
        if n == 0 || d > 1024 || starts.windows(2).all(|w| w[0] == w[1]) {
            return crate::plain::kv_write(dst, src, starts);
        }
        let device = dst.device();
        let dst = float_prim(dst).tensor();
        let src = float_prim(src).tensor();
        if dst.dtype != src.dtype {
            return Err(KernelError::Unsupported(
                "dst and src of different dtypes".into(),
            ));
        }
        // in place, as Burn's slice-assign: a shared or overlapping cache is copied first
        let dst = if dst.can_mut() && dst.is_nonoverlapping() {
            dst
        } else {
            dst.copy()
        };
        let st = ctx_tensor::<F, I, BT>(starts, &device);
        let (fd, id) = (dst.dtype, st.dtype);
        let client = dst.client.clone();
        kernels::kv_write_kernel::launch::<CudaRuntime>(
            &client,
            CubeCount::Static(n as u32, h as u32, b as u32),
            CubeDim::new_1d(d as u32),
            src.into_tensor_arg(),
            st.into_tensor_arg(),
            dst.clone().into_tensor_arg(),
            d,
            [fd.into(), id.into()],
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(dst)))
    }

    fn kv_write_pair(
        k_dst: Tensor<Self, 4>,
        v_dst: Tensor<Self, 4>,
        k_src: Tensor<Self, 4>,
        v_src: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<(Tensor<Self, 4>, Tensor<Self, 4>)> {
        check_kv_write_pair(
            [k_dst.dims(), v_dst.dims()],
            [k_src.dims(), v_src.dims()],
            starts,
        )?;
        // before anything is consumed: the caches come back unchanged on an error
        if [v_dst.dtype(), k_src.dtype(), v_src.dtype()]
            .iter()
            .any(|&t| t != k_dst.dtype())
        {
            return Err(KernelError::Unsupported(
                "kv_write_pair of tensors of different dtypes".into(),
            ));
        }
        let [b, h, n, d] = k_src.dims();
        // nothing to launch (or more columns than a block holds): the plain writes
        if b * h * n * d == 0 || d > 1024 {
            return Ok((
                crate::plain::kv_write(k_dst, k_src, starts)?,
                crate::plain::kv_write(v_dst, v_src, starts)?,
            ));
        }
        let [dk, dv, sk, sv] = [k_dst, v_dst, k_src, v_src].map(|t| float_prim(t).tensor());
        let KvPairArgs {
            dk,
            dv,
            starts: st,
            ragged,
            strides,
        } = kv_pair_args::<F, I, BT>(dk, dv, &sk, &sv, starts);
        let id: DType = <I as burn_tensor::Element>::dtype();
        let fd = dk.dtype;
        let client = dk.client.clone();
        kernels::kv_write_pair_kernel::launch::<CudaRuntime>(
            &client,
            CubeCount::Static(n as u32, h as u32, b as u32),
            CubeDim::new_1d(d as u32),
            sk.into_array_arg(),
            sv.into_array_arg(),
            st.into_array_arg(),
            dk.clone().into_array_arg(),
            dv.clone().into_array_arg(),
            strides,
            starts.first().copied().unwrap_or(0) as u32,
            ragged,
            d,
            [fd.into(), id.into()],
        );
        Ok((
            Tensor::from_primitive(TensorPrimitive::Float(dk)),
            Tensor::from_primitive(TensorPrimitive::Float(dv)),
        ))
    }

    fn rope_kv_write(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        cos: Tensor<Self, 4>,
        sin: Tensor<Self, 4>,
        k_dst: Tensor<Self, 4>,
        v_dst: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<crate::RopedKv<Self>> {
        crate::check_rope_kv_write(
            [q.dims(), k.dims(), v.dims(), cos.dims(), sin.dims()],
            [k_dst.dims(), v_dst.dims()],
            starts,
        )?;
        let fd = q.dtype();
        // before anything is consumed: the caches come back unchanged on an error
        if [&k, &v, &cos, &sin, &k_dst, &v_dst]
            .iter()
            .any(|t| t.dtype() != fd)
        {
            return Err(KernelError::Unsupported(
                "rope_kv_write of tensors of different dtypes".into(),
            ));
        }
        let [b, nh, n, d] = q.dims();
        let kvh = k.dims()[1];
        // nothing to launch (or more columns than a block holds): the separate ops
        if b * (nh + kvh) * n * d == 0 || d > 1024 {
            return crate::ops::rope_kv_write_separate(q, k, v, cos, sin, k_dst, v_dst, starts);
        }
        let [dk, dv, sq, sk, sv, tc, ts] =
            [k_dst, v_dst, q, k, v, cos, sin].map(|t| float_prim(t).tensor());
        let KvPairArgs {
            dk,
            dv,
            starts: st,
            ragged,
            strides: kv,
        } = kv_pair_args::<F, I, BT>(dk, dv, &sk, &sv, starts);
        let id: DType = <I as burn_tensor::Element>::dtype();
        let [q0, q1, q2, q3] = strides4(&sq);
        let ([x0, _, x2, x3], [y0, _, y2, y3]) = (strides4(&tc), strides4(&ts));
        let rs = kernels::RopeStridesLaunch::new(q0, q1, q2, q3, x0, x2, x3, y0, y2, y3);
        let qo = empty(&sq, vec![b, nh, n, d], fd);
        let ko = empty(&sk, vec![b, kvh, n, d], fd);
        let client = dk.client.clone();
        kernels::rope_kv_write_kernel::launch::<CudaRuntime>(
            &client,
            CubeCount::Static(n as u32, (nh + kvh) as u32, b as u32),
            CubeDim::new_1d(d as u32),
            sq.into_array_arg(),
            sk.into_array_arg(),
            sv.into_array_arg(),
            tc.into_array_arg(),
            ts.into_array_arg(),
            st.into_array_arg(),
            qo.clone().into_array_arg(),
            ko.clone().into_array_arg(),
            dk.clone().into_array_arg(),
            dv.clone().into_array_arg(),
            rs,
            kv,
            nh as u32,
            starts.first().copied().unwrap_or(0) as u32,
            ragged,
            d,
            [fd.into(), id.into()],
        );
        let t = |c: Ct| Tensor::from_primitive(TensorPrimitive::Float(c));
        Ok(crate::RopedKv {
            q: t(qo),
            k: t(ko),
            k_dst: t(dk),
            v_dst: t(dv),
        })
    }

    fn pin_host(data: &TensorData, device: &Self::Device) -> Result<Option<crate::PinnedHost>> {
        let shape: Vec<usize> = data.shape.iter().copied().collect();
        let [rows, cols] = shape[..] else {
            return Err(KernelError::Shape {
                name: "data",
                expected: vec![0, 0],
                found: shape,
            });
        };
        let bytes = data.as_bytes();
        let len = rows * cols * data.dtype.size();
        if bytes.len() != len {
            return Err(KernelError::invalid(
                "data",
                format!("{len} bytes for [{rows}, {cols}] of {:?}", data.dtype),
                bytes.len(),
            ));
        }
        make_current(device.index)?;
        // SAFETY: a plain allocation call with the primary context current; the block is
        // freed by `Mem`'s drop.
        let ptr = unsafe { cudarc::driver::result::malloc_host(len.max(1), HOST_ALLOC_PORTABLE) }
            .map_err(|e| driver(&format!("cuMemHostAlloc of {len} bytes"), e))?
            .cast::<u8>();
        // SAFETY: `ptr` holds at least `len` bytes and does not overlap `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, len) };
        Ok(Some(crate::PinnedHost {
            shape: [rows, cols],
            dtype: data.dtype,
            mem: crate::pinned::Mem {
                ptr,
                len,
                device: device.index,
            },
        }))
    }

    fn upload_pinned(host: &crate::PinnedHost, device: &Self::Device) -> Result<Tensor<Self, 2>> {
        let want = <F as burn_tensor::Element>::dtype();
        if host.dtype() != want {
            return Err(KernelError::invalid(
                "host",
                format!("a matrix of the backend's float dtype {want:?}"),
                format!("{:?}", host.dtype()),
            ));
        }
        let bytes = host.as_bytes();
        let client = <CudaRuntime as Runtime>::client(device);
        let handle = client.empty(bytes.len().max(1));
        // binding the buffer orders this thread's stream after any other stream that used the
        // block last (cubecl's stream alignment); the pool may also hand back a block that
        // work queued on this stream still reads. The sync waits for both before the copy,
        // which runs outside cubecl's streams, writes the block.
        let res = client
            .get_resource(handle.clone())
            .map_err(|e| driver("device buffer", e))?;
        cubecl::future::block_on(client.sync()).map_err(|e| driver("stream sync", e))?;
        let dst = res.resource().ptr;
        make_current(device.index)?;
        // SAFETY: `dst` is a live device buffer of at least `bytes.len()` bytes (held by `res`
        // and `handle`); from page-locked memory `cuMemcpyHtoD` returns when the copy is done.
        // cubecl's streams are non-blocking, so the legacy stream this runs on does not wait
        // for (or hold up) their work.
        unsafe { cudarc::driver::result::memcpy_htod_sync(dst, bytes) }
            .map_err(|e| driver(&format!("cuMemcpyHtoD of {} bytes", bytes.len()), e))?;
        drop(res);
        let [rows, cols] = host.dims();
        let t = CubeTensor::new_contiguous(
            client,
            device.clone(),
            Shape::new([rows, cols]),
            handle,
            host.dtype(),
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(t)))
    }

    fn release_uploads(device: &Self::Device) {
        let client = <CudaRuntime as Runtime>::client(device);
        // the first flush moves the staged buffers behind a fence, the second waits on it
        // and frees them
        let _ = client.flush();
        let _ = client.flush();
    }

    fn kv_prefix(k: Tensor<Self, 4>, len: usize) -> Tensor<Self, 4> {
        let [b, h, cap, d] = k.dims();
        let len = len.min(cap);
        if len == cap {
            return k;
        }
        let mut view: Ct = k.into_primitive().tensor();
        // the same buffer, not shortened (that is what needs the alignment), the same
        // strides: positions `len ..` stay in the buffer and out of the shape; with
        // `len < cap` the strides are not contiguous ones, so Burn copies before any op that
        // needs contiguous memory
        view.meta.shape = Shape::from(vec![b, h, len, d]);
        Tensor::from_primitive(TensorPrimitive::Float(view))
    }

    fn memory_usage(device: &Self::Device) -> Option<(u64, u64)> {
        let client = <CudaRuntime as Runtime>::client(device);
        client
            .memory_usage()
            .ok()
            .map(|m| (m.bytes_in_use, m.bytes_reserved))
    }
}
