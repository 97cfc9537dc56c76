//! `--draft`: a self-draft, a separate model, or a SubSpec substitute of the target, and the
//! vocabulary check between draft and target.

use std::path::PathBuf;

use dustin_kernels::KernelOps;
use dustin_qwen::{substitute_model, Qwen2, SubstituteConfig, Tokenizer};

use crate::CliError;

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
            "substitute draft: {} of {} layers ({}) at {} bits, group {}: {:.1} MB packed ({} bytes per weight; these layers in bf16: {:.1} MB)",
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
pub(super) fn format_layers(layers: &[usize]) -> String {
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

/// `--draft-vocab`: which vocabulary ids a separate draft model's LM head computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftVocab {
    /// Every id.
    Full,
    /// The first `n` ids (frequency-ranked, [`dustin_qwen::HeadVocab`]) and the tokenizer's
    /// special tokens.
    Ranked(usize),
}

impl DraftVocab {
    /// The default: the first 32,768 ids. On Qwen2.5-Coder-0.5B drafting for the 1.5B it cut
    /// a draft step by about a fifth on the CPU, and acceptance went from 5.00 to 4.92 on the
    /// demo prompt and from 3.06 to 2.88 on 4k tokens of `textwrap.py` (docs/decisions.md).
    pub const DEFAULT: Self = Self::Ranked(32_768);
}

impl std::fmt::Display for DraftVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Full => f.write_str("full"),
            Self::Ranked(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for DraftVocab {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "full" {
            return Ok(Self::Full);
        }
        match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Self::Ranked(n)),
            _ => Err(format!(
                "expected `full` or a number of vocabulary ids above 0, found `{s}`"
            )),
        }
    }
}

/// `model` (a separate draft) with its LM head restricted per `vocab`: the first `n` ids
/// plus every special token of `tok` (end of text, end of turn, fill-in-the-middle marks), so
/// that the draft can still propose the end of a sequence. `n` at or above the vocabulary
/// keeps every id.
///
/// # Errors
/// [`CliError::Usage`] naming `--draft-vocab` when the head cannot be restricted.
pub fn with_draft_vocab<B: KernelOps>(
    model: Qwen2<B>,
    vocab: DraftVocab,
    tok: &Tokenizer,
) -> Result<Qwen2<B>, CliError> {
    let size = model.config.vocab_size;
    let DraftVocab::Ranked(n) = vocab else {
        return Ok(model);
    };
    if n >= size {
        return Ok(model);
    }
    let mut extra: Vec<u32> = tok
        .inner()
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special)
        .map(|(id, _)| id)
        .filter(|&id| (id as usize) < size)
        .collect();
    extra.extend(tok.eos_ids.iter().filter(|&&id| (id as usize) < size));
    let keep = dustin_qwen::HeadVocab::frequency_ranked(n, &extra, size)
        .map_err(|e| CliError::Usage(format!("--draft-vocab {n}: {e}")))?;
    model
        .with_head_vocab(Some(&keep))
        .map_err(|e| CliError::Usage(format!("--draft-vocab {n}: {e}")))
}
