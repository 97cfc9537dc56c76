//! Per-sequence sampling: greedy and seeded sampled sequences in one batch, each with its own
//! rule and random stream, give each the tokens of its run alone, whether they start
//! together, join between iterations or leave early (their rows then move).

#[allow(dead_code)]
mod common;

use common::{model, B};
use dustin_core::{DenseHook, SamplingConfig, SeqSampling};
use dustin_spec::{
    autoregressive, AutoregressiveDecoder, ModelDrafter, ModelVerifier, SeqLimits, SpecConfig,
    SpecRun, SpeculativeDecoder,
};

const ROOM: usize = 40;

type Dec = SpeculativeDecoder<B, ModelDrafter<B>, ModelVerifier<B, DenseHook>>;

fn decoder(chunk: usize) -> Dec {
    SpeculativeDecoder::new(
        ModelDrafter::new(model("qwen2-gqa7"), None, ROOM).with_prefill_chunk(chunk),
        ModelVerifier::new(model("qwen2-tied"), DenseHook, ROOM, 96).with_prefill_chunk(chunk),
    )
}

/// One sequence of the batch: its prompt, its tokens at most, its rule and seed.
struct Seq {
    prompt: Vec<u32>,
    max_new: usize,
    sampling: SamplingConfig,
    seed: u64,
}

/// A greedy sequence and two sampled ones with different rules (temperature and top-k;
/// temperature and top-p) and seeds.
fn seqs() -> Vec<Seq> {
    vec![
        Seq {
            prompt: vec![5, 17, 33, 2, 90, 61, 7, 44, 12, 3, 71],
            max_new: 9,
            sampling: SamplingConfig::greedy(),
            seed: 0,
        },
        Seq {
            prompt: vec![9, 1, 64, 30, 22],
            max_new: 24,
            sampling: SamplingConfig {
                temperature: 1.3,
                top_p: 1.0,
                top_k: 12,
            },
            seed: 11,
        },
        Seq {
            prompt: vec![40, 41, 42, 43, 44, 45, 46, 47, 48, 50, 2, 7, 9],
            max_new: 18,
            sampling: SamplingConfig {
                temperature: 0.9,
                top_p: 0.95,
                top_k: 0,
            },
            seed: 4242,
        },
    ]
}

fn cfg(gamma: usize) -> SpecConfig {
    SpecConfig {
        gamma,
        max_new_tokens: ROOM - 12,
        ..SpecConfig::default()
    }
}

/// The sequence's own settings in a shared batch.
fn limits(s: &Seq) -> SeqLimits {
    SeqLimits {
        max_new_tokens: s.max_new,
        sampling: Some(SeqSampling::new(s.sampling, s.seed)),
        ..SeqLimits::default()
    }
}

/// The sequence run alone, with its rule and seed as the run's.
fn alone(s: &Seq, gamma: usize, chunk: usize) -> Vec<u32> {
    let cfg = SpecConfig {
        max_new_tokens: s.max_new,
        sampling: s.sampling,
        seed: s.seed,
        ..cfg(gamma)
    };
    decoder(chunk)
        .generate(std::slice::from_ref(&s.prompt), &cfg, None, &mut |_, _| {})
        .expect("generate alone")
        .tokens
        .remove(0)
}

/// The largest number of sequences any iteration of `run` verified together.
fn widest(run: &SpecRun) -> usize {
    run.iterations()
        .iter()
        .map(|it| it.accepted.len())
        .max()
        .unwrap_or(0)
}

#[test]
fn greedy_and_seeded_sampled_sequences_started_together_each_get_their_output_alone() {
    let seqs = seqs();
    for gamma in [1, 3, 5] {
        let want: Vec<Vec<u32>> = seqs.iter().map(|s| alone(s, gamma, 0)).collect();
        let mut dec = decoder(0);
        let prompts: Vec<Vec<u32>> = seqs.iter().map(|s| s.prompt.clone()).collect();
        let lims: Vec<SeqLimits> = seqs.iter().map(limits).collect();
        let mut streamed = vec![Vec::new(); seqs.len()];
        let mut on = |s: usize, t: &[u32]| streamed[s].extend_from_slice(t);
        let mut run = dec
            .start(&prompts, &cfg(gamma), &lims, None, &mut on)
            .expect("start");
        while !run.is_done() {
            dec.step(&mut run, None, &mut on).expect("step");
        }
        assert_eq!(widest(&run), 3, "gamma {gamma}: the three shared a batch");
        let got = run.finish();
        for (i, s) in seqs.iter().enumerate() {
            assert_eq!(got.tokens[i], want[i], "gamma {gamma}, sequence {i}");
            assert_eq!(streamed[i], want[i], "gamma {gamma}, sequence {i} streamed");
            assert_eq!(
                got.tokens[i].len(),
                s.max_new,
                "gamma {gamma}, sequence {i}"
            );
        }
    }
}

#[test]
fn sampled_rows_draw_from_their_own_seed_and_the_greedy_row_stays_greedy() {
    let seqs = seqs();
    let gamma = 3;
    let want: Vec<Vec<u32>> = seqs.iter().map(|s| alone(s, gamma, 0)).collect();
    // the greedy sequence run with the others is the greedy output, not a sample
    let greedy_at_temperature = alone(
        &Seq {
            sampling: seqs[1].sampling,
            seed: 3,
            max_new: seqs[0].max_new,
            prompt: seqs[0].prompt.clone(),
        },
        gamma,
        0,
    );
    assert_ne!(want[0], greedy_at_temperature, "sampling changes the text");
    // a sampled sequence's text follows its seed: another seed gives another text
    let reseeded = alone(
        &Seq {
            seed: seqs[1].seed + 1,
            sampling: seqs[1].sampling,
            max_new: seqs[1].max_new,
            prompt: seqs[1].prompt.clone(),
        },
        gamma,
        0,
    );
    assert_ne!(want[1], reseeded, "the seed picks the samples");
    // and the same seed as the run's default stream of another row is another text
    let mut dec = decoder(0);
    let prompts: Vec<Vec<u32>> = seqs.iter().map(|s| s.prompt.clone()).collect();
    let mut lims: Vec<SeqLimits> = seqs.iter().map(limits).collect();
    lims[1].sampling = Some(SeqSampling {
        stream: 1,
        ..SeqSampling::new(seqs[1].sampling, seqs[1].seed)
    });
    let got = dec
        .start(&prompts, &cfg(gamma), &lims, None, &mut |_, _| {})
        .map(|mut run| {
            while !run.is_done() {
                dec.step(&mut run, None, &mut |_, _| {}).expect("step");
            }
            run.finish()
        })
        .expect("start");
    assert_eq!(got.tokens[0], want[0]);
    assert_ne!(
        got.tokens[1], want[1],
        "stream 1 of the seed is not stream 0"
    );
    assert_eq!(got.tokens[2], want[2]);
}

#[test]
fn greedy_and_sampled_sequences_joining_mid_run_each_get_their_output_alone() {
    let seqs = seqs();
    let (gamma, chunk) = (3, 4);
    let want: Vec<Vec<u32>> = seqs.iter().map(|s| alone(s, gamma, chunk)).collect();
    // the greedy sequence first, the sampled ones after 2 and 5 of its iterations, in both
    // orders of joining
    for order in [[0usize, 1, 2], [2, 0, 1]] {
        let mut dec = decoder(chunk);
        let mut run = dec.open(&cfg(gamma)).expect("open");
        let mut streamed = vec![Vec::new(); seqs.len()];
        let mut ids = Vec::new();
        for iteration in 0..200 {
            if let Some(&i) = [0, 2, 5]
                .iter()
                .position(|&at| at == iteration)
                .map(|k| &order[k])
            {
                let s = dec
                    .join(&mut run, &seqs[i].prompt, &limits(&seqs[i]), ROOM)
                    .expect("join");
                ids.push((s, i));
            }
            let mut on = |s: usize, t: &[u32]| streamed[s].extend_from_slice(t);
            dec.prefill(&mut run, chunk, chunk, None, &mut on)
                .expect("prefill");
            dec.step(&mut run, None, &mut on).expect("step");
            if ids.len() == seqs.len() && run.is_done() {
                break;
            }
        }
        assert!(run.is_done(), "the run ends");
        assert!(widest(&run) >= 2, "{order:?}: sequences shared a batch");
        let got = run.finish();
        for &(s, i) in &ids {
            assert_eq!(got.tokens[s], want[i], "{order:?}: sequence {i}");
            assert_eq!(streamed[s], want[i], "{order:?}: sequence {i} streamed");
        }
    }
}

#[test]
fn autoregressive_greedy_and_sampled_sequences_share_a_batch() {
    let seqs = seqs();
    let target = model("qwen2-tied");
    let want: Vec<Vec<u32>> = seqs
        .iter()
        .map(|s| {
            let mut v = ModelVerifier::new(target.clone(), DenseHook, ROOM, 96);
            let cfg = SpecConfig {
                max_new_tokens: s.max_new,
                sampling: s.sampling,
                seed: s.seed,
                ..cfg(1)
            };
            autoregressive(
                &mut v,
                std::slice::from_ref(&s.prompt),
                &cfg,
                None,
                &mut |_, _| {},
            )
            .expect("alone")
            .tokens
            .remove(0)
        })
        .collect();
    let mut ar = AutoregressiveDecoder::new(ModelVerifier::new(target, DenseHook, ROOM, 96));
    let mut run = ar.open(&cfg(1)).expect("open");
    for (i, s) in seqs.iter().enumerate() {
        assert_eq!(
            ar.join(&mut run, &s.prompt, &limits(s), ROOM)
                .expect("join"),
            i
        );
    }
    for _ in 0..100 {
        ar.prefill(&mut run, 64, 64, None, &mut |_, _| {})
            .expect("prefill");
        ar.step(&mut run, None, &mut |_, _| {}).expect("step");
    }
    assert!(run.is_done());
    assert_eq!(widest(&run), 3);
    assert_eq!(run.finish().tokens, want);
}

#[test]
fn a_sampling_rule_out_of_range_is_refused_and_leaves_the_run_unchanged() {
    let seqs = seqs();
    let mut dec = decoder(0);
    let mut run = dec.open(&cfg(3)).expect("open");
    let bad = SeqLimits {
        sampling: Some(SeqSampling::new(
            SamplingConfig {
                temperature: 1.0,
                top_p: 0.0,
                top_k: 0,
            },
            1,
        )),
        ..limits(&seqs[1])
    };
    let e = dec
        .join(&mut run, &seqs[1].prompt, &bad, ROOM)
        .expect_err("top_p 0");
    assert!(e.to_string().contains("top_p"), "{e}");
    assert!(run.joining().is_empty() && run.active().is_empty());
    let e = dec
        .start(
            std::slice::from_ref(&seqs[1].prompt),
            &cfg(3),
            &[bad],
            None,
            &mut |_, _| {},
        )
        .expect_err("top_p 0");
    assert!(e.to_string().contains("top_p"), "{e}");
    // the run still takes a good sequence
    assert_eq!(
        dec.join(&mut run, &seqs[1].prompt, &limits(&seqs[1]), ROOM)
            .expect("join"),
        0
    );
}
