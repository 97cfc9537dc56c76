//! Project tasks: `cargo run -p xtask -- <task>`.
//!
//! - `stage-gpu`: builds the CUDA `dustin-bench` binary (the instruments the device scripts
//!   run; release, `--features cuda,host-profile`) and stages it gzipped (`stage_bin`) with
//!   the configs a GPU run needs into `.device/` (git-ignored), for the device machine;
//!   `scripts/gpu_mem.sh` unpacks it there.
//! - `fetch-model`: fetches the default model into the cache (same as `dustin fetch-model`).
//! - `gpu-kernels`: builds `dustin-kernels-gpu` (release, `--features cuda`), stages it
//!   gzipped with `scripts/sdpa_verify_bench.py` and `scripts/gpu_mem.sh` into `.device/`,
//!   and prints the one `run` command (which unpacks it first) that
//!   checks every kernel against the float64 references and runs the benchmark (ours and
//!   PyTorch SDPA) on the GPU machine.
//! - `gpu-real`: builds the CUDA `dustin` binary, stages it with the shared code files, PG-19
//!   books and LongBench samples and the device scripts into `.device/`, cuts the pair's cached
//!   GGUF files into `.w/` parts (`scripts/gpu_real_pair.sh split`) and prints the runs that
//!   carry them and evaluate the pair with its real weights on the GPU machine.
//! - `fuzz-smoke`: runs each `cargo fuzz` target of `fuzz/` briefly (30 s each by default),
//!   seeding its corpus from the test fixtures; needs a nightly toolchain and
//!   `cargo install cargo-fuzz`.

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
    /// Build the CUDA dustin-bench binary and stage it in .device/ with the Qwen2.5 configs and
    /// scripts.
    StageGpu,
    /// Fetch the default model (`dustin fetch-model`) into the cache.
    FetchModel,
    /// Build and stage the dustin-kernels GPU check + benchmark; print the device command.
    GpuKernels {
        /// Benchmark only B=8, 32k (both models).
        #[arg(long)]
        quick: bool,
    },
    /// Build and stage the CUDA `dustin-bench` binary (gzipped; a `dustin-kernels-gpu` staged
    /// by `gpu-kernels` stays beside it), the Qwen2.5 configs and the device scripts for the
    /// end-to-end benchmark; print the device commands (`scripts/gpu_e2e.sh`).
    GpuE2e,
    /// Build and stage the CUDA `dustin` binary, the evaluation data and scripts, cut the
    /// pair's GGUF files into parts; print the device runs (`scripts/gpu_real_pair.sh`).
    GpuReal,
    /// Run each fuzz target of fuzz/ for a short time (needs nightly and cargo-fuzz).
    FuzzSmoke {
        /// Seconds per target.
        #[arg(long, default_value_t = 30)]
        secs: u64,
        /// Run only this target (gguf, safetensors, config_json, longbench).
        #[arg(long)]
        target: Option<String>,
    },
}

/// The fuzz targets and the files (relative to the repository root) that seed their corpora.
const FUZZ_TARGETS: [(&str, &[&str]); 4] = [
    (
        "gguf",
        &[
            "crates/dustin-qwen/tests/fixtures/gguf/tiny_llama.gguf",
            "crates/dustin-qwen/tests/fixtures/gguf/tiny_qwen2.gguf",
            "crates/dustin-qwen/tests/fixtures/gguf/quants.gguf",
        ],
    ),
    ("safetensors", &["fuzz/seeds/safetensors"]),
    (
        "config_json",
        &[
            "crates/dustin-qwen/tests/fixtures/parity/llama/config.json",
            "crates/dustin-qwen/tests/fixtures/parity/qwen2-gqa7/config.json",
            "crates/dustin-qwen/tests/fixtures/parity/qwen2-tied/config.json",
        ],
    ),
    ("longbench", &["fuzz/seeds/longbench"]),
];

/// Copies the seed files (or the files of seed directories) into `fuzz/corpus/<target>/`.
fn seed_corpus(root: &Path, target: &str, seeds: &[&str]) -> Result<PathBuf, String> {
    let corpus = root.join("fuzz/corpus").join(target);
    std::fs::create_dir_all(&corpus).map_err(|e| format!("{}: {e}", corpus.display()))?;
    for s in seeds {
        let p = root.join(s);
        let files: Vec<PathBuf> = if p.is_dir() {
            std::fs::read_dir(&p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .flatten()
                .map(|e| e.path())
                .collect()
        } else {
            vec![p]
        };
        for f in files {
            let name = f
                .file_name()
                .ok_or_else(|| format!("{}: not a file", f.display()))?;
            let dst = corpus.join(format!("seed-{}", name.to_string_lossy()));
            std::fs::copy(&f, &dst).map_err(|e| format!("{}: {e}", f.display()))?;
        }
    }
    Ok(corpus)
}

/// `cargo +nightly fuzz run <t> fuzz/corpus/<t> -- -max_total_time=<secs>` for each target.
fn fuzz_smoke(secs: u64, only: Option<&str>) -> Result<(), String> {
    let root = root();
    let mut ran = 0;
    for (target, seeds) in FUZZ_TARGETS {
        if only.is_some_and(|o| o != target) {
            continue;
        }
        let corpus = seed_corpus(&root, target, seeds)?;
        println!("fuzz-smoke: {target} for {secs} s");
        // the nightly, instrumented build keeps to fuzz/target, whatever the workspace uses
        run(Command::new("cargo")
            .current_dir(root.join("fuzz"))
            .env_remove("CARGO_TARGET_DIR")
            .args([
                "+nightly".to_string(),
                "fuzz".into(),
                "run".into(),
                // the code under test is safe Rust: no sanitizer, debug assertions on (overflow
                // checks) instead
                "--sanitizer=none".into(),
                "--debug-assertions".into(),
                target.into(),
                corpus.display().to_string(),
                "--".into(),
                format!("-max_total_time={secs}"),
                "-rss_limit_mb=4096".into(),
            ]))?;
        ran += 1;
    }
    if ran == 0 {
        return Err(format!(
            "no fuzz target named {only:?}; targets: gguf, safetensors, config_json, longbench"
        ));
    }
    Ok(())
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

/// Cargo's target folder (`CARGO_TARGET_DIR`, else `target/`).
fn target_dir(root: &Path) -> PathBuf {
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"))
}

/// The folder staged for the device machine: `DUSTIN_DEVICE_DIR` (the main checkout's
/// `.device` when run from a worktree: the device machine receives the main checkout),
/// else this checkout's `.device`; created with its `configs/`.
fn device_dir(root: &Path) -> Result<PathBuf, String> {
    let dev = std::env::var("DUSTIN_DEVICE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join(".device"));
    std::fs::create_dir_all(dev.join("configs")).map_err(|e| e.to_string())?;
    Ok(dev)
}

/// Stages the release binary `name` as `dev/name.gz`: debug info stripped, function names
/// kept (`dustin-bench e2e --host-profile` resolves its samples with them), gzip-compressed.
/// The device tool carries at most 64 MiB: the CUDA binary of the instruments (54 MB
/// unstripped, 42 MB stripped, 2026-11-30, when `dustin` held them) and `dustin-kernels-gpu`
/// (37 MB) did not fit side by side; compressed they took 12 + 7 MB. The device scripts
/// unpack them (`scripts/gpu_mem.sh`, `unpack`).
fn stage_bin(root: &Path, dev: &Path, name: &str) -> Result<(), String> {
    let src = target_dir(root).join("release").join(name);
    let tmp = dev.join(name);
    std::fs::copy(&src, &tmp).map_err(|e| format!("{}: {e}", src.display()))?;
    let _ = Command::new("strip")
        .arg("--strip-debug")
        .arg(&tmp)
        .status();
    // gzip -f replaces `tmp` with `tmp.gz`
    run(Command::new("gzip").arg("-6").arg("-f").arg(&tmp))
}

fn stage_gpu() -> Result<(), String> {
    let root = root();
    let dev = build_and_stage(&root, "cuda,host-profile", "dustin-bench", "dustin-bench")?;
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
. .device/gpu_mem.sh; unpack .device; \
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
    let dev = device_dir(&root)?;
    stage_bin(&root, &dev, "dustin-kernels-gpu")?;
    for script in ["sdpa_verify_bench.py", "gpu_mem.sh"] {
        let src = root.join("scripts").join(script);
        std::fs::copy(&src, dev.join(script)).map_err(|e| format!("{}: {e}", src.display()))?;
    }
    println!("staged {}", dev.display());
    println!("run on the GPU machine (carry [\".device\"], about 3 minutes):");
    println!("{}", gpu_kernels_command(quick));
    Ok(())
}

/// Builds the CUDA `dustin-bench` binary (feature `host-profile` too, for `dustin-bench e2e
/// --host-profile`) and stages it, the Qwen2.5 configs and `scripts/` into the device folder
/// (`DUSTIN_DEVICE_DIR`, else `.device`).
/// A `dustin-kernels-gpu` staged by `gpu-kernels` stays beside it (see [`stage_bin`]).
fn gpu_e2e() -> Result<(), String> {
    let root = root();
    let dev = build_and_stage(&root, "cuda,host-profile", "dustin-bench", "dustin-bench")?;
    copy_dir(&root.join("../shared/data/qwen2.5"), &dev.join("configs"))?;
    copy_dir(&root.join("scripts"), &dev)?;
    // the acceptance the pair's rows replay (`scripts/gpu_pair.sh`): recorded with the real
    // weights on the CPU by `dustin eval acceptance` on code at 8k tokens
    let trace = root.join("docs/perf/pair-acceptance-trace-code-8k.jsonl");
    std::fs::copy(&trace, dev.join("acceptance-trace.jsonl"))
        .map_err(|e| format!("{}: {e}", trace.display()))?;
    println!("staged {}", dev.display());
    println!("run on the GPU machine (carry [\".device\"]), one call each, under 10 minutes:");
    println!("  bash .device/gpu_pair.sh check  # kernel checks, then the Qwen2.5-Coder pair's shapes at 32k, B 1/8/16, every mode, under the recorded acceptance trace");
    println!("  bash .device/gpu_pair.sh rest   # 72B and 7B shapes with the 0.5B draft, HF peers, the pair at 1/8 and at 8k");
    println!("  bash .device/gpu_e2e.sh selectab # (with gpu-kernels staged) both top-k kernels checked and timed; 7B 32k B 8 dense/dustin, estimator kernels off/on x top-k block/warp");
    println!("  bash .device/gpu_e2e.sh dropab  # 7B 32k B 8 and 72B shapes (20 layers) B 8/16: dustin's early refresh with and without the noise test (--accept-drop-sigmas 0,3)");
    println!("  bash .device/gpu_e2e.sh final   # 32k: 7B B 1/8/16, 72B shapes (20 layers) B 8");
    println!(
        "  bash .device/gpu_prefill.sh ttft  # time to first token, 7B, 32k, B 1/8, ours and HF"
    );
    println!("  bash .device/gpu_prefill.sh kernels  # (with gpu-kernels staged) check, bench, gemm, PyTorch");
    println!(
        "  bash .device/gpu_e2e.sh 7b      # kernels check + Qwen2.5-7B / 0.5B, 8k-32k, B 1/8/16"
    );
    println!("  bash .device/gpu_e2e.sh 72b     # Qwen2.5-72B shapes (20 layers), 32k, B 8/16 + HF peers");
    println!(
        "  bash .device/gpu_subspec.sh 7b  # SubSpec: offloaded AR vs substitute draft at 8 GiB"
    );
    println!("  bash .device/gpu_tp.sh all      # 2+ GPUs (kind nvidia-h200-x2): tp-check, 72B 80 layers at 32k");
    Ok(())
}

/// [`build_release`] of `package`, then its binary `bin` staged ([`stage_bin`]) in the
/// device folder ([`device_dir`]), which it returns.
fn build_and_stage(
    root: &Path,
    features: &str,
    package: &str,
    bin: &str,
) -> Result<PathBuf, String> {
    build_release(root, features, package)?;
    let dev = device_dir(root)?;
    stage_bin(root, &dev, bin)?;
    Ok(dev)
}

/// `cargo build --release --features FEATURES -p PACKAGE` in the repository root.
fn build_release(root: &Path, features: &str, package: &str) -> Result<(), String> {
    run(Command::new("cargo").current_dir(root).args([
        "build",
        "--release",
        "--features",
        features,
        "-p",
        package,
    ]))
}

/// Copies every file of `src` into `dst` (created; one level, no subfolders).
fn copy_dir(src: &Path, dst: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    for e in std::fs::read_dir(src)
        .map_err(|e| format!("{}: {e}", src.display()))?
        .flatten()
    {
        if e.path().is_file() {
            std::fs::copy(e.path(), dst.join(e.file_name()))
                .map_err(|err| format!("{}: {err}", e.path().display()))?;
        }
    }
    Ok(())
}

/// Builds the CUDA `dustin` binary and stages what `scripts/gpu_real_pair.sh` needs on the
/// GPU machine: the binary, the shared evaluation data (code, PG-19, LongBench) and the
/// scripts in `.device/`, and the pair's GGUF files cut into `.w/` parts (fetched first with
/// `dustin fetch-model` if missing), and the `gguf` wheel the HF peers load the GGUF files
/// with into `.device/whl/` (pip; where pip fails the HF rows are skipped there).
fn gpu_real() -> Result<(), String> {
    let root = root();
    let dev = build_and_stage(&root, "cuda", "dustin-cli", "dustin")?;
    let data = root.join("../shared/data");
    for sub in ["code", "pg19", "longbench"] {
        copy_dir(&data.join(sub), &dev.join("data").join(sub))?;
    }
    copy_dir(&root.join("scripts"), &dev)?;
    for name in ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"] {
        run(
            Command::new(target_dir(&root).join("release").join("dustin"))
                .current_dir(&root)
                .args(["fetch-model", name]),
        )?;
    }
    run(Command::new("bash")
        .current_dir(&root)
        .args(["scripts/gpu_real_pair.sh", "split"]))?;
    // the batched runs' prompts: 16 windows of 32,000 tokens of PG-19 and code, cut with the
    // target's own vocabulary (needs the `gguf` and `tokenizers` packages: `PYTHON` names an
    // interpreter that has them; without them the job's `batch` step is skipped)
    let models = std::env::var("DUSTIN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/dustin/models")
        });
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let cut = Command::new(&python)
        .current_dir(&root)
        .arg("scripts/cut_prompts.py")
        .arg("--model")
        .arg(models.join("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
        .args([
            "--tokens", "32000", "--count", "16", "--stride", "8000", "--out",
        ])
        .arg(dev.join("prompts32k"))
        .args(
            [
                "pg19/2544.txt",
                "code/hashbrown_raw.rs",
                "pg19/10762.txt",
                "pg19/15562.txt",
            ]
            .map(|f| data.join(f)),
        )
        .stdout(std::process::Stdio::null())
        .status();
    if !matches!(cut, Ok(s) if s.success()) {
        eprintln!("xtask: {python} could not cut the 32k prompts (pip install gguf tokenizers); the batch step will be skipped");
    }
    // the device machine has transformers but not `gguf`, which transformers' GGUF loading needs
    let whl = dev.join("whl");
    let pip = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-q",
            "-d",
        ])
        .arg(&whl)
        .arg("gguf==0.19.0")
        .status();
    if !matches!(pip, Ok(s) if s.success()) {
        eprintln!("xtask: pip could not fetch the gguf wheel; the HF rows will be skipped");
    }
    println!("staged {} and .w/", dev.display());
    println!("on the GPU machine, back to back (each within 30 s of the last):");
    println!("  run bash .device/gpu_real_pair.sh start            carry [\".device\"]");
    println!("      (STEPS=\"check memab evals batch subspec\" before it picks the job's steps: the script's header lists them)");
    println!("  run bash .device/gpu_real_pair.sh part d00 .. d09  carry [\".w/dNN\"], one a run");
    println!("  run bash .device/gpu_real_pair.sh part t00 .. t22  carry [\".w/tNN\"], one a run");
    println!(
        "  run bash .device/gpu_real_pair.sh parallel         (optional: the rest beside the job)"
    );
    println!("  run bash .device/gpu_real_pair.sh poll 540         until the job log says done");
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match cli.task {
        Task::StageGpu => stage_gpu(),
        Task::GpuKernels { quick } => gpu_kernels(quick),
        Task::GpuE2e => gpu_e2e(),
        Task::GpuReal => gpu_real(),
        Task::FetchModel => run(Command::new("cargo").current_dir(root()).args([
            "run",
            "--release",
            "-p",
            "dustin-cli",
            "--",
            "fetch-model",
        ])),
        Task::FuzzSmoke { secs, target } => fuzz_smoke(secs, target.as_deref()),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
