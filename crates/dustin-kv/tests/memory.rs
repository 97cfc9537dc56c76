//! The KV cache checks its memory before allocating: an absurd batch x context fails with
//! the figures (needed, available), a small one allocates.

use burn_flex::{Flex, FlexDevice};
use dustin_core::CoreError;
use dustin_kv::{DenseKvCache, KvShape};

#[test]
fn absurd_cache_is_an_error_with_the_figures() {
    let shape = KvShape {
        batch: 1 << 10,
        layers: 80,
        kv_heads: 8,
        capacity: 1 << 30,
        head_dim: 128,
    };
    let r = DenseKvCache::<Flex>::try_new(shape, &FlexDevice);
    let Some(avail) = dustin_core::memory::host_available_bytes() else {
        // no /proc/meminfo: the check is skipped (documented)
        return;
    };
    match r {
        Err(CoreError::OutOfMemory {
            needed,
            available,
            what,
            origin,
        }) => {
            assert_eq!(needed, 2 * (1u128 << 10) * 80 * 8 * (1u128 << 30) * 128 * 4);
            // MemAvailable moves between two reads; same order of magnitude
            assert!(available > 0 && available / 2 <= avail && avail / 2 <= available);
            assert!(
                what.contains("batch 1024") && what.contains("80 layers"),
                "{what}"
            );
            assert_eq!(origin, "MemAvailable in /proc/meminfo");
        }
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!("allocated an absurd cache"),
    }
}

#[test]
fn small_cache_allocates_and_a_limit_applies() {
    let shape = KvShape {
        batch: 2,
        layers: 2,
        kv_heads: 2,
        capacity: 16,
        head_dim: 8,
    };
    let c = DenseKvCache::<Flex>::try_new(shape, &FlexDevice).expect("small cache");
    assert_eq!(c.shape(), shape);
    // the check against a given limit (the CLI's --max-memory) is `check_bytes`; the
    // process-wide limit itself is not set here, as tests share the process
    let e = dustin_core::memory::check_bytes("x", shape.bytes(4), Some((100, "a limit")))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("needs 8.0 KiB (8192 bytes), but only 100 bytes are available (a limit)"),
        "{e}"
    );
}

/// `from_layers` keeps the given contents (a view reads them back) and refuses mismatched
/// layers and lengths, naming them.
#[test]
fn from_layers_keeps_contents_and_checks_shapes() {
    use burn_tensor::{Tensor, TensorData};
    use dustin_core::KvStore;
    let t = |x: f32| {
        let v: Vec<f32> = (0..2 * 3 * 4).map(|i| x + i as f32).collect();
        Tensor::<Flex, 4>::from_data(TensorData::new(v, [2, 1, 3, 4]), &FlexDevice)
    };
    let cache = DenseKvCache::from_layers(vec![t(0.0), t(100.0)], vec![t(50.0), t(150.0)], &[2, 3])
        .expect("cache");
    assert_eq!(cache.lens(), &[2, 3]);
    assert_eq!(cache.shape().layers, 2);
    let view = cache.view(1, 3);
    let k: Vec<f32> = view.k.into_data().to_vec().expect("f32");
    let v: Vec<f32> = view.v.into_data().to_vec().expect("f32");
    assert_eq!(k[5], 105.0);
    assert_eq!(v[23], 173.0);
    let small = Tensor::<Flex, 4>::zeros([2, 1, 2, 4], &FlexDevice);
    let e = DenseKvCache::from_layers(vec![t(0.0), small], vec![t(0.0), t(0.0)], &[1, 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`k`"), "{e}");
    let e = DenseKvCache::from_layers(vec![t(0.0)], vec![t(0.0)], &[1, 4])
        .unwrap_err()
        .to_string();
    assert!(e.contains("capacity") || e.contains("lens"), "{e}");
    let e = DenseKvCache::<Flex>::from_layers(vec![], vec![], &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`k`"), "{e}");
}

/// A batch filled one sequence at a time holds what stacking the sequences gives: each
/// sequence's own keys and values at its own length; bad parts are named.
#[test]
fn write_sequence_places_each_part_in_its_slot() {
    use burn_tensor::{Tensor, TensorData};
    use dustin_core::KvStore;
    let (layers, heads, cap, hd) = (2, 3, 5, 4);
    let part = |seed: f32, len: usize| {
        let mk = |off: f32| -> Vec<Tensor<Flex, 4>> {
            (0..layers)
                .map(|l| {
                    let v: Vec<f32> = (0..heads * cap * hd)
                        .map(|i| seed * 1000.0 + off + (l * 100) as f32 + i as f32)
                        .collect();
                    Tensor::from_data(TensorData::new(v, [1, heads, cap, hd]), &FlexDevice)
                })
                .collect()
        };
        DenseKvCache::from_layers(mk(0.0), mk(0.5), &[len]).unwrap()
    };
    let shape = KvShape {
        batch: 3,
        layers,
        kv_heads: heads,
        capacity: cap,
        head_dim: hd,
    };
    let mut all = DenseKvCache::<Flex>::new(shape, &FlexDevice);
    // out of order, as a prefill may finish them
    for (seq, len) in [(2usize, 4usize), (0, 1), (1, 3)] {
        all.write_sequence(seq, part(seq as f32 + 1.0, len))
            .unwrap();
    }
    assert_eq!(all.lens(), &[1, 3, 4]);
    for l in 0..layers {
        let k: Vec<f32> = all.view(l, cap).k.into_data().into_vec().unwrap();
        let v: Vec<f32> = all.view(l, cap).v.into_data().into_vec().unwrap();
        let per = heads * cap * hd;
        for seq in 0..3 {
            for i in 0..per {
                let want = (seq as f32 + 1.0) * 1000.0 + (l * 100) as f32 + i as f32;
                assert_eq!(k[seq * per + i], want, "layer {l} seq {seq} k[{i}]");
                assert_eq!(v[seq * per + i], want + 0.5, "layer {l} seq {seq} v[{i}]");
            }
        }
    }
    let e = all.write_sequence(3, part(1.0, 1)).unwrap_err().to_string();
    assert!(e.contains("seq"), "{e}");
    let two = DenseKvCache::<Flex>::new(KvShape { batch: 2, ..shape }, &FlexDevice);
    let e = all.write_sequence(0, two).unwrap_err().to_string();
    assert!(e.contains("part"), "{e}");
    // each sequence read back as a batch-1 cache: its own values and length; writing into
    // the copy leaves the batch as it was
    for seq in 0..3 {
        let mut one = all.sequence(seq).unwrap();
        assert_eq!(one.lens(), &[[1, 3, 4][seq]]);
        assert_eq!(one.shape(), KvShape { batch: 1, ..shape });
        let k: Vec<f32> = one.view(1, cap).k.into_data().into_vec().unwrap();
        assert_eq!(k[7], (seq as f32 + 1.0) * 1000.0 + 100.0 + 7.0);
        let zeros = || Tensor::<Flex, 4>::zeros([1, heads, 1, hd], &FlexDevice);
        one.append(1, zeros(), zeros()).unwrap();
    }
    let k: Vec<f32> = all.view(1, cap).k.into_data().into_vec().unwrap();
    let per = heads * cap * hd;
    for seq in 0..3 {
        let at = seq * per + [1, 3, 4][seq] * hd;
        assert_eq!(
            k[at],
            (seq as f32 + 1.0) * 1000.0 + 100.0 + ([1, 3, 4][seq] * hd) as f32
        );
    }
    let e = all.sequence(3).unwrap_err().to_string();
    assert!(e.contains("seq"), "{e}");
    // row 1 as a cache of its own whose writes land in the batch: its values and length,
    // an append at its length, the other rows and layers untouched
    let before: Vec<f32> = all.view(0, cap).v.into_data().into_vec().unwrap();
    let mut row = all.into_row(1).unwrap();
    assert!(row.is_row());
    assert_eq!(row.lens(), &[3]);
    assert_eq!(row.shape(), KvShape { batch: 1, ..shape });
    let v: Vec<f32> = row.view(0, cap).v.into_data().into_vec().unwrap();
    assert_eq!(v[2 * hd], 2000.0 + 0.5 + (2 * hd) as f32);
    // refused until the row goes back
    for e in [
        row.sequence(0).unwrap_err().to_string(),
        row.retain(&[0]).unwrap_err().to_string(),
        row.clone().into_row(0).unwrap_err().to_string(),
        DenseKvCache::stack(vec![row.clone()])
            .unwrap_err()
            .to_string(),
    ] {
        assert!(e.contains("into_batch"), "{e}");
    }
    let ones = |x: f32| Tensor::<Flex, 4>::ones([1, heads, 2, hd], &FlexDevice) * x;
    row.append(0, ones(7.0), ones(9.0)).unwrap();
    row.advance(2).unwrap();
    let all = row.into_batch();
    assert!(!all.is_row());
    assert_eq!(all.lens(), &[1, 5, 4]);
    let v: Vec<f32> = all.view(0, cap).v.into_data().into_vec().unwrap();
    let k: Vec<f32> = all.view(0, cap).k.into_data().into_vec().unwrap();
    for (i, (&a, &b)) in before.iter().zip(&v).enumerate() {
        let (seq, h, pos) = (i / per, (i % per) / (cap * hd), (i % (cap * hd)) / hd);
        if seq == 1 && (3..5).contains(&pos) {
            assert_eq!(b, 9.0, "v of row 1, head {h}, position {pos}");
            assert_eq!(k[i], 7.0, "k of row 1, head {h}, position {pos}");
        } else {
            assert_eq!(
                a, b,
                "v[{i}] (sequence {seq}, head {h}, position {pos}) moved"
            );
        }
    }
    let e = all.clone().into_row(3).unwrap_err().to_string();
    assert!(e.contains("seq"), "{e}");
}
