//! Page-locked host memory for offloaded weights ([`PinnedHost`]).
//!
//! A host-to-device copy from pageable memory is staged by the driver through a pinned bounce
//! buffer, and Burn 0.21 / CubeCL 0.10's `Tensor::from_data` copies the bytes twice more on the
//! host before that: offloaded layers streamed at 1.1-1.5 GB/s on the H200 machine
//! (docs/perf.md, "SubSpec on the GPU"). From page-locked memory the copy is one DMA transfer at
//! the bus's rate (PCIe 5 x16: about 50 GB/s per direction, less the protocol's overhead).

use burn_tensor::{DType, TensorData};

/// A `[rows, cols]` matrix in page-locked host memory, in the dtype it has on the device.
/// Made by [`KernelOps::pin_host`](crate::MemoryOps::pin_host) on backends that have page-locked memory (CUDA:
/// `cuMemHostAlloc`, portable to every context), copied to the device by
/// [`KernelOps::upload_pinned`](crate::MemoryOps::upload_pinned). Read-only once made; freed on drop.
pub struct PinnedHost {
    pub(crate) shape: [usize; 2],
    pub(crate) dtype: DType,
    pub(crate) mem: Mem,
}

/// The page-locked allocation: `len` bytes at `ptr`.
#[cfg(feature = "cuda")]
pub(crate) struct Mem {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    /// Ordinal of the GPU whose primary context made it (current again to free it).
    pub(crate) device: usize,
}

/// No page-locked memory without the CUDA backend: a [`PinnedHost`] cannot exist.
#[cfg(not(feature = "cuda"))]
pub(crate) enum Mem {}

// SAFETY: the allocation is plain host memory, written once when made and only read after;
// nothing in it is tied to the thread that made it (`CU_MEMHOSTALLOC_PORTABLE`).
#[cfg(feature = "cuda")]
unsafe impl Send for Mem {}
// SAFETY: as above; shared access is read-only.
#[cfg(feature = "cuda")]
unsafe impl Sync for Mem {}

impl PinnedHost {
    /// `[rows, cols]`.
    pub fn dims(&self) -> [usize; 2] {
        self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The bytes, row-major.
    pub fn as_bytes(&self) -> &[u8] {
        #[cfg(feature = "cuda")]
        {
            // SAFETY: `ptr` points at `len` initialised bytes owned by `self` until drop.
            unsafe { std::slice::from_raw_parts(self.mem.ptr, self.mem.len) }
        }
        #[cfg(not(feature = "cuda"))]
        match self.mem {}
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.as_bytes().len()
    }

    /// A pageable copy of the matrix.
    pub fn to_data(&self) -> TensorData {
        TensorData::from_bytes_vec(self.as_bytes().to_vec(), self.shape.to_vec(), self.dtype)
    }
}

impl std::fmt::Debug for PinnedHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PinnedHost({:?}, {:?}, {} bytes)",
            self.shape,
            self.dtype,
            self.bytes()
        )
    }
}

#[cfg(feature = "cuda")]
impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `cuMemHostAlloc` and is freed once, here. A failure (the
        // driver already torn down at exit) leaks the block, which the exit reclaims.
        if crate::cuda::make_current(self.device).is_ok() {
            unsafe {
                let _ = cudarc::driver::result::free_host(self.ptr.cast());
            }
        }
    }
}
