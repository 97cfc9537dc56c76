//! `DenseKvCache::append_with` and `append_pair_with`: the writer sees each layer's whole cache, the new rows and
//! the cached lengths; its result is what the cache holds; bad input is refused before the
//! writer runs.

use std::cell::Cell;

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Tensor, TensorData};
use dustin_core::{CoreError, KvStore};
use dustin_kv::{DenseKvCache, KvShape};

fn shape() -> KvShape {
    KvShape {
        batch: 2,
        layers: 2,
        kv_heads: 1,
        capacity: 6,
        head_dim: 2,
    }
}

fn rows(base: f32, n: usize) -> Tensor<Flex, 4> {
    let v: Vec<f32> = (0..2 * n * 2).map(|i| base + i as f32).collect();
    Tensor::from_data(TensorData::new(v, [2, 1, n, 2]), &FlexDevice)
}

/// Two caches of a ragged batch (sequence 0 holds 1 position, sequence 1 holds 3), the first
/// with two more positions appended the plain way; the second is for the writer under test.
fn ragged_pair() -> (DenseKvCache<Flex>, DenseKvCache<Flex>) {
    let mut a = DenseKvCache::<Flex>::try_new(shape(), &FlexDevice).unwrap();
    let mut b = DenseKvCache::<Flex>::try_new(shape(), &FlexDevice).unwrap();
    for c in [&mut a, &mut b] {
        for l in 0..2 {
            c.append(l, rows(100.0, 3), rows(200.0, 3)).unwrap();
        }
        c.set_lens(&[1, 3]).unwrap();
    }
    for l in 0..2 {
        a.append(l, rows(1.0, 2), rows(50.0, 2)).unwrap();
    }
    (a, b)
}

/// Every layer's keys and values of `a` and `b` are equal.
fn assert_same(a: &DenseKvCache<Flex>, b: &DenseKvCache<Flex>) {
    for l in 0..2 {
        let (va, vb) = (a.view(l, 6), b.view(l, 6));
        for (x, y) in [(va.k, vb.k), (va.v, vb.v)] {
            let (x, y) = (
                x.into_data().to_vec::<f32>().unwrap(),
                y.into_data().to_vec::<f32>().unwrap(),
            );
            assert_eq!(x, y, "layer {l}");
        }
    }
}

#[test]
fn append_with_hands_the_writer_the_lengths_and_keeps_its_result() {
    let (a, mut b) = ragged_pair();
    let calls = Cell::new(0);
    for l in 0..2 {
        b.append_with(l, rows(1.0, 2), rows(50.0, 2), |dst, src, lens| {
            assert_eq!(lens, &[1, 3]);
            assert_eq!(dst.dims(), [2, 1, 6, 2]);
            assert_eq!(src.dims(), [2, 1, 2, 2]);
            calls.set(calls.get() + 1);
            // the same rows written the plain way, one sequence at a time
            let mut dst = dst;
            for (s, &st) in lens.iter().enumerate() {
                let row = src.clone().slice([s..s + 1, 0..1, 0..2, 0..2]);
                dst = dst.slice_assign([s..s + 1, 0..1, st..st + 2, 0..2], row);
            }
            Ok(dst)
        })
        .unwrap();
    }
    assert_eq!(calls.get(), 4, "keys and values of two layers");
    assert_same(&a, &b);
    // sequence 1's new keys went to positions 3 and 4 of layer 0
    let k = b.view(0, 6).k.into_data().to_vec::<f32>().unwrap();
    assert_eq!(&k[12 + 6..12 + 10], &[5.0, 6.0, 7.0, 8.0]);
}

#[test]
fn append_with_refuses_bad_input_before_writing() {
    let mut c = DenseKvCache::<Flex>::try_new(shape(), &FlexDevice).unwrap();
    let never = |_: Tensor<Flex, 4>,
                 _: Tensor<Flex, 4>,
                 _: &[usize]|
     -> dustin_core::Result<Tensor<Flex, 4>> { panic!("the writer must not run") };
    // 7 new positions in a cache of 6
    assert!(matches!(
        c.append_with(0, rows(0.0, 7), rows(0.0, 7), never),
        Err(CoreError::CacheFull { .. })
    ));
    // layer out of range
    assert!(c.append_with(5, rows(0.0, 1), rows(0.0, 1), never).is_err());
    // a writer's error comes back as is
    let r = c.append_with(0, rows(0.0, 1), rows(0.0, 1), |_, _, _| {
        Err(CoreError::Model("writer failed".into()))
    });
    assert!(matches!(r, Err(CoreError::Model(m)) if m == "writer failed"));
}

#[test]
fn append_pair_with_writes_keys_and_values_in_one_call() {
    let (a, mut b) = ragged_pair();
    let calls = Cell::new(0);
    for l in 0..2 {
        b.append_pair_with(l, rows(1.0, 2), rows(50.0, 2), |kd, vd, ks, vs, lens| {
            assert_eq!(lens, &[1, 3]);
            assert_eq!((kd.dims(), vd.dims()), ([2, 1, 6, 2], [2, 1, 6, 2]));
            calls.set(calls.get() + 1);
            let write = |mut dst: Tensor<Flex, 4>, src: Tensor<Flex, 4>| {
                for (s, &st) in lens.iter().enumerate() {
                    let row = src.clone().slice([s..s + 1, 0..1, 0..2, 0..2]);
                    dst = dst.slice_assign([s..s + 1, 0..1, st..st + 2, 0..2], row);
                }
                dst
            };
            Ok((write(kd, ks), write(vd, vs)))
        })
        .unwrap();
    }
    assert_eq!(calls.get(), 2, "one call per layer");
    assert_same(&a, &b);
    // sequence 1's new values went to positions 3 and 4 of layer 1
    let v = b.view(1, 6).v.into_data().to_vec::<f32>().unwrap();
    assert_eq!(&v[12 + 6..12 + 10], &[54.0, 55.0, 56.0, 57.0]);
}

#[test]
fn append_pair_with_refuses_bad_input_before_writing() {
    let mut c = DenseKvCache::<Flex>::try_new(shape(), &FlexDevice).unwrap();
    type Pair = (Tensor<Flex, 4>, Tensor<Flex, 4>);
    let never = |_: Tensor<Flex, 4>,
                 _: Tensor<Flex, 4>,
                 _: Tensor<Flex, 4>,
                 _: Tensor<Flex, 4>,
                 _: &[usize]|
     -> dustin_core::Result<Pair> { panic!("the writer must not run") };
    assert!(matches!(
        c.append_pair_with(0, rows(0.0, 7), rows(0.0, 7), never),
        Err(CoreError::CacheFull { .. })
    ));
    assert!(c
        .append_pair_with(5, rows(0.0, 1), rows(0.0, 1), never)
        .is_err());
    // values of another shape than the keys
    assert!(matches!(
        c.append_pair_with(0, rows(0.0, 1), rows(0.0, 2), never),
        Err(CoreError::Shape { .. })
    ));
    let r = c.append_pair_with(0, rows(0.0, 1), rows(0.0, 1), |_, _, _, _, _| {
        Err(CoreError::Model("writer failed".into()))
    });
    assert!(matches!(r, Err(CoreError::Model(m)) if m == "writer failed"));
}
