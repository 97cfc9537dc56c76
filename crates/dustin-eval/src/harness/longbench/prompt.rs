//! The prompt of a LongBench sample as the model reads it, and the samples of the tasks.

use std::collections::BTreeMap;
use std::path::Path;

use dustin_core::TokenId;
use dustin_qwen::{ChatTemplate, Tokenizer};

use super::{ChatMode, NO_CHAT_TASKS};
use crate::harness::selectors::fnv;
use crate::harness::HarnessError;
use crate::longbench::{self as lb, Sample};
use crate::metrics;

/// LongBench's middle truncation (`pred.py`): a prompt of more than `limit` tokens keeps its
/// first `limit / 2` and its last `limit / 2` tokens (so an odd `limit` keeps `limit - 1`, as
/// `half = int(max_length / 2)` does there); a shorter prompt is kept whole.
pub fn truncate_middle(ids: &[TokenId], limit: usize) -> Vec<TokenId> {
    if ids.len() <= limit {
        return ids.to_vec();
    }
    let half = limit / 2;
    let mut out = Vec::with_capacity(2 * half);
    out.extend_from_slice(&ids[..half]);
    out.extend_from_slice(&ids[ids.len() - half..]);
    out
}

/// The token ids around a prompt in the model's chat template (a single user message with
/// `add_generation_prompt`), and the ids that end the assistant's turn.
#[derive(Debug, Clone)]
pub(super) struct Chat {
    pub(super) prefix: Vec<TokenId>,
    pub(super) suffix: Vec<TokenId>,
    /// EOS and the template's end-of-turn tokens.
    pub(super) stop: Vec<TokenId>,
    /// Where the template came from.
    pub(super) origin: String,
}

impl Chat {
    /// The wrapper of the model's chat template for `mode`; `None` with `--chat off` or a
    /// model without a template.
    pub(super) fn for_model(
        template: Option<&ChatTemplate>,
        tok: &Tokenizer,
        mode: ChatMode,
    ) -> Result<Option<Self>, HarnessError> {
        let Some(t) = template.filter(|_| mode != ChatMode::Off) else {
            return Ok(None);
        };
        let (prefix, suffix) = t.user_affixes().map_err(|e| {
            HarnessError::Usage(format!("--chat auto: {e}; --chat off reads plain prompts"))
        })?;
        Ok(Some(Self {
            prefix: tok.encode(&prefix)?,
            suffix: tok.encode(&suffix)?,
            stop: t.stop_token_ids(tok),
            origin: t.origin().to_string(),
        }))
    }

    pub(super) fn len(&self) -> usize {
        self.prefix.len() + self.suffix.len()
    }

    /// What identifies the wrapper in result keys: its token ids and stop ids.
    pub(super) fn key(&self) -> String {
        format!(
            "template:{:016x}",
            fnv(&format!(
                "{:?}|{:?}|{:?}",
                self.prefix, self.suffix, self.stop
            ))
        )
    }
}

/// A sample's prompt as the model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Prompt {
    pub(super) ids: Vec<TokenId>,
    /// Tokens of the LongBench prompt before truncation.
    pub(super) original: usize,
    /// Whether the prompt was truncated in the middle.
    pub(super) truncated: bool,
    /// Whether the chat wrapper was applied.
    pub(super) chat: bool,
}

/// The prompt budget of a task: `ctx - max_new - gamma - wrapper`, at least 2 tokens.
pub(super) fn prompt_limit(
    task: &str,
    ctx: usize,
    max_new: usize,
    gamma: usize,
    wrapper: usize,
) -> Result<usize, HarnessError> {
    ctx.checked_sub(max_new + gamma + wrapper)
        .filter(|&l| l >= 2)
        .ok_or_else(|| {
            HarnessError::Usage(format!(
                "--ctx {ctx}: too short for task {task} ({max_new} new tokens, gamma {gamma}, \
                 {wrapper} chat-wrapper tokens and a prompt of at least 2 tokens)"
            ))
        })
}

/// Tokenizes, truncates and wraps one sample's prompt.
pub(super) fn build_prompt(
    tok: &Tokenizer,
    chat: Option<&Chat>,
    sample: &Sample,
    ctx: usize,
    max_new: usize,
    gamma: usize,
) -> Result<Prompt, HarnessError> {
    let text = sample.prompt().map_err(|e| {
        HarnessError::Usage(format!("sample {} of {}: {e}", sample.id, sample.task))
    })?;
    let body = tok.encode(&text)?;
    let wrap = chat.filter(|_| !NO_CHAT_TASKS.contains(&sample.task.as_str()));
    let limit = prompt_limit(&sample.task, ctx, max_new, gamma, wrap.map_or(0, Chat::len))?;
    let kept = truncate_middle(&body, limit);
    let truncated = kept.len() < body.len();
    let ids = match wrap {
        Some(c) => [c.prefix.as_slice(), &kept, &c.suffix].concat(),
        None => kept,
    };
    Ok(Prompt {
        ids,
        original: body.len(),
        truncated,
        chat: wrap.is_some(),
    })
}

// ------------------------------------------------------------------------------- data

/// Checks a task name: it needs a generation limit and a metric.
pub(super) fn check_task(task: &str) -> Result<usize, HarnessError> {
    match (lb::max_new_tokens(task), metrics::Metric::for_task(task)) {
        (Some(n), Some(_)) => Ok(n),
        _ => Err(HarnessError::Usage(format!(
            "--tasks {task}: unknown LongBench task; known: {}",
            lb::tasks()
                .filter(|t| metrics::Metric::for_task(t).is_some())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Loads the samples of `tasks` from a data directory or file.
pub(super) fn load_samples(
    data: &Path,
    tasks: &[String],
) -> Result<BTreeMap<String, Vec<Sample>>, HarnessError> {
    let bad = |e: crate::EvalError| HarnessError::Usage(format!("--data {}: {e}", data.display()));
    let mut out: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    if data.is_dir() {
        for t in tasks {
            let json = data.join(format!("{t}.json"));
            let jsonl = data.join(format!("{t}.jsonl"));
            let samples = if json.is_file() {
                lb::load_shared_file(&json).map_err(bad)?
            } else if jsonl.is_file() {
                lb::load_jsonl_file(&jsonl).map_err(bad)?
            } else {
                return Err(HarnessError::Usage(format!(
                    "--data {}: no {t}.json or {t}.jsonl for task {t}",
                    data.display()
                )));
            };
            out.insert(t.clone(), samples);
        }
    } else if data.is_file() {
        let all = if data.extension().is_some_and(|e| e == "jsonl") {
            lb::load_jsonl_file(data).map_err(bad)?
        } else {
            lb::load_shared_file(data).map_err(bad)?
        };
        for t in tasks {
            let s: Vec<Sample> = all.iter().filter(|s| &s.task == t).cloned().collect();
            if s.is_empty() {
                return Err(HarnessError::Usage(format!(
                    "--data {}: no sample of task {t}",
                    data.display()
                )));
            }
            out.insert(t.clone(), s);
        }
    } else {
        return Err(HarnessError::Usage(format!(
            "--data {}: no such file or directory (a folder of <task>.json / <task>.jsonl \
             LongBench files, or one such file)",
            data.display()
        )));
    }
    Ok(out)
}
