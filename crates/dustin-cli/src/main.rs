//! The `dustin` command: the demo, generation, perplexity, evaluations, the HTTP server and
//! model fetching (one subcommand each; `dustin --help` lists them). The lab instruments (benchmarks and
//! kernel checks) are the `dustin-bench` command's.
//!
//! Backends: the CPU (`burn-flex`, f32) always; CUDA (`burn-cuda`, bf16 or f32) when built
//! with `--features cuda`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dustin_cli::{demo, eval, exit_code, fetch, generate, ppl, serve};

/// dustin: speculative decoding with draft-augmented sparse verification for long contexts.
#[derive(Debug, Parser)]
#[command(name = "dustin", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The main job: Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B on a shipped source
    /// file, in five modes (autoregressive; speculative with dense, dustin, streaming and
    /// quest verification), printing one table (also written as JSON, Markdown and SVG).
    Demo(demo::DemoArgs),
    /// Generate a continuation of a prompt file, or a chat reply with --chat (autoregressive,
    /// or speculative with --draft).
    Generate(generate::GenerateArgs),
    /// Perplexity of a text file under a model (dense attention) and a tokenizer round trip.
    Ppl(ppl::PplArgs),
    /// Evaluations per selector and budget: `eval acceptance` (acceptance length and speed
    /// of the pair), `eval fidelity`, `eval pg19` (perplexity) and `eval longbench`
    /// (LongBench scores), each against dense verification.
    Eval(eval::EvalArgs),
    /// An OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, streaming)
    /// over the model, speculative with --draft and sparse verification with --selector.
    Serve(serve::ServeArgs),
    /// Download a model by name into the cache (default: qwen2.5-coder-1.5b-instruct;
    /// `--list` shows the names), or check one already there.
    FetchModel(fetch::FetchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    exit_code(match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Ppl(a) => ppl::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Serve(a) => serve::run(a),
        Command::FetchModel(a) => fetch::run(a),
    })
}
