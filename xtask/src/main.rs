//! Project tasks: `cargo run -p xtask -- <task>`.
//!
//! - `stage-gpu`: builds the CUDA binary (release, `--features cuda`) and copies it with the
//!   configs a GPU run needs into `.device/` (git-ignored), for the device machine.
//! - `fetch-model`: fetches the default model into the cache (same as `dustin fetch-model`).

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Build the CUDA binary and stage it in .device/ with the Qwen2.5 configs and scripts.
    StageGpu,
    /// Fetch the default model (SmolLM2-135M-Instruct GGUF) into the cache.
    FetchModel,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let st = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed: {st}"))
    }
}

fn stage_gpu() -> Result<(), String> {
    let root = root();
    run(Command::new("cargo").current_dir(&root).args([
        "build",
        "--release",
        "--features",
        "cuda",
        "-p",
        "dustin-cli",
    ]))?;
    let dev = root.join(".device");
    std::fs::create_dir_all(dev.join("configs")).map_err(|e| e.to_string())?;
    let bin = root.join("target/release/dustin");
    std::fs::copy(&bin, dev.join("dustin")).map_err(|e| format!("{}: {e}", bin.display()))?;
    let _ = Command::new("strip").arg(dev.join("dustin")).status();
    let cfgs = root.join("../shared/data/qwen2.5");
    if let Ok(rd) = std::fs::read_dir(&cfgs) {
        for e in rd.flatten() {
            let _ = std::fs::copy(e.path(), dev.join("configs").join(e.file_name()));
        }
    }
    if let Ok(rd) = std::fs::read_dir(root.join("scripts")) {
        for e in rd.flatten() {
            let _ = std::fs::copy(e.path(), dev.join(e.file_name()));
        }
    }
    println!("staged {}", dev.display());
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match cli.task {
        Task::StageGpu => stage_gpu(),
        Task::FetchModel => run(Command::new("cargo").current_dir(root()).args([
            "run",
            "--release",
            "-p",
            "dustin-cli",
            "--",
            "fetch-model",
        ])),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
