//! Property: after any sequence of appends, rollbacks (truncate) and batch compaction
//! (retain), the cache holds exactly the entries of a cache built directly from the
//! surviving tokens (a host model of the cache, independent of the tensor code).

#![allow(clippy::needless_range_loop, clippy::type_complexity)]

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Tensor, TensorData};
use dustin_core::KvStore;
use dustin_kv::{DenseKvCache, KvShape};
use proptest::prelude::*;

type B = Flex;
const H: usize = 2;
const D: usize = 3;
const CAP: usize = 24;

#[derive(Debug, Clone)]
enum Op {
    Append(usize),
    Truncate(usize, usize),
    Retain(Vec<bool>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..5).prop_map(Op::Append),
        (0usize..3, 0usize..CAP).prop_map(|(s, l)| Op::Truncate(s, l)),
        proptest::collection::vec(any::<bool>(), 3).prop_map(Op::Retain),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn cache_equals_direct_build(ops in proptest::collection::vec(op(), 1..16)) {
        let dev = FlexDevice;
        let layers = 2;
        let mut cache = DenseKvCache::<B>::new(KvShape { batch: 3, layers, kv_heads: H, capacity: CAP, head_dim: D }, &dev);
        // host model: per sequence, per layer, the list of (k, v) rows [H][D] per position
        let mut model: Vec<Vec<Vec<(Vec<f32>, Vec<f32>)>>> = vec![vec![Vec::new(); layers]; 3];
        let mut counter = 0.0f32;
        for op in ops {
            match op {
                Op::Append(n) => {
                    let b = model.len();
                    if b == 0 || model.iter().any(|s| s[0].len() + n > CAP) {
                        continue;
                    }
                    for l in 0..layers {
                        let mut kd = vec![0.0f32; b * H * n * D];
                        let mut vd = vec![0.0f32; b * H * n * D];
                        for s in 0..b {
                            for i in 0..n {
                                let mut krow = Vec::new();
                                let mut vrow = Vec::new();
                                for h in 0..H {
                                    for d in 0..D {
                                        counter += 1.0;
                                        let idx = ((s * H + h) * n + i) * D + d;
                                        kd[idx] = counter;
                                        vd[idx] = -counter;
                                        krow.push(counter);
                                        vrow.push(-counter);
                                    }
                                }
                                model[s][l].push((krow, vrow));
                            }
                        }
                        let k = Tensor::<B, 4>::from_data(TensorData::new(kd, [b, H, n, D]), &dev);
                        let v = Tensor::<B, 4>::from_data(TensorData::new(vd, [b, H, n, D]), &dev);
                        cache.append(l, k, v).unwrap();
                    }
                    cache.advance(n).unwrap();
                }
                Op::Truncate(s, len) => {
                    if s >= model.len() {
                        prop_assert!(cache.truncate(s, 0).is_err());
                        continue;
                    }
                    let cur = model[s][0].len();
                    if len > cur {
                        prop_assert!(cache.truncate(s, len).is_err());
                        continue;
                    }
                    cache.truncate(s, len).unwrap();
                    for l in 0..layers {
                        model[s][l].truncate(len);
                    }
                }
                Op::Retain(mask) => {
                    let keep: Vec<usize> = (0..model.len()).filter(|&i| mask[i]).collect();
                    if keep.is_empty() {
                        continue;
                    }
                    cache.retain(&keep).unwrap();
                    model = keep.iter().map(|&i| model[i].clone()).collect();
                }
            }
            // compare
            prop_assert_eq!(cache.batch(), model.len());
            for (s, m) in model.iter().enumerate() {
                prop_assert_eq!(cache.lens()[s], m[0].len());
            }
            for l in 0..layers {
                let view = cache.view(l, CAP);
                let kd: Vec<f32> = view.k.into_data().into_vec().unwrap();
                let vd: Vec<f32> = view.v.into_data().into_vec().unwrap();
                for (s, m) in model.iter().enumerate() {
                    for (p, (krow, vrow)) in m[l].iter().enumerate() {
                        for h in 0..H {
                            for d in 0..D {
                                let idx = ((s * H + h) * CAP + p) * D + d;
                                prop_assert_eq!(kd[idx], krow[h * D + d]);
                                prop_assert_eq!(vd[idx], vrow[h * D + d]);
                            }
                        }
                    }
                }
            }
        }
    }
}
