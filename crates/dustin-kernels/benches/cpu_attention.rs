//! CPU cost of the attention of decoding and verification: the host kernel of
//! [`dustin_kernels::cpu_attn`] (`Flex`'s `KernelOps::verify_attention` and
//! `sparse_verify_attention`) against the plain path of Burn ops
//! ([`dustin_kernels::plain`]) on the same inputs, at the shapes of the Qwen2.5-Coder pair:
//! the 1.5B target (12 query heads, 2 KV heads, head width 128) and the 0.5B draft (14, 2,
//! 64), a context of 2,048 tokens held in a cache of 4,096 (the model passes a prefix view
//! of it), `n_new` = 1 (decoding) and 5 (verification at gamma 4), and a selection of 256
//! positions per KV head (a budget of 1/8).
//!
//! The `prefill` groups time a prefill chunk of [`PREFILL_NEW`] tokens after
//! [`PREFILL_CTX`] (dense, causal): `Flex`'s `prefill_attention` (the tiles of
//! [`dustin_kernels::cpu_prefill`]) against the chunked kernel of `cpu_attn` on the same
//! inputs.
//!
//! `cargo bench -p dustin-kernels --bench cpu_attention` (criterion; a filter such as
//! `target`, `sparse` or `prefill` picks groups).

use std::hint::black_box;

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Int, Tensor, TensorData};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use dustin_kernels::prelude::*;
use dustin_kernels::{plain, reference};

/// `(name, q_heads, kv_heads, head_dim)` of the pair's models.
const MODELS: [(&str, usize, usize, usize); 2] = [("target", 12, 2, 128), ("draft", 14, 2, 64)];

/// Context tokens before the new ones.
const CTX: usize = 2048;
/// Cache capacity.
const CAP: usize = 4096;
/// Selected positions per KV head.
const BUDGET: usize = 256;
/// Context before a prefill chunk.
const PREFILL_CTX: usize = 2048;
/// New tokens of a prefill chunk.
const PREFILL_NEW: usize = 512;

fn tensor4(v: Vec<f32>, shape: [usize; 4]) -> Tensor<Flex, 4> {
    Tensor::from_data(TensorData::new(v, shape), &FlexDevice)
}

fn bench(c: &mut Criterion) {
    for (name, hq, kvh, d) in MODELS {
        let mut group = c.benchmark_group(format!("{name} attention ctx {CTX}"));
        for n in [1usize, 5] {
            let q = tensor4(reference::random_bf16(hq * n * d, 2.0, 1), [1, hq, n, d]);
            let k = tensor4(
                reference::random_bf16(kvh * CAP * d, 2.0, 2),
                [1, kvh, CAP, d],
            );
            let v = tensor4(
                reference::random_bf16(kvh * CAP * d, 1.0, 3),
                [1, kvh, CAP, d],
            );
            let (k, v) = (k.narrow(2, 0, CTX + n), v.narrow(2, 0, CTX + n));
            let scale = 1.0 / (d as f32).sqrt();
            let (idx, counts) = reference::random_selection(1, kvh, BUDGET, &[CTX], 4);
            let idx = Tensor::<Flex, 3, Int>::from_data(
                TensorData::new(idx, [1, kvh, BUDGET]),
                &FlexDevice,
            );
            let args = || (q.clone(), k.clone(), v.clone());
            group.bench_function(BenchmarkId::new("dense kernel", n), |b| {
                b.iter(|| {
                    let (q, k, v) = args();
                    black_box(Flex::verify_attention(q, k, v, &[CTX], scale).expect("kernel"))
                })
            });
            group.bench_function(BenchmarkId::new("dense plain", n), |b| {
                b.iter(|| {
                    let (q, k, v) = args();
                    black_box(plain::verify_attention(q, k, v, &[CTX], scale).expect("plain"))
                })
            });
            group.bench_function(BenchmarkId::new("sparse kernel", n), |b| {
                b.iter(|| {
                    let (q, k, v) = args();
                    black_box(
                        Flex::sparse_verify_attention(q, k, v, &[CTX], idx.clone(), &counts, scale)
                            .expect("kernel"),
                    )
                })
            });
            group.bench_function(BenchmarkId::new("sparse plain", n), |b| {
                b.iter(|| {
                    let (q, k, v) = args();
                    black_box(
                        plain::sparse_verify_attention(
                            q,
                            k,
                            v,
                            &[CTX],
                            idx.clone(),
                            &counts,
                            scale,
                        )
                        .expect("plain"),
                    )
                })
            });
        }
        group.finish();
    }
}

fn prefill(c: &mut Criterion) {
    use dustin_kernels::cpu_attn::{self, Context, Shape, Strided};
    for (name, hq, kvh, d) in MODELS {
        let mut group =
            c.benchmark_group(format!("{name} prefill {PREFILL_NEW} after {PREFILL_CTX}"));
        let (n, cap) = (PREFILL_NEW, PREFILL_CTX + PREFILL_NEW);
        let qv = reference::random_bf16(hq * n * d, 2.0, 5);
        let kv = reference::random_bf16(kvh * cap * d, 2.0, 6);
        let vv = reference::random_bf16(kvh * cap * d, 1.0, 7);
        let scale = 1.0 / (d as f32).sqrt();
        let (q, k, v) = (
            tensor4(qv.clone(), [1, hq, n, d]),
            tensor4(kv.clone(), [1, kvh, cap, d]),
            tensor4(vv.clone(), [1, kvh, cap, d]),
        );
        group.bench_function("tiles (prefill_attention)", |b| {
            b.iter(|| {
                black_box(
                    Flex::prefill_attention(q.clone(), k.clone(), v.clone(), &[PREFILL_CTX], scale)
                        .expect("kernel"),
                )
            })
        });
        let view = |data| Strided {
            data,
            offset: 0,
            strides: [kvh * cap * d, cap * d, d],
            head_dim: d,
        };
        let shape = Shape {
            batch: 1,
            q_heads: hq,
            kv_heads: kvh,
            n_new: n,
            head_dim: d,
        };
        group.bench_function("chunked (cpu_attn)", |b| {
            b.iter(|| {
                black_box(cpu_attn::attention(
                    &qv,
                    view(&kv),
                    view(&vv),
                    shape,
                    &[PREFILL_CTX],
                    Context::Dense,
                    scale,
                ))
            })
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_group! {
    name = prefill_benches;
    config = Criterion::default().sample_size(10);
    targets = prefill
}
criterion_main!(benches, prefill_benches);
