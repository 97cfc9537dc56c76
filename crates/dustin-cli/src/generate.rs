//! `dustin generate`.

use dustin_kernels::KernelOps;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use dustin_core::{CancelToken, SamplingConfig};
use dustin_qwen::generate::{generate, FinishReason, GenerateConfig};
use dustin_qwen::{
    substitute_model, ModelFiles, Qwen2, StreamDecoder, SubstituteConfig, Tokenizer,
};
use dustin_spec::{ModelDrafter, ModelVerifier, SpecConfig, SpeculativeDecoder};

use crate::backend::DeviceKind;
use crate::CliError;

/// Arguments of `dustin generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Target model: an HF model directory (config.json, safetensors, tokenizer.json), a
    /// .gguf file, or a model name (`dustin fetch-model --list`; fetched into the cache if
    /// missing). Default: qwen2.5-coder-1.5b-instruct.
    #[arg(long)]
    pub model: Option<PathBuf>,
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
    /// Weights of a GGUF model: `auto` (kept in their block format on the CPU, whose block
    /// kernels read a sixth of the bytes of f32; decoded to f32 elsewhere), `dense` (decoded
    /// to f32) or `blocks`.
    #[arg(long, value_enum, default_value_t = crate::models::WeightsArg::Auto)]
    pub weights: crate::models::WeightsArg,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// Time every phase of the target's and the draft's forward passes (`dustin_qwen::profile`;
    /// the device is waited for around each phase) and print the decode phases at the end.
    #[arg(long)]
    pub profile: bool,
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
    /// KV selection for sparse verification (needs --draft): dense, streaming, h2o, snapkv,
    /// quest, oracle, draft-only, history-only, dustin, or `pyramid(<name>)`.
    #[arg(long, default_value = "dense")]
    pub selector: String,
    /// KV budget of sparse verification: context tokens kept per layer and KV head (sinks and
    /// recent window included).
    #[arg(long, default_value_t = 2048)]
    pub budget: usize,
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
    /// TOML or JSON file with everything else: `[select]` (n_sink, window, refresh,
    /// refresh_on_accept_drop, accept_drop_sigmas, batched_reuse) and `[estimator]` (the selector's own knobs,
    /// e.g. alpha, beta, heads_per_layer for dustin). The budget is --budget's alone (a
    /// `budget` key in `[select]` is refused).
    #[arg(long)]
    pub config: Option<PathBuf>,
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
    /// cancelled) to this JSON file, also when generation is cancelled with Ctrl-C.
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

/// Parses a byte count: a number with an optional `K`, `M`, `G` or `T` suffix (powers of
/// 1024; a trailing `B`/`iB` is allowed).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mul: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("`{s}`: unknown unit `{c}` (use K, M, G or T)")),
            };
            (&t[..i], mul)
        }
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count such as 8G, 512M or 1000000"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("`{s}`: expected a positive size"));
    }
    let b = n * mul as f64;
    if b < 1.0 {
        return Err(format!("`{s}` is less than one byte"));
    }
    if b >= u64::MAX as f64 {
        return Err(format!("`{s}` is too large"));
    }
    Ok(b as u64)
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
    let file: FileConfig = if p.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?
    } else {
        // non-finite floats become null in JSON values (then read as "not set"): refuse them
        let raw: toml::Value = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if let Some(key) = non_finite_key(&raw, "") {
            return Err(bad(format!("{key}: expected a finite number")));
        }
        toml::from_str(&text).map_err(|e| bad(e.to_string()))?
    };
    for (table, v) in [("select", &file.select), ("estimator", &file.estimator)] {
        if v.as_ref().is_some_and(|v| !v.is_object()) {
            return Err(bad(format!("{table}: expected a table of settings")));
        }
    }
    if file.select.as_ref().and_then(|v| v.get("budget")).is_some() {
        return Err(bad(
            "[select] budget: give the budget with --budget (the command line sets it)".into(),
        ));
    }
    Ok(file)
}

/// The dotted path of the first non-finite float in `v` (`prefix` is `v`'s own path).
fn non_finite_key(v: &toml::Value, prefix: &str) -> Option<String> {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        toml::Value::Float(f) if !f.is_finite() => Some(prefix.to_string()),
        toml::Value::Table(t) => t.iter().find_map(|(k, x)| non_finite_key(x, &join(k))),
        toml::Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, x)| non_finite_key(x, &join(&i.to_string()))),
        _ => None,
    }
}

/// The draft's selection for `--draft-budget budget` (`generate`, `dustin-bench e2e`): `None`
/// for 0 (dense drafting), else per-layer ranking with the selectors' default sinks and
/// window.
///
/// # Errors
/// [`CliError::Usage`] naming `--draft-budget` when it leaves no room beside the sinks and
/// window.
pub fn draft_selection(budget: usize) -> Result<Option<dustin_spec::DraftSelection>, CliError> {
    Ok(dustin_eval::harness::pair::draft_selection(budget)?)
}

/// Builds the selection policy of `--selector` / `--budget` / `--config`.
pub fn build_policy<B: KernelOps>(
    selector: &str,
    budget: usize,
    file: &FileConfig,
) -> Result<Box<dyn dustin_core::SelectionPolicy<B>>, CliError> {
    let mut select = dustin_eval::harness::pair::select_config(selector, budget);
    if let Some(v) = &file.select {
        let mut base = serde_json::to_value(&select).map_err(|e| CliError::Usage(e.to_string()))?;
        if let (Some(b), Some(o)) = (base.as_object_mut(), v.as_object()) {
            for (k, val) in o {
                b.insert(k.clone(), val.clone());
            }
        }
        select = dustin_select::registry::from_json_named(base)
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

/// Resolves `--model`: a registry name becomes its cached file (fetched if missing), a
/// path passes through (`crate::models::resolve_model_path`); absent, the default model
/// (fetched if missing).
pub fn model_path(model: &Option<PathBuf>) -> Result<PathBuf, CliError> {
    match model {
        Some(p) => crate::models::resolve_model_path(p),
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
    /// SubSpec substitute draft: the target with the listed layers group-quantized
    /// (`dustin_qwen::substitute`).
    Substitute(SubstituteSpec),
}

/// Which layers a substitute draft quantizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubstituteLayers {
    /// The default: the target's offloaded layers (`--gpu-memory`, `--offload`), or the
    /// second half when none is offloaded.
    Offloaded,
    /// The second half of the target's layers (`n / 2 .. n`): the layers that would be
    /// offloaded.
    Half,
    /// Explicit layer indices (0-based), ascending, without repeats.
    List(Vec<usize>),
}

/// `--draft substitute:bits=B:group=G:layers=L`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubstituteSpec {
    /// Quantization settings (checked when the model is built).
    pub cfg: SubstituteConfig,
    /// Layers to substitute.
    pub layers: SubstituteLayers,
    /// `kv=target`: the draft attends to the target's KV cache for every committed token
    /// (`dustin_spec::TargetKv`) instead of keeping its own (`kv=own`, the default).
    pub target_kv: bool,
}

impl SubstituteSpec {
    /// The layer indices for a target of `num_layers` layers of which `offloaded` live in
    /// host memory.
    pub fn resolve(&self, num_layers: usize, offloaded: &[usize]) -> Vec<usize> {
        match &self.layers {
            SubstituteLayers::Offloaded if !offloaded.is_empty() => offloaded.to_vec(),
            SubstituteLayers::Offloaded | SubstituteLayers::Half => {
                dustin_qwen::substitute::second_half(num_layers)
            }
            SubstituteLayers::List(l) => l.clone(),
        }
    }

    /// Builds the draft model from `target` (resident layers shared, listed layers packed
    /// group-quantized on the target's device) and prints what it holds to stderr.
    ///
    /// # Errors
    /// [`CliError::Model`] naming `substitute.layers` (an index past the target's layers),
    /// `substitute.bits` or `substitute.group`.
    pub fn build<B: KernelOps>(&self, target: &Qwen2<B>) -> Result<Qwen2<B>, CliError> {
        let layers = self.resolve(target.layers.len(), &target.offloaded_layers());
        let model = substitute_model(target, &layers, self.cfg)?;
        let weights: usize = layers
            .iter()
            .filter_map(|&l| target.layers.get(l))
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|lin| lin.weight.dims().iter().product::<usize>())
                    .sum::<usize>()
            })
            .sum();
        eprintln!(
            "substitute draft: {} of {} layers ({}) at {} bits, group {}: {:.1} MB packed ({} bytes per weight) instead of {:.1} MB in bf16",
            layers.len(),
            target.layers.len(),
            format_layers(&layers),
            self.cfg.bits,
            self.cfg.group,
            weights as f64 * self.cfg.bytes_per_weight() / 1e6,
            self.cfg.bytes_per_weight(),
            weights as f64 * 2.0 / 1e6
        );
        Ok(model)
    }
}

/// `1,3,5,6,7` -> `1,3,5-7`.
fn format_layers(layers: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i;
        while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}-{}", layers[i], layers[j])
        } else {
            layers[i].to_string()
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Largest layer index a layer list may name (no model has more layers; a larger range
/// would only allocate).
pub const MAX_LAYER_INDEX: usize = 65_535;

/// Parses a comma list of layer indices and inclusive ranges (`15-29`, `0,2,10-14`) into
/// ascending indices without repeats; the error says which part is wrong. Indices above
/// [`MAX_LAYER_INDEX`] are refused.
pub fn parse_layer_list(v: &str) -> Result<Vec<usize>, String> {
    let mut list = Vec::new();
    for part in v.split(',') {
        let num = |t: &str| {
            let i = t
                .parse::<usize>()
                .map_err(|_| format!("layer `{t}` is not a layer index"))?;
            if i > MAX_LAYER_INDEX {
                return Err(format!(
                    "layer {i} is past any model's layers (at most {MAX_LAYER_INDEX})"
                ));
            }
            Ok(i)
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("layer range `{part}` is empty"));
                }
                list.extend(a..=b);
            }
            None => list.push(num(part)?),
        }
    }
    list.sort_unstable();
    list.dedup();
    Ok(list)
}

fn parse_substitute(s: &str, rest: &str) -> Result<SubstituteSpec, CliError> {
    let bad = |msg: String| {
        CliError::Usage(format!(
            "--draft {s}: {msg} (expected substitute[:bits=2..8][:group=G][:layers=half|a-b,c,...][:kv=own|target])"
        ))
    };
    let mut spec = SubstituteSpec {
        cfg: SubstituteConfig::default(),
        layers: SubstituteLayers::Offloaded,
        target_kv: false,
    };
    if rest.is_empty() {
        return Ok(spec);
    }
    let Some(rest) = rest.strip_prefix(':') else {
        return Err(bad("keys follow a `:`".into()));
    };
    for kv in rest.split(':') {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| bad(format!("`{kv}` is not key=value")))?;
        match k {
            "bits" => {
                spec.cfg.bits = v
                    .parse::<u32>()
                    .ok()
                    .filter(|b| (2..=8).contains(b))
                    .ok_or_else(|| bad(format!("bits = `{v}` is not in 2 ..= 8")))?;
            }
            "kv" if v == "target" => spec.target_kv = true,
            "kv" if v == "own" => spec.target_kv = false,
            "kv" => return Err(bad(format!("kv = `{v}` is not own or target"))),
            "group" => {
                spec.cfg.group = v
                    .parse::<usize>()
                    .ok()
                    .filter(|&g| g > 0)
                    .ok_or_else(|| bad(format!("group = `{v}` is not a positive integer")))?;
            }
            "layers" if v == "half" => spec.layers = SubstituteLayers::Half,
            "layers" => spec.layers = SubstituteLayers::List(parse_layer_list(v).map_err(bad)?),
            other => return Err(bad(format!("unknown key `{other}`"))),
        }
    }
    Ok(spec)
}

/// Parses `--draft`: `self:layers=N`, `substitute[:bits=B][:group=G][:layers=L]` (keys in
/// any order, separated by `:`; `L` is `half` or a comma list of layer indices and inclusive
/// ranges such as `15-29` or `0,2,10-14`), or else a model path.
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
    if let Some(rest) = s.strip_prefix("substitute") {
        return Ok(DraftSpec::Substitute(parse_substitute(s, rest)?));
    }
    Ok(DraftSpec::Model(PathBuf::from(s)))
}

/// `dustin generate`.
pub fn run(args: GenerateArgs) -> Result<(), CliError> {
    dustin_core::memory::set_memory_limit(args.max_memory);
    let cancel = CancelToken::new();
    let c = cancel.clone();
    // first Ctrl-C: stop after the current step and write what was generated; second: quit
    let handler = ctrlc::set_handler(move || {
        if c.is_cancelled() {
            eprintln!("\ninterrupted again: exiting without writing output");
            std::process::exit(130);
        }
        eprintln!("\ninterrupted: stopping after the current step (Ctrl-C again to quit now)");
        c.cancel();
    });
    if let Err(e) = handler {
        eprintln!("note: Ctrl-C handler not installed ({e}); Ctrl-C will stop without output");
    }
    crate::with_backend!(args.device, |B, dev| run_on::<B>(&args, &dev, &cancel))
}

/// The target layers to keep in host memory: `--offload`, or what `--gpu-memory` leaves
/// out (the plan goes to stderr).
fn offload_plan<B: KernelOps>(
    args: &GenerateArgs,
    cfgs: &[&dustin_qwen::QwenConfig],
    batch: usize,
    capacity: usize,
    draft: Option<&ModelFiles>,
) -> Result<Vec<usize>, CliError> {
    let target = cfgs[0];
    let n = target.num_hidden_layers;
    if let Some(list) = &args.offload {
        let layers = parse_layer_list(list)
            .map_err(|m| CliError::Usage(format!("--offload {list}: {m}")))?;
        if let Some(&bad) = layers.iter().find(|&&l| l >= n) {
            return Err(CliError::Usage(format!(
                "--offload {list}: layer {bad} is past the target's {n} layers (0 ..= {})",
                n - 1
            )));
        }
        return Ok(layers);
    }
    let Some(budget) = args.gpu_memory else {
        return Ok(Vec::new());
    };
    let bytes = dustin_core::memory::float_bytes::<B>();
    let kv = u64::try_from(kv_per_token::<B>(cfgs).saturating_mul((batch * capacity) as u128))
        .unwrap_or(u64::MAX);
    let draft_weights = draft.map_or(0, |d| {
        crate::footprint::weight_bytes_per_forward(&d.config, bytes as f64) as u64
    });
    let substitute = match args.draft.as_deref().map(parse_draft).transpose()? {
        Some(DraftSpec::Substitute(s)) => Some(s.cfg),
        _ => None,
    };
    let plan = dustin_qwen::plan_offload(
        target,
        budget,
        bytes as f64,
        kv.saturating_add(draft_weights),
        substitute,
        true,
    )
    .map_err(|e| CliError::Usage(format!("--gpu-memory: {e}")))?;
    eprintln!(
        "gpu memory {:.2} GB: {} of {n} target layers resident, {} offloaded to host ({:.2} GB planned: {:.2} embedding + LM head, {:.3} per layer, {:.3} per offloaded layer, {:.2} staging, {:.2} KV and draft)",
        budget as f64 / 1e9,
        plan.resident,
        plan.offloaded.len(),
        plan.total_bytes as f64 / 1e9,
        plan.fixed_bytes as f64 / 1e9,
        plan.layer_bytes as f64 / 1e9,
        plan.substitute_layer_bytes as f64 / 1e9,
        plan.staging_bytes as f64 / 1e9,
        plan.other_bytes as f64 / 1e9,
    );
    if substitute.is_some() && plan.offloaded.is_empty() {
        eprintln!(
            "note: the whole target fits the GPU budget: nothing is offloaded, and the substitute \
             draft quantizes the second half of the layers on top of the plan"
        );
    }
    Ok(plan.offloaded)
}

/// KV bytes per token of one sequence over the caches of `cfgs` (target and drafts).
fn kv_per_token<B: KernelOps>(cfgs: &[&dustin_qwen::QwenConfig]) -> u128 {
    let bytes = dustin_core::memory::float_bytes::<B>();
    cfgs.iter()
        .map(|c| c.kv_bytes_per_token(bytes) as u128)
        .sum()
}

/// Checks the KV caches' memory (target and draft, `batch` sequences of `capacity` tokens)
/// before the weights are loaded, so that an impossible request fails at once with the
/// figures.
pub fn check_kv_memory<B: KernelOps>(
    cfgs: &[&dustin_qwen::QwenConfig],
    batch: usize,
    capacity: usize,
    dev: &B::Device,
) -> Result<(), CliError> {
    let per_token = kv_per_token::<B>(cfgs);
    // prefill stacks per-sequence caches into the batch: both are alive at that moment
    let copies: u128 = if batch > 1 { 2 } else { 1 };
    let needed = per_token
        .saturating_mul(batch as u128)
        .saturating_mul(capacity as u128)
        .saturating_mul(copies);
    dustin_core::memory::check_alloc::<B>(
        &format!(
            "the KV caches (batch {batch} x {capacity} tokens, {} model(s), {} bytes per token)",
            cfgs.len(),
            per_token
        ),
        needed,
        dev,
    )?;
    Ok(())
}

fn run_on<B: KernelOps>(
    args: &GenerateArgs,
    dev: &B::Device,
    cancel: &CancelToken,
) -> Result<(), CliError> {
    let has_plain = !args.prompts.is_empty() || !args.prompt_files.is_empty();
    let inputs = crate::chat::Inputs::from_args(&args.chat, || read_prompts(args), has_plain)?;
    let file = read_config(&args.config)?;
    crate::check_gamma(args.gamma)?;
    // a bad --output path is found before the model runs, not after (the tokens were lost)
    if let Some(path) = &args.output {
        check_output_path(path)?;
    }
    if args.draft.is_none() && args.selector != "dense" {
        return Err(CliError::Usage(format!(
            "--selector {} needs speculative decoding: add --draft <path | self:layers=N | substitute>",
            args.selector
        )));
    }
    // anything but the default or all layers (an unreadable setting included) needs a draft
    let plain_setting = args
        .lookahead_layers
        .parse::<dustin_spec::LookaheadLayers>()
        .is_ok_and(|l| {
            l == dustin_spec::LookaheadLayers::All || l == dustin_spec::LookaheadLayers::default()
        });
    if args.draft.is_none() && !plain_setting {
        return Err(CliError::Usage(format!(
            "--lookahead-layers {} needs speculative decoding: add --draft <path | self:layers=N | substitute>",
            args.lookahead_layers
        )));
    }
    if args.draft_budget > 0 {
        if args.draft.is_none() {
            return Err(CliError::Usage(format!(
                "--draft-budget {} needs speculative decoding: add --draft <path | self:layers=N | substitute>",
                args.draft_budget
            )));
        }
        draft_selection(args.draft_budget)?;
    }
    // check the selector name and knobs before loading the model
    build_policy::<B>(&args.selector, args.budget, &file)?;
    let path = model_path(&args.model)?;
    let files = ModelFiles::open(&path)?;
    // with --chat: the rendered conversations, and EOS ids that include the end-of-turn tokens
    let (prompts, tok) = inputs.render(&files, &path)?;
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| tok.encode(p))
        .collect::<Result<_, _>>()?;
    let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
    let positions = (longest + args.max_new_tokens + 2 * (args.gamma + 2))
        .min(files.config.max_position_embeddings);
    let draft_files = match args.draft.as_deref().map(parse_draft).transpose()? {
        Some(DraftSpec::Model(p)) => {
            Some(ModelFiles::open(&crate::models::resolve_model_path(&p)?)?)
        }
        _ => None,
    };
    let mut cfgs = vec![&files.config];
    cfgs.extend(draft_files.as_ref().map(|d| &d.config));
    let spec = args.draft.as_deref().map(parse_draft).transpose()?;
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
                args.draft.as_deref().unwrap_or_default()
            )));
        }
    }
    check_kv_memory::<B>(&cfgs, ids.len(), positions, dev)?;
    let offloaded = offload_plan::<B>(args, &cfgs, ids.len(), positions, draft_files.as_ref())?;
    let weights = args.weights.format::<B>();
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
    let model = Arc::new(model.with_profile(args.profile.then_some("target")));
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
                cancel: Some(cancel.clone()),
                ..GenerateConfig::default()
            };
            let o = generate(&model, &ids, &cfg, Some(&tok), &mut on_tokens)?;
            println!();
            print_rest(&tok, &o.tokens)?;
            finish_run(args, &tok, &o.tokens, &o.finish)?;
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
        }
        Some(d) => {
            let extra = args.max_new_tokens + 2 * (args.gamma + 2);
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
                        df.build_as::<B>(positions, dev, weights)?
                            .with_profile(args.profile.then_some("draft")),
                    );
                    (ModelDrafter::new(dm, None, extra), n)
                }
                DraftSpec::Substitute(sub) => {
                    let d = ModelDrafter::new(Arc::new(sub.build(&model)?), None, extra);
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
            let policy = build_policy::<B>(&args.selector, args.budget, &file)?;
            let verifier = ModelVerifier::new(model.clone(), policy, extra, vocab);
            let verifier = match target_kv {
                Some(kv) => verifier.with_target_kv(kv),
                None => verifier,
            };
            let mut dec = SpeculativeDecoder::new(drafter, verifier);
            dec.set_cancel(cancel.clone());
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
            let fin = finish_run(args, &tok, &o.tokens, &o.finish);
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
            fin?;
        }
    }
    if args.profile {
        print_profile();
    }
    Ok(())
}

/// The decode-stage phases recorded by `--profile`, per model, largest first.
fn print_profile() {
    let mut rows: Vec<_> = dustin_qwen::profile::snapshot()
        .into_iter()
        .filter(|p| p.stage == "decode")
        .collect();
    rows.sort_by(|a, b| a.model.cmp(b.model).then(b.secs.total_cmp(&a.secs)));
    eprintln!("profile (decode steps and verifications; device waited for around each phase):");
    eprintln!("| model | phase | calls | seconds |");
    eprintln!("|---|---|---:|---:|");
    for p in rows {
        eprintln!(
            "| {} | {} | {} | {:.3} |",
            p.model, p.phase, p.calls, p.secs
        );
    }
}

/// Checks before a run that `--output path` can be written: not a folder, its folder
/// existing, and the file openable for writing (an existing file is left as it is until the
/// run ends; a file made for the check is removed again).
///
/// # Errors
/// [`CliError::Usage`] naming `--output` and the reason.
fn check_output_path(path: &std::path::Path) -> Result<(), CliError> {
    let bad = |why: String| {
        Err(CliError::Usage(format!(
            "--output {}: {why}",
            path.display()
        )))
    };
    if path.is_dir() {
        return bad("is a folder; expected a file path".into());
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        return bad(format!("its folder {} does not exist", parent.display()));
    }
    let existed = path.exists();
    match std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(e) => bad(format!("cannot be written ({e})")),
    }
}

/// One sequence of `--output`.
#[derive(Debug, serde::Serialize)]
struct SeqOut<'a> {
    index: usize,
    finish: &'static str,
    text: String,
    tokens: &'a [u32],
}

/// Prints each sequence's finish reason, writes `--output`, and turns a cancelled run into
/// [`CliError::Cancelled`] (exit code 130) once everything is written.
fn finish_run(
    args: &GenerateArgs,
    tok: &Tokenizer,
    tokens: &[Vec<u32>],
    finish: &[FinishReason],
) -> Result<(), CliError> {
    let reasons: Vec<String> = finish
        .iter()
        .enumerate()
        .map(|(i, f)| format!("{i}: {}", f.as_str()))
        .collect();
    eprintln!("finish: {}", reasons.join(", "));
    if let Some(path) = &args.output {
        let seqs = tokens
            .iter()
            .zip(finish)
            .enumerate()
            .map(|(index, (t, f))| {
                Ok(SeqOut {
                    index,
                    finish: f.as_str(),
                    text: tok.decode(t)?,
                    tokens: t,
                })
            })
            .collect::<Result<Vec<_>, CliError>>()?;
        let json = serde_json::json!({ "sequences": seqs });
        let text = serde_json::to_string_pretty(&json)
            .map_err(|e| CliError::Usage(format!("--output: {e}")))?;
        if let Err(source) = std::fs::write(path, text.clone() + "\n") {
            // keep what was generated: the JSON on standard output, then the error
            println!("{text}");
            eprintln!(
                "could not write --output {}: the JSON is on standard output above",
                path.display()
            );
            return Err(CliError::Io {
                path: path.display().to_string(),
                source,
            });
        }
        eprintln!("wrote {}", path.display());
    }
    let cancelled = finish
        .iter()
        .filter(|f| **f == FinishReason::Cancelled)
        .count();
    if cancelled > 0 {
        return Err(CliError::Cancelled {
            cancelled,
            total: finish.len(),
        });
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
        assert_eq!(super::format_layers(&[0, 1, 2, 7, 9, 10]), "0-2,7,9-10");
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
