//! The draft's lookahead computed two ways on the backend, for `dustin-bench kernel-check`:
//! a greedy proposal of gamma tokens ([`ModelDrafter`] as the speculative loop drives it)
//! and a teacher-forced window of the same tokens from the same prompt
//! ([`ModelDrafter::force_window`], as `eval fidelity` drives it). Both are the attention
//! mass of the draft's query rows over the keys, normalised to 1 per sequence, and must agree
//! (the CPU test `force_window_gives_a_proposals_lookahead_and_the_accepted_state` holds them
//! within 1e-6 in f32). On CUDA the proposal's lookahead was once NaN while the window's was
//! right: an f32 key mass added to bf16 zeros (docs/decisions.md, "The draft's lookahead is
//! summed in f32"); this row is the check that would have caught it.

use std::sync::Arc;

use burn_tensor::{DType, Tensor};
use dustin_core::{DraftCtx, Drafter, TokenId};
use dustin_kernels::check::CheckRow;
use dustin_kernels::KernelOps;
use dustin_qwen::check::CHECK_CONFIG;
use dustin_qwen::{Qwen2, QwenConfig};
use dustin_spec::{LookaheadConfig, LookaheadLayers, LookaheadScoring, ModelDrafter};

/// Draft tokens of the proposal.
const GAMMA: usize = 4;
/// Prompt tokens before the proposal.
const PROMPT: usize = 300;

/// One row per lookahead scoring (deferred: the key mass of all gamma rows at the end;
/// per step: each step's mass as it is drafted), op `lookahead`: the proposal's lookahead
/// against the forced window's over the window's positions, normwise relative error
/// ([`dustin_kernels::reference::rel_err`], infinite where either side is not finite)
/// against `bound`. A model error becomes a failed row carrying it.
pub fn lookahead_rows<B: KernelOps>(dev: &B::Device, bound: f64) -> Vec<CheckRow> {
    [LookaheadScoring::Deferred, LookaheadScoring::PerStep]
        .into_iter()
        .map(|scoring| {
            let case = format!("2-layer random Qwen2, {PROMPT} + {GAMMA} tokens, {scoring:?}");
            match compare::<B>(dev, scoring) {
                Ok((got, want)) => CheckRow {
                    case,
                    op: "lookahead",
                    err: dustin_kernels::reference::rel_err(&got, &want),
                    bound,
                    error: None,
                },
                Err(e) => CheckRow {
                    case,
                    op: "lookahead",
                    err: f64::INFINITY,
                    bound,
                    error: Some(e),
                },
            }
        })
        .collect()
}

/// `(proposal's lookahead, forced window's lookahead)` over the window's positions.
fn compare<B: KernelOps>(
    dev: &B::Device,
    scoring: LookaheadScoring,
) -> Result<(Vec<f32>, Vec<f64>), String> {
    let cfg = QwenConfig::from_json(CHECK_CONFIG, "dustin_qwen::check::CHECK_CONFIG")
        .map_err(|e| e.to_string())?;
    let vocab = cfg.vocab_size;
    let model = Arc::new(Qwen2::<B>::random(&cfg, 512, dev).map_err(|e| e.to_string())?);
    let ids: Vec<TokenId> = (0..PROMPT)
        .map(|i| ((i * 7919 + 13) % vocab) as TokenId)
        .collect();
    let drafter = || {
        ModelDrafter::new(model.clone(), None, 64).with_lookahead(LookaheadConfig {
            layers: LookaheadLayers::All
                .resolve(cfg.num_hidden_layers)
                .ok()
                .flatten(),
            scoring,
        })
    };
    let ctx = DraftCtx {
        want_lookahead: true,
        ..DraftCtx::greedy(GAMMA, vocab)
    };
    let mut real = drafter();
    real.prefill(std::slice::from_ref(&ids), &[ids[0]])
        .map_err(|e| e.to_string())?;
    let p = real.propose(&ctx).map_err(|e| e.to_string())?;
    let la = p.lookahead.ok_or("the proposal carries no lookahead")?;
    let mut forced = drafter();
    forced
        .prefill(std::slice::from_ref(&ids), &[ids[0]])
        .map_err(|e| e.to_string())?;
    let window: Vec<TokenId> = std::iter::once(ids[0]).chain(p.tokens[0].clone()).collect();
    let lf = forced
        .force_window(std::slice::from_ref(&window), &[0])
        .map_err(|e| e.to_string())?;
    let n = lf.dims()[1];
    if la.dims()[1] < n {
        return Err(format!(
            "the proposal's lookahead spans {} positions, the window's {n}",
            la.dims()[1]
        ));
    }
    let want = host(lf)?.into_iter().map(f64::from).collect();
    Ok((host(la.narrow(1, 0, n))?, want))
}

fn host<B: KernelOps>(t: Tensor<B, 2>) -> Result<Vec<f32>, String> {
    t.cast(DType::F32)
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| format!("{e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::{Flex, FlexDevice};

    #[test]
    fn both_lookaheads_agree_on_the_cpu() {
        let rows = lookahead_rows::<Flex>(&FlexDevice, 1e-5);
        assert_eq!(rows.len(), 2);
        for r in &rows {
            assert!(r.ok(), "{r}");
        }
    }
}
