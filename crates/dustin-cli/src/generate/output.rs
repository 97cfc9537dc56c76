//! What a run leaves: the `--profile` table, `--output` (checked before the run, written
//! after it) and the texts printed.

use dustin_qwen::generate::FinishReason;
use dustin_qwen::Tokenizer;

use super::GenerateArgs;
use crate::CliError;

/// The decode-stage phases recorded by `--profile`, per model, largest first.
pub(super) fn print_profile() {
    let mut rows = dustin_qwen::profile::snapshot();
    // prefill first, then decode steps and verifications; the slowest phases first in each
    rows.sort_by(|a, b| {
        (b.stage == "prefill")
            .cmp(&(a.stage == "prefill"))
            .then(a.model.cmp(b.model))
            .then(b.secs.total_cmp(&a.secs))
    });
    eprintln!("profile (device waited for around each phase):");
    eprintln!("| stage | model | phase | calls | seconds |");
    eprintln!("|---|---|---|---:|---:|");
    for p in rows {
        eprintln!(
            "| {} | {} | {} | {} | {:.3} |",
            p.stage, p.model, p.phase, p.calls, p.secs
        );
    }
}

/// Checks before a run that `--output path` can be written: not a folder, its folder
/// existing, not one of the `inputs` (the `--prompt-file`s, `--chat-file`s, `--config` and
/// the model files, which it would overwrite; compared as files, so a hard link counts), not
/// an existing file inside an input folder (an HF model directory), and
/// the file openable for writing (an existing file is left as it is until the run ends; a
/// file made for the check is removed again).
///
/// # Errors
/// [`CliError::Usage`] naming `--output` and the reason.
pub(super) fn check_output_path(
    path: &std::path::Path,
    inputs: &[std::path::PathBuf],
) -> Result<(), CliError> {
    let bad = |why: String| {
        Err(CliError::Usage(format!(
            "--output {}: {why}",
            path.display()
        )))
    };
    if path.is_dir() {
        return bad("is a folder; expected a file path".into());
    }
    if let Some(i) = inputs.iter().find(|i| crate::same_file(path, i)) {
        return bad(format!(
            "is the input file {}; expected another path (it would be overwritten)",
            i.display()
        ));
    }
    if let Some(d) = inputs
        .iter()
        .find(|d| d.is_dir() && path.is_file() && inside(path, d))
    {
        return bad(format!(
            "is a file of the model folder {}; expected a path outside it (it would be \
             overwritten)",
            d.display()
        ));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if parent.is_file() {
        return bad(format!("{} is a file, not a folder", parent.display()));
    }
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

/// Whether the existing file `file` lies under the folder `dir` (canonical paths).
fn inside(file: &std::path::Path, dir: &std::path::Path) -> bool {
    match (file.canonicalize(), dir.canonicalize()) {
        (Ok(f), Ok(d)) => f.starts_with(d),
        _ => false,
    }
}

/// One sequence of `--output`.
#[derive(Debug, serde::Serialize)]
pub(super) struct SeqOut<'a> {
    index: usize,
    finish: &'static str,
    text: String,
    tokens: &'a [u32],
}

/// Prints each sequence's finish reason, writes `--output`, and turns a cancelled run into
/// [`CliError::Cancelled`] (exit code 130) once everything is written.
pub(super) fn finish_run(
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
                    text: tok.decode(&text_ids(t, &tok.eos_ids))?,
                    tokens: t,
                })
            })
            .collect::<Result<Vec<_>, CliError>>()?;
        let json = serde_json::json!({ "sequences": seqs });
        let text = serde_json::to_string_pretty(&json)
            .map_err(|e| CliError::Usage(format!("--output: {e}")))?;
        if let Err(source) = std::fs::write(path, text.clone() + "\n") {
            // keep what was generated: the JSON on standard output, then the error
            crate::stdout::line(&text);
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

/// Whether `e` is a prefill stopped by the cancel token (Ctrl-C before the first token),
/// however the model or the speculative loop wrapped it.
pub(super) fn prefill_cancelled(e: &CliError) -> bool {
    use dustin_core::CoreError::Cancelled;
    use dustin_qwen::QwenError;
    use dustin_spec::SpecError;
    matches!(
        e,
        CliError::Core(Cancelled { .. })
            | CliError::Model(QwenError::Core(Cancelled { .. }))
            | CliError::Spec(SpecError::Core(Cancelled { .. }))
            | CliError::Spec(SpecError::Model(QwenError::Core(Cancelled { .. })))
    )
}

/// A run that failed with `e`: a prefill stopped by Ctrl-C ends as any cancelled run does
/// (every one of the `n` sequences `cancelled` with no tokens, `--output` written, then
/// [`CliError::Cancelled`]); any other error is returned as it is.
pub(super) fn after_error(
    args: &GenerateArgs,
    tok: &Tokenizer,
    n: usize,
    e: CliError,
) -> Result<(), CliError> {
    if !prefill_cancelled(&e) {
        return Err(e);
    }
    eprintln!("cancelled before the first token: nothing was generated");
    finish_run(
        args,
        tok,
        &vec![Vec::new(); n],
        &vec![FinishReason::Cancelled; n],
    )
}

/// Prints the texts of every sequence but the first (which was streamed), each under a
/// `--- sequence i ---` header.
///
/// # Errors
/// [`CliError::Tokenizer`](crate::CliError) when a sequence's tokens do not decode.
pub(super) fn print_rest(tok: &Tokenizer, tokens: &[Vec<u32>]) -> Result<(), CliError> {
    for (i, t) in tokens.iter().enumerate().skip(1) {
        crate::stdout::line(&format!(
            "--- sequence {i} ---\n{}",
            tok.decode(&text_ids(t, &tok.eos_ids))?
        ));
    }
    Ok(())
}

/// The ids of `ids` that make text: all but the stop tokens `eos` (EOS and, with `--chat`,
/// the template's end-of-turn tokens such as `<|im_end|>`), which end a sequence without
/// being part of what it says (as the server's texts). `--output`'s `tokens` keep them.
pub(super) fn text_ids(ids: &[u32], eos: &[u32]) -> Vec<u32> {
    ids.iter().copied().filter(|t| !eos.contains(t)).collect()
}

#[cfg(test)]
mod tests {
    use super::{prefill_cancelled, text_ids};
    use crate::CliError;
    use dustin_core::CoreError;
    use dustin_qwen::QwenError;
    use dustin_spec::SpecError;

    #[test]
    fn a_cancelled_prefill_is_found_however_it_is_wrapped() {
        let c = || CoreError::Cancelled { during: "prefill" };
        // autoregressive decoding returns the model's error; the speculative loop its own,
        // around the model's or the core's
        assert!(prefill_cancelled(&CliError::Model(QwenError::Core(c()))));
        assert!(prefill_cancelled(&CliError::Spec(SpecError::Core(c()))));
        assert!(prefill_cancelled(&CliError::Spec(SpecError::Model(
            QwenError::Core(c())
        ))));
        assert!(prefill_cancelled(&CliError::Core(c())));
        // any other error stays an error
        assert!(!prefill_cancelled(&CliError::Core(CoreError::Model(
            "cancelled".into()
        ))));
        assert!(!prefill_cancelled(&CliError::Usage("prefill".into())));
    }

    #[test]
    fn stop_tokens_leave_the_text() {
        // Qwen2.5's `<|im_end|>` (151645) and `<|endoftext|>` (151643), from its
        // tokenizer_config.json
        let eos = [151645, 151643];
        assert_eq!(text_ids(&[73, 88, 151645], &eos), vec![73, 88]);
        assert_eq!(text_ids(&[151643], &eos), Vec::<u32>::new());
        assert_eq!(text_ids(&[5, 6], &eos), vec![5, 6]);
    }
}
