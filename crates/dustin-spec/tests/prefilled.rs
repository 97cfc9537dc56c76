//! The engine's drafter and verifier started from a prefill made outside them
//! (`ModelDrafter::with_prefilled`, `ModelVerifier::with_prefilled`) run as if they had
//! prefilled themselves, and a teacher-forced window (`ModelDrafter::force_window`) gives the
//! lookahead a real proposal of the same tokens carries, leaves the draft where accepting
//! them would, and a verifier fed that lookahead reads exactly its budget (`last_reads`).
//! Tiny random models (the HF parity fixtures of `dustin-qwen`), CPU.

use std::path::Path;
use std::sync::Arc;

use burn_flex::{Flex, FlexDevice};
use burn_tensor::Tensor;
use dustin_core::{
    DenseHook, DraftCtx, Drafter, Proposal, SelectionPolicy, TokenId, Verifier, VerifyCtx,
};
use dustin_kv::DenseKvCache;
use dustin_qwen::generate::{prefill, AUTO_PREFILL_CHUNK};
use dustin_qwen::{Qwen2, QwenConfig, SafetensorsDir};
use dustin_select::{registry::build_budgeted, SelectConfig};
use dustin_spec::{LookaheadConfig, LookaheadScoring, ModelDrafter, ModelVerifier};

type B = Flex;

/// Room each cache keeps beyond the prompt.
const EXTRA: usize = 16;
/// The fixtures' vocabulary.
const VOCAB: usize = 96;

fn model(name: &str) -> Arc<Qwen2<B>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dustin-qwen/tests/fixtures/parity")
        .join(name);
    let cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
    let src = SafetensorsDir::open(&dir).expect("weights");
    Arc::new(Qwen2::load(&cfg, &src, 256, &FlexDevice).expect("model"))
}

fn prompt(len: usize) -> Vec<TokenId> {
    (0..len)
        .map(|i| ((i * 37 + 11) % VOCAB) as TokenId)
        .collect()
}

/// A dense prefill of `ids` on the first `layers` layers of `m` (all: `None`), with the
/// capacity the engine's own prefill allocates (prompt + [`EXTRA`]) and its chunks.
fn shared(m: &Qwen2<B>, ids: &[TokenId], layers: Option<usize>) -> (DenseKvCache<B>, Tensor<B, 2>) {
    let (cache, last, _) = prefill(
        m,
        &[ids.to_vec()],
        ids.len() + EXTRA,
        layers,
        &mut DenseHook,
        AUTO_PREFILL_CHUNK,
        false,
    )
    .expect("shared prefill");
    (cache, last)
}

fn host(t: Tensor<B, 2>) -> Vec<f32> {
    t.into_data().to_vec().expect("host copy")
}

fn host3(t: Tensor<B, 3>) -> Vec<f32> {
    t.into_data().to_vec().expect("host copy")
}

fn greedy(gamma: usize) -> DraftCtx {
    DraftCtx {
        want_lookahead: true,
        ..DraftCtx::greedy(gamma, VOCAB)
    }
}

fn drafter(m: &Arc<Qwen2<B>>, layers: Option<usize>) -> ModelDrafter<B> {
    ModelDrafter::new(m.clone(), layers, EXTRA).with_lookahead(LookaheadConfig {
        layers: None,
        scoring: LookaheadScoring::Deferred,
    })
}

fn verify<P: SelectionPolicy<B>>(
    v: &mut ModelVerifier<B, P>,
    drafted: &[TokenId],
    lookahead: Option<Tensor<B, 2>>,
) -> Tensor<B, 3> {
    let proposal = Proposal {
        tokens: vec![drafted.to_vec()],
        q: None,
        lookahead,
    };
    v.verify(&VerifyCtx {
        proposal: &proposal,
        iteration: 0,
    })
    .expect("verify")
    .logits
}

/// Same last-prompt logits, same verification logits bit for bit, same reads, whether the
/// verifier prefilled the prompt itself or was handed a prefill made with the same chunks.
#[test]
fn a_verifier_from_a_shared_prefill_verifies_as_one_that_prefilled_itself() {
    for name in ["llama", "qwen2-gqa7"] {
        let m = model(name);
        let ids = prompt(41);
        let drafted = [5, 17, 60, 2];
        let mut own = ModelVerifier::new(m.clone(), DenseHook, EXTRA, VOCAB);
        let last_own = host(
            own.prefill(std::slice::from_ref(&ids))
                .expect("own prefill"),
        );
        let (cache, last) = shared(&m, &ids, None);
        let mut from =
            ModelVerifier::new(m.clone(), DenseHook, EXTRA, VOCAB).with_prefilled(cache, last);
        let last_from = host(from.prefill(std::slice::from_ref(&ids)).expect("prefilled"));
        assert_eq!(last_own.len(), VOCAB, "{name}");
        assert_eq!(last_own, last_from, "{name}: last prompt logits");
        for v in [&mut own, &mut from] {
            v.set_pending(&[ids[0]]).expect("pending");
        }
        let a = host3(verify(&mut own, &drafted, None));
        let b = host3(verify(&mut from, &drafted, None));
        assert_eq!(a.len(), (drafted.len() + 1) * VOCAB, "{name}");
        assert_eq!(a, b, "{name}: verification logits");
        assert_eq!(own.last_reads(), from.last_reads(), "{name}: reads");
        assert_eq!(from.lens(), vec![ids.len() + drafted.len() + 1], "{name}");
    }
}

/// A verifier handed a cache of other lengths than the prompts refuses it, naming the prompts.
#[test]
fn a_prefilled_verifier_refuses_prompts_of_other_lengths() {
    let m = model("llama");
    let ids = prompt(20);
    let (cache, last) = shared(&m, &ids, None);
    let mut v = ModelVerifier::new(m, DenseHook, EXTRA, VOCAB).with_prefilled(cache, last);
    let e = v
        .prefill(&[prompt(21)])
        .expect_err("a longer prompt")
        .to_string();
    assert!(
        e.contains("prompts") && e.contains("[20]") && e.contains("[21]"),
        "{e}"
    );
}

/// Same tokens, same lookahead bit for bit, for a separate draft and an early-exit
/// self-draft (the target's cache cut to its first layer), over two proposals.
#[test]
fn a_drafter_from_a_shared_prefill_proposes_as_one_that_prefilled_itself() {
    let m = model("qwen2-gqa7");
    let ids = prompt(33);
    for layers in [None, Some(1)] {
        let mut own = drafter(&m, layers);
        own.prefill(std::slice::from_ref(&ids), &[ids[0]])
            .expect("own prefill");
        let cache = match layers {
            None => shared(&m, &ids, None).0,
            Some(n) => shared(&m, &ids, None).0.first_layers(n),
        };
        let mut from = drafter(&m, layers).with_prefilled(cache);
        from.prefill(std::slice::from_ref(&ids), &[ids[0]])
            .expect("prefilled");
        for round in 0..2 {
            let what = format!("layers {layers:?}, proposal {round}");
            let a = own.propose(&greedy(3)).expect("own proposal");
            let b = from.propose(&greedy(3)).expect("proposal");
            assert_eq!(a.tokens, b.tokens, "{what}: tokens");
            assert_eq!(a.tokens[0].len(), 3, "{what}");
            let (la, lb) = (
                a.lookahead.expect("lookahead"),
                b.lookahead.expect("lookahead"),
            );
            assert!(la.dims()[1] >= ids.len() + 3 * (round + 1), "{what}: width");
            assert_eq!(host(la), host(lb), "{what}: lookahead");
            // accept the first draft, the second becomes pending
            let next = a.tokens[0][1];
            own.commit(&[1], &[next]).expect("commit");
            from.commit(&[1], &[next]).expect("commit");
        }
    }
}

/// The lookahead of a forced window is the one a greedy proposal of the same tokens carries
/// (within 1e-6 per position; a proposal's lookahead spans its cache's capacity, the
/// positions past the window have no mass, nor has the window's last token, which a
/// proposal does not feed), and after it the draft proposes as a draft whose prompt
/// ended with the window would (same tokens, lookahead within 1e-5).
#[test]
fn force_window_gives_a_proposals_lookahead_and_the_accepted_state() {
    let m = model("llama");
    let ids = prompt(30);
    let gamma = 4;
    let mut real = drafter(&m, None);
    real.prefill(std::slice::from_ref(&ids), &[ids[0]])
        .expect("prefill");
    let p = real.propose(&greedy(gamma)).expect("proposal");
    let drafted = p.tokens[0].clone();
    let la = host(p.lookahead.expect("lookahead"));

    let mut forced = drafter(&m, None);
    forced
        .prefill(std::slice::from_ref(&ids), &[ids[0]])
        .expect("prefill");
    let window: Vec<TokenId> = std::iter::once(ids[0]).chain(drafted.clone()).collect();
    let next = 42;
    let lf = forced
        .force_window(std::slice::from_ref(&window), &[next])
        .expect("forced window");
    assert_eq!(lf.dims(), [1, ids.len() + gamma + 1]);
    let lf = host(lf);
    assert!(la.len() >= lf.len());
    let err = la
        .iter()
        .zip(&lf)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(err < 1e-6, "forced vs proposed lookahead: max error {err}");
    assert_eq!(
        lf[ids.len() + gamma],
        0.0,
        "the last window token is not fed"
    );
    assert!(
        la[lf.len()..].iter().all(|&x| x == 0.0),
        "mass past the window"
    );
    let total: f32 = lf.iter().sum();
    assert!((total - 1.0).abs() < 1e-5, "mass sums to {total}");

    // the window counts as accepted: `next` is pending after the prompt and the window
    let mut whole = drafter(&m, None);
    let longer: Vec<TokenId> = ids.iter().copied().chain(window).collect();
    whole
        .prefill(std::slice::from_ref(&longer), &[next])
        .expect("prefill");
    let a = forced.propose(&greedy(gamma)).expect("after the window");
    let b = whole
        .propose(&greedy(gamma))
        .expect("after the longer prompt");
    assert_eq!(a.tokens, b.tokens, "tokens after the window");
    let (la, lb) = (
        host(a.lookahead.expect("la")),
        host(b.lookahead.expect("la")),
    );
    // each spans its own cache's capacity: compare the common part, zeros past it
    let n = la.len().min(lb.len());
    assert!(n >= longer.len() + gamma);
    let err = la
        .iter()
        .zip(&lb)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(err < 1e-5, "lookahead after the window: max error {err}");
    assert!(la[n..].iter().chain(&lb[n..]).all(|&x| x == 0.0));
}

/// Windows that do not start with the pending token, or of another batch, are named errors.
#[test]
fn force_window_names_bad_windows() {
    let m = model("llama");
    let ids = prompt(12);
    let mut d = drafter(&m, None);
    d.prefill(std::slice::from_ref(&ids), &[7])
        .expect("prefill");
    let e = d
        .force_window(&[vec![8, 1, 2]], &[3])
        .expect_err("wrong pending");
    assert!(e.to_string().contains("window"), "{e}");
    let e = d.force_window(&[vec![7]], &[3]).expect_err("too short");
    assert!(e.to_string().contains("window"), "{e}");
    let e = d
        .force_window(&[vec![7, 1]], &[3, 4])
        .expect_err("two next tokens");
    assert!(e.to_string().contains("next"), "{e}");
}

/// A verifier started from a shared prefill and fed a forced window's lookahead through a
/// draft-aware selector (`draft-only`) at budget `k` reads exactly `k` context positions per
/// layer and KV head (`last_reads`), of the `prompt` positions dense attention reads; a
/// dense verifier of the same window reads them all, and at a budget over the context the
/// selector's logits are the dense ones bit for bit.
#[test]
fn a_forced_windows_verification_reads_exactly_the_budget() {
    let m = model("qwen2-gqa7");
    let (layers, kv_heads) = (
        m.config.num_hidden_layers as u64,
        m.config.kv_heads() as u64,
    );
    let ids = prompt(150);
    let window = vec![ids[0], 9, 30, 71];
    let mut d = drafter(&m, None);
    d.prefill(std::slice::from_ref(&ids), &[ids[0]])
        .expect("prefill");
    let la = d
        .force_window(std::slice::from_ref(&window), &[5])
        .expect("forced window");
    let (cache, last) = shared(&m, &ids, None);
    let mut dense = ModelVerifier::new(m.clone(), DenseHook, EXTRA, VOCAB)
        .with_prefilled(cache.clone(), last.clone());
    dense
        .prefill(std::slice::from_ref(&ids))
        .expect("prefilled");
    dense.set_pending(&[ids[0]]).expect("pending");
    let dense_logits = host3(verify(&mut dense, &window[1..], Some(la.clone())));
    let all = layers * kv_heads * ids.len() as u64;
    assert_eq!(dense.last_reads(), (&[all][..], &[all][..]));
    for k in [80usize, 120, 4096] {
        let mut policy = build_budgeted::<B>("draft-only", &SelectConfig::with_budget(k), None)
            .expect("draft-only");
        assert!(policy.wants_lookahead());
        policy.reset(1, m.config.num_hidden_layers);
        let mut v = ModelVerifier::new(m.clone(), policy, EXTRA, VOCAB)
            .with_prefilled(cache.clone(), last.clone());
        v.prefill(std::slice::from_ref(&ids)).expect("prefilled");
        v.set_pending(&[ids[0]]).expect("pending");
        let logits = host3(verify(&mut v, &window[1..], Some(la.clone())));
        let read = layers * kv_heads * k.min(ids.len()) as u64;
        assert_eq!(v.last_reads(), (&[read][..], &[all][..]), "budget {k}");
        if k >= ids.len() {
            assert_eq!(logits, dense_logits, "budget {k} over the context");
        } else {
            assert_ne!(logits, dense_logits, "budget {k} reads a part");
        }
    }
}
