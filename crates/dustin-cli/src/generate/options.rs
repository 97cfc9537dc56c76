//! The options of `generate` that `dustin-bench` and the demo share: byte counts, the
//! `--config` file, selection policies and draft budgets, prompts and the model path.

use std::path::PathBuf;

use dustin_kernels::KernelOps;

use super::GenerateArgs;
use crate::CliError;

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
        path: format!("--config {}", p.display()),
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
            path: format!("--prompt-file {}", p.display()),
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
        // sequences number the --prompt texts first, then the files; a file is named too
        let what = match args.prompt_files.get(i.wrapping_sub(args.prompts.len())) {
            Some(f) if i >= args.prompts.len() => format!(" (prompt file {})", f.display()),
            _ => " (--prompt)".to_string(),
        };
        return Err(CliError::Usage(format!("prompt {i}{what} is empty")));
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
