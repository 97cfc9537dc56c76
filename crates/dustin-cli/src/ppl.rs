//! `dustin ppl`: perplexity of a text (for example a PG-19 book) under a model, dense
//! attention, and a tokenizer round-trip check.

use dustin_kernels::KernelOps;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use dustin_qwen::generate::nll;
use dustin_qwen::ModelFiles;

use crate::backend::DeviceKind;
use crate::CliError;

/// Arguments of `dustin ppl`.
#[derive(Debug, Args)]
pub struct PplArgs {
    /// Model: HF directory, .gguf file, or a model name (`dustin fetch-model --list`).
    /// Default: qwen2.5-coder-1.5b-instruct from the cache.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Text file; a Project Gutenberg header and footer are stripped.
    #[arg(long)]
    pub text_file: PathBuf,
    /// Tokens scored (from the start of the text).
    #[arg(long, default_value_t = 2048)]
    pub tokens: usize,
    /// Chunk size, tokens.
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,
    /// Weights of a GGUF model: `auto` (kept in their block format on the CPU, whose block
    /// kernels read a sixth of the bytes of f32; decoded to f32 elsewhere), `dense` (decoded
    /// to f32) or `blocks`.
    #[arg(long, value_enum, default_value_t = crate::models::WeightsArg::Auto)]
    pub weights: crate::models::WeightsArg,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// `dustin ppl`.
pub fn run(args: PplArgs) -> Result<(), CliError> {
    crate::with_backend!(args.device, |B, dev| run_on::<B>(&args, &dev))
}

fn run_on<B: KernelOps>(args: &PplArgs, dev: &B::Device) -> Result<(), CliError> {
    if args.tokens < 2 {
        return Err(CliError::Usage(format!(
            "--tokens {}: expected at least 2 (the first token is not predicted)",
            args.tokens
        )));
    }
    if args.chunk == 0 {
        return Err(CliError::Usage(
            "--chunk 0: expected at least 1 token".into(),
        ));
    }
    let book = dustin_eval::pg19::load_book(&args.text_file)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let path = crate::generate::model_path(&args.model)?;
    let files = ModelFiles::open(&path)?;
    let tok = &files.tokenizer;
    let t = Instant::now();
    let ids = tok.encode(&book.text)?;
    let enc_secs = t.elapsed().as_secs_f64();
    let back = tok.decode(&ids)?;
    crate::stdout::line(&format!(
        "tokenizer: {} chars -> {} tokens in {:.2} s; round trip exact: {}",
        book.text.chars().count(),
        ids.len(),
        enc_secs,
        back == book.text
    ));
    let n = args
        .tokens
        .min(ids.len())
        .min(files.config.max_position_embeddings);
    if n < 2 {
        return Err(CliError::Usage(format!(
            "{}: fewer than 2 tokens ({} in the text, {} positions in the model)",
            args.text_file.display(),
            ids.len(),
            files.config.max_position_embeddings
        )));
    }
    let model = files.build_as::<B>(n, dev, args.weights.format::<B>())?;
    let t = Instant::now();
    let (sum, count) = nll(&model, &ids[..n], args.chunk)?;
    let secs = t.elapsed().as_secs_f64();
    crate::stdout::line(&format!(
        "perplexity of the first {n} tokens: {:.3} (mean NLL {:.4} nats over {count} predictions) in {secs:.1} s ({:.1} tokens/s)",
        (sum / count as f64).exp(),
        sum / count as f64,
        n as f64 / secs
    ));
    Ok(())
}
