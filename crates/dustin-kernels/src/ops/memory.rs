//! [`MemoryOps`]: the memory ops of [`KernelOps`](crate::KernelOps).

use super::{ElementwiseOps, KernelBackend};
use crate::check_kv_write_pair;
use crate::check_rope;
use crate::plain;
use crate::KernelError;
use crate::PinnedHost;
use crate::Result;
#[cfg(doc)]
#[allow(unused_imports)]
use crate::*;
use burn_tensor::Tensor;
use burn_tensor::TensorData;

/// What [`KernelOps::rope_kv_write`](crate::MemoryOps::rope_kv_write) returns: the rotated
/// queries and keys, and the updated caches.
#[derive(Debug, Clone)]
pub struct RopedKv<B: burn_tensor::backend::Backend> {
    /// RoPE of the queries, contiguous `[batch, heads, n, head_dim]`.
    pub q: Tensor<B, 4>,
    /// RoPE of the new keys, contiguous `[batch, kv_heads, n, head_dim]` (what the cache got).
    pub k: Tensor<B, 4>,
    /// The key cache `[batch, kv_heads, capacity, head_dim]` with the rotated keys written.
    pub k_dst: Tensor<B, 4>,
    /// The value cache with the new values written.
    pub v_dst: Tensor<B, 4>,
}

/// KV-cache writes and views, device memory, and uploads from page-locked host memory.
///
/// Part of [`KernelOps`](crate::KernelOps); every method defaults to the plain path.
pub trait MemoryOps: KernelBackend + ElementwiseOps {
    /// Writes the new keys (or values) of every sequence into a layer's cache at that
    /// sequence's own position: `dst[b, h, starts[b] + i, :] = src[b, h, i, :]` for
    /// `i < n`. `dst` `[batch, kv_heads, capacity, head_dim]`, `src` `[batch, kv_heads, n,
    /// head_dim]`, `starts` `[batch]` (the cached lengths). Returns the updated `dst` (in place
    /// where the backend can). The plain path is one slice-assign for equal starts and one
    /// slice and one slice-assign per sequence otherwise (a ragged batch after unequal
    /// acceptance: `batch` to `2 batch` launches per tensor and layer on CUDA, where the kernel
    /// takes one).
    ///
    /// # Errors
    /// [`KernelError::Shape`] when `src` does not match `dst`'s batch, heads and width;
    /// [`KernelError::InvalidInput`] for a wrong number of starts or `starts[b] + n` past the
    /// capacity.
    fn kv_write(
        dst: Tensor<Self, 4>,
        src: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<Tensor<Self, 4>> {
        plain::kv_write(dst, src, starts)
    }

    /// [`KernelOps::kv_write`](crate::MemoryOps::kv_write) of a layer's keys and values together:
    /// `k_dst[b, h, starts[b] + i, :] = k_src[b, h, i, :]` and the same for `v`, shapes as
    /// there. Returns the updated `(k_dst, v_dst)`. The default is two `kv_write` calls; on
    /// CUDA it is one launch for both, equal starts included (where `kv_write` takes two of Burn's slice-assigns, each
    /// with its tensors' metadata uploaded: 9-10 us of host time a launch against 4.5-5.4 for
    /// a kernel with array arguments, `dustin-kernels-gpu launchcost`, docs/perf.md).
    ///
    /// # Errors
    /// As [`KernelOps::kv_write`](crate::MemoryOps::kv_write), for either pair; [`KernelError::Shape`] when `v_dst` or
    /// `v_src` does not match its key counterpart's shape. Checked before anything is
    /// written.
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
        Ok((
            Self::kv_write(k_dst, k_src, starts)?,
            Self::kv_write(v_dst, v_src, starts)?,
        ))
    }

    /// A layer's RoPE and cache write as one op: [`KernelOps::rope`](crate::ElementwiseOps::rope)
    /// of the new queries `q` `[batch, heads, n, head_dim]` and keys `k` `[batch, kv_heads, n,
    /// head_dim]` (any strides; `cos` / `sin` `[batch, 1, n, head_dim]` as `rope` takes them),
    /// then [`KernelOps::kv_write_pair`](crate::MemoryOps::kv_write_pair) of the rotated keys
    /// and the values `v` into `k_dst` / `v_dst` at `starts`. The default is those three
    /// calls; on CUDA it is one launch (three before: each a few microseconds of host time,
    /// which binds a decoding step at small batches, docs/perf.md).
    ///
    /// # Errors
    /// As `rope` for `q` or `k` and as `kv_write_pair`, checked before anything is written;
    /// [`KernelError::Shape`] naming `k` when it is not `[batch, _, n, head_dim]` of `q`.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_write(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        cos: Tensor<Self, 4>,
        sin: Tensor<Self, 4>,
        k_dst: Tensor<Self, 4>,
        v_dst: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<RopedKv<Self>> {
        check_rope_kv_write(
            [q.dims(), k.dims(), v.dims(), cos.dims(), sin.dims()],
            [k_dst.dims(), v_dst.dims()],
            starts,
        )?;
        rope_kv_write_separate(q, k, v, cos, sin, k_dst, v_dst, starts)
    }

    /// The first `len` positions of a KV-cache tensor `k` `[batch, kv_heads, capacity,
    /// head_dim]`: `[batch, kv_heads, len, head_dim]` (`len` clamped to `capacity`), a view
    /// where the backend can make one. Burn's `narrow` by default.
    ///
    /// Why the CUDA backend overrides it: burn-cubecl 0.21's `slice` is a view only when the
    /// bytes it drops from the end of the buffer are a multiple of the allocator's alignment;
    /// for a cache cut at `len` that is `head_dim * 2 * (capacity - len)` bytes, so about
    /// half of all lengths (head_dim 128) or three quarters (64) copied the whole layer's
    /// cache, K and V, at every layer of every step (seen in the H200 trace of 2026-11-30:
    /// two 85 us slice kernels per layer at batch 1, 32k). The override keeps the buffer and
    /// the strides and shortens the shape.
    fn kv_prefix(k: Tensor<Self, 4>, len: usize) -> Tensor<Self, 4> {
        let cap = k.dims()[2];
        k.narrow(2, 0, len.min(cap))
    }

    /// What the device allocator of the calling thread's stream holds, bytes: `(in use,
    /// reserved)`; `None` where the backend does not say (the CPU backend). Reserved includes
    /// freed blocks the pool keeps for reuse: it is what `nvidia-smi` sees of this stream.
    fn memory_usage(_device: &Self::Device) -> Option<(u64, u64)> {
        None
    }

    /// Frees the host staging buffers of finished uploads issued on the calling thread's
    /// stream, waiting for the copies first. CubeCL keeps each upload's host buffer in a
    /// per-stream queue that it empties only when that stream launches enough kernels or is
    /// flushed twice (the queue is double-buffered behind a fence); a stream that only uploads
    /// (the offload prefetch thread) would otherwise keep every buffer. No-op by default.
    fn release_uploads(_device: &Self::Device) {}

    /// Copies `data`, a `[rows, cols]` matrix in this backend's float dtype, into page-locked
    /// host memory on `device`'s side, for [`KernelOps::upload_pinned`](crate::MemoryOps::upload_pinned) (offloaded layers,
    /// copied in for every forward pass). `Ok(None)` where the backend has no page-locked
    /// memory (the default; the CPU), so callers keep their pageable copy.
    ///
    /// # Errors
    /// [`KernelError::Shape`] for data that is not 2-D or whose bytes do not match its shape
    /// and dtype; [`KernelError::Driver`] when the driver cannot lock that much host memory.
    fn pin_host(data: &TensorData, device: &Self::Device) -> Result<Option<PinnedHost>> {
        let _ = (data, device);
        Ok(None)
    }

    /// A device copy `[rows, cols]` of a page-locked matrix made by [`KernelOps::pin_host`](crate::MemoryOps::pin_host):
    /// one host-to-device DMA transfer into a buffer of the device allocator, finished before
    /// this returns (so the tensor is ready for any stream). It waits for the work queued on
    /// the calling thread's stream first, since the allocator may hand back a block that work
    /// still reads. On CUDA from the prefetch thread's own stream that wait is for uploads
    /// only.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] on backends without page-locked memory (the default);
    /// [`KernelError::Driver`] for a failed copy.
    fn upload_pinned(host: &PinnedHost, device: &Self::Device) -> Result<Tensor<Self, 2>> {
        let _ = (host, device);
        Err(KernelError::Unsupported(
            "page-locked uploads on this backend (it has no page-locked memory)".into(),
        ))
    }
}

/// Checks [`KernelOps::rope_kv_write`](crate::MemoryOps::rope_kv_write)'s shapes: `src` `[q, k,
/// v, cos, sin]`, `dst` `[k_dst, v_dst]`.
///
/// # Errors
/// [`KernelError::Shape`] naming the first input that does not match;
/// [`KernelError::InvalidInput`] for an odd `head_dim` or bad `starts`.
pub fn check_rope_kv_write(
    src: [[usize; 4]; 5],
    dst: [[usize; 4]; 2],
    starts: &[usize],
) -> Result<()> {
    let [q, k, v, cos, sin] = src;
    check_rope(q, cos, sin)?;
    let [b, _, n, d] = q;
    if k[0] != b || k[2] != n || k[3] != d {
        return Err(KernelError::Shape {
            name: "k",
            expected: vec![b, k[1], n, d],
            found: k.to_vec(),
        });
    }
    check_kv_write_pair(dst, [k, v], starts)
}

/// [`KernelOps::rope_kv_write`](crate::MemoryOps::rope_kv_write) as its three ops: `rope` of
/// `q` and of `k`, then `kv_write_pair` of the rotated keys and `v` (the trait's default, and
/// a backend's fallback where its one-launch kernel does not apply). Shapes as there, checked
/// by the callee ops.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_kv_write_separate<B: MemoryOps>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
    k_dst: Tensor<B, 4>,
    v_dst: Tensor<B, 4>,
    starts: &[usize],
) -> Result<RopedKv<B>> {
    let q = B::rope(q, cos.clone(), sin.clone())?;
    let k = B::rope(k, cos, sin)?;
    let (k_dst, v_dst) = B::kv_write_pair(k_dst, v_dst, k.clone(), v, starts)?;
    Ok(RopedKv { q, k, k_dst, v_dst })
}
