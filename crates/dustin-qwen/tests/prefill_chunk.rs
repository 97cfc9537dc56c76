//! The automatic prefill chunk (`dustin_qwen::generate::AUTO_PREFILL_CHUNK`): the rule, the
//! hook scan behind it, and a prefill run with it.

use std::path::Path;

use burn_flex::{Flex, FlexDevice};
use dustin_core::{AttentionHook, DenseHook, LayerAttnCtx, LayerSelection, Phase};
use dustin_qwen::generate::{
    auto_prefill_chunk, choose_prefill_chunk, hook_wants_prefill_probs, prefill,
    resolve_prefill_chunk, AUTO_PREFILL_CHUNK, DEFAULT_PREFILL_CHUNK,
};
use dustin_qwen::{Qwen2, QwenConfig, SafetensorsDir};

type B = Flex;

/// Wants the probabilities of one layer in the last prefill chunk only (SnapKV's
/// observation window is of this kind).
struct LastChunkProbs(usize);

impl AttentionHook<B> for LastChunkProbs {
    fn on_layer(
        &mut self,
        _ctx: &LayerAttnCtx<'_, B>,
    ) -> dustin_core::Result<Option<LayerSelection<B>>> {
        Ok(None)
    }
    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        layer == self.0
            && matches!(
                phase,
                Phase::Prefill {
                    last_chunk: true,
                    ..
                }
            )
    }
}

#[test]
fn the_rule_takes_the_backend_chunk_only_without_probabilities_or_offloading() {
    assert_eq!(choose_prefill_chunk(2048, false, false), 2048);
    assert_eq!(
        choose_prefill_chunk(2048, true, false),
        DEFAULT_PREFILL_CHUNK
    );
    assert_eq!(
        choose_prefill_chunk(2048, false, true),
        DEFAULT_PREFILL_CHUNK
    );
    // clamped so that the last chunk (up to 1.5 chunks) stays within what the prefill
    // kernel takes, and never 0
    let most = choose_prefill_chunk(1 << 20, false, false);
    assert!(most + most / 2 <= dustin_kernels::MAX_PREFILL_NEW, "{most}");
    assert!(most >= 2048, "{most}");
    assert_eq!(choose_prefill_chunk(0, false, false), 1);
}

#[test]
fn the_hook_scan_sees_a_last_chunk_only_layer() {
    assert!(!hook_wants_prefill_probs::<B, _>(&DenseHook, 24));
    assert!(hook_wants_prefill_probs::<B, _>(&LastChunkProbs(23), 24));
    // a layer past the ones asked about does not count
    assert!(!hook_wants_prefill_probs::<B, _>(&LastChunkProbs(24), 24));
}

#[test]
fn auto_prefills_as_the_backend_chunk_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity/qwen2-gqa7");
    let cfg = QwenConfig::from_file(&dir.join("config.json")).unwrap();
    let src = SafetensorsDir::open(&dir).unwrap();
    let m: Qwen2<B> = Qwen2::load(&cfg, &src, 64, &FlexDevice).unwrap();
    // the CPU backend's chunk is 512 (KernelOps::PREFILL_CHUNK's default)
    assert_eq!(auto_prefill_chunk(&m, &DenseHook, None), 512);
    let prompts = vec![(0..40u32).map(|i| (i * 37 + 5) % 96).collect::<Vec<_>>()];
    let run = |chunk| {
        let (_, last, _) = prefill(&m, &prompts, 64, None, &mut DenseHook, chunk, false).unwrap();
        last.into_data().to_vec::<f32>().unwrap()
    };
    let auto = run(AUTO_PREFILL_CHUNK);
    // 0 runs as the automatic chunk (neither an error nor an empty chunk) and gives the
    // same logits, bit for bit (the CPU's logits do not depend on the chunking at all, so
    // which chunk it chose is checked above and in the rule's test, not here)
    assert_eq!(auto, run(512), "auto is the backend's 512 on the CPU");
    // explicit chunks run as given up to the largest the kernels' bound allows (the last
    // chunk takes up to half a chunk more: 21845 + 10922 < 32768 new tokens)
    assert_eq!(resolve_prefill_chunk(&m, &DenseHook, None, 100), 100);
    assert_eq!(resolve_prefill_chunk(&m, &DenseHook, None, 1 << 20), 21845);
}

/// Sets its token while layer `at` of a prefill runs, and counts the layers it sees.
struct CancelAt {
    at: usize,
    token: dustin_core::CancelToken,
    seen: Vec<(usize, Phase)>,
}

impl AttentionHook<B> for CancelAt {
    fn on_layer(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
    ) -> dustin_core::Result<Option<LayerSelection<B>>> {
        self.seen.push((ctx.layer, ctx.phase));
        if ctx.layer == self.at {
            self.token.cancel();
        }
        Ok(None)
    }
}

#[test]
fn a_cancelled_prefill_stops_at_the_next_layer() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity/qwen2-gqa7");
    let cfg = QwenConfig::from_file(&dir.join("config.json")).unwrap();
    let src = SafetensorsDir::open(&dir).unwrap();
    let token = dustin_core::CancelToken::new();
    let m: Qwen2<B> = Qwen2::load(&cfg, &src, 64, &FlexDevice)
        .unwrap()
        .with_cancel(token.clone());
    let prompts = vec![(0..40u32).map(|i| (i * 37 + 5) % 96).collect::<Vec<_>>()];
    // a token never set changes nothing: the same logits as the model without one
    let plain: Qwen2<B> = Qwen2::load(&cfg, &src, 64, &FlexDevice).unwrap();
    let logits = |m: &Qwen2<B>| {
        let (_, last, _) = prefill(m, &prompts, 64, None, &mut DenseHook, 16, false).unwrap();
        last.into_data().to_vec::<f32>().unwrap()
    };
    assert_eq!(logits(&m), logits(&plain));
    // set during layer 0 of the first chunk (16 of 40 tokens): layer 1 never runs
    let mut hook = CancelAt {
        at: 0,
        token: token.clone(),
        seen: Vec::new(),
    };
    let e = prefill(&m, &prompts, 64, None, &mut hook, 16, false).unwrap_err();
    assert!(
        matches!(
            e,
            dustin_qwen::QwenError::Core(dustin_core::CoreError::Cancelled { during: "prefill" })
        ),
        "{e}"
    );
    assert_eq!(e.to_string(), "cancelled during the prefill");
    assert_eq!(
        hook.seen,
        vec![(
            0,
            Phase::Prefill {
                seq: 0,
                last_chunk: false
            }
        )]
    );
    // decoding does not read the model's token (its loops check their own once per step)
    let mut cache = m.new_cache(1, 64, None);
    m.forward(
        &[vec![3, 4]],
        &mut cache,
        &mut DenseHook,
        dustin_qwen::ForwardOpts {
            phase: Phase::Decode,
            logits: dustin_qwen::LogitsMode::Last,
            layers: None,
        },
    )
    .unwrap();
}
