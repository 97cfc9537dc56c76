//! Memory checks before large allocations (KV caches): estimate the bytes, compare them with
//! what the device has, and fail with both figures instead of an out-of-memory abort.
//!
//! What "available" means:
//! - a limit set with [`set_memory_limit`] (the CLI's `--max-memory`), on any device;
//! - otherwise, on a host backend (the CPU: Burn's `flex`, `ndarray`, ...), `MemAvailable`
//!   of `/proc/meminfo`;
//! - otherwise (GPU backends, or no `/proc/meminfo`) the check is skipped: Burn 0.21's
//!   backend API does not report a device's free memory (see `docs/decisions.md`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use burn_tensor::backend::Backend;

use crate::error::{CoreError, Result};

/// 0: no limit.
static LIMIT: AtomicU64 = AtomicU64::new(0);

/// Sets (or, with `None`, clears) a process-wide memory limit in bytes that every check uses
/// in place of the device's own figure.
pub fn set_memory_limit(bytes: Option<u64>) {
    LIMIT.store(bytes.unwrap_or(0), Ordering::Relaxed);
}

/// The limit of [`set_memory_limit`], if any.
pub fn memory_limit() -> Option<u64> {
    match LIMIT.load(Ordering::Relaxed) {
        0 => None,
        b => Some(b),
    }
}

/// Whether [`persistent`] puts allocations in the backend's persistent pool (the default).
static PERSISTENT: AtomicBool = AtomicBool::new(true);

/// Turns the persistent allocation of [`persistent`] on (the default) or off, process-wide
/// (`dustin-bench e2e --persistent-alloc off` measures the difference).
pub fn set_persistent_allocations(on: bool) {
    PERSISTENT.store(on, Ordering::Relaxed);
}

/// Whether [`persistent`] allocates persistently ([`set_persistent_allocations`]).
pub fn persistent_allocations() -> bool {
    PERSISTENT.load(Ordering::Relaxed)
}

/// Runs `f(input)` with every device allocation it makes taken from the backend's persistent
/// pool (Burn's `Backend::memory_persistent_allocations`), for tensors that live as long as
/// the model: weights and KV caches.
///
/// Why: CubeCL's default pools (Burn 0.21, cubecl-runtime 0.10) carve allocations out of
/// pages sized for reuse (for example a page of a quarter of the device's memory opened for
/// one large tensor); a persistent allocation is one exact-size buffer. Backends without
/// device pools (the CPU's burn-flex) run `f` unchanged. Allocations of the same byte size
/// made later by anything (a temporary of a cache layer's size) reuse the free persistent
/// buffers of that size, or add one (cubecl-runtime's `MemoryManagement::reserve`).
pub fn persistent<B: Backend, I: Send, O: Send>(
    device: &B::Device,
    input: I,
    f: impl Fn(I) -> O + Send,
) -> O {
    if persistent_allocations() {
        B::memory_persistent_allocations(device, input, f)
    } else {
        f(input)
    }
}

/// Hands the device memory of dropped tensors back now: the backend's free pool pages and
/// persistent buffers released (`Backend::memory_cleanup`), then the device synchronised, so
/// that the releases CubeCL queues on its stream are carried out before the next allocation
/// (cubecl-cuda 0.10 frees queued buffers when a stream is flushed). Use it between the
/// steps of a rebuild that replaces large buffers with buffers of another size, one at a
/// time (a KV cache losing sequences): without it each old buffer stays reserved until the
/// end and the rebuild's peak is two whole caches. A no-op on backends without device pools.
///
/// # Errors
/// [`CoreError::Model`] when the device reports an execution error at the synchronisation.
pub fn release_freed<B: Backend>(device: &B::Device) -> Result<()> {
    B::memory_cleanup(device);
    B::sync(device).map_err(|e| CoreError::Model(format!("device sync: {e:?}")))
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        let mut it = rest.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        match it.next() {
            Some("kB") | None => n.checked_mul(1024),
            _ => None,
        }
    })
}

/// `MemAvailable` of this machine (`None` where `/proc/meminfo` is missing or unreadable).
pub fn host_available_bytes() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .as_deref()
        .and_then(parse_mem_available)
}

/// Whether backend `B` keeps tensors in host memory (judged by its name: every backend but
/// the `cubecl` GPU ones (CUDA, wgpu, ROCm) and libtorch on a GPU).
pub fn is_host_backend<B: Backend>(device: &B::Device) -> bool {
    let name = B::name(device).to_ascii_lowercase();
    !["cubecl", "cuda", "wgpu", "rocm", "hip", "metal", "vulkan"]
        .iter()
        .any(|g| name.contains(g))
}

/// The bytes available for new tensors on `device` and where the figure comes from, or
/// `None` when it cannot be known (the check is then skipped).
pub fn available_bytes<B: Backend>(device: &B::Device) -> Option<(u64, &'static str)> {
    if let Some(l) = memory_limit() {
        return Some((l, "the --max-memory limit"));
    }
    if is_host_backend::<B>(device) {
        return host_available_bytes().map(|b| (b, "MemAvailable in /proc/meminfo"));
    }
    None
}

/// Bytes of one element of `B`'s float tensors.
pub fn float_bytes<B: Backend>() -> usize {
    std::mem::size_of::<B::FloatElem>()
}

/// A byte count in GiB / MiB / KiB / bytes, for messages.
pub fn human_bytes(b: u128) -> String {
    const K: f64 = 1024.0;
    let f = b as f64;
    if f >= K * K * K {
        format!("{:.2} GiB", f / (K * K * K))
    } else if f >= K * K {
        format!("{:.1} MiB", f / (K * K))
    } else if f >= K {
        format!("{:.1} KiB", f / K)
    } else {
        format!("{b} bytes")
    }
}

/// [`human_bytes`] with the exact count in parentheses from 1 KiB on: `8.0 KiB (8192 bytes)`.
pub fn describe_bytes(b: u128) -> String {
    if b < 1024 {
        human_bytes(b)
    } else {
        format!("{} ({b} bytes)", human_bytes(b))
    }
}

/// Fails with [`CoreError::OutOfMemory`] when `needed` bytes exceed `available`
/// (`(bytes, where the figure comes from)`); `None` passes.
///
/// # Errors
/// [`CoreError::OutOfMemory`] with both figures.
pub fn check_bytes(what: &str, needed: u128, available: Option<(u64, &str)>) -> Result<()> {
    match available {
        Some((avail, source)) if needed > u128::from(avail) => Err(CoreError::OutOfMemory {
            what: what.to_string(),
            needed,
            available: avail,
            origin: source.to_string(),
        }),
        _ => Ok(()),
    }
}

/// [`check_bytes`] against [`available_bytes`] of `device`.
///
/// # Errors
/// [`CoreError::OutOfMemory`] with both figures.
pub fn check_alloc<B: Backend>(what: &str, needed: u128, device: &B::Device) -> Result<()> {
    check_bytes(what, needed, available_bytes::<B>(device))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text =
            "MemTotal:       16318480 kB\nMemFree:         1234 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(parse_mem_available(text), Some(8_000_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: x kB\n"), None);
    }

    #[test]
    fn check_bytes_reports_both_figures() {
        assert!(check_bytes("x", 10, Some((10, "test"))).is_ok());
        assert!(check_bytes("x", u128::MAX, None).is_ok());
        let e = check_bytes("KV cache", 3 << 30, Some((1 << 30, "test"))).unwrap_err();
        match &e {
            CoreError::OutOfMemory {
                needed, available, ..
            } => {
                assert_eq!(*needed, 3 << 30);
                assert_eq!(*available, 1 << 30);
            }
            other => panic!("{other:?}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("3.00 GiB") && msg.contains("1.00 GiB"),
            "{msg}"
        );
        assert!(msg.contains("KV cache") && msg.contains("test"), "{msg}");
    }

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(2048), "2.0 KiB");
        assert_eq!(human_bytes(5 << 20), "5.0 MiB");
    }
}
