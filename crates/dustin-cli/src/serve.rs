//! `dustin serve`: the OpenAI-compatible HTTP server of `dustin-serve` over the models and
//! selection that `dustin generate` takes.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use dustin_core::{DenseHook, SelectionPolicy};
use dustin_kernels::KernelOps;
use dustin_qwen::{ModelFiles, Qwen2, QwenConfig};
use dustin_serve::{Decoder, DecoderFactory, EngineConfig, Limits, Server, ServerConfig};
use dustin_spec::{
    AutoregressiveDecoder, JoinPolicy, ModelDrafter, ModelVerifier, PerRow, SpeculativeDecoder,
};

use crate::generate::{
    build_policy, check_vocab, parse_bytes, parse_draft, read_config, DraftSpec, FileConfig,
};
use crate::CliError;

/// Arguments of `dustin serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The models, the draft and the verification (as for `dustin generate`).
    #[command(flatten)]
    pub pair: crate::generate::PairArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The model id clients name in `model` (default: the model's name or file name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Prompt tokens per request at most (after the chat template); longer prompts are
    /// answered 400.
    #[arg(long, default_value_t = 4096)]
    pub max_prompt_tokens: usize,
    /// `max_tokens` per request at most; more is answered 400.
    #[arg(long, default_value_t = 1024)]
    pub max_tokens: usize,
    /// `max_tokens` of a request that gives none; at most --max-tokens. Default: 256, or
    /// --max-tokens where that is lower.
    #[arg(long)]
    pub default_max_tokens: Option<usize>,
    /// Requests waiting for admission at most; more are answered 429 with `Retry-After`.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Sequences decoding at once at most (those being prefilled included): every request,
    /// greedy or sampled, joins the one running batch between its iterations.
    #[arg(long, default_value_t = 16)]
    pub max_batch: usize,
    /// Prompt tokens prefilled between two iterations of a batch: a new request's prompt
    /// runs in chunks of this size interleaved with the running requests' iterations.
    #[arg(long, default_value_t = 256)]
    pub prefill_chunk: usize,
    /// Memory the KV caches may take, e.g. `8G`: each new batch is checked against it
    /// before it is admitted. Default: MemAvailable on the CPU.
    #[arg(long, value_parser = parse_bytes)]
    pub max_memory: Option<u64>,
}

/// `dustin serve`.
pub fn run(args: ServeArgs) -> Result<(), CliError> {
    dustin_core::memory::set_memory_limit(args.max_memory);
    crate::with_backend!(args.pair.device, |B, dev| run_on::<B>(args, dev))
}

/// The draft of a batch's decoder.
enum Draft<B: KernelOps> {
    None,
    Model(Arc<Qwen2<B>>),
    SelfLayers(usize),
    Substitute(Arc<Qwen2<B>>),
}

/// Makes each batch's decoder: fresh caches and selection policy over shared models.
struct Factory<B: KernelOps> {
    target: Arc<Qwen2<B>>,
    draft: Draft<B>,
    selector: String,
    budget: usize,
    file: Arc<FileConfig>,
    vocab: usize,
    /// the configs of every KV cache a batch holds (target and draft)
    cfgs: Vec<QwenConfig>,
    dev: B::Device,
}

impl<B: KernelOps> DecoderFactory for Factory<B> {
    fn check_memory(&self, batch: usize, capacity: usize) -> Result<u64, String> {
        let bytes = dustin_core::memory::float_bytes::<B>();
        let per_token: u128 = self
            .cfgs
            .iter()
            .map(|c| c.kv_bytes_per_token(bytes) as u128)
            .sum();
        let refs: Vec<&QwenConfig> = self.cfgs.iter().collect();
        crate::generate::check_kv_memory::<B>(&refs, batch, capacity, &self.dev)
            .map_err(|e| e.to_string())?;
        Ok(u64::try_from(per_token * (batch * capacity) as u128).unwrap_or(u64::MAX))
    }

    fn build(&mut self, extra: usize) -> Result<Box<dyn Decoder>, String> {
        if self.selector == "dense" {
            let verifier = ModelVerifier::new(self.target.clone(), DenseHook, extra, self.vocab);
            return Ok(self.decoder(verifier, extra));
        }
        build_policy::<B>(&self.selector, self.budget, &self.file).map_err(|e| e.to_string())?;
        let (selector, budget) = (self.selector.clone(), self.budget);
        let file = self.file.clone();
        // one policy per sequence, so that sequences join and leave with their own state;
        // the settings built above, so the fallback to dense is never taken
        let policy = PerRow::new(move || {
            build_policy::<B>(&selector, budget, &file)
                .unwrap_or_else(|_| Box::new(DenseHook) as Box<dyn SelectionPolicy<B>>)
        });
        let verifier = ModelVerifier::new(self.target.clone(), policy, extra, self.vocab);
        Ok(self.decoder(verifier, extra))
    }
}

impl<B: KernelOps> Factory<B> {
    /// The batch's decoder over `verifier`: speculative with the draft, else autoregressive.
    fn decoder<P: JoinPolicy<B> + 'static>(
        &self,
        verifier: ModelVerifier<B, P>,
        extra: usize,
    ) -> Box<dyn Decoder> {
        let drafter = match &self.draft {
            Draft::None => return Box::new(AutoregressiveDecoder::new(verifier)),
            Draft::Model(d) | Draft::Substitute(d) => ModelDrafter::new(d.clone(), None, extra),
            Draft::SelfLayers(n) => ModelDrafter::new(self.target.clone(), Some(*n), extra),
        };
        Box::new(SpeculativeDecoder::new(drafter, verifier))
    }
}

/// The model id: the registry name or the file / folder name.
fn model_id(arg: &Option<PathBuf>, path: &std::path::Path) -> String {
    match arg {
        Some(a) if !a.exists() => a.display().to_string(),
        _ => path
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| path.display().to_string()),
    }
}

/// `--default-max-tokens` when not given: 256, or `--max-tokens` where that is lower.
const DEFAULT_MAX_TOKENS: usize = 256;

/// The `max_tokens` of a request that gives none: `--default-max-tokens` as given (at most
/// `--max-tokens`), else [`DEFAULT_MAX_TOKENS`] capped by `--max-tokens`.
///
/// # Errors
/// [`CliError::Usage`] when `--default-max-tokens` exceeds `--max-tokens` (requests without
/// `max_tokens` would silently get fewer tokens than asked for).
fn default_max_tokens(args: &ServeArgs) -> Result<usize, CliError> {
    match args.default_max_tokens {
        Some(d) if d > args.max_tokens => Err(CliError::Usage(format!(
            "--default-max-tokens {d}: more than --max-tokens {}; expected at most that",
            args.max_tokens
        ))),
        Some(d) => Ok(d),
        None => Ok(DEFAULT_MAX_TOKENS.min(args.max_tokens)),
    }
}

fn run_on<B: KernelOps>(args: ServeArgs, dev: B::Device) -> Result<(), CliError> {
    let default_max = default_max_tokens(&args)?;
    crate::check_gamma(args.pair.gamma)?;
    let file = read_config(&args.pair.config)?;
    if args.pair.draft.is_none() && args.pair.selector != "dense" {
        return Err(CliError::Usage(format!(
            "--selector {} needs speculative decoding: add --draft <path | self:layers=N | substitute>",
            args.pair.selector
        )));
    }
    build_policy::<B>(&args.pair.selector, args.pair.budget, &file)?;
    let spec = args.pair.draft.as_deref().map(parse_draft).transpose()?;
    let path = crate::generate::model_path(&args.pair.model)?;
    let files = ModelFiles::open(&path)?;
    let slack = 2 * (args.pair.gamma + 2);
    // in u128: values near usize::MAX are refused here, not wrapped to a small sum
    let positions = args.max_prompt_tokens as u128 + args.max_tokens as u128 + slack as u128;
    let limit = files.config.max_position_embeddings;
    if positions > limit as u128 {
        return Err(CliError::Usage(format!(
            "--max-prompt-tokens {} + --max-tokens {} (+ {slack} for drafting) = {positions} positions: the model has {limit}; lower either",
            args.max_prompt_tokens, args.max_tokens
        )));
    }
    let draft_files = match &spec {
        Some(DraftSpec::Model(p)) => {
            let df = ModelFiles::open(&crate::models::resolve_model_path(p)?)?;
            check_vocab(&files.tokenizer, &df.tokenizer)?;
            Some(df)
        }
        _ => None,
    };
    let positions = positions as usize;
    let weights = args.pair.weights.format::<B>();
    let target = Arc::new(files.build_as::<B>(positions, &dev, weights)?);
    let mut cfgs = vec![files.config.clone()];
    let draft = match spec {
        None => Draft::None,
        Some(DraftSpec::Model(_)) => {
            let df = draft_files
                .as_ref()
                .ok_or_else(|| CliError::Usage("--draft: not loaded".into()))?;
            cfgs.push(df.config.clone());
            Draft::Model(Arc::new(crate::generate::with_draft_vocab(
                df.build_as::<B>(positions, &dev, weights)?,
                args.pair.draft_vocab,
                &df.tokenizer,
            )?))
        }
        Some(DraftSpec::SelfLayers(n)) => {
            if n >= files.config.num_hidden_layers {
                return Err(CliError::Usage(format!(
                    "--draft self:layers={n}: the target has {} layers; use fewer",
                    files.config.num_hidden_layers
                )));
            }
            cfgs.push(QwenConfig {
                num_hidden_layers: n,
                ..files.config.clone()
            });
            Draft::SelfLayers(n)
        }
        Some(DraftSpec::Substitute(sub)) => {
            if sub.target_kv {
                return Err(CliError::Usage(
                    "--draft substitute:kv=target: not served; use kv=own".into(),
                ));
            }
            cfgs.push(files.config.clone());
            Draft::Substitute(Arc::new(sub.build(&target)?))
        }
    };
    let tok = files.tokenizer.clone();
    let vocab = tok.vocab_size().min(files.config.vocab_size);
    let cfg = ServerConfig {
        model_id: args
            .served_model_name
            .clone()
            .unwrap_or_else(|| model_id(&args.pair.model, &path)),
        limits: Limits {
            max_prompt_tokens: args.max_prompt_tokens,
            max_tokens: args.max_tokens,
            default_max_tokens: default_max,
            max_queue: args.max_queue,
            max_stop: 4,
        },
        engine: EngineConfig {
            gamma: args.pair.gamma,
            max_batch: args.max_batch,
            prefill_chunk: args.prefill_chunk,
        },
    };
    let factory = Factory::<B> {
        target,
        draft,
        selector: args.pair.selector.clone(),
        budget: args.pair.budget,
        file: Arc::new(file),
        vocab,
        cfgs,
        dev,
    };
    // the models move to the engine thread, which owns them from here on
    let server = Server::start(cfg.clone(), tok, files.chat_template.clone(), move || {
        Ok(Box::new(factory) as Box<dyn DecoderFactory>)
    })
    .map_err(|e| CliError::Usage(e.to_string()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| CliError::Io {
            path: "the async runtime".into(),
            source,
        })?;
    let addr = format!("{}:{}", args.host, args.port);
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| CliError::Io {
                path: format!("--host {} --port {}", args.host, args.port),
                source,
            })?;
        let local = listener
            .local_addr()
            .map_or(addr.clone(), |a| a.to_string());
        eprintln!(
            "serving {} on http://{local} (draft {}, gamma {}, selector {}, budget {}); \
             SIGTERM or Ctrl-C finishes the running requests and stops, a second one cancels them",
            cfg.model_id,
            args.pair.draft.as_deref().unwrap_or("none: autoregressive"),
            args.pair.gamma,
            args.pair.selector,
            args.pair.budget
        );
        let handle = server.handle();
        let shutdown = async move {
            signal().await;
            eprintln!(
                "shutting down: finishing the running requests (a second signal cancels them)"
            );
            tokio::spawn(async move {
                signal().await;
                eprintln!("cancelling the running requests");
                handle.cancel_all();
            });
        };
        server
            .serve(listener, shutdown)
            .await
            .map_err(|e| CliError::Usage(e.to_string()))?;
        eprintln!("stopped");
        Ok(())
    })
}

/// Resolves at SIGTERM or Ctrl-C (SIGINT).
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
