//! Tensor parallelism on the CPU backend (host-side all-reduce): the shards of a model, each
//! run on its own thread, give HF transformers' logits (float64 reference of
//! `scripts/make_parity_fixtures.py`, the same bound as `hf_parity.rs`), identical on every
//! rank; world size 1 is the unsharded model bit for bit; sizes that do not split are named.

mod common;

use burn_flex::FlexDevice;
use common::{forward_logits, load, max_err, reference, Case, B};
use dustin_qwen::{Qwen2, TpGroup, TpRank};

const TOL: f32 = 1e-4;

/// Rows of logits: the prefill's (every position), then one per decode step.
fn run(m: &Qwen2<B>, case: &Case) -> Vec<Vec<f32>> {
    let mut cache = m.new_cache(1, 64, None);
    let vocab = m.config.vocab_size;
    let mut steps = vec![case.prompt.clone()];
    steps.extend(case.decode_tokens.iter().map(|&t| vec![t]));
    steps
        .into_iter()
        .flat_map(|tokens| {
            let d = forward_logits(m, &mut cache, &[tokens]);
            d.chunks(vocab).map(<[f32]>::to_vec).collect::<Vec<_>>()
        })
        .collect()
}

/// Shards of `m` over `world` ranks (all on the one CPU device), each run on its own thread.
fn run_sharded(m: &Qwen2<B>, world: usize, case: &Case) -> Vec<Vec<Vec<f32>>> {
    let group = TpGroup::<B>::new(vec![FlexDevice; world]).unwrap();
    assert!(!group.on_device(), "the CPU backend sums on the host");
    let shards: Vec<Qwen2<B>> = (0..world)
        .map(|r| m.shard(TpRank::new(r, group.clone()).unwrap()).unwrap())
        .collect();
    for (r, s) in shards.iter().enumerate() {
        assert_eq!(s.tp(), Some((r, world)));
        let (h, kv) = s.local_heads();
        assert_eq!(h * world, m.config.num_attention_heads);
        assert_eq!(kv * world, m.config.kv_heads());
        assert_eq!(s.kv_shape(1, 8, None).kv_heads, kv);
        // a cache never holds layers the model does not run
        let depth = m.config.num_hidden_layers;
        assert_eq!(s.kv_shape(1, 8, Some(depth + 3)).layers, depth);
        assert_eq!(s.kv_shape(1, 8, Some(1)).layers, 1.min(depth));
        // the shard holds 1/world of every layer's q/k/v/o/gate/up/down
        let [_, q_out] = s.layers[0].q.weight.dims();
        let [down_in, _] = s.layers[0].down.weight.dims();
        assert_eq!(q_out * world, m.layers[0].q.weight.dims()[1]);
        assert_eq!(down_in * world, m.config.intermediate_size);
    }
    std::thread::scope(|sc| {
        let hands: Vec<_> = shards.iter().map(|s| sc.spawn(|| run(s, case))).collect();
        hands.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn two_ranks_give_hf_logits_on_every_rank() {
    for name in ["llama", "qwen2-tied"] {
        let (model, r) = (load(name), reference(name));
        for (ci, case) in r.cases.iter().enumerate() {
            let want: Vec<Vec<f32>> = case
                .prefill_logits
                .iter()
                .chain(&case.decode_logits[..case.decode_tokens.len()])
                .cloned()
                .collect();
            let ranks = run_sharded(&model, 2, case);
            // every rank continues from the same all-reduced hidden states: same logits
            assert_eq!(ranks[0], ranks[1], "{name} case {ci}: ranks disagree");
            assert_eq!(ranks[0].len(), want.len());
            let worst = ranks[0]
                .iter()
                .zip(&want)
                .map(|(g, e)| max_err(g, e))
                .fold(0.0, f32::max);
            println!("{name} case {ci}: 2 ranks vs HF max abs err {worst:.2e}");
            assert!(worst <= TOL, "{name} case {ci}: error {worst}");
        }
    }
}

#[test]
fn world_size_one_is_the_model_itself() {
    let (model, r) = (load("qwen2-tied"), reference("qwen2-tied"));
    let want = run(&model, &r.cases[0]);
    let got = run_sharded(&model, 1, &r.cases[0]);
    assert_eq!(got[0], want);
}

#[test]
fn sizes_that_do_not_split_are_named() {
    // 7 query heads over 1 KV head
    let model = load("qwen2-gqa7");
    let group = TpGroup::<B>::new(vec![FlexDevice; 2]).unwrap();
    let e = model
        .shard(TpRank::new(0, group.clone()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("num_attention_heads") && e.contains('7') && e.contains("2 ranks"),
        "{e}"
    );
    let e = TpRank::new(2, group.clone()).unwrap_err().to_string();
    assert!(e.contains("rank 2"), "{e}");
    assert!(TpGroup::<B>::new(vec![]).is_err());
    // a shard does not shard again
    let model = load("llama");
    let s = model.shard(TpRank::new(0, group.clone()).unwrap()).unwrap();
    let e = s
        .shard(TpRank::new(1, group).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("already"), "{e}");
}
