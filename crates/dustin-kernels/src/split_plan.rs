//! How the CUDA flash kernel splits the keys of a verification call across thread blocks, and
//! how the tensor-core skinny GEMM splits its inner dimension: pure functions of the shapes,
//! kept outside the `cuda` module so CPU CI tests them.

/// Keys per shared-memory tile of the flash kernel; every split is a multiple of it.
pub(crate) const FLASH_KEYS: usize = 64;
/// Fewest keys per split the split count aims for in dense verification and scoring: more
/// splits than `keys / MIN_CHUNK` only add partial results to merge.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const MIN_CHUNK: usize = 256;
/// Fewest keys per split for sparse verification: one tile. A selection of about a thousand
/// keys is too little work to hide a block's copy latency behind four tiles in turn; split
/// to single tiles, more tiles' copies are in flight at once (ncu on the H200: 33 us of GPU
/// time for the 17.9 MB of K and V at 7B, B=8, budget 1024, with 256-key splits;
/// `docs/perf/kernel-gpu-time-2026-11-30/`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const SPARSE_MIN_CHUNK: usize = FLASH_KEYS;
/// Blocks of the flash kernel one SM holds at once: its 222 registers a thread (128 threads)
/// and 70 KB of shared memory a block allow 2 (ncu on the H200,
/// `docs/perf/flash-attention-kernel-2026-11-30/ncu-prefill-ttft/`).
pub(crate) const FLASH_BLOCKS_PER_SM: usize = 2;
/// Full waves of resident blocks the splits aim for: blocks of one call take about equally
/// long, so a grid of just over `w` waves costs `w + 1` (544 blocks on 264 slots run as
/// three waves, the last 6% full).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const FLASH_WAVES: usize = 2;

/// `(splits, chunk)` for a verification call whose grid has `per` blocks per split
/// (sequences x KV heads x row blocks), `max_keys` virtual keys in its longest sequence
/// (context or selection, plus the new tokens) and `sms` SMs: the most splits that keep the
/// grid within `waves` ([`FLASH_WAVES`] dense; 0 counts as 1) waves of
/// [`FLASH_BLOCKS_PER_SM`] blocks per SM (at least one), at most one per `min_chunk` keys ([`MIN_CHUNK`] dense, [`SPARSE_MIN_CHUNK`]
/// sparse; 0 counts as 1); `chunk` the keys per split, a multiple of [`FLASH_KEYS`], with
/// `splits * chunk >= max_keys` and no split empty for the longest sequence (`(splits - 1) *
/// chunk < max_keys`). `per`, `max_keys` and `sms` of 0 count as 1.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn verify_splits(
    per: usize,
    max_keys: usize,
    sms: usize,
    min_chunk: usize,
    waves: usize,
) -> (usize, usize) {
    let max_keys = max_keys.max(1);
    let want = (waves.max(1) * FLASH_BLOCKS_PER_SM * sms.max(1) / per.max(1)).max(1);
    let most = max_keys.div_ceil(min_chunk.max(1));
    let splits = want.min(most);
    let chunk = max_keys.div_ceil(splits).div_ceil(FLASH_KEYS) * FLASH_KEYS;
    (max_keys.div_ceil(chunk), chunk)
}

/// Fewest rows of `w` per split of the tensor-core skinny GEMM (where `k` allows): 4 steps of
/// 16 rows for each of a block's 4 warps.
pub(crate) const MMA_MIN_SPLIT_ROWS: usize = 256;
/// The share of their waves' slots a skinny GEMM grid's blocks must fill for the split count
/// to be taken (the first count that does; else the best).
pub(crate) const MMA_FILL: f64 = 0.95;

/// `(rows, splits)` for the tensor-core skinny GEMM `x [m, k] . w [k, n]`: `tiles` 64-column
/// tiles (over every weight sharing the partial-sum buffer), `slots` blocks resident on the
/// GPU at once (blocks per SM x SMs). Rows per split are a multiple of 16 (whole `mma` steps),
/// `splits = ceil(k / rows)`, and `splits` is the fewest whose grid (`tiles x splits` blocks)
/// fills at least [`MMA_FILL`] of its waves (`ceil(blocks / slots) x slots`), else the one
/// that fills them best, among at most `k / (16 m)` splits (the partial sums, `2 splits m n`
/// f32 written then read, stay under a quarter of the `k n` bf16 weight read) and at most `k /`
/// [`MMA_MIN_SPLIT_ROWS`]. The first rule, "best fill" alone, picked 99 splits for Qwen2.5-7B's
/// down projection at 8 rows (56 tiles, 396 slots: its only exact fill), whose reduction then
/// took 15.6 of the call's 90 us (ncu, docs/perf.md, 2026-12-01). `k`, `tiles`, `slots` of 0
/// count as 1 (a `k` of 0 as 16).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn mma_splits(k: usize, m: usize, tiles: usize, slots: usize) -> (usize, usize) {
    splits_in_units(k, m, tiles, slots, 16)
}

/// [`mma_splits`] with rows per split a multiple of `unit` (16: the tensor-core kernel's
/// `mma` steps; 32 or 64: the ring kernel's stages, `cuda::RingConfig::kc`); a `unit` of 0 counts
/// as 1.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn splits_in_units(
    k: usize,
    m: usize,
    tiles: usize,
    slots: usize,
    unit: usize,
) -> (usize, usize) {
    let unit = unit.max(1);
    let k = k.max(1);
    let (tiles, slots) = (tiles.max(1), slots.max(1));
    let cap = (k / (16 * m.max(1))).clamp(1, (k / MMA_MIN_SPLIT_ROWS).max(1));
    let mut best = (k.next_multiple_of(unit), 1usize, -1.0f64);
    for want in 1..=cap {
        let rows = k.div_ceil(want).next_multiple_of(unit);
        let splits = k.div_ceil(rows);
        let blocks = tiles * splits;
        let fill = blocks as f64 / (blocks.div_ceil(slots) * slots) as f64;
        if fill > best.2 + 1e-9 {
            best = (rows, splits, fill);
        }
        if fill >= MMA_FILL {
            break;
        }
    }
    (best.0, best.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Qwen2.5 projections on the H200 (132 SMs, 3 blocks an SM up to 32 rows: 396 slots;
    /// 2 above: 264), worked by hand. 7B down (`k` 18944, 3584 columns = 56 tiles) at 8 rows:
    /// 7 splits make 392 of 396 slots (99%), where "best fill" took 99 (5544 = 14 x 396);
    /// ceil(18944 / 7) = 2707 -> 2720 rows. 7B gate/up (296 tiles): 1, 2, 3 splits fill 75%,
    /// 4 make 1184 of 1188 (99.7%): 896 rows. 72B gate/up (462 tiles): 1-4 splits fill 58-93%,
    /// 5 make 2310 of 2376 (97%): ceil(8192 / 5) = 1639 -> 1648 rows. 7B gate/up at 40 rows
    /// (264 slots; at most 3584 / 640 = 5 splits): 5 make 1480 of 1584 (93%), under 95%, and the
    /// best.
    #[test]
    fn qwen_projections() {
        assert_eq!(mma_splits(18944, 8, 56, 396), (2720, 7));
        assert_eq!(mma_splits(3584, 8, 296, 396), (896, 4));
        assert_eq!(mma_splits(8192, 8, 462, 396), (1648, 5));
        assert_eq!(mma_splits(3584, 40, 296, 264), (720, 5));
        // 0.5B's k/v (896 -> 128 columns: 2 tiles) at one row: at most 896 / 256 = 3 splits
        assert_eq!(mma_splits(896, 1, 2, 396), (304, 3));
        // the ring kernel (3 blocks an SM: 396 slots), 72B gate/up as one SwiGLU launch at 40
        // rows (924 tiles; at most 8192 / 640 = 12 splits): 1 split fills 924 of 1188
        // (78%), 2 make 1848 of 1980 (93%), 3 make 2772 of 2772 (100%): ceil(8192 / 3) =
        // 2731 -> 2752 rows (a multiple of 32, where 16 would give 2736)
        assert_eq!(splits_in_units(8192, 40, 924, 396, 32), (2752, 3));
    }

    proptest! {
        /// Every unit a kernel plans in (16: the tensor-core kernel's `mma` steps, by
        /// `mma_splits`; 32 and 64: the ring kernel's stages, which it reads as `(k1 - k0) /
        /// unit` and would drop a remainder of): whole units in every split, the last one
        /// included, `k` covered, no empty split, within the caps.
        #[test]
        fn splits_are_whole_units_and_cover_k_within_their_caps(
            unit in prop::sample::select(vec![16usize, 32, 64]),
            ku in 1usize..4000,
            m in 1usize..129,
            tiles in 1usize..5000,
            slots in 1usize..2000,
        ) {
            let k = unit * ku;
            let (rows, splits) = if unit == 16 {
                mma_splits(k, m, tiles, slots)
            } else {
                splits_in_units(k, m, tiles, slots, unit)
            };
            prop_assert_eq!(rows % unit, 0);
            prop_assert!(splits >= 1);
            prop_assert!(rows * splits >= k, "k not covered");
            prop_assert!((splits - 1) * rows < k, "an empty split");
            // the last split's rows, k - (splits - 1) rows, are whole units too
            prop_assert_eq!((k - (splits - 1) * rows) % unit, 0);
            let cap = (k / (16 * m)).clamp(1, (k / MMA_MIN_SPLIT_ROWS).max(1));
            prop_assert!(splits <= cap, "{} splits over the cap {}", splits, cap);
        }
    }

    /// The benchmark shapes of docs/perf.md (B=8, 32k context + 5 new tokens, H200's 132
    /// SMs), worked by hand: 7B has 8 x 4 KV heads x 1 row block = 32 blocks a split, so
    /// floor(528 / 32) = 16 splits of ceil(32773 / 16) = 2049 -> 2112 keys (512 blocks, where
    /// the first version's 17 made 544); 72B has 8 x 8 = 64, so 8 splits of 4097 -> 4160.
    #[test]
    fn benchmark_shapes_fill_two_waves() {
        assert_eq!(
            verify_splits(32, 32773, 132, MIN_CHUNK, FLASH_WAVES),
            (16, 2112)
        );
        assert_eq!(
            verify_splits(64, 32773, 132, MIN_CHUNK, FLASH_WAVES),
            (8, 4160)
        );
        // B=1, 7B: 4 blocks a split would want 132 splits; 32773 keys allow 129 of 256, and
        // ceil(32773 / 129) = 255 -> 256 keys a split makes 129 splits
        assert_eq!(
            verify_splits(4, 32773, 132, MIN_CHUNK, FLASH_WAVES),
            (129, 256)
        );
        // a short context: one split of the 5 new tokens, rounded up to a tile
        assert_eq!(verify_splits(32, 5, 132, MIN_CHUNK, FLASH_WAVES), (1, 64));
    }

    /// Sparse verification at budget 1024 (+4 sinks +64 window, + 5 new tokens = 1097
    /// virtual keys), B=8: with 256-key splits 7B got ceil(1097 / 256) = 5 splits of 256
    /// (160 blocks, up to 4 tiles in turn each); with single tiles it wants 16 splits, ceil(1097
    /// / 16) = 69 -> 128 keys makes 9 splits (288 blocks of 2 tiles). 72B (64 blocks a split)
    /// wants 8: ceil(1097 / 8) = 138 -> 192 keys, 6 splits.
    #[test]
    fn sparse_selections_split_finer() {
        assert_eq!(
            verify_splits(32, 1097, 132, MIN_CHUNK, FLASH_WAVES),
            (5, 256)
        );
        assert_eq!(
            verify_splits(32, 1097, 132, SPARSE_MIN_CHUNK, FLASH_WAVES),
            (9, 128)
        );
        assert_eq!(
            verify_splits(64, 1097, 132, SPARSE_MIN_CHUNK, FLASH_WAVES),
            (6, 192)
        );
        // four waves: 7B wants 33, 18 tiles allow 18 of one tile each (576 blocks)
        assert_eq!(verify_splits(32, 1097, 132, SPARSE_MIN_CHUNK, 4), (18, 64));
    }

    proptest! {
        #[test]
        fn splits_cover_the_keys_within_two_waves(
            per in 1usize..2000,
            max_keys in 1usize..200_000,
            sms in 1usize..200,
            sparse in proptest::bool::ANY,
        ) {
            let min_chunk = if sparse { SPARSE_MIN_CHUNK } else { MIN_CHUNK };
            let waves = if sparse { 4 } else { FLASH_WAVES };
            let (splits, chunk) = verify_splits(per, max_keys, sms, min_chunk, waves);
            prop_assert!(splits >= 1);
            prop_assert_eq!(chunk % FLASH_KEYS, 0);
            prop_assert!(splits * chunk >= max_keys, "keys not covered");
            prop_assert!((splits - 1) * chunk < max_keys, "an empty split");
            prop_assert!(splits <= max_keys.div_ceil(min_chunk), "more splits than min_chunk allows");
            // within `waves` waves, unless one split a block already exceeds them
            let slots = waves * FLASH_BLOCKS_PER_SM * sms;
            prop_assert!(splits * per <= slots.max(per), "{} blocks over {} slots", splits * per, slots);
        }
    }
}
