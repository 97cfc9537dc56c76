//! CPU cost of choosing a selection, per layer, at SmolLM2-135M attention shapes (9 query /
//! 3 KV heads, head_dim 64) with a 4096-token context and gamma + 1 = 5 new tokens: the
//! shared top-k step alone, and each selector's whole per-layer decision (score + top-k).
//!
//! `cargo bench -p dustin-select --bench select`. Figures go in docs/perf.md.

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Distribution, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use dustin_core::{AttentionHook, LayerAttnCtx, Phase, SelectionPolicy};
use dustin_select::{build, select_top_k, SelectConfig};

type B = Flex;

const KVH: usize = 3;
const G: usize = 3;
const D: usize = 64;
const CTX: usize = 4096;
const NEW: usize = 5;
const BUDGET: usize = 512;

fn rand<const N: usize>(shape: [usize; N]) -> Tensor<B, N> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &FlexDevice)
}

fn bench(c: &mut Criterion) {
    let cfg = SelectConfig::with_budget(BUDGET);
    let mut g = c.benchmark_group("select_4096");
    let scores = rand([1, KVH, CTX]);
    g.bench_function("top_k_only", |b| {
        b.iter(|| select_top_k(scores.clone(), &[CTX], cfg.keep()).expect("top-k"))
    });
    let k = rand([1, KVH, CTX + NEW, D]);
    let q = rand([1, KVH * G, NEW, D]);
    let q_prefill = rand([1, KVH * G, 64, D]);
    let k_prefill = k.clone().slice([0..1, 0..KVH, 0..CTX, 0..D]);
    let la: Tensor<B, 2> = burn_tensor::activation::softmax(rand([1, CTX]), 1);
    for name in ["streaming", "h2o", "snapkv", "quest", "oracle", "dustin"] {
        let mut p = build::<B>(name, &cfg).expect("selector");
        p.reset(1, 1);
        let pre = LayerAttnCtx {
            layer: 0,
            phase: Phase::Prefill {
                seq: 0,
                last_chunk: true,
            },
            q: &q_prefill,
            k: &k_prefill,
            ctx_lens: &[CTX - 64],
            n_new: 64,
            scale: 0.125,
        };
        p.on_layer(&pre).expect("prefill");
        let ctx = LayerAttnCtx {
            layer: 0,
            phase: Phase::Decode,
            q: &q,
            k: &k,
            ctx_lens: &[CTX],
            n_new: NEW,
            scale: 0.125,
        };
        let mut it = 0;
        g.bench_with_input(BenchmarkId::new("selector", name), &name, |b, _| {
            b.iter(|| {
                if p.wants_lookahead() {
                    p.observe_lookahead(&la);
                }
                p.begin_verify(it);
                it += 1;
                let sel = p.on_layer(&ctx).expect("select");
                p.commit(&[NEW - 1]).expect("commit");
                sel
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
