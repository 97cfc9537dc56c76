//! The ring skinny GEMM's block shape (`skinny_ring_kernel` in `cuda::linear`): a plain value
//! type, here so that every build can parse and check it (the kernel itself is CUDA only).

use crate::KernelError;

/// The block shape of the ring skinny GEMM (`skinny_ring_kernel`): `cols` columns of `w` a
/// block (64 or 128: the 4 warps own a quarter each), `kc` rows of `w` a stage (32 or 64:
/// whole `mma` steps) and `bufs` stages in its `cp.async` ring (3 or 4). [`RING_CONFIG`] by
/// default; [`crate::KernelConfig::ring`] changes it (benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RingConfig {
    /// Columns of `w` per block: 64 or 128.
    pub cols: usize,
    /// Rows of `w` per ring stage: 32 or 64.
    pub kc: usize,
    /// Stages in the ring: 3 or 4.
    pub bufs: usize,
}

impl RingConfig {
    /// Shared memory of one block at `mt` 16-row tiles of `x`, bytes: `bufs` stages of `kc`
    /// rows of `w` (`cols` + 8 padding columns) and `16 mt` rows of `x` (`kc` + 8), bf16.
    pub fn shared_bytes(&self, mt: usize) -> usize {
        self.bufs * (self.kc * (self.cols + 8) + 16 * mt * (self.kc + 8)) * 2
    }

    /// Parses `COLSxKCxBUFS` (`64x32x4`), each within its range, else a
    /// [`KernelError::InvalidInput`] naming `ring config`.
    pub fn parse(s: &str) -> crate::Result<Self> {
        let bad = || {
            KernelError::invalid(
                "ring config",
                "COLSxKCxBUFS with COLS 64 or 128, KC 32 or 64, BUFS 3 or 4 (e.g. 64x32x4)",
                format!("{s:?}"),
            )
        };
        // digits only (Rust's integer parsing would also take a leading `+`)
        let parts: Vec<usize> = s
            .split('x')
            .map(|p| {
                let p = p.trim();
                if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                    p.parse::<usize>().map_err(|_| bad())
                } else {
                    Err(bad())
                }
            })
            .collect::<crate::Result<_>>()?;
        let [cols, kc, bufs] = parts[..] else {
            return Err(bad());
        };
        let c = Self { cols, kc, bufs };
        if matches!(cols, 64 | 128) && matches!(kc, 32 | 64) && matches!(bufs, 3 | 4) {
            Ok(c)
        } else {
            Err(bad())
        }
    }
}

impl std::fmt::Display for RingConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.cols, self.kc, self.bufs)
    }
}

/// The ring kernel's block shape by default: 128 columns a block, 64-row stages, 3 stages
/// (71 KB of shared memory at 3 row tiles: 3 blocks an SM; 107.5 KB at 8: 2). On the H200
/// (`dustin-kernels-gpu gemm --decode-only --ring-configs`, six shapes side by side in one
/// process; docs/perf.md, "GPU kernels: decode and verification GEMMs", raw output in
/// `docs/perf/skinny-ring-kernel-2026-12-02/ring-shapes-e2e-ab/`) it had the lowest sum
/// over Qwen2.5-7B's and 72B's projections at 40 and 80 rows: 1541 us against 1892 for
/// `64x32x4` (the first shape tried); 72B gate/up at 40 rows 174.3 us (2.78 TB/s of weight
/// read) where the tensor-core kernel took 235.5 and cuBLAS 167.7, at 128 rows 266.8 against
/// 652.3 and 414.6.
pub const RING_CONFIG: RingConfig = RingConfig {
    cols: 128,
    kc: 64,
    bufs: 3,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_shapes_it_takes_and_names_the_rest() {
        let c = RingConfig::parse("128x64x3").unwrap();
        assert_eq!((c.cols, c.kc, c.bufs), (128, 64, 3));
        assert_eq!(c.to_string(), "128x64x3");
        assert_eq!(
            RingConfig::parse(" 64 x32x4").unwrap(),
            RingConfig {
                cols: 64,
                kc: 32,
                bufs: 4
            }
        );
        for bad in [
            "",
            "64x32",
            "64x32x4x1",
            "96x32x4",
            "64x16x4",
            "64x32x2",
            "axbxc",
            "64x32x-1",
        ] {
            let e = RingConfig::parse(bad).unwrap_err().to_string();
            assert!(
                e.starts_with("ring config: expected COLSxKCxBUFS"),
                "{bad:?}: {e}"
            );
            assert!(e.contains(&format!("{bad:?}")), "{bad:?}: {e}");
        }
    }

    /// `bufs x (kc (cols + 8) + 16 mt (kc + 8)) x 2` bytes, by hand: the default at 3 row
    /// tiles, 3 x (64 x 136 + 48 x 72) x 2 = 72,960; `64x32x4` at 3, 4 x (32 x 72 + 48 x 40)
    /// x 2 = 33,792.
    #[test]
    fn shared_memory_per_block() {
        assert_eq!(RING_CONFIG.shared_bytes(3), 72_960);
        assert_eq!(
            RingConfig {
                cols: 64,
                kc: 32,
                bufs: 4
            }
            .shared_bytes(3),
            33_792
        );
    }
}
