//! `dustin-bench plot`: tokens/s against context length for each mode, from the JSON lines
//! `dustin-bench e2e --json` appends. One batch size and one
//! target depth (`target_layers`) per plot; where several rows share a (mode, context), the
//! last one read wins, so files are given oldest first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use dustin_eval::report::{plot_lines, Cell, Table};

use dustin_cli::CliError;

/// Arguments of `dustin-bench plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// JSON-lines files written by `dustin-bench e2e --json` (oldest first: a later row
    /// replaces an earlier one of the same mode and context).
    #[arg(long = "json", required = true, num_args = 1..)]
    pub json: Vec<PathBuf>,
    /// Batch size to plot (rows of other batch sizes are left out).
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Target layers to plot (`target_layers` of the rows; 28 for a whole Qwen2.5-7B, 20 for
    /// the first 20 of Qwen2.5-72B's 80). Default: the depth of the first matching row.
    #[arg(long)]
    pub target_layers: Option<usize>,
    /// Keep only rows whose JSON field KEY equals VALUE (repeatable; strings unquoted, for
    /// example `--only verify_kernel=flash --only ragged_accept=on`).
    #[arg(long = "only", value_name = "KEY=VALUE")]
    pub only: Vec<String>,
    /// SVG to write (the Markdown table goes to stdout, and beside the SVG as `.md`).
    #[arg(long)]
    pub out: PathBuf,
}

/// One measured point: `e2e`'s `tokens_per_sec` for a (mode, context).
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Mode (`ar`, `dense`, `dustin`, ...).
    pub mode: String,
    /// Context length in tokens.
    pub ctx: usize,
    /// Generated tokens per second over the batch.
    pub tokens_per_sec: f64,
}

/// Whether `line` is one of `e2e --profile`'s phase lines (a JSON object with a
/// `"profile"` key), which share the rows' file and are not points.
fn is_profile_line(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line)
        .ok()
        .is_some_and(|v| v.get("profile").is_some())
}

/// Reads the rows of `batch` (and `target_layers`, or the first matching row's depth) whose
/// fields match every `(key, value)` of `only` from `files`, later rows replacing earlier
/// ones of the same (mode, context) (how many were replaced goes to stderr). Returns the
/// points sorted by mode then context, and the depth used.
///
/// # Errors
/// [`CliError::Io`] for a file that cannot be read; [`CliError::Usage`] naming the file and
/// line of a row that is not a JSON object with `mode` (string), `ctx`, `batch`,
/// `target_layers` (integers) and `tokens_per_sec` (number), or when no row has this batch
/// (and depth), listing the (batch, depth) pairs the files hold.
pub fn read_points(
    files: &[PathBuf],
    batch: usize,
    target_layers: Option<usize>,
    only: &[(String, String)],
) -> Result<(Vec<Point>, usize), CliError> {
    let mut depth = target_layers;
    let mut replaced = 0usize;
    let mut found: Vec<(usize, usize)> = Vec::new();
    let mut by_key: BTreeMap<(String, usize), f64> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|source| CliError::Io {
            path: f.display().to_string(),
            source,
        })?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() || is_profile_line(line) {
                continue;
            }
            let row = parse_row(line, only).ok_or_else(|| {
                CliError::Usage(format!(
                    "{}:{}: expected an e2e JSON row with mode, ctx, batch, \
                     target_layers and tokens_per_sec",
                    f.display(),
                    i + 1
                ))
            })?;
            let Some((mode, ctx, b, layers, tps)) = row else {
                continue;
            };
            if !found.contains(&(b, layers)) {
                found.push((b, layers));
            }
            if b != batch {
                continue;
            }
            let want = *depth.get_or_insert(layers);
            if layers != want {
                continue;
            }
            // `null`: a rate that was not finite when written (serde_json writes NaN and
            // infinities as null); the point is left out, not the plot
            let Some(tps) = tps else {
                eprintln!(
                    "{}:{}: {mode} at {ctx} has no finite tokens_per_sec; left out",
                    f.display(),
                    i + 1
                );
                continue;
            };
            if by_key.insert((mode, ctx), tps).is_some() {
                replaced += 1;
            }
        }
    }
    if replaced > 0 {
        eprintln!(
            "{replaced} row(s) replaced by later rows of the same mode and context (--only \
             KEY=VALUE chooses among runs, e.g. --only verify_kernel=flash)"
        );
    }
    let Some(depth) = depth.filter(|_| !by_key.is_empty()) else {
        let held: Vec<String> = found
            .iter()
            .map(|(b, l)| format!("batch {b} x {l} layers"))
            .collect();
        return Err(CliError::Usage(format!(
            "no e2e row with batch {batch}{} in {} file(s); they hold: {}",
            target_layers.map_or(String::new(), |l| format!(" and {l} target layers")),
            files.len(),
            if held.is_empty() {
                "nothing".to_string()
            } else {
                held.join(", ")
            }
        )));
    };
    let points = by_key
        .into_iter()
        .map(|((mode, ctx), tokens_per_sec)| Point {
            mode,
            ctx,
            tokens_per_sec,
        })
        .collect();
    Ok((points, depth))
}

/// One row's fields (`mode`, `ctx`, `batch`, `target_layers`, `tokens_per_sec`).
type RowFields = (String, usize, usize, usize, Option<f64>);

/// `(mode, ctx, batch, target_layers, tokens_per_sec)` of one JSON row (`None` when it is
/// not such a row), or `Some(None)` when a field named in `only` differs from its value;
/// `tokens_per_sec` is `None` where it is `null`.
fn parse_row(line: &str, only: &[(String, String)]) -> Option<Option<RowFields>> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v.as_object()?;
    for (key, want) in only {
        let matches = match v.get(key) {
            Some(serde_json::Value::String(s)) => s == want,
            // numbers and booleans: VALUE read as JSON, numbers compared by value (`3`
            // matches a row's `3.0`: serde writes an f64 field with its decimal point)
            Some(x) => match (serde_json::from_str::<serde_json::Value>(want).ok(), x) {
                (Some(serde_json::Value::Number(a)), serde_json::Value::Number(b)) => {
                    a.as_f64() == b.as_f64()
                }
                (w, x) => w.as_ref() == Some(x),
            },
            None => false,
        };
        if !matches {
            return Some(None);
        }
    }
    let int = |k: &str| v.get(k)?.as_u64().map(|x| x as usize);
    let tps = match v.get("tokens_per_sec")? {
        serde_json::Value::Null => None,
        x => Some(x.as_f64()?),
    };
    Some(Some((
        v.get("mode")?.as_str()?.to_string(),
        int("ctx")?,
        int("batch")?,
        int("target_layers")?,
        tps,
    )))
}

/// `KEY=VALUE` pairs of `--only`.
///
/// # Errors
/// [`CliError::Usage`] naming an entry without `=` or with an empty key.
pub fn parse_only(only: &[String]) -> Result<Vec<(String, String)>, CliError> {
    only.iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(CliError::Usage(format!(
                "--only {kv}: expected KEY=VALUE, for example verify_kernel=flash"
            ))),
        })
        .collect()
}

/// The table of `points`: one row per context (ascending), one column per mode (in the
/// order modes first appear sorted by name), tokens/s; empty where a (mode, context) was
/// not measured.
pub fn points_table(points: &[Point], batch: usize, depth: usize) -> Table {
    let mut modes: Vec<&str> = Vec::new();
    let mut ctxs: Vec<usize> = Vec::new();
    for p in points {
        if !modes.contains(&p.mode.as_str()) {
            modes.push(&p.mode);
        }
        if !ctxs.contains(&p.ctx) {
            ctxs.push(p.ctx);
        }
    }
    ctxs.sort_unstable();
    let mut t = Table::new(
        std::iter::once("context".to_string()).chain(modes.iter().map(|m| format!("{m} tokens/s"))),
    )
    .with_title(format!("tokens/s at batch {batch}, {depth} target layers"))
    .with_precision(1);
    for &c in &ctxs {
        let mut row = vec![Cell::Text(c.to_string())];
        for m in &modes {
            row.push(
                points
                    .iter()
                    .find(|p| p.ctx == c && p.mode == *m)
                    .map_or(Cell::Empty, |p| Cell::Num(p.tokens_per_sec)),
            );
        }
        // every row has one cell per column by construction
        let _ = t.push_row(row);
    }
    t
}

/// Writes the plot (x: context in thousands of tokens, y: tokens/s, one line per mode) to
/// `svg` and the table beside it (`.md`).
///
/// # Errors
/// [`CliError::Usage`] carrying the plot's or the table's write error.
pub fn write_plot(
    svg: &Path,
    points: &[Point],
    batch: usize,
    depth: usize,
) -> Result<Table, CliError> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for p in points {
        let xy = (p.ctx as f64 / 1024.0, p.tokens_per_sec);
        match series.iter_mut().find(|(m, _)| *m == p.mode) {
            Some((_, pts)) => pts.push(xy),
            None => series.push((p.mode.clone(), vec![xy])),
        }
    }
    plot_lines(
        svg,
        &format!("Decoding speed by mode, batch {batch}, {depth} target layers"),
        "context (thousands of tokens)",
        "tokens/s",
        &series,
    )
    .map_err(|e| CliError::Usage(e.to_string()))?;
    let table = points_table(points, batch, depth);
    table
        .write_markdown(svg.with_extension("md"))
        .map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(table)
}

/// Runs `dustin-bench plot`.
///
/// # Errors
/// [`CliError::Usage`] for an `--out` not ending in `.svg`; see [`read_points`] and
/// [`write_plot`].
pub fn run(a: PlotArgs) -> Result<(), CliError> {
    // the table goes to the same path with `.md`: an `--out` ending in `.md` would be
    // overwritten by it
    if a.out.extension().and_then(|e| e.to_str()) != Some("svg") {
        return Err(CliError::Usage(format!(
            "--out {}: expected a path ending in .svg",
            a.out.display()
        )));
    }
    let only = parse_only(&a.only)?;
    // the SVG and its table must not overwrite the rows they are drawn from
    let md = a.out.with_extension("md");
    for out in [&a.out, &md] {
        if let Some(j) = a.json.iter().find(|j| dustin_cli::same_file(out, j)) {
            return Err(CliError::Usage(format!(
                "--out {}: writes {}, which is the --json input {}; expected another path",
                a.out.display(),
                out.display(),
                j.display()
            )));
        }
    }
    let (points, depth) = read_points(&a.json, a.batch, a.target_layers, &only)?;
    let table = write_plot(&a.out, &points, a.batch, depth)?;
    print!("{}", table.to_markdown());
    eprintln!(
        "wrote {} and {}",
        a.out.display(),
        a.out.with_extension("md").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &str, ctx: usize, batch: usize, layers: usize, tps: f64) -> String {
        format!(
            "{{\"mode\":\"{mode}\",\"ctx\":{ctx},\"batch\":{batch},\"target_layers\":{layers},\"tokens_per_sec\":{tps},\"iter_ms\":1.0}}"
        )
    }

    /// A fresh scratch folder of this test process.
    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("dustin-bench-plot-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p
    }

    #[test]
    fn later_rows_win_and_other_batches_are_left_out() {
        let dir = scratch("rows");
        let old = write(
            &dir,
            "old.jsonl",
            &[
                row("ar", 32768, 8, 28, 100.0),
                row("dense", 32768, 8, 28, 40.0),
                row("ar", 8192, 8, 28, 300.0),
                row("ar", 32768, 1, 28, 20.0),
                row("ar", 32768, 8, 20, 90.0),
            ],
        );
        let new = write(&dir, "new.jsonl", &[row("ar", 32768, 8, 28, 455.1)]);
        let (pts, depth) = read_points(&[old, new], 8, None, &[]).unwrap();
        assert_eq!(depth, 28);
        let get = |m: &str, c: usize| {
            pts.iter()
                .find(|p| p.mode == m && p.ctx == c)
                .map(|p| p.tokens_per_sec)
        };
        assert_eq!(get("ar", 32768), Some(455.1));
        assert_eq!(get("ar", 8192), Some(300.0));
        assert_eq!(get("dense", 32768), Some(40.0));
        assert_eq!(
            pts.len(),
            3,
            "batch 1 and the 20-layer row are left out: {pts:?}"
        );

        let svg = dir.join("plot.svg");
        let table = write_plot(&svg, &pts, 8, depth).unwrap();
        let md = table.to_markdown();
        // contexts ascending, dense missing at 8k
        let i8 = md.find("| 8192").unwrap();
        let i32 = md.find("| 32768").unwrap();
        assert!(i8 < i32, "{md}");
        assert!(md.contains("455.1"), "{md}");
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            text.contains("<svg") && text.contains("dense"),
            "svg without the series"
        );
        assert!(std::fs::read_to_string(svg.with_extension("md"))
            .unwrap()
            .contains("455.1"));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// `e2e --profile --json` writes phase lines beside the rows: they are skipped,
    /// not taken for bad rows.
    #[test]
    fn profile_lines_are_skipped() {
        let dir = scratch("profile");
        let f = write(
            &dir,
            "prof.jsonl",
            &[
                row("ar", 32768, 8, 28, 455.1),
                "{\"profile\":\"ar\",\"ctx\":32768,\"batch\":8,\"iterations\":6,\"phases\":[]}"
                    .into(),
            ],
        );
        let (pts, _) = read_points(std::slice::from_ref(&f), 8, None, &[]).unwrap();
        assert_eq!(pts.len(), 1);
        assert_eq!(pts[0].tokens_per_sec, 455.1);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn only_keeps_the_rows_of_one_run() {
        let dir = scratch("only");
        let tagged = |tps: f64, kern: &str| {
            row("ar", 32768, 8, 28, tps).replace('}', &format!(",\"verify_kernel\":\"{kern}\"}}"))
        };
        let f = write(
            &dir,
            "runs.jsonl",
            &[tagged(455.1, "flash"), tagged(379.0, "split")],
        );
        let pick = |kv: &str| {
            let only = parse_only(&[kv.to_string()]).unwrap();
            let (pts, _) = read_points(std::slice::from_ref(&f), 8, None, &only).unwrap();
            pts[0].tokens_per_sec
        };
        assert_eq!(pick("verify_kernel=flash"), 455.1);
        assert_eq!(pick("verify_kernel=split"), 379.0);
        // numbers compare as JSON values
        assert_eq!(pick("ctx=32768"), 379.0);
        // and by value: `3` picks a row whose f64 field reads `3.0`, `0` one that reads `0.0`
        let sig = |tps: f64, v: &str| {
            row("dustin", 32768, 8, 28, tps).replace('}', &format!(",\"accept_drop_sigmas\":{v}}}"))
        };
        let g = write(&dir, "sig.jsonl", &[sig(260.0, "3.0"), sig(250.0, "0.0")]);
        let pick_sig = |kv: &str| {
            let only = parse_only(&[kv.to_string()]).unwrap();
            read_points(std::slice::from_ref(&g), 8, None, &only)
                .unwrap()
                .0[0]
                .tokens_per_sec
        };
        assert_eq!(pick_sig("accept_drop_sigmas=3"), 260.0);
        assert_eq!(pick_sig("accept_drop_sigmas=0"), 250.0);
        assert_eq!(pick_sig("accept_drop_sigmas=3.0"), 260.0);
        let only = parse_only(&["verify_kernel=auto".to_string()]).unwrap();
        assert!(read_points(std::slice::from_ref(&f), 8, None, &only).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_rows_and_missing_batches_name_the_input() {
        let dir = scratch("bad");
        let bad = write(
            &dir,
            "bad.jsonl",
            &[row("ar", 32768, 8, 28, 1.0), "{\"mode\":1}".into()],
        );
        let e = read_points(std::slice::from_ref(&bad), 8, None, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.jsonl:2"), "{e}");
        let good = write(&dir, "good.jsonl", &[row("ar", 32768, 1, 28, 1.0)]);
        let e = read_points(std::slice::from_ref(&good), 8, None, &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("batch 8") && e.contains("batch 1 x 28 layers"),
            "{e}"
        );
        let e = read_points(&[dir.join("absent.jsonl")], 8, None, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent.jsonl"), "{e}");
        // a null rate leaves that point out, not the file
        let null = write(
            &dir,
            "null.jsonl",
            &[
                row("ar", 32768, 8, 28, 7.5),
                "{\"mode\":\"dense\",\"ctx\":32768,\"batch\":8,\"target_layers\":28,\"tokens_per_sec\":null}".into(),
            ],
        );
        let (pts, _) = read_points(&[null], 8, None, &[]).unwrap();
        assert_eq!(pts.len(), 1);
        assert_eq!(pts[0].tokens_per_sec, 7.5);
        assert!(parse_only(&["verify_kernel".into()]).is_err());
        assert!(parse_only(&["=flash".into()]).is_err());
        let e = run(PlotArgs {
            json: vec![good],
            batch: 1,
            target_layers: None,
            only: Vec::new(),
            out: dir.join("table.md"),
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("table.md") && e.contains(".svg"), "{e}");
        // an --out whose SVG or table is a --json input: refused, the rows left as they were
        let rows = write(&dir, "rows.svg", &[row("ar", 32768, 8, 28, 7.5)]);
        let before = std::fs::read_to_string(&rows).unwrap();
        let e = run(PlotArgs {
            json: vec![rows.clone()],
            batch: 8,
            target_layers: None,
            only: Vec::new(),
            out: rows.clone(),
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("which is the --json input"), "{e}");
        assert_eq!(std::fs::read_to_string(&rows).unwrap(), before);
        std::fs::remove_dir_all(&dir).ok();
    }
}
