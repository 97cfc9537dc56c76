//! The LongBench harness (`dustin eval longbench`): LongBench tasks answered greedily by
//! speculative decoding whose target verifies through each selector at each budget, scored
//! with LongBench's metrics ([`crate::metrics`]).
//!
//! Per sample (shared by every selector and budget of the sample):
//! 1. the LongBench prompt (`Sample::prompt`) is tokenized and truncated in the middle to the
//!    context minus the task's generation limit and `gamma` (room for the last verification
//!    block), keeping the head and tail halves as LongBench's `pred.py` does
//!    ([`truncate_middle`]); with `--chat auto` and a model that ships a chat template, the
//!    prompt is then wrapped as the template renders a single user message with
//!    `add_generation_prompt` (the token ids of the rendering before and after the message's
//!    text, `ChatTemplate::user_affixes`; Qwen2.5's and SmolLM2's templates add their default
//!    system prompt), except for LongBench's few-shot tasks, as `pred.py` does; with the
//!    template in use, generation (of every task) also stops at its end-of-turn tokens
//!    (`ChatTemplate::stop_token_ids`);
//! 2. one dense prefill of the prompt, in the chunks of `ModelVerifier`'s own prefill, whose
//!    chunks are shown to every (selector, budget) policy of the sample through the fidelity
//!    harness's fan-out hook, so each policy sees exactly what its own prefill would show it;
//!    the early-exit draft's cache is the first layers of the target's.
//!
//! Per (selector, budget): a greedy speculative run (`SpeculativeDecoder`, gamma 4 by default)
//! from clones of the shared caches, up to the task's `max_new_tokens` or EOS; the prediction
//! (special tokens skipped, as `pred.py` decodes) is scored with `metrics::scorer`. `dense` runs
//! once per sample, whatever the budgets.

use std::path::PathBuf;

use dustin_kernels::KernelOps;
use dustin_qwen::ModelFiles;
use dustin_select::BudgetedPolicy;

use super::engine::EvalPair;
use super::selectors::SelectorFlags;
use super::{check_gamma, open_store, progress, say, HarnessError, ModelFlags, ModelHost};
use crate::longbench::Sample;
use crate::metrics;
use prompt::{build_prompt, check_task, load_samples, prompt_limit, Chat};
use runs::{clip, generate_from, run_specs, shared_prefill, Cx, KeyBase, Row, RunSpec};

mod prompt;
mod report;
mod runs;
#[cfg(test)]
mod tests;

pub use prompt::truncate_middle;

/// The tasks of the shared data folder (`../shared/data/longbench`), the default of `tasks`.
pub const DEFAULT_TASKS: &str =
    "narrativeqa,qasper,multifieldqa_en,gov_report,passage_retrieval_en,trec,samsum";

/// Tasks LongBench's `pred.py` leaves without the chat wrapper (few-shot and code tasks).
const NO_CHAT_TASKS: [&str; 6] = ["trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"];

/// Whether prompts are wrapped in the model's chat format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ChatMode {
    /// A single user message in the model's chat template (transformers'
    /// `apply_chat_template` with `add_generation_prompt`), when the model ships one, except
    /// for trec, triviaqa, samsum, lsht, lcc and repobench-p (as LongBench's `pred.py`);
    /// plain otherwise. Generation also stops at the template's end-of-turn tokens.
    #[default]
    Auto,
    /// The plain LongBench prompt for every task.
    Off,
}

/// The options of a LongBench run (the flags of `dustin eval longbench`).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct LongBenchOptions {
    /// `--model` and `--draft`.
    #[cfg_attr(feature = "clap", command(flatten))]
    pub models: ModelFlags,
    /// Draft layers whose attention makes the lookahead (`dustin_spec::LookaheadLayers`):
    /// `half` (the default: the later half), `all`, `stride:S` (every S-th layer counted
    /// back from the last), `last:N` or a list of layer indices (`0,5,9`), of the draft's
    /// layers (a self-draft's `N`), as `eval fidelity --lookahead-layers`.
    #[cfg_attr(feature = "clap", arg(long, default_value = "half"))]
    pub lookahead_layers: String,
    /// LongBench data: a directory of `<task>.json` (MiniLongBench layout) or `<task>.jsonl`
    /// (original LongBench layout) files, or one such file.
    #[cfg_attr(
        feature = "clap",
        arg(long, default_value = "../shared/data/longbench")
    )]
    pub data: PathBuf,
    /// Tasks (comma-separated LongBench English task names).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ',', default_value = DEFAULT_TASKS))]
    pub tasks: Vec<String>,
    /// Selectors (comma-separated registry names, `pyramid(<name>)`, or `label=<name>` for a
    /// variant whose knobs `--knobs label=...` sets). `dense` runs once per sample.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', default_value = "dense,dustin,streaming")
    )]
    pub selectors: Vec<String>,
    /// `--budget`, `--knobs` and `--select`.
    #[cfg_attr(feature = "clap", command(flatten))]
    pub tuning: SelectorFlags,
    /// Context length: prompts are truncated in the middle to this minus the task's
    /// generation limit and gamma. Default: the model's (`max_position_embeddings`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub ctx: Option<usize>,
    /// Use at most this many samples per task (in id order).
    #[cfg_attr(feature = "clap", arg(long))]
    pub max_samples: Option<usize>,
    /// Draft tokens per verification.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 4))]
    pub gamma: usize,
    /// Chat wrapper of the prompts.
    #[cfg_attr(feature = "clap", arg(long, value_enum, default_value_t = ChatMode::Auto))]
    pub chat: ChatMode,
    /// Output folder (results.jsonl, longbench.md, longbench.json, longbench.svg,
    /// per_sample.md).
    #[cfg_attr(feature = "clap", arg(long, default_value = "out/longbench"))]
    pub out: PathBuf,
}

/// Runs `dustin eval longbench`: every (sample, selector, budget) run that the results
/// store of `args.out` lacks, then `longbench.md`, `longbench.json`, `longbench.svg` and
/// `per_sample.md`; prints the table.
///
/// # Errors
/// [`HarnessError::Usage`] for bad options and data (named, checked before the model
/// loads); the host's, model, engine and I/O errors. Finished runs are kept in
/// `results.jsonl` whatever happens later.
pub fn run<B: KernelOps, H: ModelHost>(
    args: &LongBenchOptions,
    dev: &B::Device,
    host: &H,
) -> Result<(), HarnessError> {
    check_gamma(args.gamma)?;
    if args.max_samples == Some(0) {
        return Err(HarnessError::Usage("--max-samples: at least 1".into()));
    }
    let mut tasks: Vec<String> = Vec::new();
    for t in args
        .tasks
        .iter()
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
    {
        check_task(t)?;
        if !tasks.iter().any(|x| x == t) {
            tasks.push(t.to_string());
        }
    }
    if tasks.is_empty() {
        return Err(HarnessError::Usage("--tasks: none given".into()));
    }
    let sels = args.tuning.selectors(&args.selectors)?;
    let budgets = args.tuning.budgets()?;
    if args.ctx == Some(0) {
        return Err(HarnessError::Usage(
            "--ctx 0: expected a positive context".into(),
        ));
    }
    // check the lookahead setting, selectors, budgets and data before loading the model
    let la: dustin_spec::LookaheadLayers = args
        .lookahead_layers
        .parse()
        .map_err(|e| HarnessError::Usage(format!("--lookahead-layers: {e}")))?;
    let probe_ctx = args.ctx.unwrap_or(1 << 20);
    for r in run_specs(&sels, &budgets, probe_ctx)? {
        r.build::<B>(probe_ctx)?;
    }
    let data = load_samples(&args.data, &tasks)?;
    // a task without samples would rewrite the reports with no row of its own: refused
    if let Some(t) = tasks
        .iter()
        .find(|t| data.get(*t).is_none_or(Vec::is_empty))
    {
        return Err(HarnessError::Usage(format!(
            "--tasks {t}: --data {} holds no sample of this task",
            args.data.display()
        )));
    }

    let path = host.model_path(args.models.model.as_deref())?;
    let files = ModelFiles::open(&path)?;
    let limit = files.config.max_position_embeddings;
    let ctx = args.ctx.unwrap_or(limit);
    if ctx > limit {
        return Err(HarnessError::Usage(format!(
            "--ctx {ctx}: larger than the model's context ({limit} positions)"
        )));
    }
    let runs = run_specs(&sels, &budgets, ctx)?;
    let mut tok = files.tokenizer.clone();
    let chat = Chat::for_model(files.chat_template.as_ref(), &tok, args.chat)?;
    if let Some(c) = &chat {
        tok.eos_ids = c.stop.clone();
    }
    for t in &tasks {
        let max_new = check_task(t)?;
        let wrap = chat
            .as_ref()
            .filter(|_| !NO_CHAT_TASKS.contains(&t.as_str()));
        prompt_limit(t, ctx, max_new, args.gamma, wrap.map_or(0, Chat::len))?;
    }
    let pair = EvalPair::load(host, &files, &args.models.draft, &la, ctx, dev, &tok, true)?;
    let cx = Cx {
        pair,
        tok,
        ctx,
        gamma: args.gamma,
    };
    let kb = KeyBase {
        args,
        ctx,
        model: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        chat: chat.as_ref().map_or_else(|| "false".to_string(), Chat::key),
    };

    let mut store = open_store(&args.out)?;
    let chosen: Vec<(String, Vec<Sample>)> = tasks
        .iter()
        .map(|t| {
            let s = data.get(t).cloned().unwrap_or_default();
            let n = args.max_samples.unwrap_or(usize::MAX);
            (t.clone(), s.into_iter().take(n).collect())
        })
        .collect();
    let mut total = 0usize;
    let mut todo = 0usize;
    for (t, samples) in &chosen {
        let max_new = check_task(t)?;
        for s in samples {
            for r in &runs {
                total += 1;
                if !store.is_done(&kb.key(t, &s.id, r, max_new)?) {
                    todo += 1;
                }
            }
        }
    }
    let bar = progress(todo, "runs")?;
    let device = B::device_description(dev);
    say(
        &bar,
        format!(
            "longbench: {} samples of {} tasks x {} (selector, budget) runs = {total} runs, {todo} to compute; context {ctx}, chat wrapper {}",
            chosen.iter().map(|c| c.1.len()).sum::<usize>(),
            chosen.len(),
            runs.len(),
            chat.as_ref().map_or_else(
                || "none".to_string(),
                |c| format!("the chat template of {} (not for few-shot tasks)", c.origin)
            )
        ),
    );
    for (task, samples) in &chosen {
        let max_new = check_task(task)?;
        for sample in samples {
            let mut pending: Vec<(String, &RunSpec)> = Vec::new();
            for r in &runs {
                let key = kb.key(task, &sample.id, r, max_new)?;
                if !store.is_done(&key) {
                    pending.push((key, r));
                }
            }
            if pending.is_empty() {
                continue;
            }
            let prompt = build_prompt(&cx.tok, chat.as_ref(), sample, ctx, max_new, args.gamma)?;
            bar.set_message(format!(
                "{task} {}: prefill {} tokens",
                sample.id,
                prompt.ids.len()
            ));
            let mut policies: Vec<Box<dyn BudgetedPolicy<B>>> = pending
                .iter()
                .map(|(_, r)| r.build::<B>(ctx))
                .collect::<Result<_, _>>()?;
            let sh = shared_prefill(&cx, &prompt.ids, &mut policies)?;
            say(
                &bar,
                format!(
                    "{task} {}: prompt {} tokens{} -> {} read, prefill {:.1} s",
                    sample.id,
                    prompt.original,
                    if prompt.truncated {
                        " (truncated in the middle)"
                    } else {
                        ""
                    },
                    prompt.ids.len(),
                    sh.secs
                ),
            );
            for ((key, r), policy) in pending.into_iter().zip(policies) {
                bar.set_message(format!(
                    "{task} {} {} budget {}",
                    sample.id, r.sel.label, r.budget_label
                ));
                let g = generate_from(&cx, &sh, &prompt.ids, policy, max_new)?;
                let prediction = cx
                    .tok
                    .inner()
                    .decode(&g.tokens, true)
                    .map_err(|e| HarnessError::Usage(format!("decoding a prediction: {e}")))?;
                let score =
                    metrics::scorer(task, &prediction, &sample.answers, &sample.all_classes)
                        .map_err(|e| {
                            HarnessError::Usage(format!("scoring {task} sample {}: {e}", sample.id))
                        })?;
                let row = Row {
                    task: task.clone(),
                    id: sample.id.clone(),
                    ctx,
                    prompt_tokens: prompt.original,
                    input_tokens: prompt.ids.len(),
                    chat: prompt.chat,
                    budget: r.budget,
                    budget_label: r.budget_label.clone(),
                    selector: r.sel.label.clone(),
                    spec: r.sel.spec.clone(),
                    gamma: args.gamma,
                    prediction,
                    score,
                    new_tokens: g.tokens.len(),
                    finish: g.finish,
                    accept_len: g.accept_len,
                    iterations: g.iterations,
                    kv_selected: g.kv_selected,
                    kv_estimation: g.kv_estimation,
                    secs: g.secs,
                    secs_prefill: sh.secs,
                    device: device.clone(),
                };
                say(
                    &bar,
                    format!(
                        "  {:<12} budget {:>6}: score {:.3}  {} tokens ({})  tau {:.2}  KV {:.3}+{:.3}  {:.1} s  {:?}",
                        row.selector,
                        row.budget_key(),
                        row.score,
                        row.new_tokens,
                        row.finish,
                        row.accept_len,
                        row.kv_selected,
                        row.kv_estimation,
                        row.secs,
                        clip(&row.prediction, 60)
                    ),
                );
                store
                    .append(&key, &row)
                    .map_err(|e| HarnessError::Usage(e.to_string()))?;
                bar.inc(1);
            }
        }
    }
    bar.finish_with_message("done");
    report::report(args, &store, &kb, &chosen, &runs, &budgets)
}
