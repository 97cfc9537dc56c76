//! Autoregressive generation: chunked prefill, decode, greedy or sampled, EOS and stop
//! strings, `max_new_tokens`, for a batch of prompts of different lengths.

use std::time::Instant;

use burn_tensor::{activation, backend::Backend, Tensor};
use dustin_core::{AttentionHook, KvStore, Phase, SamplingConfig};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{QwenError, Result};
use crate::model::{ForwardOpts, LogitsMode, Qwen2};
use crate::tokenizer::Tokenizer;

/// Prefill chunk, in tokens, where a chunk's attention probabilities are needed (and on the
/// CPU): bounds the score matrix of one chunk to `[heads, chunk, context]` (a 32k prompt
/// never builds a 32k x 32k matrix).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// The prefill chunk "automatic": [`prefill`] and [`prefill_from`] take `chunk` 0 as
/// [`auto_prefill_chunk`]'s choice.
pub const AUTO_PREFILL_CHUNK: usize = 0;

/// The chunk [`AUTO_PREFILL_CHUNK`] stands for: the backend's [`KernelOps::PREFILL_CHUNK`](dustin_kernels::AttentionOps::PREFILL_CHUNK)
/// (16384 on CUDA, whose prefill kernel builds no score matrix) where the model's prefill
/// attention runs as that kernel ([`Qwen2::prefill_attention_fused`]), `hook` wants no
/// layer's attention probabilities during prefill (neither in the last chunk nor before it,
/// asked for each of `layers` layers, the model's by default) and no layer of `model` is
/// offloaded; else [`DEFAULT_PREFILL_CHUNK`]: the plain path and the probabilities of a
/// chunk are `[heads, chunk, context]` matrices (at 16384 new tokens over a 32k context, 30
/// GB a 7B layer), and an offloaded model's memory plan ([`crate::plan_offload`]) leaves
/// activations to the budget's slack, which larger chunks would grow.
pub fn auto_prefill_chunk<B: KernelOps, H: AttentionHook<B> + ?Sized>(
    model: &Qwen2<B>,
    hook: &H,
    layers: Option<usize>,
) -> usize {
    let n = model.kv_shape(1, 1, layers).layers;
    let backend_chunk = if model.prefill_attention_fused() {
        B::PREFILL_CHUNK
    } else {
        DEFAULT_PREFILL_CHUNK
    };
    choose_prefill_chunk(
        backend_chunk,
        hook_wants_prefill_probs(hook, n),
        !model.offloaded_layers().is_empty(),
    )
}

/// `chunk` as [`prefill`] runs it: [`auto_prefill_chunk`]'s choice for [`AUTO_PREFILL_CHUNK`]
/// (0), any other value as given up to [`MAX_AUTO_PREFILL_CHUNK`] (larger values run as that:
/// the last chunk, up to half a chunk longer, must stay within the kernels'
/// [`dustin_kernels::MAX_PREFILL_NEW`], past which a chunk would take the plain path and its
/// score matrix). For callers that report or slice by the chunk used.
pub fn resolve_prefill_chunk<B: KernelOps, H: AttentionHook<B> + ?Sized>(
    model: &Qwen2<B>,
    hook: &H,
    layers: Option<usize>,
    chunk: usize,
) -> usize {
    if chunk == AUTO_PREFILL_CHUNK {
        auto_prefill_chunk(model, hook, layers)
    } else {
        chunk.min(MAX_AUTO_PREFILL_CHUNK)
    }
}

/// Whether `hook` wants the attention probabilities of any of layers `0 .. layers` in a
/// prefill chunk, the last one or an earlier one ([`AttentionHook::wants_probs`] with
/// [`Phase::Prefill`]).
pub fn hook_wants_prefill_probs<B: Backend, H: AttentionHook<B> + ?Sized>(
    hook: &H,
    layers: usize,
) -> bool {
    (0..layers).any(|l| {
        [false, true]
            .into_iter()
            .any(|last_chunk| hook.wants_probs(l, Phase::Prefill { seq: 0, last_chunk }))
    })
}

/// [`auto_prefill_chunk`]'s rule: `backend_chunk` unless the hook wants prefill
/// probabilities or the model is offloaded, then [`DEFAULT_PREFILL_CHUNK`]; clamped to `1
/// ..=` [`MAX_AUTO_PREFILL_CHUNK`].
pub fn choose_prefill_chunk(backend_chunk: usize, wants_probs: bool, offloaded: bool) -> usize {
    if wants_probs || offloaded {
        DEFAULT_PREFILL_CHUNK
    } else {
        backend_chunk.clamp(1, MAX_AUTO_PREFILL_CHUNK)
    }
}

/// Largest chunk [`choose_prefill_chunk`] picks: the last chunk of a prompt takes up to half
/// a chunk more (the remainder is never left shorter than that), and must stay within the
/// kernels' [`dustin_kernels::MAX_PREFILL_NEW`] new tokens.
pub const MAX_AUTO_PREFILL_CHUNK: usize = dustin_kernels::MAX_PREFILL_NEW * 2 / 3;

/// Checks prompts against the model: non-empty, ids in the vocabulary, and `len + extra`
/// within the model's position limit.
///
/// # Errors
/// [`QwenError::Prompt`] naming the prompt.
pub fn check_prompts<B: Backend>(
    model: &Qwen2<B>,
    prompts: &[Vec<u32>],
    extra: usize,
) -> Result<()> {
    if prompts.is_empty() {
        return Err(QwenError::Prompt {
            index: 0,
            msg: "the batch has no prompts".into(),
        });
    }
    let limit = model.config.max_position_embeddings;
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(QwenError::Prompt {
                index: i,
                msg: "empty prompt (no tokens)".into(),
            });
        }
        if p.len().saturating_add(extra) > limit {
            return Err(QwenError::Prompt {
                index: i,
                msg: format!(
                    "{} prompt tokens + {extra} to generate exceed max_position_embeddings = {limit}",
                    p.len()
                ),
            });
        }
        if let Some(&bad) = p.iter().find(|&&t| t as usize >= model.config.vocab_size) {
            return Err(QwenError::Prompt {
                index: i,
                msg: format!(
                    "token id {bad} is outside the vocabulary of {}",
                    model.config.vocab_size
                ),
            });
        }
    }
    Ok(())
}

/// Prefills each prompt separately in chunks of `chunk` tokens ([`AUTO_PREFILL_CHUNK`], 0:
/// [`auto_prefill_chunk`]'s choice for this backend and hook) into its own cache of
/// `capacity` tokens (the hook sees [`Phase::Prefill`]), stacks the caches into one batch,
/// and returns it with the logits of each prompt's last position, `[batch, vocab]`.
///
/// With `all_logits`, also returns the logits of every prompt position per prompt,
/// `[1, len, vocab]` each (for perplexity).
///
/// # Errors
/// Prompt and model errors.
#[allow(clippy::type_complexity)]
pub fn prefill<B: KernelOps, H: AttentionHook<B> + ?Sized>(
    model: &Qwen2<B>,
    prompts: &[Vec<u32>],
    capacity: usize,
    layers: Option<usize>,
    hook: &mut H,
    chunk: usize,
    all_logits: bool,
) -> Result<(DenseKvCache<B>, Tensor<B, 2>, Vec<Tensor<B, 3>>)> {
    prefill_from(
        model, prompts, None, capacity, layers, hook, chunk, all_logits,
    )
}

/// As [`prefill`], continuing from `prefixes`: one batch-1 cache per prompt that already
/// holds the prompt's first `prefix.lens()[0]` tokens (for example a shared dense prefill of
/// a common prefix, cloned per run). Only the rest of each prompt is run, so the hook sees
/// the remaining chunks (always including the last one). With `all_logits`, the logits
/// returned cover only the positions run here.
///
/// # Errors
/// Prompt and model errors; [`QwenError::Prompt`] when a prefix is longer than its prompt
/// (it must leave at least one token to run), has other layers, KV heads or head width than
/// this run (`layers` of `model`), or the counts differ; with more than one prompt, a
/// [`dustin_core::CoreError::InvalidInput`] for a prefix of another capacity.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub fn prefill_from<B: KernelOps, H: AttentionHook<B> + ?Sized>(
    model: &Qwen2<B>,
    prompts: &[Vec<u32>],
    prefixes: Option<Vec<DenseKvCache<B>>>,
    capacity: usize,
    layers: Option<usize>,
    hook: &mut H,
    chunk: usize,
    all_logits: bool,
) -> Result<(DenseKvCache<B>, Tensor<B, 2>, Vec<Tensor<B, 3>>)> {
    check_prompts(model, prompts, 0)?;
    // a batch is filled one sequence at a time, each in its row of the batch cache (plus any
    // prefix caches the caller passed)
    let batch = prompts.len();
    DenseKvCache::<B>::check_memory(model.kv_shape(batch, capacity, layers), 1, model.device())?;
    if let Some(p) = &prefixes {
        if p.len() != prompts.len() {
            return Err(QwenError::Prompt {
                index: 0,
                msg: format!("{} prefix caches for {} prompts", p.len(), prompts.len()),
            });
        }
    }
    if let Some(pre) = &prefixes {
        let want = model.kv_shape(1, capacity, layers);
        for (seq, (c, p)) in pre.iter().zip(prompts).enumerate() {
            let have = c.shape();
            if (have.layers, have.kv_heads, have.head_dim)
                != (want.layers, want.kv_heads, want.head_dim)
            {
                return Err(QwenError::Prompt {
                    index: seq,
                    msg: format!(
                        "prefix cache of {} layers x {} KV heads x {} for a model run over {} layers x {} KV heads x {}",
                        have.layers, have.kv_heads, have.head_dim, want.layers, want.kv_heads, want.head_dim
                    ),
                });
            }
            let done = c.lens().first().copied().unwrap_or(0);
            if c.batch() != 1 || done >= p.len() {
                return Err(QwenError::Prompt {
                    index: seq,
                    msg: format!(
                        "prefix cache of {done} tokens (batch {}) for a prompt of {} tokens: it must be batch 1 and shorter than the prompt",
                        c.batch(),
                        p.len()
                    ),
                });
            }
        }
    }
    let chunk = resolve_prefill_chunk(model, hook, layers, chunk);
    let mut stacked = (batch > 1).then(|| model.new_cache(batch, capacity, layers));
    // a batch with prefixes: every prefix goes into the batch cache first, and each
    // sequence's rest then runs in its row (`into_row`). A prefix shared by several sequences
    // (clones of one cache) is then freed before any tail runs; writing each tail into its
    // clone instead copies the prefix, which stays alive for the sequences after it (one
    // sequence's cache more at the peak)
    let mut prefixes = match (stacked.as_mut(), prefixes) {
        (Some(all), Some(pre)) => {
            for (seq, c) in pre.into_iter().enumerate() {
                all.write_sequence(seq, c)?;
            }
            // the prefixes' pool pages back to the device before the prefill's temporaries
            // are made beside them
            crate::offload::release_freed::<B>(model.device())?;
            None
        }
        (_, pre) => pre.map(|v| v.into_iter()),
    };
    let mut single = None;
    let mut lasts = Vec::with_capacity(prompts.len());
    let mut alls = Vec::new();
    for (seq, p) in prompts.iter().enumerate() {
        // a batch's sequence runs in its row of the batch cache, whose writes land in the
        // batch's buffers: no second copy of any row is made (a batch's prefixes are in it
        // already); a single sequence runs on its prefix or a new cache
        let (mut cache, mut start) = match stacked.take() {
            Some(all) => {
                let done = all.lens()[seq];
                (all.into_row(seq)?, done)
            }
            None => match prefixes.as_mut().and_then(Iterator::next) {
                Some(c) => {
                    let done = c.lens().first().copied().unwrap_or(0);
                    (c, done)
                }
                None => (model.new_cache(1, capacity, layers), 0),
            },
        };
        let mut per = Vec::new();
        while start < p.len() {
            // the last chunk takes the remainder, so it is never shorter than needed to hold
            // an observation window of the prompt's end
            let end = if p.len() - start <= chunk + chunk / 2 {
                p.len()
            } else {
                start + chunk
            };
            let last_chunk = end == p.len();
            let out = model.forward(
                &[p[start..end].to_vec()],
                &mut cache,
                hook,
                ForwardOpts {
                    phase: Phase::Prefill { seq, last_chunk },
                    logits: if all_logits {
                        LogitsMode::All
                    } else if last_chunk {
                        LogitsMode::Last
                    } else {
                        LogitsMode::None
                    },
                    layers,
                },
            )?;
            if let Some(l) = out.logits {
                if all_logits {
                    per.push(l.clone());
                }
                if last_chunk {
                    let [_, m, v] = l.dims();
                    lasts.push(l.slice([0..1, m - 1..m, 0..v]).reshape([1, v]));
                }
            }
            start = end;
        }
        if all_logits {
            alls.push(Tensor::cat(per, 1));
        }
        if cache.is_row() {
            stacked = Some(cache.into_batch());
        } else {
            single = Some(cache);
        }
    }
    // the prefill's temporaries and any prefix are gone: hand their pool pages back to the
    // device, or the allocator keeps them in size classes decoding never asks for (at 72B,
    // 32k, batch 8 on two H200s that stranded memory is what decoding then runs out of)
    crate::offload::release_freed::<B>(model.device())?;
    let cache = match (stacked, single) {
        (Some(all), _) => all,
        (None, Some(one)) => one,
        (None, None) => {
            return Err(QwenError::Prompt {
                index: 0,
                msg: "no prompts".into(),
            })
        }
    };
    Ok((cache, Tensor::cat(lasts, 0), alls))
}

/// Options of [`generate`].
#[derive(Debug, Clone)]
pub struct GenerateConfig {
    /// Tokens to generate per sequence at most.
    pub max_new_tokens: usize,
    /// Sampling rule.
    pub sampling: SamplingConfig,
    /// Seed; sequence `i` draws from its own stream `(seed, i)`.
    pub seed: u64,
    /// Strings that end a sequence when its generated text contains one.
    pub stop_strings: Vec<String>,
    /// Prefill chunk in tokens; [`AUTO_PREFILL_CHUNK`] (0, the default) for
    /// [`auto_prefill_chunk`]'s choice.
    pub prefill_chunk: usize,
    /// Stop at the tokenizer's EOS ids.
    pub stop_at_eos: bool,
    /// Checked once per decode step: when cancelled, generation stops and every unfinished
    /// sequence ends with [`FinishReason::Cancelled`] (finished ones keep their reason).
    pub cancel: Option<dustin_core::CancelToken>,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            sampling: SamplingConfig::greedy(),
            seed: 0,
            stop_strings: Vec::new(),
            prefill_chunk: AUTO_PREFILL_CHUNK,
            stop_at_eos: true,
            cancel: None,
        }
    }
}

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum FinishReason {
    /// An EOS token was generated (it is included in the output).
    Eos,
    /// A stop string appeared (the output ends with the token that completed it).
    StopString,
    /// `max_new_tokens` were generated.
    Length,
    /// Generation was cancelled (Ctrl-C) before the sequence finished; its tokens so far are
    /// kept.
    Cancelled,
}

impl FinishReason {
    /// The reason in words, for output files and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::StopString => "stop_string",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Output of [`generate`].
#[derive(Debug, Clone)]
pub struct GenerateOutput {
    /// Generated tokens per sequence (prompt excluded).
    pub tokens: Vec<Vec<u32>>,
    /// Why each sequence stopped.
    pub finish: Vec<FinishReason>,
    /// Prefill wall time, seconds.
    pub prefill_secs: f64,
    /// Decode wall time, seconds.
    pub decode_secs: f64,
    /// Prompt tokens processed.
    pub prefill_tokens: usize,
}

/// Per-sequence stop bookkeeping shared by autoregressive and speculative decoding.
#[derive(Debug, Clone)]
pub struct StopRule {
    /// EOS ids (empty: none).
    pub eos: Vec<u32>,
    /// Stop strings.
    pub stop_strings: Vec<String>,
    /// Token budget.
    pub max_new_tokens: usize,
}

impl StopRule {
    /// Pushes `tok` onto `out` and tells whether the sequence is finished.
    ///
    /// # Errors
    /// Tokenizer errors while checking stop strings.
    pub fn push(
        &self,
        out: &mut Vec<u32>,
        tok: u32,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Option<FinishReason>> {
        out.push(tok);
        if self.eos.contains(&tok) {
            return Ok(Some(FinishReason::Eos));
        }
        if !self.stop_strings.is_empty() {
            if let Some(t) = tokenizer {
                // decode a short tail: enough tokens to cover the longest stop string
                let longest = self.stop_strings.iter().map(String::len).max().unwrap_or(0);
                let tail = &out[out.len().saturating_sub(longest + 2)..];
                let text = t.decode(tail)?;
                if self
                    .stop_strings
                    .iter()
                    .any(|s| !s.is_empty() && text.contains(s.as_str()))
                {
                    return Ok(Some(FinishReason::StopString));
                }
            }
        }
        if out.len() >= self.max_new_tokens {
            return Ok(Some(FinishReason::Length));
        }
        Ok(None)
    }
}

/// Host copy of `[batch, vocab]` logits (first `vocab` columns), one row per sequence.
///
/// # Errors
/// [`QwenError::Core`] if the data cannot be read as f32.
pub fn rows_to_host<B: Backend>(logits: Tensor<B, 2>, vocab: usize) -> Result<Vec<Vec<f32>>> {
    let [b, v] = logits.dims();
    let vocab = vocab.min(v);
    let data = logits
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| QwenError::Core(dustin_core::CoreError::Model(format!("{e:?}"))))?;
    Ok((0..b)
        .map(|i| data[i * v..i * v + vocab].to_vec())
        .collect())
}

/// Picks the next token of each row with `sampling` and the per-sequence RNGs.
///
/// # Errors
/// [`dustin_core::CoreError::NonFinite`] for NaN logits.
pub fn pick_tokens(
    rows: &[Vec<f32>],
    sampling: &SamplingConfig,
    rngs: &mut [ChaCha8Rng],
    seq_ids: &[usize],
) -> Result<Vec<u32>> {
    rows.iter()
        .zip(seq_ids)
        .map(|(row, &s)| {
            let p = sampling.probs(row, s)?;
            let t = if sampling.is_greedy() {
                dustin_core::argmax(&p)
            } else {
                dustin_core::sample_with(&p, rngs[s].random::<f32>())
            };
            Ok(t as u32)
        })
        .collect()
}

/// A per-sequence random stream `(seed, seq)`.
pub fn seq_rng(seed: u64, seq: usize) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(seq as u64);
    r
}

/// Generates up to `cfg.max_new_tokens` tokens for each prompt, autoregressively with dense
/// attention. `on_tokens(seq, new_tokens)` is called as tokens are produced (for streaming).
///
/// # Errors
/// Prompt errors (empty, too long, ids out of range), model errors, non-finite logits.
pub fn generate<B: KernelOps>(
    model: &Qwen2<B>,
    prompts: &[Vec<u32>],
    cfg: &GenerateConfig,
    tokenizer: Option<&Tokenizer>,
    on_tokens: &mut dyn FnMut(usize, &[u32]),
) -> Result<GenerateOutput> {
    cfg.sampling.validate()?;
    check_prompts(model, prompts, cfg.max_new_tokens)?;
    let vocab = tokenizer.map_or(model.config.vocab_size, |t| {
        t.vocab_size().min(model.config.vocab_size)
    });
    let capacity = prompts
        .iter()
        .map(Vec::len)
        .max()
        .unwrap_or(0)
        .saturating_add(cfg.max_new_tokens)
        .saturating_add(1);
    let rule = StopRule {
        eos: if cfg.stop_at_eos {
            tokenizer.map(|t| t.eos_ids.clone()).unwrap_or_default()
        } else {
            Vec::new()
        },
        stop_strings: cfg.stop_strings.clone(),
        max_new_tokens: cfg.max_new_tokens,
    };
    let n = prompts.len();
    let mut rngs: Vec<ChaCha8Rng> = (0..n).map(|i| seq_rng(cfg.seed, i)).collect();
    let t0 = Instant::now();
    let (mut cache, last, _) = prefill(
        model,
        prompts,
        capacity,
        None,
        &mut dustin_core::DenseHook,
        cfg.prefill_chunk,
        false,
    )?;
    // greedy decoding reads back one id per sequence, not its logits (`batch x 151,936`
    // floats a step for Qwen2.5); sampling needs the rows on the host
    let pick =
        |logits: Tensor<B, 2>, rngs: &mut [ChaCha8Rng], active: &[usize]| -> Result<Vec<u32>> {
            if cfg.sampling.is_greedy() {
                // rows are the active sequences in order: an error names the sequence
                dustin_core::greedy::greedy_on_device(logits, vocab, "target logits").map_err(|e| {
                    QwenError::Core(match e {
                        dustin_core::CoreError::NonFinite { what, seq } => {
                            dustin_core::CoreError::NonFinite {
                                what,
                                seq: active.get(seq).copied().unwrap_or(seq),
                            }
                        }
                        e => e,
                    })
                })
            } else {
                pick_tokens(&rows_to_host(logits, vocab)?, &cfg.sampling, rngs, active)
            }
        };
    let mut active: Vec<usize> = (0..n).collect();
    // the first tokens come from the prefill's logits (their read-back waits for the prefill)
    let mut next = pick(last, &mut rngs, &active)?;
    let prefill_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut finish: Vec<Option<FinishReason>> = vec![None; n];
    if cfg.max_new_tokens == 0 {
        return Ok(GenerateOutput {
            tokens: out,
            finish: vec![FinishReason::Length; n],
            prefill_secs,
            decode_secs: 0.0,
            prefill_tokens: prompts.iter().map(Vec::len).sum(),
        });
    }
    loop {
        let mut keep = Vec::new();
        let mut feed = Vec::new();
        for (slot, (&s, &tok)) in active.iter().zip(&next).enumerate() {
            let f = rule.push(&mut out[s], tok, tokenizer)?;
            on_tokens(s, &[tok]);
            match f {
                Some(r) => finish[s] = Some(r),
                None => {
                    keep.push(slot);
                    feed.push(tok);
                }
            }
        }
        if keep.is_empty() {
            break;
        }
        if cfg.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
            for &k in &keep {
                finish[active[k]] = Some(FinishReason::Cancelled);
            }
            break;
        }
        if keep.len() != active.len() {
            cache.retain(&keep)?;
            active = keep.iter().map(|&k| active[k]).collect();
        }
        let batch: Vec<Vec<u32>> = feed.iter().map(|&t| vec![t]).collect();
        let fo = model.forward(
            &batch,
            &mut cache,
            &mut dustin_core::DenseHook,
            ForwardOpts {
                phase: Phase::Decode,
                logits: LogitsMode::Last,
                layers: None,
            },
        )?;
        let logits = fo
            .logits
            .ok_or_else(|| QwenError::Core(dustin_core::CoreError::Model("no logits".into())))?;
        let [b, _, v] = logits.dims();
        next = pick(logits.reshape([b, v]), &mut rngs, &active)?;
    }
    Ok(GenerateOutput {
        tokens: out,
        finish: finish
            .into_iter()
            .map(|f| f.unwrap_or(FinishReason::Length))
            .collect(),
        prefill_secs,
        decode_secs: t1.elapsed().as_secs_f64(),
        prefill_tokens: prompts.iter().map(Vec::len).sum(),
    })
}

/// Negative log-likelihood of `tokens[1..]` given their prefixes, with dense attention:
/// returns `(sum of -ln p(token), number of predicted tokens)`; perplexity is
/// `exp(sum / count)`. Runs in chunks of `chunk` tokens (the logits of one chunk at a time).
///
/// # Errors
/// Prompt and model errors.
pub fn nll<B: KernelOps>(model: &Qwen2<B>, tokens: &[u32], chunk: usize) -> Result<(f64, usize)> {
    use burn_tensor::Int;
    check_prompts(model, &[tokens.to_vec()], 0)?;
    let chunk = chunk.max(1);
    let mut cache = model.new_cache(1, tokens.len(), None);
    let mut sum = 0.0f64;
    let mut count = 0usize;
    let mut start = 0;
    while start < tokens.len() {
        let end = (start + chunk).min(tokens.len());
        let out = model.forward(
            &[tokens[start..end].to_vec()],
            &mut cache,
            &mut dustin_core::DenseHook,
            ForwardOpts {
                phase: Phase::Prefill {
                    seq: 0,
                    last_chunk: end == tokens.len(),
                },
                logits: LogitsMode::All,
                layers: None,
            },
        )?;
        let logits = out
            .logits
            .ok_or_else(|| QwenError::Core(dustin_core::CoreError::Model("no logits".into())))?;
        // predict tokens[start+1 ..= end] from positions start .. end (the last chunk has
        // one target fewer)
        let n_pred = (end - start).min(tokens.len() - 1 - start);
        if n_pred > 0 {
            let [_, _, v] = logits.dims();
            let lp = activation::log_softmax(logits.slice([0..1, 0..n_pred, 0..v]), 2);
            let targets: Vec<i64> = tokens[start + 1..start + 1 + n_pred]
                .iter()
                .map(|&t| t as i64)
                .collect();
            let idx = Tensor::<B, 3, Int>::from_data(
                burn_tensor::TensorData::new(targets, [1, n_pred, 1]),
                model.device(),
            );
            let picked: Vec<f32> = lp
                .gather(2, idx)
                .into_data()
                .convert::<f32>()
                .into_vec()
                .map_err(|e| QwenError::Core(dustin_core::CoreError::Model(format!("{e:?}"))))?;
            sum -= picked.iter().map(|&x| x as f64).sum::<f64>();
            count += n_pred;
        }
        start = end;
    }
    Ok((sum, count))
}
