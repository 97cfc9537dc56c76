//! `dustin demo`: the main job on real input. Qwen2.5-Coder-0.5B-Instruct drafts for
//! Qwen2.5-Coder-1.5B-Instruct (both fetched by name into the cache the first time) on a
//! shipped public source file: autoregressive decoding of the target, then speculative
//! decoding with dense verification and with sparse verification through `dustin` and two
//! baselines at a budget well below the context. The command streams Dustin's continuation,
//! prints one table, and writes it as JSON and Markdown with a plot (SVG) into an output
//! folder.

use dustin_kernels::KernelOps;
use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use dustin_core::SamplingConfig;
use dustin_eval::report::{plot_lines, Table};
use dustin_qwen::StreamDecoder;
use dustin_spec::SpecOutput;
use serde::Serialize;

use crate::backend::DeviceKind;
use crate::generate::DraftVocab;
use crate::pair::{Mode, Pair, RunConfig, SharedPrefill};
use crate::CliError;

/// The default prompt: the first 261 lines of `src/map.rs` of the crate indexmap 2.14.2
/// (MIT OR Apache-2.0; `assets/README.md`), about 2,000 Qwen2.5 tokens, ending with the doc
/// comment of `IndexMap::values` so that the continuation starts with that method.
pub const CODE_PROMPT: &str = include_str!("../assets/indexmap_map_head.rs");

/// The prose prompt (`--prompt prose`): the opening of "A Niece of Snapshot Harry's", the
/// first story of Bret Harte's *From Sand Hill to Pine* (1900), Project Gutenberg eBook
/// #2544, from the PG-19 test split, public domain: the story's title and its first 7,400
/// characters, cut in the middle of a sentence ("There was no other light than").
pub const EXCERPT: &str = include_str!("../assets/excerpt_2544.txt");

/// The shipped prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShippedPrompt {
    /// Rust source: the head of indexmap's `map.rs`, shipped with the binary.
    Code,
    /// A public-domain story: an excerpt of 2,544 characters, shipped with the binary.
    Prose,
}

/// Arguments of `dustin demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Target model: a model name (`dustin fetch-model --list`), an HF directory or a .gguf
    /// file.
    #[arg(long, default_value = "qwen2.5-coder-1.5b-instruct")]
    pub model: String,
    /// Draft model (same tokenizer as the target): a model name or a path.
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    pub draft: String,
    /// Which shipped prompt to continue.
    #[arg(long, value_enum, default_value_t = ShippedPrompt::Code)]
    pub prompt: ShippedPrompt,
    /// A prompt file instead of a shipped prompt.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Tokens to generate per mode.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// KV budget of the sparse modes: context tokens kept per layer and KV head (sinks and
    /// recent window included). 256 is 1/8 of the code prompt (docs/decisions.md).
    #[arg(long, default_value_t = 256)]
    pub budget: usize,
    /// Draft tokens per iteration (gamma; docs/decisions.md).
    #[arg(long, default_value_t = 4)]
    pub gamma: usize,
    /// Tokens the draft attends to per layer and KV head (0: dense drafting).
    #[arg(long, default_value_t = 0)]
    pub draft_budget: usize,
    /// The sparse modes (comma-separated selectors); the first streams its continuation.
    #[arg(long, value_delimiter = ',', default_value = "dustin,streaming,quest")]
    pub selectors: Vec<String>,
    /// Output folder for demo.json, demo.md and demo.svg.
    #[arg(long, default_value = "out/demo")]
    pub out: PathBuf,
    /// Weights of a GGUF model: `auto` (kept in their block format on the CPU, whose block
    /// kernels read a sixth of the bytes of f32; decoded to f32 elsewhere), `dense` (decoded
    /// to f32) or `blocks`.
    #[arg(long, value_enum, default_value_t = crate::models::WeightsArg::Auto)]
    pub weights: crate::models::WeightsArg,
    /// Vocabulary ids the draft's LM head computes: `full`, or a count N (the first N ids,
    /// most frequent first in byte-level BPE, plus the special tokens); see `generate
    /// --draft-vocab`.
    #[arg(long, default_value_t = DraftVocab::DEFAULT)]
    pub draft_vocab: DraftVocab,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct ModeResult {
    /// Mode name.
    pub mode: String,
    /// Generated tokens.
    pub tokens: usize,
    /// Decode tokens per second.
    pub tokens_per_sec: f64,
    /// Mean acceptance length (tokens per verification; 1 for autoregressive).
    pub mean_acceptance_length: f64,
    /// KV fraction read per verification by the target's attention (selected / dense
    /// positions, summed over layers and KV heads).
    pub kv_fraction_read: f64,
    /// KV fraction read per verification by the selector itself (estimation: for Dustin the
    /// estimator heads' keys, for Quest the page summaries), same denominator.
    pub estimation_fraction_read: f64,
    /// Share of positions equal to the dense autoregressive output.
    pub agreement_with_dense: f64,
    /// Tokens equal to the dense output before the first difference.
    pub identical_prefix: usize,
    /// Wall time, prefill included, seconds.
    pub wall_secs: f64,
    /// Prefill seconds.
    pub prefill_secs: f64,
    /// The continuation.
    pub text: String,
    /// (seconds since decode start, tokens emitted) as they came.
    #[serde(skip)]
    pub timeline: Vec<(f64, f64)>,
}

/// `dustin demo`.
///
/// # Errors
/// Bad arguments (named), fetch, model and engine errors, and I/O errors writing the tables.
pub fn run(args: DemoArgs) -> Result<(), CliError> {
    crate::with_backend!(args.device, |B, dev| run_on::<B>(&args, &dev))
}

/// The prompt's last tokens each mode runs itself after the shared prefill (so that each
/// selection policy observes the end of the prompt, as SnapKV's window and Dustin's
/// calibration need); the rest is prefilled once for all modes.
const DEMO_TAIL: usize = 128;

fn run_on<B: KernelOps>(args: &DemoArgs, dev: &B::Device) -> Result<(), CliError> {
    let t_all = Instant::now();
    crate::check_gamma(args.gamma)?;
    if args.max_new_tokens == 0 {
        return Err(CliError::Usage(
            "--max-new-tokens 0: expected at least 1".into(),
        ));
    }
    if args.selectors.is_empty() {
        return Err(CliError::Usage("--selectors: expected at least one".into()));
    }
    // every selector name, the draft budget and the output folder are checked before any
    // model loads
    for s in &args.selectors {
        crate::pair::check_selector(s)?;
    }
    crate::generate::draft_selection(args.draft_budget)?;
    crate::create_out_dir(&args.out)?;
    let prompt = match &args.prompt_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| CliError::Io {
                path: format!("--prompt-file {}", p.display()),
                source,
            })?;
            if text.trim().is_empty() {
                return Err(CliError::Usage(format!(
                    "--prompt-file {}: no text (expected the prompt to continue)",
                    p.display()
                )));
            }
            text
        }
        None => match args.prompt {
            ShippedPrompt::Code => CODE_PROMPT.to_string(),
            ShippedPrompt::Prose => EXCERPT.to_string(),
        },
    };
    let run = RunConfig {
        gamma: args.gamma,
        max_new_tokens: args.max_new_tokens,
        sampling: SamplingConfig::greedy(),
        seed: 0,
        lookahead_layers: "half".into(),
    };
    let t = Instant::now();
    let files = crate::pair::PairFiles::open(&args.model, &args.draft)?;
    let ids = files.tokenizer().encode(&prompt)?;
    if ids.is_empty() {
        return Err(CliError::Usage("the prompt is empty".into()));
    }
    if args.budget == 0 || args.budget >= ids.len() {
        return Err(CliError::Usage(format!(
            "--budget {}: expected 1 ..= {} (below the prompt's {} tokens)",
            args.budget,
            ids.len() - 1,
            ids.len()
        )));
    }
    if ids.len().saturating_add(run.extra()) > files.max_positions() {
        return Err(CliError::Usage(format!(
            "the prompt's {} tokens and --max-new-tokens {} need {} positions, more than the \
             models take ({})",
            ids.len(),
            args.max_new_tokens,
            ids.len().saturating_add(run.extra()),
            files.max_positions()
        )));
    }
    // every sparse mode's selector builds at the budget before the models load
    for s in &args.selectors {
        crate::pair::policy::<B>(s, args.budget).map_err(|e| {
            CliError::Usage(format!("--selectors {s} --budget {}: {e}", args.budget))
        })?;
    }
    let pair: Pair<B> = files.build(
        ids.len().saturating_add(run.extra()),
        dev,
        args.weights,
        args.draft_vocab,
    )?;
    eprintln!(
        "dustin demo: draft {} ({} layers) for target {} ({} layers), loaded in {:.1} s; {} prompt tokens continued by {} tokens, greedy, gamma {}, sparse budget {} tokens per layer and KV head ({:.1}% of the context)",
        args.draft,
        pair.draft.config.num_hidden_layers,
        args.model,
        pair.target.config.num_hidden_layers,
        t.elapsed().as_secs_f64(),
        ids.len(),
        args.max_new_tokens,
        args.gamma,
        args.budget,
        100.0 * args.budget as f64 / ids.len() as f64
    );
    let mut modes: Vec<(String, Mode)> = vec![
        ("autoregressive, dense".into(), Mode::Autoregressive),
        (
            "speculative, dense verification".into(),
            Mode::Speculative {
                selector: "dense".into(),
                budget: ids.len(),
                draft_budget: args.draft_budget,
            },
        ),
    ];
    for s in &args.selectors {
        modes.push((
            format!("speculative, {s}"),
            Mode::Speculative {
                selector: s.clone(),
                budget: args.budget,
                draft_budget: args.draft_budget,
            },
        ));
    }
    let prefill = SharedPrefill::with_tail(&pair, ids.clone(), run.extra(), DEMO_TAIL)?;
    eprintln!(
        "shared dense prefill of {} tokens: target {:.1} s, draft {:.1} s (the last {} prompt tokens go through each mode's own prefill)",
        prefill.shared_tokens(),
        prefill.target_secs,
        prefill.draft_secs,
        ids.len() - prefill.shared_tokens()
    );
    let n = modes.len();
    let mut results: Vec<ModeResult> = Vec::new();
    let mut reference: Vec<u32> = Vec::new();
    for (i, (name, mode)) in modes.iter().enumerate() {
        let stream = i == 2;
        eprintln!("[{}/{n}] {name} ...", i + 1);
        if stream {
            eprintln!("--- {} continuation ---", args.selectors[0]);
        }
        let (out, wall, timeline) = run_mode(&pair, &prefill, mode, &run, stream)?;
        if stream {
            crate::stdout::line("");
            eprintln!("---------------------------");
        }
        let toks = out.tokens[0].clone();
        if i == 0 {
            reference = toks.clone();
        }
        let same = toks.iter().zip(&reference).filter(|(a, b)| a == b).count();
        let prefix = toks
            .iter()
            .zip(&reference)
            .take_while(|(a, b)| a == b)
            .count();
        let s = &out.summary;
        let res = ModeResult {
            mode: name.to_string(),
            tokens: toks.len(),
            tokens_per_sec: s.tokens_per_sec,
            mean_acceptance_length: s.mean_acceptance_length,
            kv_fraction_read: s.mean_kv_read_fraction,
            estimation_fraction_read: s.mean_estimation_read_fraction,
            agreement_with_dense: same as f64 / reference.len().max(1) as f64,
            identical_prefix: prefix,
            wall_secs: wall,
            prefill_secs: s.prefill_secs,
            text: pair.tok.decode(&toks)?,
            timeline,
        };
        eprintln!(
            "      {:.2} tokens/s, acceptance length {:.2}, KV read {:.3} (+ {:.3} estimation), agreement {:.3}, {:.1} s",
            res.tokens_per_sec, res.mean_acceptance_length, res.kv_fraction_read, res.estimation_fraction_read, res.agreement_with_dense, res.wall_secs
        );
        results.push(res);
    }
    // table
    let mut table = Table::new([
        "mode",
        "tokens/s",
        "mean acceptance length",
        "KV fraction read",
        "+ estimation reads",
        "agreement with dense",
        "identical prefix",
        "wall time (s)",
    ]);
    for r in &results {
        table
            .push_row([
                r.mode.clone().into(),
                r.tokens_per_sec.into(),
                r.mean_acceptance_length.into(),
                r.kv_fraction_read.into(),
                r.estimation_fraction_read.into(),
                r.agreement_with_dense.into(),
                r.identical_prefix.to_string().into(),
                r.wall_secs.into(),
            ])
            .map_err(|e| CliError::Usage(e.to_string()))?;
    }
    crate::stdout::line("");
    crate::stdout::line(&table.to_markdown());
    let json = serde_json::json!({
        "model": args.model,
        "draft": args.draft,
        "prompt_tokens": ids.len(),
        "max_new_tokens": args.max_new_tokens,
        "gamma": args.gamma,
        "budget": args.budget,
        "draft_budget": args.draft_budget,
        "device": format!("{:?}", args.device),
        "shared_prefill_secs": prefill.target_secs + prefill.draft_secs,
        "results": results,
    });
    let write = |name: &str, text: String| -> Result<PathBuf, CliError> {
        let p = args.out.join(name);
        std::fs::write(&p, text).map_err(|source| CliError::Io {
            path: p.display().to_string(),
            source,
        })?;
        Ok(p)
    };
    let pretty = serde_json::to_string_pretty(&json).map_err(|e| CliError::Usage(e.to_string()))?;
    write("demo.json", pretty)?;
    write("demo.md", table.to_markdown())?;
    let series: Vec<(String, Vec<(f64, f64)>)> = results
        .iter()
        .map(|r| (r.mode.clone(), r.timeline.clone()))
        .collect();
    let svg = args.out.join("demo.svg");
    plot_lines(
        &svg,
        "Tokens generated over decode time",
        "seconds since the first token",
        "tokens generated",
        &series,
    )
    .map_err(|e| CliError::Usage(e.to_string()))?;
    eprintln!(
        "wrote {}/demo.json, demo.md, demo.svg; total wall time {:.1} s",
        args.out.display(),
        t_all.elapsed().as_secs_f64()
    );
    Ok(())
}

type ModeRun = (SpecOutput, f64, Vec<(f64, f64)>);

/// One mode from the shared prefill: its output, wall seconds (its own part of the prefill
/// included) and (seconds since its first token, tokens so far) as they came.
fn run_mode<B: KernelOps>(
    pair: &Pair<B>,
    prefill: &SharedPrefill<B>,
    mode: &Mode,
    run: &RunConfig,
    stream: bool,
) -> Result<ModeRun, CliError> {
    let mut dec = StreamDecoder::default();
    let mut timeline = vec![(0.0, 0.0)];
    let mut count = 0usize;
    let mut start: Option<Instant> = None;
    let mut on_tokens = |_: usize, t: &[u32]| {
        let st = *start.get_or_insert_with(Instant::now);
        count += t.len();
        timeline.push((st.elapsed().as_secs_f64(), count as f64));
        if stream {
            if let Ok(s) = dec.push(&pair.tok, t) {
                crate::stdout::text(&s);
            }
        }
    };
    let t = Instant::now();
    let out = crate::pair::run_mode(pair, prefill, mode, run, &mut on_tokens)?;
    Ok((out, t.elapsed().as_secs_f64(), timeline))
}
