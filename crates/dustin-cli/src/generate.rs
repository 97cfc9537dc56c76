//! `dustin generate`: the arguments ([`GenerateArgs`]) and the run; the options it shares
//! with the demo and `dustin-bench` (`options`: `--config`, policies, draft budgets,
//! prompts), `--draft` values (`draft`), the memory checks (`memory`) and the output
//! (`output`) are in modules of their own.

use dustin_kernels::KernelOps;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use dustin_core::{CancelToken, SamplingConfig};
use dustin_qwen::generate::{generate, GenerateConfig};
use dustin_qwen::{ModelFiles, StreamDecoder};
use dustin_spec::{ModelDrafter, ModelVerifier, SpecConfig, SpeculativeDecoder};

use crate::backend::DeviceKind;
use crate::CliError;

mod draft;
mod memory;
mod options;
mod output;

pub use draft::{
    check_vocab, parse_draft, parse_layer_list, with_draft_vocab, DraftSpec, DraftVocab,
    SubstituteLayers, SubstituteSpec, MAX_LAYER_INDEX,
};
pub use memory::check_kv_memory;
use memory::offload_plan;
pub use options::{
    build_policy, draft_selection, model_path, parse_bytes, read_config, read_prompts, FileConfig,
};
use output::{after_error, check_output_path, finish_run, print_profile, print_rest};

/// Arguments of `dustin generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The models, the draft and the verification (shared with `dustin serve`).
    #[command(flatten)]
    pub pair: PairArgs,
    /// Text file holding one prompt; repeat for a batch of prompts of different lengths.
    #[arg(long = "prompt-file")]
    pub prompt_files: Vec<PathBuf>,
    /// Prompt text (alternative to --prompt-file); repeatable.
    #[arg(long = "prompt")]
    pub prompts: Vec<String>,
    /// Chat prompts rendered with the model's chat template (--chat, --system, --user,
    /// --chat-file).
    #[command(flatten)]
    pub chat: crate::chat::ChatArgs,
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
    /// Prefill products over block weights: `on` multiplies prefill chunks with AMX tiles
    /// (each operand split into two bf16 parts: within about 2^-15 of the f32 product), `off`
    /// decodes each weight for an f32 matmul; `auto` is `on` where the CPU has AMX.
    #[arg(long, value_parser = parse_switch, default_value = "auto")]
    pub quant_prefill: dustin_kernels::config::Switch,
    /// Time every phase of the target's and the draft's forward passes (`dustin_qwen::profile`;
    /// the device is waited for around each phase) and print the decode phases at the end.
    #[arg(long)]
    pub profile: bool,
    /// Tokens the draft attends to per layer and KV head (needs --draft): the sinks and
    /// recent window of the selectors' defaults (4 and 64) plus the top of each draft
    /// layer's own attention mass in the last proposal (`ModelDrafter::with_draft_selection`,
    /// `DraftSelection::new`); 0 (the default) drafts densely.
    /// The draft's tokens change, the output does not (the target verifies them).
    #[arg(long, default_value_t = 0)]
    pub draft_budget: usize,
    /// Draft layers whose attention makes the lookahead the selector reads (needs --draft;
    /// `dustin_spec::LookaheadLayers`): `half` (the default: the later half of the draft's
    /// layers), `all`, `stride:S` (every S-th layer counted back from the last), `last:N` or
    /// a list of layer indices (`0,5,9`). Fewer layers cost the draft less (docs/perf.md);
    /// their effect on the selections is in docs/fidelity.md. The output does not change with greedy decoding.
    #[arg(long, default_value = "half")]
    pub lookahead_layers: String,
    /// Memory the KV caches may take, e.g. `8G`, `512M`, `1000000` (bytes): checked before
    /// allocating. Default: MemAvailable on the CPU; on a GPU no check unless given (Burn
    /// 0.21 does not report free device memory).
    #[arg(long, value_parser = parse_bytes)]
    pub max_memory: Option<u64>,
    /// GPU memory the model may hold, e.g. `8G`: the target's layers that do not fit stay in
    /// host memory and are copied in for each forward pass (top layers first; see
    /// `dustin_qwen::offload::plan_offload`, which also counts the KV caches and a substitute
    /// draft). Conflicts with --offload.
    #[arg(long, value_parser = parse_bytes, conflicts_with = "offload")]
    pub gpu_memory: Option<u64>,
    /// Target layers kept in host memory, e.g. `14-27` or `20,21` (0-based).
    #[arg(long)]
    pub offload: Option<String>,
    /// Host memory of the offloaded layers' weights: `pinned` (page-locked, the default:
    /// each forward pass copies a matrix by one DMA transfer, 50-52 GB/s on the H200 machine)
    /// or `pageable` (Burn's `Tensor::from_data`, 0.4 GB/s there; `dustin-bench upload-check
    /// --device cuda`, docs/perf.md). The CPU has no page-locked memory: both are the same
    /// there, and asking for `pinned` explicitly says so.
    #[arg(long, value_enum)]
    pub offload_memory: Option<OffloadMemory>,
    /// Write every sequence's text, tokens and finish reason (eos, stop_string, length,
    /// cancelled) to this JSON file, also when generation is cancelled with Ctrl-C (or SIGTERM).
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// Where offloaded target weights live in host memory (`--offload-memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OffloadMemory {
    /// Page-locked (`cuMemHostAlloc`), copied by one DMA transfer per matrix
    /// (`Qwen2::pin_offloaded`).
    Pinned,
    /// Ordinary host memory, copied through Burn's `Tensor::from_data`.
    Pageable,
}

/// `dustin generate`.
pub fn run(args: GenerateArgs) -> Result<(), CliError> {
    dustin_core::memory::set_memory_limit(args.max_memory);
    let cancel = CancelToken::new();
    let c = cancel.clone();
    // first Ctrl-C (or SIGTERM, SIGHUP): stop after the current step and write what was
    // generated; second: quit
    let handler = ctrlc::set_handler(move || {
        if c.is_cancelled() {
            eprintln!("\ninterrupted again: exiting now");
            std::process::exit(130);
        }
        eprintln!(
            "\ninterrupted: stopping at the next prefill layer or decoding step (Ctrl-C again to quit now)"
        );
        c.cancel();
    });
    if let Err(e) = handler {
        eprintln!("note: Ctrl-C handler not installed ({e}); Ctrl-C will stop without output");
    }
    crate::with_backend!(args.pair.device, |B, dev| run_on::<B>(&args, &dev, &cancel))
}

fn run_on<B: KernelOps>(
    args: &GenerateArgs,
    dev: &B::Device,
    cancel: &CancelToken,
) -> Result<(), CliError> {
    let has_plain = !args.prompts.is_empty() || !args.prompt_files.is_empty();
    let inputs = crate::chat::Inputs::from_args(&args.chat, || read_prompts(args), has_plain)?;
    let file = read_config(&args.pair.config)?;
    crate::check_gamma(args.pair.gamma)?;
    // an empty stop string would end every sequence at once (the server refuses it too)
    if args.stop.iter().any(String::is_empty) {
        return Err(CliError::Usage(
            "--stop \"\": expected a non-empty stop string".into(),
        ));
    }
    // a bad --output path is found before the model runs, not after (the tokens were lost)
    if let Some(path) = &args.output {
        let mut inputs: Vec<PathBuf> = args
            .prompt_files
            .iter()
            .chain(&args.chat.chat_files)
            .chain(&args.pair.config)
            .cloned()
            .collect();
        // the model files too (a GGUF file, or a folder whose files it would overwrite)
        let target = args
            .pair
            .model
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::models::DEFAULT_MODEL));
        inputs.extend(crate::models::existing_model_path(&target));
        if let Some(Ok(DraftSpec::Model(p))) = args.pair.draft.as_deref().map(parse_draft) {
            inputs.extend(crate::models::existing_model_path(&p));
        }
        check_output_path(path, &inputs)?;
    }
    if args.pair.draft.is_none() && args.pair.selector != "dense" {
        return Err(CliError::Usage(format!(
            "--selector {} needs speculative decoding: add --draft <path | self:layers=N | substitute>",
            args.pair.selector
        )));
    }
    // anything but the default or all layers (an unreadable setting included) needs a draft
    let plain_setting = args
        .lookahead_layers
        .parse::<dustin_spec::LookaheadLayers>()
        .is_ok_and(|l| {
            l == dustin_spec::LookaheadLayers::All || l == dustin_spec::LookaheadLayers::default()
        });
    if args.pair.draft.is_none() && !plain_setting {
        return Err(CliError::Usage(format!(
            "--lookahead-layers {} needs speculative decoding: add --draft <path | self:layers=N | substitute>",
            args.lookahead_layers
        )));
    }
    if args.draft_budget > 0 {
        if args.pair.draft.is_none() {
            return Err(CliError::Usage(format!(
                "--draft-budget {} needs speculative decoding: add --draft <path | self:layers=N | substitute>",
                args.draft_budget
            )));
        }
        draft_selection(args.draft_budget)?;
    }
    // check the selector name and knobs before loading the model
    build_policy::<B>(&args.pair.selector, args.pair.budget, &file)?;
    let path = model_path(&args.pair.model)?;
    let files = ModelFiles::open(&path)?;
    // with --chat: the rendered conversations, and EOS ids that include the end-of-turn tokens
    let (prompts, tok) = inputs.render(&files, &path)?;
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| tok.encode(p))
        .collect::<Result<_, _>>()?;
    let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
    let margin = 2 * (args.pair.gamma + 2);
    // saturating: a count near usize::MAX is refused by the prompt check (more positions than
    // the model takes), not wrapped to a small table that fails at its last position
    let positions = longest
        .saturating_add(args.max_new_tokens)
        .saturating_add(margin)
        .min(files.config.max_position_embeddings);
    let draft_files = match args.pair.draft.as_deref().map(parse_draft).transpose()? {
        Some(DraftSpec::Model(p)) => {
            Some(ModelFiles::open(&crate::models::resolve_model_path(&p)?)?)
        }
        _ => None,
    };
    let mut cfgs = vec![&files.config];
    cfgs.extend(draft_files.as_ref().map(|d| &d.config));
    let spec = args.pair.draft.as_deref().map(parse_draft).transpose()?;
    let self_cfg = match &spec {
        // an early-exit draft keeps its own cache of its first N layers
        Some(DraftSpec::SelfLayers(n)) => Some(dustin_qwen::QwenConfig {
            num_hidden_layers: (*n).min(files.config.num_hidden_layers),
            ..files.config.clone()
        }),
        _ => None,
    };
    cfgs.extend(self_cfg.as_ref());
    if let Some(DraftSpec::Substitute(sub)) = &spec {
        // its own KV cache for every layer, of the target's shape
        cfgs.push(&files.config);
        if args.gpu_memory.is_some() && sub.layers != SubstituteLayers::Offloaded {
            return Err(CliError::Usage(format!(
                "--gpu-memory with --draft {}: under a GPU budget the substitute takes exactly \
                 the offloaded layers (drop `:layers=`, or choose them with --offload)",
                args.pair.draft.as_deref().unwrap_or_default()
            )));
        }
    }
    check_kv_memory::<B>(&cfgs, ids.len(), positions, dev)?;
    let offloaded = offload_plan::<B>(args, &cfgs, ids.len(), positions, draft_files.as_ref())?;
    let weights = args.pair.weights.format::<B>();
    let mut model = files.build_offloaded::<B>(positions, dev, &offloaded, weights)?;
    if offloaded.is_empty() && args.offload_memory.is_some() {
        eprintln!("note: --offload-memory: no target layer is offloaded, so it has no effect");
    }
    if args.offload_memory != Some(OffloadMemory::Pageable) && !offloaded.is_empty() {
        // a driver that refuses to lock this much memory leaves the rest pageable: the values
        // are the same either way, only the copies are slower
        if let Err(e) = model.pin_offloaded() {
            eprintln!(
                "note: could not page-lock the offloaded weights ({e}); the rest copy through pageable memory (--offload-memory pageable skips the attempt)"
            );
        } else if !model.offloaded_pinned() && args.offload_memory == Some(OffloadMemory::Pinned) {
            eprintln!(
                "note: --offload-memory pinned: this backend has no page-locked memory; the offloaded layers copy through pageable memory"
            );
        }
    }
    let model = Arc::new(
        quant_prefill(model, args.quant_prefill)
            .with_profile(args.profile.then_some("target"))
            .with_cancel(cancel.clone()),
    );
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
            // the stop tokens end the text, they are not part of it (as the server's)
            let shown = output::text_ids(t, &tok.eos_ids);
            if let Ok(s) = stream.push(&tok, &shown) {
                let _ = write!(out, "{s}");
                let _ = out.flush();
            }
        }
    };
    let done = match &args.pair.draft {
        None => {
            let cfg = GenerateConfig {
                max_new_tokens: args.max_new_tokens,
                sampling,
                seed: args.seed,
                stop_strings: args.stop.clone(),
                cancel: Some(cancel.clone()),
                ..GenerateConfig::default()
            };
            let o = match generate(&model, &ids, &cfg, Some(&tok), &mut on_tokens) {
                Ok(o) => o,
                Err(e) => return after_error(args, &tok, ids.len(), e.into()),
            };
            crate::stdout::line("");
            print_rest(&tok, &o.tokens)?;
            let fin = finish_run(args, &tok, &o.tokens, &o.finish);
            let gen: usize = o.tokens.iter().map(Vec::len).sum();
            eprintln!(
                "prefill: {} tokens in {:.2} s ({:.1} tokens/s); decode: {} tokens in {:.2} s ({:.2} tokens/s)",
                o.prefill_tokens,
                o.prefill_secs,
                o.prefill_tokens as f64 / o.prefill_secs.max(1e-9),
                gen,
                o.decode_secs,
                gen as f64 / o.decode_secs.max(1e-9),
            );
            fin
        }
        Some(d) => {
            let extra = args.max_new_tokens.saturating_add(margin);
            let mut target_kv = None;
            // (the drafter, its layer count)
            let (drafter, draft_layers) = match parse_draft(d)? {
                DraftSpec::SelfLayers(n) => {
                    if n >= model.config.num_hidden_layers {
                        return Err(CliError::Usage(format!(
                            "--draft self:layers={n}: the target has {} layers; use fewer",
                            model.config.num_hidden_layers
                        )));
                    }
                    (ModelDrafter::new(model.clone(), Some(n), extra), n)
                }
                DraftSpec::Model(p) => {
                    let df = match draft_files {
                        Some(df) => df,
                        None => ModelFiles::open(&crate::models::resolve_model_path(&p)?)?,
                    };
                    check_vocab(&tok, &df.tokenizer)?;
                    let n = df.config.num_hidden_layers;
                    let dm = Arc::new(
                        quant_prefill(
                            with_draft_vocab(
                                df.build_as::<B>(positions, dev, weights)?,
                                args.pair.draft_vocab,
                                &df.tokenizer,
                            )?,
                            args.quant_prefill,
                        )
                        .with_profile(args.profile.then_some("draft"))
                        .with_cancel(cancel.clone()),
                    );
                    (ModelDrafter::new(dm, None, extra), n)
                }
                DraftSpec::Substitute(sub) => {
                    let built = match sub.build(&model) {
                        Ok(m) => m,
                        // Ctrl-C during the quantization ends as a cancelled run
                        Err(e) => return after_error(args, &tok, ids.len(), e),
                    };
                    let d = ModelDrafter::new(Arc::new(built), None, extra);
                    let n = model.config.num_hidden_layers;
                    if sub.target_kv {
                        let kv = dustin_spec::TargetKv::new();
                        target_kv = Some(kv.clone());
                        (d.with_target_kv(kv), n)
                    } else {
                        (d, n)
                    }
                }
            };
            let la_bad = |e: dustin_spec::SpecError| {
                CliError::Usage(format!("--lookahead-layers {}: {e}", args.lookahead_layers))
            };
            let layers = args
                .lookahead_layers
                .parse::<dustin_spec::LookaheadLayers>()
                .map_err(la_bad)?
                .resolve(draft_layers)
                .map_err(la_bad)?;
            let drafter = drafter
                .with_lookahead(dustin_spec::LookaheadConfig {
                    layers,
                    ..Default::default()
                })
                .with_draft_selection(draft_selection(args.draft_budget)?)
                .map_err(|e| CliError::Usage(format!("--draft-budget: {e}")))?;
            let policy = build_policy::<B>(&args.pair.selector, args.pair.budget, &file)?;
            let verifier = ModelVerifier::new(model.clone(), policy, extra, vocab);
            let verifier = match target_kv {
                Some(kv) => verifier.with_target_kv(kv),
                None => verifier,
            };
            let mut dec = SpeculativeDecoder::new(drafter, verifier);
            dec.set_cancel(cancel.clone());
            let cfg = SpecConfig {
                gamma: args.pair.gamma,
                max_new_tokens: args.max_new_tokens,
                sampling,
                seed: args.seed,
                eos: tok.eos_ids.clone(),
                stop_strings: args.stop.clone(),
            };
            let o = match dec.generate(&ids, &cfg, Some(&tok), &mut on_tokens) {
                Ok(o) => o,
                Err(e) => return after_error(args, &tok, ids.len(), e.into()),
            };
            crate::stdout::line("");
            print_rest(&tok, &o.tokens)?;
            let fin = finish_run(args, &tok, &o.tokens, &o.finish);
            let s = &o.summary;
            eprintln!(
                "speculative (gamma {}): {} iterations, mean acceptance length {:.2}, {} tokens in {:.2} s ({:.2} tokens/s); \
                 draft {:.2} s, verify {:.2} s, accept {:.3} s, commit {:.3} s; prefill {:.2} s; KV fraction read {:.3} (+ {:.3} by the selector's estimation)",
                args.pair.gamma,
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
            fin
        }
    };
    // also after a cancelled run: its steps were timed as well
    if args.profile {
        print_profile();
    }
    done
}

/// The target, the draft and how the target verifies: the flags `dustin generate` and
/// `dustin serve` share.
#[derive(Debug, Args)]
pub struct PairArgs {
    /// Target model: an HF model directory (config.json, safetensors, tokenizer.json), a
    /// .gguf file, or a model name (`dustin fetch-model --list`; fetched into the cache if
    /// missing). Default: qwen2.5-coder-1.5b-instruct.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Draft for speculative decoding: a model path or name (same tokenizer as the target),
    /// `self:layers=N` (the target's first N layers and its LM head: early-exit self-draft),
    /// or `substitute[:bits=4][:group=64][:layers=half|a-b,c]` (SubSpec: the whole target with
    /// the listed layers, default the second half, group-quantized to `bits` bits).
    /// Without it, decoding is autoregressive.
    #[arg(long)]
    pub draft: Option<String>,
    /// Draft tokens per speculative iteration (gamma), 1..=15.
    #[arg(long, default_value_t = 4)]
    pub gamma: usize,
    /// Vocabulary ids a separate draft model's LM head computes: `full`, or a count N (the
    /// first N ids, which byte-level BPE numbers most frequent first, plus the special
    /// tokens). Every other id gets no probability in the draft; the output is the target's
    /// either way (FR-Spec, Zhao et al. 2025).
    #[arg(long, default_value_t = DraftVocab::DEFAULT)]
    pub draft_vocab: DraftVocab,
    /// KV selection for sparse verification (needs --draft): dense, streaming, h2o, snapkv,
    /// quest, oracle, draft-only, history-only, dustin, or `pyramid(<name>)`.
    #[arg(long, default_value = "dense")]
    pub selector: String,
    /// KV budget of sparse verification: context tokens kept per layer and KV head (sinks and
    /// recent window included).
    #[arg(long, default_value_t = 2048, value_parser = parse_token_budget)]
    pub budget: usize,
    /// TOML or JSON file with everything else: `[select]` (n_sink, window, refresh,
    /// refresh_on_accept_drop, accept_drop_sigmas, batched_reuse) and `[estimator]` (the selector's own knobs,
    /// e.g. alpha, beta, heads_per_layer for dustin). The budget is --budget's alone (a
    /// `budget` key in `[select]` is refused).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Weights of a GGUF model: `auto` (kept in their block format on the CPU, whose block
    /// kernels read a sixth of the bytes of f32; decoded to f32 elsewhere), `dense` (decoded
    /// to f32) or `blocks`.
    #[arg(long, value_enum, default_value_t = crate::models::WeightsArg::Auto)]
    pub weights: crate::models::WeightsArg,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// `--budget`'s value: a count of tokens. A fraction of the context (`1/8`, as `dustin
/// eval` takes) is refused by name: here the prompt's length is not known yet.
fn parse_token_budget(s: &str) -> Result<usize, String> {
    s.trim().parse::<usize>().map_err(|_| {
        if s.contains('/') || s.contains('.') {
            "expected a count of tokens per layer and KV head, e.g. 1024 (fractions of the context are `dustin eval`'s)".into()
        } else {
            "expected a count of tokens per layer and KV head, e.g. 1024".into()
        }
    })
}

/// `--quant-prefill`'s value.
fn parse_switch(s: &str) -> Result<dustin_kernels::config::Switch, String> {
    s.parse()
        .map_err(|e: dustin_kernels::KernelError| e.to_string())
}

/// `model` with `--quant-prefill` applied (`auto` leaves the backend's default).
fn quant_prefill<B: dustin_kernels::KernelOps>(
    model: dustin_qwen::Qwen2<B>,
    switch: dustin_kernels::config::Switch,
) -> dustin_qwen::Qwen2<B> {
    use dustin_kernels::config::Switch;
    match switch {
        Switch::Auto => model,
        Switch::On => model.with_quant_prefill(true),
        Switch::Off => model.with_quant_prefill(false),
    }
}

#[cfg(test)]
mod tests {
    use super::{
        parse_bytes, parse_draft, parse_layer_list, DraftSpec, SubstituteLayers, SubstituteSpec,
    };
    use dustin_qwen::SubstituteConfig;

    fn sub(bits: u32, group: usize, layers: SubstituteLayers) -> DraftSpec {
        DraftSpec::Substitute(SubstituteSpec {
            cfg: SubstituteConfig { bits, group },
            layers,
            target_kv: false,
        })
    }

    #[test]
    fn substitute_drafts_parse() {
        use SubstituteLayers::{Half, List, Offloaded};
        assert_eq!(parse_draft("substitute").unwrap(), sub(4, 64, Offloaded));
        assert_eq!(
            parse_draft("substitute:bits=2").unwrap(),
            sub(2, 64, Offloaded)
        );
        assert_eq!(
            parse_draft("substitute:layers=15-29:bits=3:group=32").unwrap(),
            sub(3, 32, List((15..=29).collect()))
        );
        assert_eq!(
            parse_draft("substitute:layers=7,0-2,2:group=128").unwrap(),
            sub(4, 128, List(vec![0, 1, 2, 7]))
        );
        assert_eq!(
            parse_draft("substitute:layers=half").unwrap(),
            sub(4, 64, Half)
        );
        assert_eq!(
            parse_draft("self:layers=3").unwrap(),
            DraftSpec::SelfLayers(3)
        );
        let DraftSpec::Substitute(s) = parse_draft("substitute").unwrap() else {
            panic!("substitute")
        };
        assert_eq!(s.resolve(30, &[]), (15..30).collect::<Vec<_>>());
        assert_eq!(s.resolve(30, &[20, 21]), vec![20, 21]);
        assert_eq!(
            super::draft::format_layers(&[0, 1, 2, 7, 9, 10]),
            "0-2,7,9-10"
        );
    }

    #[test]
    fn bad_substitute_drafts_are_named() {
        for (bad, want) in [
            ("substitute:bits=9", "bits = `9` is not in 2 ..= 8"),
            ("substitute:bits=1", "bits = `1` is not in 2 ..= 8"),
            (
                "substitute:group=0",
                "group = `0` is not a positive integer",
            ),
            ("substitute:layers=5-2", "layer range `5-2` is empty"),
            ("substitute:layers=a", "layer `a` is not a layer index"),
            ("substitute:layers=1,,2", "layer `` is not a layer index"),
            ("substitute:depth=3", "unknown key `depth`"),
            ("substitute:bits", "`bits` is not key=value"),
            ("substitute,bits=3", "keys follow a `:`"),
        ] {
            let e = parse_draft(bad).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn max_memory_sizes_parse() {
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert_eq!(parse_bytes("8G"), Ok(8 << 30));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("2kB"), Ok(2048));
        for bad in ["", "G", "-1G", "0", "0.5", "8X", "lots", "1e30T"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        assert!(parse_bytes("8X").unwrap_err().contains("unknown unit `X`"));
        assert!(parse_bytes("0.5")
            .unwrap_err()
            .contains("less than one byte"));
    }

    #[test]
    fn layer_lists_refuse_indices_past_any_model() {
        assert_eq!(parse_layer_list("3,0-1,1"), Ok(vec![0, 1, 3]));
        for bad in ["0-18446744073709551615", "0-100000000000", "65536"] {
            let e = parse_layer_list(bad).unwrap_err();
            assert!(
                e.contains("is past any model's layers (at most 65535)"),
                "{bad}: {e}"
            );
        }
    }
}
