//! `dustin generate`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use burn_tensor::backend::Backend;
use clap::Args;
use dustin_core::SamplingConfig;
use dustin_qwen::generate::{generate, GenerateConfig};
use dustin_qwen::{ModelFiles, StreamDecoder, Tokenizer};
use dustin_spec::{ModelDrafter, ModelVerifier, SpecConfig, SpeculativeDecoder};

use crate::backend::DeviceKind;
use crate::CliError;

/// Arguments of `dustin generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Target model: an HF model directory (config.json, safetensors, tokenizer.json) or a
    /// .gguf file. Default: SmolLM2-135M-Instruct from the cache (fetched if missing).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Text file holding one prompt; repeat for a batch of prompts of different lengths.
    #[arg(long = "prompt-file")]
    pub prompt_files: Vec<PathBuf>,
    /// Prompt text (alternative to --prompt-file); repeatable.
    #[arg(long = "prompt")]
    pub prompts: Vec<String>,
    /// Tokens to generate per sequence at most.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 is greedy decoding.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus (top-p) mass kept, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the top-k tokens (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// Draft for speculative decoding: a model path (same tokenizer as the target), or
    /// `self:layers=N` (the target's first N layers and its LM head: early-exit self-draft).
    /// Without it, decoding is autoregressive.
    #[arg(long)]
    pub draft: Option<String>,
    /// Draft tokens per speculative iteration (gamma), 1..=15.
    #[arg(long, default_value_t = 4)]
    pub gamma: usize,
    /// KV selection for sparse verification (needs --draft): dense, streaming, h2o, snapkv,
    /// quest, oracle, draft-only, history-only, dustin, or `pyramid(<name>)`.
    #[arg(long, default_value = "dense")]
    pub selector: String,
    /// KV budget of sparse verification: context tokens kept per layer and KV head (sinks and
    /// recent window included).
    #[arg(long, default_value_t = 2048)]
    pub budget: usize,
    /// TOML or JSON file with everything else: `[select]` (n_sink, window, refresh,
    /// refresh_on_accept_drop) and `[estimator]` (the selector's own knobs, e.g. alpha, beta,
    /// heads_per_layer for dustin). Command-line --budget wins over the file.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// The `--config` file: selection config and estimator knobs.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Shared selection knobs.
    #[serde(default)]
    pub select: Option<serde_json::Value>,
    /// The estimator's own knobs.
    #[serde(default)]
    pub estimator: Option<serde_json::Value>,
}

/// Reads `--config` (TOML by default, JSON when the name ends in `.json`).
pub fn read_config(path: &Option<PathBuf>) -> Result<FileConfig, CliError> {
    let Some(p) = path else {
        return Ok(FileConfig::default());
    };
    let text = std::fs::read_to_string(p).map_err(|source| CliError::Io {
        path: p.display().to_string(),
        source,
    })?;
    let bad = |e: String| CliError::Usage(format!("--config {}: {e}", p.display()));
    if p.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| bad(e.to_string()))
    } else {
        toml::from_str(&text).map_err(|e| bad(e.to_string()))
    }
}

/// Builds the selection policy of `--selector` / `--budget` / `--config`.
pub fn build_policy<B: Backend>(
    selector: &str,
    budget: usize,
    file: &FileConfig,
) -> Result<Box<dyn dustin_core::SelectionPolicy<B>>, CliError> {
    let mut select = if selector == "dustin" {
        dustin_select::estimators::dustin::recommended_select_config(budget)
    } else {
        dustin_select::SelectConfig::with_budget(budget)
    };
    if let Some(v) = &file.select {
        let mut base = serde_json::to_value(&select).map_err(|e| CliError::Usage(e.to_string()))?;
        if let (Some(b), Some(o)) = (base.as_object_mut(), v.as_object()) {
            for (k, val) in o {
                b.insert(k.clone(), val.clone());
            }
        }
        select = serde_json::from_value(base)
            .map_err(|e| CliError::Usage(format!("[select] in --config: {e}")))?;
        select.budget = budget;
    }
    dustin_select::build_with::<B>(selector, &select, file.estimator.clone())
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// Reads the prompts of `args`.
pub fn read_prompts(args: &GenerateArgs) -> Result<Vec<String>, CliError> {
    let mut out = args.prompts.clone();
    for p in &args.prompt_files {
        let bytes = std::fs::read(p).map_err(|source| CliError::Io {
            path: p.display().to_string(),
            source,
        })?;
        let text = String::from_utf8(bytes).map_err(|e| {
            CliError::Usage(format!(
                "prompt file {} is not UTF-8 text (invalid byte at offset {})",
                p.display(),
                e.utf8_error().valid_up_to()
            ))
        })?;
        out.push(text);
    }
    if out.is_empty() {
        return Err(CliError::Usage(
            "no prompt: give --prompt-file FILE or --prompt TEXT".into(),
        ));
    }
    if let Some(i) = out.iter().position(|p| p.trim().is_empty()) {
        return Err(CliError::Usage(format!("prompt {i} is empty")));
    }
    Ok(out)
}

/// Resolves `--model`, fetching the default model when absent.
pub fn model_path(model: &Option<PathBuf>) -> Result<PathBuf, CliError> {
    match model {
        Some(p) => Ok(p.clone()),
        None => crate::fetch::ensure_default_model(&crate::fetch::cache_root()),
    }
}

/// The parsed `--draft` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DraftSpec {
    /// Early-exit self-draft from the target's first `layers` layers.
    SelfLayers(usize),
    /// A separate model.
    Model(PathBuf),
}

/// Parses `--draft`.
pub fn parse_draft(s: &str) -> Result<DraftSpec, CliError> {
    if let Some(rest) = s.strip_prefix("self") {
        let n = rest
            .strip_prefix(":layers=")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                CliError::Usage(format!("--draft {s}: expected self:layers=N with N >= 1"))
            })?;
        return Ok(DraftSpec::SelfLayers(n));
    }
    Ok(DraftSpec::Model(PathBuf::from(s)))
}

/// `dustin generate`.
pub fn run(args: GenerateArgs) -> Result<(), CliError> {
    crate::with_backend!(args.device, |B, dev| run_on::<B>(&args, &dev))
}

fn run_on<B: Backend>(args: &GenerateArgs, dev: &B::Device) -> Result<(), CliError> {
    let prompts = read_prompts(args)?;
    let file = read_config(&args.config)?;
    if args.draft.is_none() && args.selector != "dense" {
        return Err(CliError::Usage(format!(
            "--selector {} needs speculative decoding: add --draft <path | self:layers=N>",
            args.selector
        )));
    }
    // check the selector name and knobs before loading the model
    build_policy::<B>(&args.selector, args.budget, &file)?;
    let path = model_path(&args.model)?;
    let files = ModelFiles::open(&path)?;
    let tok = files.tokenizer.clone();
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| tok.encode(p))
        .collect::<Result<_, _>>()?;
    let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
    let positions = (longest + args.max_new_tokens + 2 * (args.gamma + 2))
        .min(files.config.max_position_embeddings);
    let model = Arc::new(files.build::<B>(positions, dev)?);
    let sampling = SamplingConfig {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
    };
    let vocab = tok.vocab_size().min(model.config.vocab_size);
    let mut stream = StreamDecoder::default();
    let mut out = std::io::stdout();
    let mut on_tokens = |seq: usize, t: &[u32]| {
        if seq == 0 {
            if let Ok(s) = stream.push(&tok, t) {
                let _ = write!(out, "{s}");
                let _ = out.flush();
            }
        }
    };
    match &args.draft {
        None => {
            let cfg = GenerateConfig {
                max_new_tokens: args.max_new_tokens,
                sampling,
                seed: args.seed,
                stop_strings: args.stop.clone(),
                ..GenerateConfig::default()
            };
            let o = generate(&model, &ids, &cfg, Some(&tok), &mut on_tokens)?;
            println!();
            print_rest(&tok, &o.tokens)?;
            let gen: usize = o.tokens.iter().map(Vec::len).sum();
            eprintln!(
                "prefill: {} tokens in {:.2} s ({:.1} tokens/s); decode: {} tokens in {:.2} s ({:.2} tokens/s); finish: {:?}",
                o.prefill_tokens,
                o.prefill_secs,
                o.prefill_tokens as f64 / o.prefill_secs.max(1e-9),
                gen,
                o.decode_secs,
                gen as f64 / o.decode_secs.max(1e-9),
                o.finish
            );
        }
        Some(d) => {
            let extra = args.max_new_tokens + 2 * (args.gamma + 2);
            let drafter = match parse_draft(d)? {
                DraftSpec::SelfLayers(n) => {
                    if n >= model.config.num_hidden_layers {
                        return Err(CliError::Usage(format!(
                            "--draft self:layers={n}: the target has {} layers; use fewer",
                            model.config.num_hidden_layers
                        )));
                    }
                    ModelDrafter::new(model.clone(), Some(n), extra)
                }
                DraftSpec::Model(p) => {
                    let df = ModelFiles::open(&p)?;
                    check_vocab(&tok, &df.tokenizer)?;
                    ModelDrafter::new(Arc::new(df.build::<B>(positions, dev)?), None, extra)
                }
            };
            let policy = build_policy::<B>(&args.selector, args.budget, &file)?;
            let verifier = ModelVerifier::new(model.clone(), policy, extra, vocab);
            let mut dec = SpeculativeDecoder::new(drafter, verifier);
            let cfg = SpecConfig {
                gamma: args.gamma,
                max_new_tokens: args.max_new_tokens,
                sampling,
                seed: args.seed,
                eos: tok.eos_ids.clone(),
                stop_strings: args.stop.clone(),
            };
            let o = dec.generate(&ids, &cfg, Some(&tok), &mut on_tokens)?;
            println!();
            print_rest(&tok, &o.tokens)?;
            let s = &o.summary;
            eprintln!(
                "speculative (gamma {}): {} iterations, mean acceptance length {:.2}, {} tokens in {:.2} s ({:.2} tokens/s); \
                 draft {:.2} s, verify {:.2} s, accept {:.3} s, commit {:.3} s; prefill {:.2} s; KV fraction read {:.3} (+ {:.3} by the selector's estimation)",
                args.gamma,
                s.iterations,
                s.mean_acceptance_length,
                s.generated_tokens,
                s.decode_secs,
                s.tokens_per_sec,
                s.draft_secs,
                s.verify_secs,
                s.accept_secs,
                s.commit_secs,
                s.prefill_secs,
                s.mean_kv_read_fraction,
                s.mean_estimation_read_fraction
            );
        }
    }
    Ok(())
}

fn print_rest(tok: &Tokenizer, tokens: &[Vec<u32>]) -> Result<(), CliError> {
    for (i, t) in tokens.iter().enumerate().skip(1) {
        println!("--- sequence {i} ---\n{}", tok.decode(t)?);
    }
    Ok(())
}

/// Checks that draft and target tokenizers agree on every token.
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), CliError> {
    if let Some((token, t, d)) = target.first_mismatch(draft) {
        return Err(dustin_spec::SpecError::VocabMismatch {
            token,
            draft: d,
            target: t,
        }
        .into());
    }
    Ok(())
}
