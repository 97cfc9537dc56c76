//! Project tasks: `cargo run -p xtask -- <task>`.
//!
//! - `stage-gpu`: builds the CUDA binary (release, `--features cuda`) and copies it with the
//!   configs a GPU run needs into `.device/` (git-ignored), for the device machine.
//! - `fetch-model`: fetches the default model into the cache (same as `dustin fetch-model`).
//! - `gpu-kernels`: builds `dustin-kernels-gpu` (release, `--features cuda`), stages it with
//!   `scripts/sdpa_verify_bench.py` into `.device/`, and prints the one `run` command that
//!   checks every kernel against the float64 references and runs the benchmark (ours and
//!   PyTorch SDPA) on the GPU machine.

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
    /// Build and stage the dustin-kernels GPU check + benchmark; print the device command.
    GpuKernels {
        /// Benchmark only B=8, 32k (both models).
        #[arg(long)]
        quick: bool,
    },
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

/// The command the device machine runs (from the repository root, `.device` carried).
fn gpu_kernels_command(quick: bool) -> String {
    let q = if quick { " --quick" } else { "" };
    format!(
        "set -o pipefail; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt; \
./.device/dustin-kernels-gpu check 2>&1 | tee $OUT/check.txt; \
./.device/dustin-kernels-gpu bench{q} --json $OUT/bench.jsonl 2>&1 | tee $OUT/bench.txt; \
PYTHONUNBUFFERED=1 python3 .device/sdpa_verify_bench.py{q} 2>&1 | tee $OUT/sdpa.jsonl"
    )
}

fn gpu_kernels(quick: bool) -> Result<(), String> {
    let root = root();
    run(Command::new("cargo").current_dir(&root).args([
        "build",
        "--release",
        "--features",
        "cuda",
        "-p",
        "dustin-kernels",
        "--bin",
        "dustin-kernels-gpu",
    ]))?;
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    // stage into the main checkout's .device when run from a worktree (the device machine
    // receives the session's checkout), else into this one's
    let dev = std::env::var("DUSTIN_DEVICE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join(".device"));
    std::fs::create_dir_all(&dev).map_err(|e| e.to_string())?;
    let bin = target.join("release/dustin-kernels-gpu");
    let dst = dev.join("dustin-kernels-gpu");
    std::fs::copy(&bin, &dst).map_err(|e| format!("{}: {e}", bin.display()))?;
    let _ = Command::new("strip").arg(&dst).status();
    let script = root.join("scripts/sdpa_verify_bench.py");
    std::fs::copy(&script, dev.join("sdpa_verify_bench.py"))
        .map_err(|e| format!("{}: {e}", script.display()))?;
    println!("staged {}", dev.display());
    println!("run on the GPU machine (carry [\".device\"], about 3 minutes):");
    println!("{}", gpu_kernels_command(quick));
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match cli.task {
        Task::StageGpu => stage_gpu(),
        Task::GpuKernels { quick } => gpu_kernels(quick),
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
