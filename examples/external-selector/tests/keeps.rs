//! The strided selector inside dustin-select's `Selector`, on Burn's CPU backend: the
//! positions it keeps for a ragged batch, worked out by hand.

use burn_flex::{Flex, FlexDevice};
use burn_tensor::Tensor;
use dustin_core::{AttentionHook, ImportanceEstimator, LayerAttnCtx, Phase, SelectionPolicy};
use dustin_select::{SelectConfig, Selector};
use external_selector::Strided;

type B = Flex;

/// One layer's context: 2 sequences with `ctx_lens` context tokens and one new token each,
/// 4 query heads over 2 KV heads, head_dim 4 (the selector reads only the shapes here).
fn run_layer(
    policy: &mut impl AttentionHook<B>,
    phase: Phase,
    ctx_lens: &[usize],
) -> Option<(Vec<i64>, [usize; 3], Vec<usize>)> {
    let width = ctx_lens.iter().max().unwrap() + 1;
    let q = Tensor::<B, 4>::zeros([2, 4, 1, 4], &FlexDevice);
    let k = Tensor::<B, 4>::zeros([2, 2, width, 4], &FlexDevice);
    let ctx = LayerAttnCtx {
        layer: 0,
        phase,
        q: &q,
        k: &k,
        ctx_lens,
        n_new: 1,
        scale: 0.5,
    };
    policy.on_layer(&ctx).unwrap().map(|sel| {
        let dims = sel.indices.dims();
        let idx = sel.indices.into_data().convert::<i64>().to_vec().unwrap();
        (idx, dims, sel.counts)
    })
}

fn selector() -> Selector<B, Strided> {
    // 7 positions per sequence and KV head: sink 0, a window of 3, and 3 chosen by score
    let cfg = SelectConfig {
        budget: 7,
        n_sink: 1,
        window: 3,
        ..SelectConfig::default()
    };
    Selector::new(Strided::new(4).unwrap(), cfg).unwrap()
}

#[test]
fn scores_put_strided_positions_first_and_recent_first_within() {
    // width 9, stride 4: p, plus 9 at p = 0, 4, 8
    let s = Strided::new(4).unwrap().position_scores(9);
    assert_eq!(s, vec![9.0, 1.0, 2.0, 3.0, 13.0, 5.0, 6.0, 7.0, 17.0]);
    assert_eq!(
        ImportanceEstimator::<B>::name(&Strided::new(4).unwrap()),
        "strided(4)"
    );
    assert!(Strided::new(0).is_err());
}

#[test]
fn keeps_the_window_the_sink_and_the_most_recent_strided_positions() {
    let mut policy = selector();
    policy.reset(2, 1);
    policy.begin_verify(0);
    let (idx, dims, counts) = run_layer(&mut policy, Phase::Decode, &[20, 13]).unwrap();
    // Sequence 0, 20 context tokens: sink {0}, window {17, 18, 19}; the free positions 1..=16
    // hold the strided 4, 8, 12, 16, of which the 3 left in the budget take the most recent:
    // 8, 12, 16.
    let seq0 = [0, 8, 12, 16, 17, 18, 19];
    // Sequence 1, 13 context tokens: sink {0}, window {10, 11, 12}; free 1..=9 holds the
    // strided 4 and 8 (both kept), and the last slot goes to the most recent other one, 9.
    let seq1 = [0, 4, 8, 9, 10, 11, 12];
    assert_eq!(dims, [2, 2, 7]);
    assert_eq!(counts, vec![7, 7]);
    // rows: (sequence 0, KV head 0), (0, 1), (1, 0), (1, 1)
    let want: Vec<i64> = [seq0, seq0, seq1, seq1].concat();
    assert_eq!(idx, want);
    assert_eq!(policy.policy_name(), "strided(4)");
    assert_eq!(policy.estimation_reads(), vec![0.0, 0.0]);
}

#[test]
fn attends_densely_at_prefill_and_where_every_context_fits_the_budget() {
    let mut policy = selector();
    policy.reset(2, 1);
    let prefill = Phase::Prefill {
        seq: 0,
        last_chunk: true,
    };
    assert!(run_layer(&mut policy, prefill, &[20, 13]).is_none());
    assert!(run_layer(&mut policy, Phase::Decode, &[7, 5]).is_none());
    // one context over the budget: both sequences select (the shorter keeps all it has)
    let (idx, _, counts) = run_layer(&mut policy, Phase::Decode, &[8, 5]).unwrap();
    assert_eq!(counts, vec![7, 5]);
    // sequence 0, 8 tokens: sink {0}, window {5, 6, 7}, strided 4, then the most recent
    // others 3 and 2 (1 is dropped)
    assert_eq!(&idx[..7], &[0, 2, 3, 4, 5, 6, 7]);
    // sequence 1 keeps its 5 positions; its 2 padding slots are not read
    assert_eq!(&idx[14..19], &[0, 1, 2, 3, 4]);
}
