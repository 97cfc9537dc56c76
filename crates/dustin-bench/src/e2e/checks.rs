//! The checks of `dustin-bench e2e`'s arguments before any weights are built, and the
//! positions and acceptance lengths they imply.

use dustin_cli::generate::draft_selection;
use dustin_cli::CliError;

use super::args::E2eArgs;

/// The largest `--accept-drop-sigmas` value: beyond a few standard errors the early refresh
/// never fires (the drop is at most the running mean), and the value goes into row labels
/// and file names.
const MAX_DROP_SIGMAS: f64 = 100.0;

/// Checks every argument (and makes the `--host-profile` folder) before anything is built.
pub(super) fn validate(a: &E2eArgs) -> Result<(), CliError> {
    let bad = |m: String| Err(CliError::Usage(m));
    dustin_cli::check_gamma(a.gamma)?;
    if a.ctx.iter().any(|&c| c <= a.tail) {
        return bad(format!(
            "--ctx {:?}: every context must be longer than --tail {}",
            a.ctx, a.tail
        ));
    }
    if a.tail == 0 {
        return bad("--tail 0: at least one prompt token is prefilled for real".into());
    }
    if a.batch.contains(&0) {
        return bad("--batch: sizes must be at least 1".into());
    }
    if a.iters == 0 {
        return bad("--iters 0: nothing would be timed".into());
    }
    if !(1..=MAX_ROUNDS).contains(&a.rounds) {
        return bad(format!(
            "--rounds {}: expected 1 ..= {MAX_ROUNDS}",
            a.rounds
        ));
    }
    if a.tp == 0 {
        return bad("--tp 0: expected at least one rank".into());
    }
    for m in &a.modes {
        if m != "ar" && !dustin_select::registry::names().contains(&m.as_str()) {
            return bad(format!(
                "--modes {m}: expected ar or one of {}",
                dustin_select::registry::names().join(", ")
            ));
        }
    }
    for m in &a.modes {
        accept_of(a, m)?;
    }
    check_accept_keys(a)?;
    // sizes before anything is allocated (a wrapped sum or a huge batch aborted the process)
    if a.warmup.saturating_add(a.iters) > MAX_ITERATIONS {
        return bad(format!(
            "--warmup {} + --iters {}: at most {MAX_ITERATIONS} iterations",
            a.warmup, a.iters
        ));
    }
    let positions = max_positions(a);
    if positions > MAX_TOKENS {
        return bad(format!(
            "--ctx {}: with the tokens the run decodes ({} more), at most {MAX_TOKENS} positions",
            a.ctx.iter().max().copied().unwrap_or(0),
            positions - a.ctx.iter().max().copied().unwrap_or(0)
        ));
    }
    for &c in &a.ctx {
        for &b in &a.batch {
            if b.saturating_mul(c) > MAX_TOKENS {
                return bad(format!(
                    "--batch {b} x --ctx {c}: at most {MAX_TOKENS} context tokens in all"
                ));
            }
        }
    }
    // a list flag naming a value twice would print the same row twice
    no_repeats("--modes", &a.modes)?;
    no_repeats("--ctx", &a.ctx)?;
    no_repeats("--batch", &a.batch)?;
    no_repeats("--draft-budget", &a.draft_budget)?;
    no_repeats("--fused-residual", &a.fused_residual)?;
    no_repeats("--rope-kv-write", &a.rope_kv_write)?;
    no_repeats("--lookahead-scoring", &a.lookahead_scoring)?;
    // by the written form (`last:1`), not the enum's debug name
    no_repeats_named("--lookahead-layers", &a.lookahead_layers, |v| v.to_string())?;
    no_repeats("--estimator-kernels", &a.estimator_kernels)?;
    no_repeats("--topk-kernel", &a.topk_kernel)?;
    no_repeats("--split-reduce", &a.split_reduce)?;
    no_repeats_named("--dense-waves", &a.dense_waves, |v| v.to_string())?;
    if let Some(w) = a.dense_waves.iter().find(|&&w| !(1..=16).contains(&w)) {
        return Err(CliError::Usage(format!(
            "--dense-waves {w}: expected 1 to 16 waves"
        )));
    }
    no_repeats("--batched-reuse", &a.batched_reuse)?;
    if let Some(bad) = a
        .accept_drop_sigmas
        .iter()
        .find(|v| !(v.is_finite() && (0.0..=MAX_DROP_SIGMAS).contains(*v)))
    {
        return Err(CliError::Usage(format!(
            "--accept-drop-sigmas {bad}: expected numbers in 0 ..= {MAX_DROP_SIGMAS} (standard \
             errors)"
        )));
    }
    no_repeats("--accept-drop-sigmas", &a.accept_drop_sigmas)?;
    if let Some(dir) = &a.host_profile {
        std::fs::create_dir_all(dir).map_err(|e| {
            CliError::Usage(format!(
                "--host-profile {}: expected a folder that exists or can be made ({e})",
                dir.display()
            ))
        })?;
    }
    // the budget is checked before any weights are built or any row measured (also for
    // `dense`: its policy is a selector built with the same config, and failed after the
    // `ar` rows had run)
    if a.modes.iter().any(|m| m != "ar") {
        dustin_select::SelectConfig::with_budget(a.budget)
            .validate()
            .map_err(|e| CliError::Usage(format!("--budget {}: {e}", a.budget)))?;
    }
    for &db in &a.draft_budget {
        draft_selection(db)?;
    }
    // the acceptance trace of every (mode, context): a bad file or a mode without cells is
    // named before the first row, not after the `ar` rows ran
    for mode in &a.modes {
        for &ctx in &a.ctx {
            trace_of(a, mode, ctx)?;
        }
    }
    Ok(())
}

/// Most timed plus warm-up iterations of one row (as `subspec`).
const MAX_ITERATIONS: usize = 10_000;

/// Most `--rounds`: each round repeats every row's setup (the prefill of a 32k context).
const MAX_ROUNDS: usize = 10;

/// Most positions (a context and the tokens decoded after it) and most context tokens of a
/// batch: 2^24, the `max_position_embeddings` bound of `QwenConfig` (and of `tp-check`).
const MAX_TOKENS: usize = 1 << 24;

/// Positions the models need: the longest context, the tokens decoded (every iteration
/// appends up to gamma + 1) and room for a verification; saturating (checked by `validate`).
pub(super) fn max_positions(a: &E2eArgs) -> usize {
    let max_ctx = a.ctx.iter().copied().max().unwrap_or(0);
    max_ctx.saturating_add(extra_positions(a)).saturating_add(1)
}

/// Positions past the context a row may write (see [`max_positions`]).
pub(super) fn extra_positions(a: &E2eArgs) -> usize {
    let max_new = a
        .warmup
        .saturating_add(a.iters)
        .saturating_add(2)
        .saturating_mul(a.gamma.saturating_add(1));
    max_new.saturating_add(a.gamma.saturating_add(2).saturating_mul(2))
}

/// [`CliError::Usage`] naming `flag` and the first value it lists twice.
fn no_repeats<T: PartialEq + std::fmt::Debug>(flag: &str, vals: &[T]) -> Result<(), CliError> {
    no_repeats_named(flag, vals, |v| {
        format!("{v:?}").trim_matches('"').to_lowercase()
    })
}

/// [`no_repeats`] with the value written by `name`.
fn no_repeats_named<T: PartialEq>(
    flag: &str,
    vals: &[T],
    name: impl Fn(&T) -> String,
) -> Result<(), CliError> {
    for (i, v) in vals.iter().enumerate() {
        if vals[..i].contains(v) {
            return Err(CliError::Usage(format!(
                "{flag}: {} is listed twice (each value runs once)",
                name(v)
            )));
        }
    }
    Ok(())
}

/// Every `--accept` key is `default` or a selector's name, at most once (a misspelt mode
/// would silently take the default; `ar` always runs at 1); a selector not among `--modes`
/// is warned about.
fn check_accept_keys(a: &E2eArgs) -> Result<(), CliError> {
    let mut seen: Vec<&str> = Vec::new();
    for item in &a.accept {
        let k = item.split_once('=').map_or(item.as_str(), |(k, _)| k);
        if seen.contains(&k) {
            return Err(CliError::Usage(format!(
                "--accept {item}: {k} is given twice"
            )));
        }
        seen.push(k);
        if k == "ar" {
            return Err(CliError::Usage(format!(
                "--accept {item}: ar has no acceptance length (it decodes one token a step)"
            )));
        }
        if k == "default" || a.modes.iter().any(|m| m == k) {
            continue;
        }
        if dustin_select::registry::names().contains(&k) {
            eprintln!(
                "e2e: warning: --accept {item}: {k} is not among --modes {} (unused)",
                a.modes.join(",")
            );
        } else {
            return Err(CliError::Usage(format!(
                "--accept {item}: expected default or a mode ({}), not {k}",
                dustin_select::registry::names().join(", ")
            )));
        }
    }
    Ok(())
}

/// The mean acceptance length tau of `mode` from `--accept`.
pub(super) fn accept_of(a: &E2eArgs, mode: &str) -> Result<f64, CliError> {
    let mut default = None;
    let mut own = None;
    for item in &a.accept {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            CliError::Usage(format!(
                "--accept {item}: expected mode=tau, e.g. dustin=2.1"
            ))
        })?;
        let tau: f64 = v
            .parse()
            .ok()
            .filter(|t: &f64| t.is_finite() && *t >= 1.0)
            .ok_or_else(|| {
                CliError::Usage(format!("--accept {item}: tau must be a number >= 1"))
            })?;
        if k == "default" {
            default = Some(tau);
        } else if k == mode {
            own = Some(tau);
        }
    }
    let tau = if mode == "ar" {
        1.0
    } else {
        own.or(default).ok_or_else(|| {
            CliError::Usage(format!(
                "--accept: no tau for mode {mode} (give {mode}=tau or default=tau)"
            ))
        })?
    };
    if tau - 1.0 > a.gamma as f64 {
        return Err(CliError::Usage(format!(
            "--accept {mode}={tau}: at most gamma + 1 = {}",
            a.gamma + 1
        )));
    }
    Ok(tau)
}

/// The acceptance trace of `mode` at context `ctx` from `--accept-trace` (`None` without the
/// flag and for `ar`): the drafts accepted at each verification, over every cell of the
/// file with the mode's selector and the row's budget fraction, each count capped at gamma.
///
/// # Errors
/// [`CliError::Usage`] naming the file when it cannot be read or a line is not a cell
/// record, and naming the mode when no cell matches (with the cells the file has).
pub(super) fn trace_of(
    a: &E2eArgs,
    mode: &str,
    ctx: usize,
) -> Result<Option<Vec<usize>>, CliError> {
    let Some(path) = &a.accept_trace else {
        return Ok(None);
    };
    if mode == "ar" {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("--accept-trace {}: {e}", path.display())))?;
    let want = a.budget as f64 / ctx as f64;
    let mut trace = Vec::new();
    let mut seen = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = |what: &str| {
            CliError::Usage(format!(
                "--accept-trace {} line {}: {what}",
                path.display(),
                i + 1
            ))
        };
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(&format!("not JSON ({e})")))?;
        let cell = v.get("value").unwrap_or(&v);
        let selector = cell["selector"].as_str().unwrap_or_default();
        if selector.is_empty() {
            continue; // autoregressive
        }
        let (tokens, cctx) = (
            cell["budget_tokens"].as_u64().unwrap_or(0) as f64,
            cell["ctx"].as_u64().unwrap_or(0) as f64,
        );
        let fraction = if cctx > 0.0 { tokens / cctx } else { 0.0 };
        seen.push(if selector == "dense" {
            "dense".to_string()
        } else {
            format!("{selector}@{fraction:.4}")
        });
        let matches = if mode == "dense" {
            selector == "dense"
        } else {
            selector == mode && (fraction - want).abs() <= 0.01 * want
        };
        if !matches {
            continue;
        }
        let counts = cell["accepted"]
            .as_array()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                bad("a matching cell has no `accepted` trace (recorded before traces were kept?)")
            })?;
        for c in counts {
            let c = c
                .as_u64()
                .ok_or_else(|| bad("`accepted` holds a non-count"))?;
            trace.push((c as usize).min(a.gamma));
        }
    }
    if trace.is_empty() {
        return Err(CliError::Usage(format!(
            "--accept-trace {}: no cell for mode {mode} at budget fraction {want:.4} \
             (--budget {} of {ctx}); the file has: {}",
            path.display(),
            a.budget,
            seen.join(", ")
        )));
    }
    Ok(Some(trace))
}
