//! The fidelity harness (`dustin eval fidelity`, and the rows of `dustin eval pg19`): how
//! closely sparse verification through each selector follows dense verification, on PG-19
//! books (docs/fidelity.md has the method, the accounting and the results).
//!
//! Per book and context `N` (the shared part, computed once):
//! 1. the first `P = N - E` tokens of the book text (Gutenberg header stripped) are the
//!    prompt; `E` leaves room for the verified continuation inside `N` positions (the model's
//!    RoPE table ends at `max_position_embeddings`);
//! 2. `tokens[..P - 512]` is prefilled densely once; the last 512 prompt tokens then run
//!    densely once more through a *fan-out* hook that shows that chunk, as the last prefill
//!    chunk, to every selector instance (so each estimator gets its prefill observation
//!    without a prefill of its own; H2O therefore accumulates over that last chunk only);
//! 3. the draft's lookahead for each teacher-forced window (`ModelDrafter::force_window`) and
//!    the dense reference verification of each window (`ModelVerifier` with `DenseHook`).
//!
//! Per selector and budget: `W` teacher-forced verification windows (the pending book token
//! and the next `gamma` book tokens, verified by `ModelVerifier::verify` and all committed),
//! compared position by position with the dense reference (top-1 agreement, KL(dense ||
//! sparse), perplexity of the true next tokens, KV fraction read with the estimators' own
//! reads); then a short greedy speculative run (the engine's `SpeculativeDecoder`, the
//! drafter and verifier starting from the shared prefill) for the mean acceptance length.
//!
//! [`run`] computes the rows a results store lacks and writes the report; the modules below
//! hold the shared part and one row (`windows`), and the tables (`report`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::ModelFiles;
use dustin_spec::LookaheadLayers;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use super::selectors::{fnv, lookahead_key, selector_specs_from, BudgetSpec, SelectorSpec};
use super::{check_gamma, say, HarnessError, ModelHost};
use crate::report::ResultStore;
use windows::{run_row, shared_part, Ctx, Pending};

mod report;
mod summary;
#[cfg(test)]
mod tests;
mod timed;
mod windows;

pub(crate) use report::Agg;

/// The last prompt tokens every selector sees as its prefill observation (the prefill chunk
/// of `dustin_qwen::generate::prefill`).
const OBSERVED_CHUNK: usize = 512;

/// The options of a fidelity run (the flags of `dustin eval fidelity`).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct FidelityOptions {
    /// Target model: HF directory, .gguf file, or a model name (`dustin fetch-model
    /// --list`). Default: qwen2.5-coder-1.5b-instruct from the cache.
    #[cfg_attr(feature = "clap", arg(long))]
    pub model: Option<PathBuf>,
    /// Draft: `self:layers=N` (early-exit self-draft), `substitute[:bits=B][:group=G][:layers=L]`
    /// (SubSpec: the target with the listed layers group-quantized) or a model path or name
    /// (same tokenizer).
    #[cfg_attr(
        feature = "clap",
        arg(long, default_value = "qwen2.5-coder-0.5b-instruct")
    )]
    pub draft: String,
    /// Draft layers whose attention makes the lookahead (`dustin_spec::LookaheadLayers`):
    /// `half` (the default: the later half), `all`, `stride:S` (every S-th layer counted
    /// back from the last), `last:N` or a list of layer indices (`0,5,9`), of the draft's
    /// layers (a self-draft's `N`). Applies to the teacher-forced lookaheads and to the
    /// speculative run's draft.
    #[cfg_attr(feature = "clap", arg(long, default_value = "half"))]
    pub lookahead_layers: String,
    /// A PG-19 book (.txt), a directory of them, any other text file (source code is kept
    /// as it is), or a comma-separated list of these.
    #[cfg_attr(feature = "clap", arg(long))]
    pub data: PathBuf,
    /// Use at most this many books (in file-name order).
    #[cfg_attr(feature = "clap", arg(long))]
    pub books: Option<usize>,
    /// Context lengths N (comma-separated): the last verified position is below N.
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ',', required = true))]
    pub ctx: Vec<usize>,
    /// Token budgets (comma-separated): absolute (`512`) or fractions of the context
    /// (`1/8`, `0.125`).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ',', required = true))]
    pub budget: Vec<String>,
    /// Selectors (comma-separated registry names, `pyramid(<name>)`, or `label=<name>` for a
    /// variant whose knobs `--knobs label=...` sets).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_delimiter = ',',
            default_value = "dense,streaming,h2o,snapkv,quest,oracle,draft-only,history-only,dustin,pyramid(dustin)"
        )
    )]
    pub selectors: Vec<String>,
    /// Estimator knobs of one selector label as JSON, e.g. `dustin={"alpha":0.7}`
    /// (repeatable).
    #[cfg_attr(feature = "clap", arg(long = "knobs"))]
    pub knobs: Vec<String>,
    /// Selector-config overrides of one selector label as JSON, e.g. `dustin={"refresh":1}`
    /// (repeatable; the budget always comes from `--budget`).
    #[cfg_attr(feature = "clap", arg(long = "select"))]
    pub select: Vec<String>,
    /// Teacher-forced verification windows per (book, context, budget, selector).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 16))]
    pub windows: usize,
    /// Draft tokens per verification (each window verifies gamma + 1 tokens).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 4))]
    pub gamma: usize,
    /// Tokens generated by the speculative run that measures the acceptance length
    /// (0: skip it).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 32))]
    pub spec_tokens: usize,
    /// Output folder (results.jsonl, fidelity.md, fidelity.json, `fidelity_ctx<N>.svg`).
    #[cfg_attr(feature = "clap", arg(long, default_value = "out/fidelity"))]
    pub out: PathBuf,
}

// ------------------------------------------------------------------------------- records

/// One finished (book, context, budget, selector) row, as stored in results.jsonl.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Row {
    pub(crate) book: String,
    pub(crate) ctx: usize,
    pub(crate) prompt_tokens: usize,
    pub(crate) budget: usize,
    pub(crate) budget_label: String,
    pub(crate) selector: String,
    pub(crate) spec: String,
    pub(crate) windows: usize,
    pub(crate) gamma: usize,
    /// Verified positions compared with dense.
    pub(crate) positions: usize,
    /// Fraction of positions where the sparse and dense argmax agree.
    pub(crate) top1: f64,
    /// Mean KL(dense || sparse) of the next-token distributions, nats.
    pub(crate) kl: f64,
    /// Mean negative log-likelihood of the true next tokens under the sparse target, nats.
    pub(crate) nll: f64,
    /// The same under dense verification.
    pub(crate) dense_nll: f64,
    /// Context positions the sparse attention read / dense reads (all layers, KV heads).
    pub(crate) kv_selected: f64,
    /// The estimator's own reads (token-equivalents) / dense reads.
    pub(crate) kv_estimation: f64,
    /// Mean acceptance length of the speculative run (accepted drafts + 1 per iteration).
    pub(crate) accept_len: Option<f64>,
    /// Verification iterations of the speculative run.
    pub(crate) spec_iterations: Option<usize>,
    /// Seconds of the windows.
    pub(crate) secs_windows: f64,
    /// Seconds of the speculative run.
    pub(crate) secs_spec: f64,
    /// Seconds drafting in the speculative run.
    #[serde(default)]
    pub(crate) secs_spec_draft: f64,
    /// Seconds verifying in the speculative run.
    #[serde(default)]
    pub(crate) secs_spec_verify: f64,
    /// Seconds in the selector's hooks over the windows (its scoring, re-ranking and top-k:
    /// the selection work), all windows together.
    #[serde(default)]
    pub(crate) secs_select: f64,
    /// Per window: positions whose sparse and dense argmax agree (empty in rows stored
    /// before the per-window figures were kept).
    #[serde(default)]
    pub(crate) win_agree: Vec<usize>,
    /// Per window: KL(dense || sparse) summed over its positions, nats.
    #[serde(default)]
    pub(crate) win_kl: Vec<f64>,
    /// Per window: NLL of the true next tokens summed over its positions, nats.
    #[serde(default)]
    pub(crate) win_nll: Vec<f64>,
    /// Per iteration of the speculative run: drafts accepted.
    #[serde(default)]
    pub(crate) spec_accepted: Vec<usize>,
}

/// The sources of `--data`: one file (a PG-19 book, or any text such as a source file), a
/// directory of PG-19 `.txt` books, or a comma-separated list of either. Every file's
/// Gutenberg header and footer are stripped when it has them (`dustin_eval::pg19`); a source
/// file is kept as it is. A source's id is its file stem.
///
/// # Errors
/// [`HarnessError::Usage`] naming the path that cannot be read, and for two sources with
/// the same id (their rows would share store keys).
pub(crate) fn load_sources(data: &std::path::Path) -> Result<Vec<crate::pg19::Book>, HarnessError> {
    let text = data.to_string_lossy();
    let mut books = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let path = std::path::Path::new(part);
        let got = if path.is_dir() {
            crate::pg19::load_dir(path)
        } else {
            crate::pg19::load_book(path).map(|b| vec![b])
        }
        .map_err(|e| HarnessError::Usage(format!("--data {part}: {e}")))?;
        books.extend(got);
    }
    let mut ids: Vec<&str> = books.iter().map(|b| b.id.as_str()).collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(HarnessError::Usage(format!(
            "--data {text}: two sources named {} (the file stem identifies a source)",
            w[0]
        )));
    }
    Ok(books)
}

/// The store key of one (book, context, budget, selector) row.
pub(crate) fn row_key(
    book: &str,
    ctx: usize,
    budget: usize,
    sel: &SelectorSpec,
    args: &FidelityOptions,
) -> Result<String, HarnessError> {
    let la = lookahead_key(&args.lookahead_layers);
    Ok(format!(
        "{book}|ctx={ctx}|budget={budget}|{}|W={}|g={}|spec={}|draft={}{la}|{:016x}",
        sel.label,
        args.windows,
        args.gamma,
        args.spec_tokens,
        args.draft,
        fnv(&sel.fingerprint(budget)?)
    ))
}

/// Runs `dustin eval fidelity`: computes every (book, context, budget, selector) row that
/// the results store of `args.out` lacks, then writes `fidelity.md`, `fidelity.json`,
/// `per_book.md` and one `fidelity_ctx<N>.svg` per context, and prints the table.
///
/// # Errors
/// [`HarnessError::Usage`] for bad options (named, checked before any model loads) and
/// unreadable books; the host's, model, engine and I/O errors. Finished rows are kept in
/// `results.jsonl` whatever happens later.
pub fn run<B: KernelOps, H: ModelHost>(
    args: &FidelityOptions,
    dev: &B::Device,
    host: &H,
) -> Result<(), HarnessError> {
    let c = compute_rows::<B, H>(args, dev, host, "fidelity")?;
    report::report(args, &c.store, &c.books, &c.budgets, &c.sels)
}

/// The finished rows of a fidelity run and what identifies them, for a report.
pub(crate) struct Computed {
    /// The results store, every row of the run in it.
    pub(crate) store: ResultStore,
    /// The books read.
    pub(crate) books: Vec<crate::pg19::Book>,
    /// The budgets as given, parsed.
    pub(crate) budgets: Vec<(String, BudgetSpec)>,
    /// The selectors.
    pub(crate) sels: Vec<SelectorSpec>,
}

/// Computes every (book, context, budget, selector) row of `args` that the store of
/// `args.out` lacks (the fidelity harness; `what` names the command in the log).
pub(crate) fn compute_rows<B: KernelOps, H: ModelHost>(
    args: &FidelityOptions,
    dev: &B::Device,
    host: &H,
    what: &str,
) -> Result<Computed, HarnessError> {
    check_gamma(args.gamma)?;
    if args.windows == 0 {
        return Err(HarnessError::Usage("--windows: at least 1".into()));
    }
    let sels = selector_specs_from(&args.selectors, &args.knobs, &args.select)?;
    let budgets: Vec<(String, BudgetSpec)> = args
        .budget
        .iter()
        .map(|b| BudgetSpec::parse(b).map(|s| (b.trim().to_string(), s)))
        .collect::<Result<_, _>>()?;
    // check every selector and config before loading anything
    for s in &sels {
        for (label, b) in &budgets {
            for &n in &args.ctx {
                if b.tokens(n) == 0 {
                    return Err(HarnessError::Usage(format!(
                        "--budget {label}: 0 tokens of a {n}-token context"
                    )));
                }
                s.build::<B>(b.tokens(n))?;
            }
        }
    }
    let books = load_sources(&args.data)?;
    let books: Vec<_> = books
        .into_iter()
        .take(args.books.unwrap_or(usize::MAX))
        .collect();
    if books.is_empty() {
        return Err(HarnessError::Usage(format!(
            "--data {}: no .txt books",
            args.data.display()
        )));
    }

    std::fs::create_dir_all(&args.out).map_err(|source| HarnessError::Io {
        path: args.out.display().to_string(),
        source,
    })?;
    let mut store = ResultStore::open(args.out.join("results.jsonl"))
        .map_err(|e| HarnessError::Usage(e.to_string()))?;

    let total: usize = books.len() * args.ctx.len() * budgets.len() * sels.len();
    let mut todo = 0usize;
    for b in &books {
        for &n in &args.ctx {
            for (_, bs) in &budgets {
                for s in &sels {
                    if !store.is_done(&row_key(&b.id, n, bs.tokens(n), s, args)?) {
                        todo += 1;
                    }
                }
            }
        }
    }
    if todo == 0 {
        // every row is stored: the report needs no model
        println!(
            "{what}: all {total} rows are in {}",
            args.out.join("results.jsonl").display()
        );
        return Ok(Computed {
            store,
            books,
            budgets,
            sels,
        });
    }

    let path = host.model_path(args.model.as_deref())?;
    let files = ModelFiles::open(&path)?;
    let tok = files.tokenizer.clone();
    let max_ctx = *args.ctx.iter().max().unwrap_or(&0);
    let limit = files.config.max_position_embeddings;
    if max_ctx > limit {
        return Err(HarnessError::Usage(format!(
            "--ctx {max_ctx}: the model's positions end at {limit}"
        )));
    }
    let target = Arc::new(files.build::<B>(max_ctx, dev)?);
    let (draft, draft_layers, self_draft) =
        host.eval_draft(&args.draft, &target, max_ctx, dev, None)?;
    let la: LookaheadLayers = args
        .lookahead_layers
        .parse()
        .map_err(|e| HarnessError::Usage(format!("--lookahead-layers: {e}")))?;
    let lookahead_layers = la
        .resolve(draft_layers.unwrap_or(draft.layers.len()))
        .map_err(|e| HarnessError::Usage(format!("--lookahead-layers: {e}")))?;
    let vocab = tok.vocab_size().min(target.config.vocab_size);
    let cx = Ctx {
        args,
        target,
        draft,
        draft_layers,
        lookahead_layers,
        self_draft,
        vocab,
        capacity: max_ctx,
        observed: OBSERVED_CHUNK,
    };

    let bar = ProgressBar::new(todo as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} rows (eta {eta}) {msg}",
        )
        .map_err(|e| HarnessError::Usage(e.to_string()))?
        .progress_chars("=> "),
    );
    say(
        &bar,
        format!(
        "{what}: {} books x {} contexts x {} budgets x {} selectors = {total} rows, {} to compute",
        books.len(),
        args.ctx.len(),
        budgets.len(),
        sels.len(),
        todo
    ),
    );

    let spec_extra = if args.spec_tokens > 0 {
        args.spec_tokens + 2 * (args.gamma + 1)
    } else {
        0
    };
    let extra = (args.windows * (args.gamma + 1) + 1).max(spec_extra);
    for book in &books {
        // enough characters for the longest context (PG-19 prose: ~4 characters a token)
        let chars: String = book.text.chars().take(max_ctx * 8 + 4096).collect();
        let ids = tok.encode(&chars)?;
        // ascending, so that each context's dense prefill continues the previous one's
        let mut ctxs = args.ctx.clone();
        ctxs.sort_unstable();
        ctxs.dedup();
        let mut prefix: Option<DenseKvCache<B>> = None;
        for &n in &ctxs {
            if n <= extra + OBSERVED_CHUNK + 1 {
                return Err(HarnessError::Usage(format!(
                    "--ctx {n}: too short for {extra} verified tokens and a {OBSERVED_CHUNK}-token observed chunk"
                )));
            }
            let p = n - extra;
            // the windows need tokens up to p + W(gamma + 1) (their next tokens included);
            // leave a few tokens of margin before the cut of the text
            if ids.len() < n + 16 {
                say(
                    &bar,
                    format!(
                        "{}: {} tokens, fewer than {} for ctx {n}; skipped",
                        book.id,
                        ids.len(),
                        n + 16
                    ),
                );
                continue;
            }
            let mut pend: Vec<Pending<B>> = Vec::new();
            for (bl, bs) in &budgets {
                let budget = bs.tokens(n);
                for s in &sels {
                    let key = row_key(&book.id, n, budget, s, args)?;
                    if store.is_done(&key) {
                        continue;
                    }
                    pend.push(Pending {
                        key,
                        sel: s.clone(),
                        budget,
                        budget_label: bl.clone(),
                        fid: s.build::<B>(budget)?,
                        spec: None,
                    });
                }
            }
            if pend.is_empty() {
                continue;
            }
            bar.set_message(format!("{} ctx {n}: prefill {p} tokens", book.id));
            let t = Instant::now();
            let shared = shared_part(&cx, &ids, p, &mut pend, &mut prefix)?;
            say(&bar, format!(
                "{} ctx {n}: prompt {p} tokens, shared part in {:.1} s (prefill {:.1}, observed chunk {:.1}, draft lookaheads {:.1}, dense windows {:.1}); dense ppl {:.3}",
                book.id,
                t.elapsed().as_secs_f64(),
                shared.secs[0],
                shared.secs[1],
                shared.secs[2],
                shared.secs[3],
                (shared.dense_nll / (args.windows * (args.gamma + 1)) as f64).exp()
            ));
            for pe in pend {
                bar.set_message(format!(
                    "{} ctx {n} budget {} {}",
                    book.id, pe.budget, pe.sel.label
                ));
                let key = pe.key.clone();
                let row = run_row(&cx, &ids, p, &shared, pe, &book.id, n)?;
                say(&bar, format!(
                    "  {:<18} budget {:>5}: top-1 {:.4}  KL {:.5}  ppl {:.3}  KV {:.3}+{:.3}  tau {}  (windows {:.1} s, spec {:.1} s: draft {:.1}, verify {:.1})",
                    row.selector,
                    row.budget,
                    row.top1,
                    row.kl,
                    row.nll.exp(),
                    row.kv_selected,
                    row.kv_estimation,
                    row.accept_len.map_or("-".into(), |a| format!("{a:.2}")),
                    row.secs_windows,
                    row.secs_spec,
                    row.secs_spec_draft,
                    row.secs_spec_verify
                ));
                store
                    .append(&key, &row)
                    .map_err(|e| HarnessError::Usage(e.to_string()))?;
                bar.inc(1);
            }
        }
    }
    bar.finish_with_message("done");
    Ok(Computed {
        store,
        books,
        budgets,
        sels,
    })
}
