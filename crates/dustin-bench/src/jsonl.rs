//! JSON-lines output of the instruments (`--json PATH`): one row appended per line.

use dustin_cli::CliError;

/// Appends `row` as one JSON line to `path` (created if missing).
///
/// # Errors
/// [`CliError::Io`] naming the file.
pub fn append_json<T: serde::Serialize>(path: &std::path::Path, row: &T) -> Result<(), CliError> {
    use std::io::Write;
    let line = serde_json::to_string(row).map_err(|e| CliError::Usage(format!("json: {e}")))?;
    let mut f = open_append(path)?;
    writeln!(f, "{line}").map_err(|source| CliError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Checks before a run that `--json PATH` is none of the run's `inputs` (the model configs,
/// an acceptance trace: rows appended to one would leave it unreadable) and can be appended
/// to (creating it), so a bad path is reported before anything is measured rather than after
/// the first row.
///
/// # Errors
/// [`CliError::Usage`] naming `--json` and the input; [`CliError::Io`] naming the path.
pub fn check_json_path(
    path: Option<&std::path::Path>,
    inputs: &[&std::path::Path],
) -> Result<(), CliError> {
    let Some(p) = path else { return Ok(()) };
    if let Some(i) = inputs.iter().find(|i| dustin_cli::same_file(p, i)) {
        return Err(CliError::Usage(format!(
            "--json {}: is the input file {}; expected another path (rows appended to it \
             would leave it unreadable)",
            p.display(),
            i.display()
        )));
    }
    open_append(p).map(drop)
}

/// `path` opened for appending (created if missing).
///
/// # Errors
/// [`CliError::Io`] naming the file.
fn open_append(path: &std::path::Path) -> Result<std::fs::File, CliError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| CliError::Io {
            path: path.display().to_string(),
            source,
        })
}
