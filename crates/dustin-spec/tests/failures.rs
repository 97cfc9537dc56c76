//! Refusals, errors and cancellation of the speculative engine and of autoregressive
//! generation, on tiny random models (the HF parity fixtures of `dustin-qwen`), CPU.

use std::path::Path;
use std::sync::Arc;

use burn_flex::FlexDevice;
use burn_tensor::Tensor;
use dustin_core::DenseHook;
use dustin_qwen::generate::{generate, FinishReason, GenerateConfig};
use dustin_qwen::{Qwen2, QwenConfig, SafetensorsDir};
use dustin_spec::{ModelDrafter, ModelVerifier, SpecConfig, SpeculativeDecoder};

mod common;

use common::{ar, model, prompts, B};

#[test]
fn gamma_out_of_range_is_an_error() {
    let target = model("llama");
    for gamma in [0usize, 16] {
        let mut dec = SpeculativeDecoder::new(
            ModelDrafter::new(target.clone(), Some(1), 32),
            ModelVerifier::new(target.clone(), DenseHook, 32, 96),
        );
        let cfg = SpecConfig {
            gamma,
            ..SpecConfig::default()
        };
        let err = dec
            .generate(&prompts(), &cfg, None, &mut |_, _| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("gamma"), "{err}");
    }
}

#[test]
fn empty_prompt_in_batch_is_named() {
    let target = model("llama");
    let mut dec = SpeculativeDecoder::new(
        ModelDrafter::new(target.clone(), Some(1), 32),
        ModelVerifier::new(target.clone(), DenseHook, 32, 96),
    );
    let mut p = prompts();
    p[1].clear();
    let err = dec
        .generate(&p, &SpecConfig::default(), None, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("prompt 1") && err.contains("empty"), "{err}");
}

/// A batch where one sequence hits EOS early, one hits `max_new_tokens` and one is
/// cancelled: the first two keep their full text and reason, the cancelled one keeps the
/// exact prefix it had (speculative decoding, where sequences advance at different rates).
#[test]
fn cancel_keeps_finished_and_partial_sequences() {
    use dustin_core::CancelToken;
    let target = model("qwen2-tied");
    let other = model("qwen2-gqa7");
    let max_new = 23;
    let (reference, _) = ar(&target, max_new, &[]);
    // an EOS id that only sequence 1 emits, early
    let eos_tok = *reference[1][1..]
        .iter()
        .find(|t| !reference[0].contains(t) && !reference[2].contains(t))
        .expect("a token of sequence 1 only");
    let (reference_eos, _) = ar(&target, max_new, &[eos_tok]);
    assert!(reference_eos[1].len() < max_new);
    let gamma = 4;
    let extra = max_new + 2 * (gamma + 2);
    let mut dec = SpeculativeDecoder::new(
        ModelDrafter::new(other.clone(), None, extra),
        ModelVerifier::new(target.clone(), DenseHook, extra, 96),
    );
    let cancel = CancelToken::new();
    dec.set_cancel(cancel.clone());
    let cfg = SpecConfig {
        gamma,
        max_new_tokens: max_new,
        eos: vec![eos_tok],
        ..SpecConfig::default()
    };
    // cancel as soon as the first of sequences 0 and 2 reaches max_new_tokens
    let mut counts = [0usize; 3];
    let mut first_done = None;
    let o = dec
        .generate(&prompts(), &cfg, None, &mut |s, t| {
            counts[s] += t.len();
            if s != 1 && counts[s] >= max_new && first_done.is_none() {
                first_done = Some(s);
                cancel.cancel();
            }
        })
        .expect("spec");
    let done = first_done.expect("a sequence reached max_new_tokens");
    let cut = 2 - done; // the other of 0 and 2
    assert_eq!(o.finish[1], FinishReason::Eos);
    assert_eq!(o.tokens[1], reference_eos[1]);
    assert_eq!(o.finish[done], FinishReason::Length);
    assert_eq!(o.tokens[done], reference[done]);
    assert_eq!(o.finish[cut], FinishReason::Cancelled, "{:?}", o.finish);
    let n = o.tokens[cut].len();
    assert!(n > 0 && n < max_new, "partial length {n}");
    assert_eq!(
        o.tokens[cut],
        reference[cut][..n],
        "partial text is a prefix"
    );
}

/// Autoregressive generation stops at the next step after a cancel: finished sequences keep
/// their reason, the others are cancelled with the tokens emitted so far.
#[test]
fn cancel_stops_autoregressive_generation() {
    use dustin_core::CancelToken;
    let target = model("llama");
    let (reference, _) = ar(&target, 20, &[]);
    let cancel = CancelToken::new();
    let cfg = GenerateConfig {
        max_new_tokens: 20,
        cancel: Some(cancel.clone()),
        ..GenerateConfig::default()
    };
    let mut steps = 0;
    let o = generate(&target, &prompts(), &cfg, None, &mut |s, _| {
        if s == 0 {
            steps += 1;
            if steps == 5 {
                cancel.cancel();
            }
        }
    })
    .expect("generate");
    assert!(o.finish.iter().all(|f| *f == FinishReason::Cancelled));
    for (got, want) in o.tokens.iter().zip(&reference) {
        assert_eq!(got.len(), 5);
        assert_eq!(got[..], want[..5]);
    }
}

/// A weight source serving the fixture with NaN in the final norm: every logit is NaN.
struct Poisoned(SafetensorsDir);

impl dustin_qwen::WeightSource for Poisoned {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }
    fn load(&self, name: &str) -> dustin_qwen::Result<dustin_qwen::HostTensor> {
        let mut t = self.0.load(name)?;
        if name == "model.norm.weight" {
            t.data[0] = f32::NAN;
        }
        Ok(t)
    }
}

/// NaN logits are an error naming the sequence, in autoregressive generation and in greedy
/// speculative verification (whose argmax runs on the device), never a silent token.
#[test]
fn nan_logits_are_an_error_not_a_token() {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dustin-qwen/tests/fixtures/parity/llama");
    let cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
    let src = Poisoned(SafetensorsDir::open(&dir).expect("weights"));
    let bad = Arc::new(Qwen2::<B>::load(&cfg, &src, 256, &FlexDevice).expect("model"));
    let good = model("llama");
    let gen_cfg = GenerateConfig {
        max_new_tokens: 4,
        ..GenerateConfig::default()
    };
    let e = generate(&bad, &prompts(), &gen_cfg, None, &mut |_, _| {}).unwrap_err();
    assert!(
        matches!(
            e,
            dustin_qwen::QwenError::Core(dustin_core::CoreError::NonFinite { seq: 0, .. })
        ),
        "{e:?}"
    );
    // greedy speculative verification takes its argmax on the device: a verifier whose
    // logits turn NaN for sequence 1 after a clean prefill must still be refused
    let mut dec = SpeculativeDecoder::new(
        ModelDrafter::new(good.clone(), None, 32),
        NanVerifier(ModelVerifier::new(good, DenseHook, 32, 96)),
    );
    let e = dec
        .generate(&prompts(), &SpecConfig::default(), None, &mut |_, _| {})
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("non-finite") && msg.contains("sequence 1"),
        "{msg}"
    );
}

/// A verifier whose verification logits are NaN for the second sequence of the batch.
struct NanVerifier<V>(V);

impl<V: dustin_core::Verifier<B>> dustin_core::Verifier<B> for NanVerifier<V> {
    fn prefill(&mut self, prompts: &[Vec<u32>]) -> dustin_core::Result<Tensor<B, 2>> {
        self.0.prefill(prompts)
    }
    fn set_pending(&mut self, next: &[u32]) -> dustin_core::Result<()> {
        self.0.set_pending(next)
    }
    fn verify(
        &mut self,
        ctx: &dustin_core::VerifyCtx<'_, B>,
    ) -> dustin_core::Result<dustin_core::Verification<B>> {
        let mut ver = self.0.verify(ctx)?;
        let [b, m, v] = ver.logits.dims();
        if b > 1 {
            let nan = Tensor::<B, 3>::full([1, m, v], f32::NAN, &FlexDevice);
            ver.logits = ver.logits.slice_assign([1..2, 0..m, 0..v], nan);
        }
        Ok(ver)
    }
    fn commit(&mut self, accepted: &[usize], next: &[u32]) -> dustin_core::Result<()> {
        self.0.commit(accepted, next)
    }
    fn retain(&mut self, keep: &[usize]) -> dustin_core::Result<()> {
        self.0.retain(keep)
    }
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
}
