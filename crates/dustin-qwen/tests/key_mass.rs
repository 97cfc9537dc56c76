//! `Qwen2::key_mass` (the attention mass per key of queries already run through a layer,
//! scored later against the cache) against a float64 host computation from the queries and
//! keys the layer showed its hook, on the HF parity fixtures, CPU: a ragged batch, more rows
//! than one scoring call takes (`MAX_NEW`), a slice of rows starting past the context, the
//! plain and the kernel path; and its errors.

use std::path::Path;

use burn_flex::{Flex, FlexDevice};
use burn_tensor::Tensor;
use dustin_core::{AttentionHook, DenseHook, KvStore, LayerAttnCtx, LayerSelection, Phase};
use dustin_kernels::MAX_NEW;
use dustin_qwen::{ForwardOpts, LogitsMode, Qwen2, QwenConfig, SafetensorsDir};

type B = Flex;

fn model(name: &str, kernels: bool) -> Qwen2<B> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(name);
    let cfg = QwenConfig::from_file(&dir.join("config.json")).unwrap();
    let src = SafetensorsDir::open(&dir).unwrap();
    Qwen2::load(&cfg, &src, 64, &FlexDevice)
        .unwrap()
        .with_kernels(Some(kernels))
}

/// Keeps one layer's queries and keys (as the layer shows them to its hook).
struct Capture {
    layer: usize,
    q: Option<Tensor<B, 4>>,
    k: Option<Tensor<B, 4>>,
}

impl AttentionHook<B> for Capture {
    fn on_layer(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
    ) -> dustin_core::Result<Option<LayerSelection<B>>> {
        if ctx.layer == self.layer {
            self.q = Some(ctx.q.clone());
            self.k = Some(ctx.k.clone());
        }
        Ok(None)
    }
}

fn host4(t: &Tensor<B, 4>) -> (Vec<f64>, [usize; 4]) {
    let d = t.dims();
    let v: Vec<f32> = t.clone().into_data().convert::<f32>().to_vec().unwrap();
    (v.into_iter().map(f64::from).collect(), d)
}

/// Float64 mass of rows `rows` of `q` (row `i` at position `ctx_lens[b] + i`, seeing keys
/// `0 ..= ctx_lens[b] + i`): `[batch][kv_heads][width]`.
fn reference(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    ctx_lens: &[usize],
    rows: std::ops::Range<usize>,
    width: usize,
) -> Vec<Vec<Vec<f64>>> {
    let (qv, [b, nh, n, hd]) = host4(q);
    let (kv, [_, kvh, kl, _]) = host4(k);
    let g = nh / kvh;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![vec![vec![0.0; width]; kvh]; b];
    for s in 0..b {
        for h in 0..nh {
            let kh = h / g;
            for i in rows.clone() {
                assert!(i < n);
                let vis = ctx_lens[s] + i + 1;
                assert!(vis <= kl);
                let qi = &qv[((s * nh + h) * n + i) * hd..][..hd];
                let logits: Vec<f64> = (0..vis)
                    .map(|j| {
                        let kj = &kv[((s * kvh + kh) * kl + j) * hd..][..hd];
                        scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>()
                    })
                    .collect();
                let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|x| (x - m).exp()).sum();
                for (j, x) in logits.iter().enumerate() {
                    out[s][kh][j] += (x - m).exp() / z;
                }
            }
        }
    }
    out
}

fn max_err(got: &Tensor<B, 3>, want: &[Vec<Vec<f64>>]) -> f64 {
    let [b, kvh, w] = got.dims();
    let v: Vec<f32> = got.clone().into_data().to_vec().unwrap();
    let mut err = 0.0f64;
    for s in 0..b {
        for h in 0..kvh {
            for j in 0..w {
                let e = (f64::from(v[(s * kvh + h) * w + j]) - want[s][h][j]).abs();
                err = err.max(e);
            }
        }
    }
    err
}

/// A 2-sequence cache with lengths `[10, 6]`, then `new` tokens each through `layer`'s
/// capture: the captured queries and keys, the model and its cache.
fn setup(
    name: &str,
    kernels: bool,
    layer: usize,
    new: usize,
) -> (Qwen2<B>, dustin_kv::DenseKvCache<B>, Capture) {
    let m = model(name, kernels);
    let mut cache = m.new_cache(2, 64, None);
    let opts = ForwardOpts {
        phase: Phase::Decode,
        logits: LogitsMode::None,
        layers: None,
    };
    let prompt: Vec<Vec<u32>> = vec![
        (0..10).map(|i| 3 + 7 * i).collect(),
        (0..10).map(|i| 90 - 5 * i).collect(),
    ];
    m.forward(&prompt, &mut cache, &mut DenseHook, opts)
        .unwrap();
    cache.truncate(1, 6).unwrap();
    let tokens: Vec<Vec<u32>> = (0..2)
        .map(|s| {
            (0..new)
                .map(|i| ((11 * i + 29 * s + 5) % 96) as u32)
                .collect()
        })
        .collect();
    let mut cap = Capture {
        layer,
        q: None,
        k: None,
    };
    m.forward(&tokens, &mut cache, &mut cap, opts).unwrap();
    (m, cache, cap)
}

#[test]
fn key_mass_equals_a_float64_softmax_over_the_visible_keys() {
    let n = MAX_NEW + 4;
    for name in ["qwen2-gqa7", "llama"] {
        for kernels in [false, true] {
            let (m, cache, cap) = setup(name, kernels, 1, n);
            let (q, k) = (cap.q.unwrap(), cap.k.unwrap());
            let lens = [10usize, 6];
            assert_eq!(cache.lens(), &[10 + n, 6 + n]);
            // all rows: more than one scoring call takes
            let got = m.key_mass(&cache, 1, q.clone(), &lens).unwrap();
            let [_, _, w] = got.dims();
            assert_eq!(
                w, 64,
                "width: max(ctx) + n rounded up to 64, at most the capacity"
            );
            let want = reference(&q, &k, &lens, 0..n, w);
            let err = max_err(&got, &want);
            assert!(
                err < 1e-4,
                "{name} kernels {kernels}: all rows, max abs err {err}"
            );
            // heads x rows of probability per sequence
            let total: f32 = got.clone().sum().into_scalar();
            let heads = q.dims()[1] as f32;
            assert!(
                (total - 2.0 * heads * n as f32).abs() < 1e-2,
                "{name}: total {total}"
            );
            // rows 5 .. 8 only, given as starting 5 positions later
            let sub = q
                .clone()
                .slice([0..2, 0..q.dims()[1], 5..8, 0..q.dims()[3]]);
            let got = m.key_mass(&cache, 1, sub, &[15, 11]).unwrap();
            let w = got.dims()[2];
            let want = reference(&q, &k, &lens, 5..8, w);
            let err = max_err(&got, &want);
            assert!(
                err < 1e-4,
                "{name} kernels {kernels}: rows 5..8, max abs err {err}"
            );
        }
    }
}

#[test]
fn key_mass_rejects_bad_input_by_name() {
    let (m, cache, cap) = setup("qwen2-gqa7", false, 0, 3);
    let q = cap.q.unwrap();
    let layers = cache.num_layers();
    let msg = |r: dustin_qwen::Result<Tensor<B, 3>>| r.unwrap_err().to_string();
    let e = msg(m.key_mass(&cache, layers, q.clone(), &[10, 6]));
    assert!(
        e.contains("layer") && e.contains(&layers.to_string()),
        "{e}"
    );
    // sequence 1 holds 9 keys: 3 rows from position 7 would need 10
    let e = msg(m.key_mass(&cache, 0, q.clone(), &[10, 7]));
    assert!(e.contains("ctx_lens[1]") && e.contains("9 keys"), "{e}");
    let e = msg(m.key_mass(&cache, 0, q.clone(), &[10]));
    assert!(e.contains("ctx_lens") && e.contains("2 lengths"), "{e}");
    let [b, nh, _, hd] = q.dims();
    let e = msg(m.key_mass(
        &cache,
        0,
        q.clone().slice([0..b, 0..nh - 1, 0..3, 0..hd]),
        &[10, 6],
    ));
    assert!(
        e.contains("invalid `q`") && e.contains(&format!("[2, {nh}")),
        "{e}"
    );
    let e = msg(m.key_mass(&cache, 0, q.slice([0..b, 0..nh, 0..0, 0..hd]), &[10, 6]));
    assert!(e.contains("n >= 1"), "{e}");
}
