//! `retain` keeps the kept sequences' keys and values in order, both where it compacts the
//! cache in place (a row of a layer a multiple of `VIEW_ALIGN_BYTES`) and where it rebuilds
//! the layers: a copy of the cache taken before is left as it was (copy on write), and appends
//! after the retain land in the kept rows. The expected values are written out from the
//! positions each sequence was given, not read from the cache.

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Tensor, TensorData};
use dustin_core::KvStore;
use dustin_kv::{DenseKvCache, KvShape, VIEW_ALIGN_BYTES};

const H: usize = 2;
const D: usize = 3;
const LAYERS: usize = 2;
/// Capacities whose f32 rows (`H * cap * D * 4` bytes) are a multiple of `VIEW_ALIGN_BYTES`
/// (compacted in place) and are not (rebuilt).
const CAPS: [usize; 2] = [64, 8];

/// Key entry `(layer, seq, head, pos, d)` of the pattern written below; values are its
/// negation.
fn key(layer: usize, seq: usize, head: usize, pos: usize, d: usize) -> f32 {
    (layer * 1_000_000 + seq * 100_000 + head * 10_000 + pos * 10 + d) as f32
}

/// Appends `n` positions per sequence (from each one's length `start`) to every layer,
/// sequences named by `ids` (their row `b` holds sequence `ids[b]`).
fn append(cache: &mut DenseKvCache<Flex>, ids: &[usize], start: usize, n: usize) {
    let b = ids.len();
    for l in 0..LAYERS {
        let mut k = Vec::with_capacity(b * H * n * D);
        for &s in ids {
            for h in 0..H {
                for i in 0..n {
                    for d in 0..D {
                        k.push(key(l, s, h, start + i, d));
                    }
                }
            }
        }
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        let t = |x: Vec<f32>| {
            Tensor::<Flex, 4>::from_data(TensorData::new(x, [b, H, n, D]), &FlexDevice)
        };
        cache.append(l, t(k), t(v)).unwrap();
    }
    cache.advance(n).unwrap();
}

/// Asserts that row `b` of `cache` holds sequence `ids[b]`'s first `len` positions.
fn assert_holds(cache: &DenseKvCache<Flex>, ids: &[usize], len: usize) {
    assert_eq!(cache.batch(), ids.len());
    assert!(cache.lens().iter().all(|&l| l == len), "{:?}", cache.lens());
    for l in 0..LAYERS {
        let view = cache.view(l, len);
        assert_eq!(view.k.dims(), [ids.len(), H, len, D]);
        let k = view.k.into_data().to_vec::<f32>().unwrap();
        let v = view.v.into_data().to_vec::<f32>().unwrap();
        for (b, &s) in ids.iter().enumerate() {
            for h in 0..H {
                for p in 0..len {
                    for d in 0..D {
                        let i = ((b * H + h) * len + p) * D + d;
                        let want = key(l, s, h, p, d);
                        assert_eq!(
                            k[i], want,
                            "layer {l}, row {b} (seq {s}), head {h}, pos {p}, d {d}"
                        );
                        assert_eq!(
                            v[i], -want,
                            "layer {l}, row {b} (seq {s}), head {h}, pos {p}, d {d}"
                        );
                    }
                }
            }
        }
    }
}

fn filled(batch: usize, len: usize, capacity: usize) -> DenseKvCache<Flex> {
    let shape = KvShape {
        batch,
        layers: LAYERS,
        kv_heads: H,
        capacity,
        head_dim: D,
    };
    let mut cache = DenseKvCache::<Flex>::new(shape, &FlexDevice);
    let ids: Vec<usize> = (0..batch).collect();
    append(&mut cache, &ids, 0, len);
    cache
}

#[test]
fn both_paths_are_exercised() {
    let row = |cap: usize| H * cap * D * 4;
    assert!(row(CAPS[0]).is_multiple_of(VIEW_ALIGN_BYTES));
    assert!(!row(CAPS[1]).is_multiple_of(VIEW_ALIGN_BYTES));
}

#[test]
fn retain_moves_the_kept_rows_and_leaves_a_copy_alone() {
    for cap in CAPS {
        moves_the_kept_rows(cap);
    }
}

fn moves_the_kept_rows(cap: usize) {
    // rows 0 stays, 2 and 3 move down (the first moved row is 1)
    let mut cache = filled(5, 3, cap);
    let before = cache.clone();
    cache.retain(&[0, 2, 3]).unwrap();
    assert_holds(&cache, &[0, 2, 3], 3);
    assert_holds(&before, &[0, 1, 2, 3, 4], 3);
    // appends after the compaction go to the kept sequences' rows
    append(&mut cache, &[0, 2, 3], 3, 2);
    assert_holds(&cache, &[0, 2, 3], 5);
    assert_holds(&before, &[0, 1, 2, 3, 4], 3);
    // and a second compaction of the compacted cache
    cache.retain(&[2]).unwrap();
    assert_holds(&cache, &[3], 5);
}

#[test]
fn retain_of_a_leading_run_and_of_one_row() {
    for cap in CAPS {
        leading_run_and_one_row(cap);
    }
}

fn leading_run_and_one_row(cap: usize) {
    let mut cache = filled(4, 2, cap);
    cache.retain(&[0, 1]).unwrap();
    assert_holds(&cache, &[0, 1], 2);
    append(&mut cache, &[0, 1], 2, 1);
    assert_holds(&cache, &[0, 1], 3);
    let mut cache = filled(4, 2, cap);
    cache.retain(&[3]).unwrap();
    assert_holds(&cache, &[3], 2);
    append(&mut cache, &[3], 2, 3);
    assert_holds(&cache, &[3], 5);
}
