//! `dustin demo`: the main job on real input. SmolLM2-135M-Instruct continues a shipped
//! excerpt of a public-domain book with five decoding modes, and the command prints the
//! Dustin continuation as it streams, then one table; it writes the table as JSON and
//! Markdown and a plot (SVG) into an output folder.

use dustin_kernels::KernelOps;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use dustin_core::{DenseHook, SelectionPolicy};
use dustin_eval::report::{plot_lines, Table};
use dustin_qwen::{ModelFiles, Qwen2, StreamDecoder, Tokenizer};
use dustin_select::{estimators::dustin::recommended_select_config, SelectConfig};
use dustin_spec::{
    autoregressive, ModelDrafter, ModelVerifier, SpecConfig, SpecOutput, SpeculativeDecoder,
};
use serde::Serialize;

use crate::backend::DeviceKind;
use crate::CliError;

/// The shipped prompt: the opening of "A Niece of Snapshot Harry's", the first story of Bret
/// Harte's *From Sand Hill to Pine* (1900), Project Gutenberg eBook #2544, from the PG-19
/// test split (`../shared/data/pg19/2544.txt`), public domain: the story's title and its
/// first 7,400 characters (1,949 SmolLM2 tokens), cut in the middle of a sentence ("There was
/// no other light than") so that the continuation has a sentence to finish.
pub const EXCERPT: &str = include_str!("../assets/excerpt_2544.txt");

/// Arguments of `dustin demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Model (HF directory or .gguf). Default: SmolLM2-135M-Instruct, fetched into the cache.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt file instead of the shipped book excerpt.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Tokens to generate per mode.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// KV budget of the sparse modes: context tokens kept per layer and KV head. 512 is
    /// about 1/4 of the shipped excerpt: at 1/8 (256) SmolLM2-135M's greedy continuation
    /// under every sparse selector drifts into loops within a few lines (docs/decisions.md).
    #[arg(long, default_value_t = 512)]
    pub budget: usize,
    /// Draft tokens per iteration (gamma).
    #[arg(long, default_value_t = 4)]
    pub gamma: usize,
    /// Layers of the early-exit self-draft (the target's first N layers and its LM head).
    #[arg(long, default_value_t = 20)]
    pub draft_layers: usize,
    /// Output folder for demo.json, demo.md and demo.svg.
    #[arg(long, default_value = "out/demo")]
    pub out: PathBuf,
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
pub fn run(args: DemoArgs) -> Result<(), CliError> {
    crate::with_backend!(args.device, |B, dev| run_on::<B>(&args, &dev))
}

enum Mode {
    Autoregressive,
    Speculative { selector: &'static str },
}

fn run_on<B: KernelOps>(args: &DemoArgs, dev: &B::Device) -> Result<(), CliError> {
    let t_all = Instant::now();
    let path = crate::generate::model_path(&args.model)?;
    let prompt = match &args.prompt_file {
        Some(p) => std::fs::read_to_string(p).map_err(|source| CliError::Io {
            path: p.display().to_string(),
            source,
        })?,
        None => EXCERPT.to_string(),
    };
    let files = ModelFiles::open(&path)?;
    let tok = files.tokenizer.clone();
    let ids = tok.encode(&prompt)?;
    if ids.is_empty() {
        return Err(CliError::Usage("the prompt is empty".into()));
    }
    let extra = args.max_new_tokens + 2 * (args.gamma + 2);
    let model = Arc::new(files.build::<B>(ids.len() + extra, dev)?);
    if args.draft_layers == 0 || args.draft_layers >= model.config.num_hidden_layers {
        return Err(CliError::Usage(format!(
            "--draft-layers {}: expected 1 ..= {}",
            args.draft_layers,
            model.config.num_hidden_layers - 1
        )));
    }
    eprintln!(
        "dustin demo: {} ({} layers) continues {} prompt tokens by {} tokens in 5 modes (gamma {}, self-draft of {} layers, budget {} tokens = {:.1}% of the context)",
        path.display(),
        model.config.num_hidden_layers,
        ids.len(),
        args.max_new_tokens,
        args.gamma,
        args.draft_layers,
        args.budget,
        100.0 * args.budget as f64 / ids.len() as f64
    );
    let modes: [(&str, Mode); 5] = [
        ("autoregressive, dense", Mode::Autoregressive),
        (
            "speculative, dense verification",
            Mode::Speculative { selector: "dense" },
        ),
        (
            "speculative, dustin",
            Mode::Speculative { selector: "dustin" },
        ),
        (
            "speculative, streaming",
            Mode::Speculative {
                selector: "streaming",
            },
        ),
        (
            "speculative, quest",
            Mode::Speculative { selector: "quest" },
        ),
    ];
    // One dense prefill of the prompt minus its last chunk, shared by every mode (cloned);
    // each mode runs the last chunk itself, so its selection policy sees the end of the
    // prompt (SnapKV's window, Dustin's calibration) as in a full prefill. The self-draft
    // takes the first layers of the same cache: its KV entries equal the target's there.
    let tail = dustin_qwen::generate::DEFAULT_PREFILL_CHUNK.min(ids.len() - 1);
    let t = Instant::now();
    let prefix = if ids.len() > tail {
        let (c, _, _) = dustin_qwen::generate::prefill(
            &model,
            &[ids[..ids.len() - tail].to_vec()],
            ids.len() + extra,
            None,
            &mut DenseHook,
            dustin_qwen::generate::DEFAULT_PREFILL_CHUNK,
            false,
        )?;
        Some(c)
    } else {
        None
    };
    eprintln!(
        "shared dense prefill of {} tokens: {:.1} s (the last {tail} prompt tokens go through each mode's own prefill)",
        ids.len() - tail,
        t.elapsed().as_secs_f64()
    );
    let mut results: Vec<ModeResult> = Vec::new();
    let mut reference: Vec<u32> = Vec::new();
    for (i, (name, mode)) in modes.iter().enumerate() {
        let stream = matches!(mode, Mode::Speculative { selector: "dustin" });
        eprintln!("[{}/5] {name} ...", i + 1);
        if stream {
            eprintln!("--- Dustin continuation ---");
        }
        let r = run_mode(
            args,
            &model,
            &tok,
            &ids,
            prefix.as_ref(),
            mode,
            extra,
            stream,
        )?;
        if stream {
            println!();
            eprintln!("---------------------------");
        }
        let (out, wall, timeline) = r;
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
            text: tok.decode(&toks)?,
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
    println!();
    println!("{}", table.to_markdown());
    std::fs::create_dir_all(&args.out).map_err(|source| CliError::Io {
        path: args.out.display().to_string(),
        source,
    })?;
    let json = serde_json::json!({
        "model": path.display().to_string(),
        "prompt_tokens": ids.len(),
        "max_new_tokens": args.max_new_tokens,
        "gamma": args.gamma,
        "draft": format!("self:layers={}", args.draft_layers),
        "budget": args.budget,
        "device": format!("{:?}", args.device),
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

#[allow(clippy::too_many_arguments)]
fn run_mode<B: KernelOps>(
    args: &DemoArgs,
    model: &Arc<Qwen2<B>>,
    tok: &Tokenizer,
    ids: &[u32],
    prefix: Option<&dustin_kv::DenseKvCache<B>>,
    mode: &Mode,
    extra: usize,
    stream: bool,
) -> Result<ModeRun, CliError> {
    let vocab = tok.vocab_size().min(model.config.vocab_size);
    let cfg = SpecConfig {
        gamma: args.gamma,
        max_new_tokens: args.max_new_tokens,
        eos: tok.eos_ids.clone(),
        ..SpecConfig::default()
    };
    let prompts = vec![ids.to_vec()];
    let mut dec = StreamDecoder::default();
    let mut timeline = vec![(0.0, 0.0)];
    let mut count = 0usize;
    let mut start: Option<Instant> = None;
    let mut on_tokens = |_: usize, t: &[u32]| {
        let st = *start.get_or_insert_with(Instant::now);
        count += t.len();
        timeline.push((st.elapsed().as_secs_f64(), count as f64));
        if stream {
            if let Ok(s) = dec.push(tok, t) {
                print!("{s}");
                use std::io::Write;
                let _ = std::io::stdout().flush();
            }
        }
    };
    let t = Instant::now();
    let out = match mode {
        Mode::Autoregressive => {
            let mut v = ModelVerifier::new(model.clone(), DenseHook, extra, vocab);
            if let Some(p) = prefix {
                v = v.with_prefix(vec![p.clone()]);
            }
            autoregressive(&mut v, &prompts, &cfg, Some(tok), &mut on_tokens)?
        }
        Mode::Speculative { selector } => {
            let select = if *selector == "dustin" {
                recommended_select_config(args.budget)
            } else {
                SelectConfig::with_budget(args.budget)
            };
            let policy: Box<dyn SelectionPolicy<B>> = dustin_select::build::<B>(selector, &select)
                .map_err(|e| CliError::Usage(e.to_string()))?;
            let mut drafter = ModelDrafter::new(model.clone(), Some(args.draft_layers), extra);
            let mut verifier = ModelVerifier::new(model.clone(), policy, extra, vocab);
            if let Some(p) = prefix {
                drafter = drafter.with_prefix(vec![p.clone()]);
                verifier = verifier.with_prefix(vec![p.clone()]);
            }
            let mut d = SpeculativeDecoder::new(drafter, verifier);
            d.generate(&prompts, &cfg, Some(tok), &mut on_tokens)?
        }
    };
    let wall = t.elapsed().as_secs_f64();
    Ok((out, wall, timeline))
}
