//! A synthetic "model": random queries and per-(layer, sequence) random keys, driven through a
//! policy the way `dustin-qwen` / `dustin-spec` drive it (batch-1 chunked prefill, then
//! batched decode passes).

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Tensor, TensorData};
use dustin_core::{LayerAttnCtx, LayerSelection, Phase, SelectionPolicy};
use dustin_select::KeepRule;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub type B = Flex;

pub fn dev() -> FlexDevice {
    FlexDevice
}

#[derive(Clone)]
pub struct Synth {
    pub layers: usize,
    pub kvh: usize,
    pub group: usize,
    pub d: usize,
    pub cap: usize,
    /// `[layer][seq]` -> `kvh * cap * d` values.
    keys: Vec<Vec<Vec<f32>>>,
    rng: ChaCha8Rng,
}

impl Synth {
    pub fn new(
        seed: u64,
        layers: usize,
        kvh: usize,
        group: usize,
        d: usize,
        batch: usize,
        cap: usize,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let keys = (0..layers)
            .map(|_| {
                (0..batch)
                    .map(|_| {
                        (0..kvh * cap * d)
                            .map(|_| rng.random_range(-2.0f32..2.0))
                            .collect()
                    })
                    .collect()
            })
            .collect();
        Self {
            layers,
            kvh,
            group,
            d,
            cap,
            keys,
            rng,
        }
    }

    pub fn heads(&self) -> usize {
        self.kvh * self.group
    }

    pub fn host_q(&mut self, b: usize, n: usize) -> Vec<f32> {
        (0..b * self.heads() * n * self.d)
            .map(|_| self.rng.random_range(-2.0f32..2.0))
            .collect()
    }

    pub fn q(&mut self, b: usize, n: usize) -> Tensor<B, 4> {
        let v = self.host_q(b, n);
        Tensor::from_data(TensorData::new(v, [b, self.heads(), n, self.d]), &dev())
    }

    /// Host keys `[seqs.len(), kvh, len, d]` of `layer`.
    pub fn host_k(&self, layer: usize, seqs: &[usize], len: usize) -> Vec<f32> {
        let mut v = Vec::with_capacity(seqs.len() * self.kvh * len * self.d);
        for &s in seqs {
            let src = &self.keys[layer][s];
            for h in 0..self.kvh {
                let base = h * self.cap * self.d;
                v.extend_from_slice(&src[base..base + len * self.d]);
            }
        }
        v
    }

    pub fn k(&self, layer: usize, seqs: &[usize], len: usize) -> Tensor<B, 4> {
        let v = self.host_k(layer, seqs, len);
        Tensor::from_data(
            TensorData::new(v, [seqs.len(), self.kvh, len, self.d]),
            &dev(),
        )
    }

    pub fn scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }

    /// Chunked batch-1 prefill of every sequence (chunking as `dustin_qwen::generate::prefill`).
    pub fn prefill(&mut self, p: &mut dyn SelectionPolicy<B>, lens: &[usize], chunk: usize) {
        for (seq, &len) in lens.iter().enumerate() {
            let mut start = 0;
            while start < len {
                let end = if len - start <= chunk + chunk / 2 {
                    len
                } else {
                    start + chunk
                };
                let n = end - start;
                for layer in 0..self.layers {
                    let q = self.q(1, n);
                    let k = self.k(layer, &[seq], end);
                    let ctx = LayerAttnCtx {
                        layer,
                        phase: Phase::Prefill {
                            seq,
                            last_chunk: end == len,
                        },
                        q: &q,
                        k: &k,
                        ctx_lens: &[start],
                        n_new: n,
                        scale: self.scale(),
                    };
                    let sel = p.on_layer(&ctx).expect("prefill hook");
                    assert!(sel.is_none(), "prefill must be dense");
                }
                start = end;
            }
        }
    }

    /// One decode pass of `n` new tokens for sequences `seqs` (original indices) with
    /// contexts `lens`; the selection of every layer.
    pub fn verify(
        &mut self,
        p: &mut dyn SelectionPolicy<B>,
        seqs: &[usize],
        lens: &[usize],
        n: usize,
    ) -> Vec<Option<LayerSelection<B>>> {
        let keys_len = lens.iter().max().unwrap() + n;
        (0..self.layers)
            .map(|layer| {
                let q = self.q(seqs.len(), n);
                let k = self.k(layer, seqs, keys_len);
                let ctx = LayerAttnCtx {
                    layer,
                    phase: Phase::Decode,
                    q: &q,
                    k: &k,
                    ctx_lens: lens,
                    n_new: n,
                    scale: self.scale(),
                };
                p.on_layer(&ctx).expect("decode hook")
            })
            .collect()
    }

    /// A random lookahead `[b, c]`, normalised per row.
    pub fn lookahead(&mut self, b: usize, c: usize) -> Tensor<B, 2> {
        let mut v: Vec<f32> = (0..b * c)
            .map(|_| self.rng.random_range(0.0f32..1.0))
            .collect();
        for row in v.chunks_mut(c) {
            let s: f32 = row.iter().sum();
            row.iter_mut().for_each(|x| *x /= s);
        }
        Tensor::from_data(TensorData::new(v, [b, c]), &dev())
    }
}

pub fn host_i64<const D: usize>(t: Tensor<B, D, burn_tensor::Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().into_vec::<i64>().unwrap()
}

pub fn host_f32<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

/// The valid rows `[b][kv_head] -> positions` of a selection.
pub fn rows(sel: &LayerSelection<B>) -> Vec<Vec<Vec<usize>>> {
    let [b, h, k] = sel.indices.dims();
    let v = host_i64(sel.indices.clone());
    (0..b)
        .map(|i| {
            (0..h)
                .map(|j| {
                    v[(i * h + j) * k..(i * h + j) * k + sel.counts[i]]
                        .iter()
                        .map(|&x| x as usize)
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Checks every invariant of a selection for contexts `lens` under `keep`; returns the rows.
pub fn check_selection(
    sel: &LayerSelection<B>,
    lens: &[usize],
    keep: KeepRule,
    what: &str,
) -> Vec<Vec<Vec<usize>>> {
    let [b, _, k] = sel.indices.dims();
    assert_eq!(b, lens.len(), "{what}: batch");
    assert_eq!(sel.counts.len(), b, "{what}: counts");
    let want: Vec<usize> = lens.iter().map(|&l| l.min(keep.budget)).collect();
    assert_eq!(sel.counts, want, "{what}: kept count == min(budget, ctx)");
    assert_eq!(
        k,
        *want.iter().max().unwrap(),
        "{what}: width == largest count"
    );
    let all = host_i64(sel.indices.clone());
    let max_ctx = *lens.iter().max().unwrap() as i64;
    assert!(
        all.iter().all(|&x| (0..max_ctx.max(1)).contains(&x)),
        "{what}: padding must be gather-safe"
    );
    let r = rows(sel);
    for (i, heads) in r.iter().enumerate() {
        let ctx = lens[i];
        for (j, row) in heads.iter().enumerate() {
            assert!(
                row.windows(2).all(|w| w[0] < w[1]),
                "{what}: seq {i} head {j} sorted+unique: {row:?}"
            );
            assert!(
                row.iter().all(|&p| p < ctx),
                "{what}: seq {i} head {j} in range: {row:?}"
            );
            for p in 0..keep.n_sink.min(ctx) {
                assert!(
                    row.contains(&p),
                    "{what}: seq {i} head {j} sink {p} missing"
                );
            }
            for p in ctx.saturating_sub(keep.window)..ctx {
                assert!(
                    row.contains(&p),
                    "{what}: seq {i} head {j} window {p} missing"
                );
            }
        }
    }
    r
}
