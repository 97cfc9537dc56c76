//! `dustin eval`: `fidelity`, `pg19`, `longbench` and `acceptance`. Each command's flags are
//! the option struct of its harness run in `dustin_eval::harness` (flattened; that crate's
//! `clap` feature derives them), plus the device and, for `acceptance`, the weight format
//! (docs/fidelity.md has the fidelity method, the accounting and the results). This module
//! also gives the harness what it leaves to the command: models by registry name (fetched
//! when missing), `--draft` values, the backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Subcommand};
use dustin_eval::harness::acceptance::AcceptanceOptions;
use dustin_eval::harness::fidelity::FidelityOptions;
use dustin_eval::harness::longbench::LongBenchOptions;
use dustin_eval::harness::pg19::Pg19Options;
use dustin_eval::harness::{self, EvalDraft, HarnessError, ModelHost, PairSource};
use dustin_kernels::KernelOps;
use dustin_qwen::{ModelFiles, Qwen2, Tokenizer};

use crate::backend::DeviceKind;
use crate::generate::{model_path, parse_draft, DraftSpec, DraftVocab};
use crate::models::WeightsArg;
use crate::pair::PairFiles;
use crate::CliError;

/// Arguments of `dustin eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Which evaluation.
    #[command(subcommand)]
    pub command: EvalCommand,
}

/// The evaluations.
#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Fidelity of sparse verification vs dense, per selector and budget, on PG-19 books.
    Fidelity(RunArgs<FidelityOptions>),
    /// Perplexity of PG-19 continuations when the target reads only its selection
    /// (teacher-forced verification windows), per selector and budget, against dense.
    Pg19(RunArgs<Pg19Options>),
    /// LongBench tasks answered by greedy speculative decoding with sparse verification,
    /// scored with LongBench's metrics, per selector and budget, against dense.
    Longbench(RunArgs<LongBenchOptions>),
    /// Mean acceptance length and speed of a draft/target pair per gamma, temperature,
    /// selector and budget, beside autoregressive decoding on the same prompts (resumable).
    Acceptance(AcceptanceArgs),
}

/// Arguments of `dustin eval fidelity`, `pg19` and `longbench`: the harness's options `O`,
/// the weight format and the device.
#[derive(Debug, Args)]
pub struct RunArgs<O: Args> {
    /// The harness's options.
    #[command(flatten)]
    pub options: O,
    /// Weights of a GGUF model: `auto` (kept in their block format on the CPU, whose block
    /// kernels read a sixth of the bytes of f32; decoded elsewhere), `dense` (decoded to the
    /// backend's float type) or `blocks`. Dense and sparse verification read the same
    /// weights in every case.
    #[arg(long, value_enum, default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// Arguments of `dustin eval acceptance`: the harness's options, the weight format and the
/// device (the command applies those two itself when it loads the pair).
#[derive(Debug, Args)]
pub struct AcceptanceArgs {
    /// The harness's options.
    #[command(flatten)]
    pub options: AcceptanceOptions,
    /// Weights of a GGUF model: `auto` (kept in their block format on the CPU, whose block
    /// kernels read a sixth of the bytes of f32; decoded to f32 elsewhere), `dense` (decoded
    /// to f32) or `blocks`.
    #[arg(long, value_enum, default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// `dustin eval`.
pub fn run(args: EvalArgs) -> Result<(), CliError> {
    match args.command {
        EvalCommand::Fidelity(a) => {
            let opts = a.options;
            let host = CliHost { weights: a.weights };
            crate::with_backend!(a.device, |B, dev| Ok(harness::fidelity::run::<B, _>(
                &opts, &dev, &host
            )?))
        }
        EvalCommand::Pg19(a) => {
            let opts = a.options;
            let host = CliHost { weights: a.weights };
            crate::with_backend!(a.device, |B, dev| Ok(harness::pg19::run::<B, _>(
                &opts, &dev, &host
            )?))
        }
        EvalCommand::Longbench(a) => {
            let opts = a.options;
            let host = CliHost { weights: a.weights };
            crate::with_backend!(a.device, |B, dev| Ok(harness::longbench::run::<B, _>(
                &opts, &dev, &host
            )?))
        }
        EvalCommand::Acceptance(a) => {
            let opts = a.options;
            let host = CliHost { weights: a.weights };
            crate::with_backend!(a.device, |B, dev| Ok(harness::acceptance::run::<B, _>(
                &opts, &dev, &host
            )?))
        }
    }
}

/// What the harness leaves to the command: models by name or path, `--draft` values, and
/// the weight format (`--weights`).
#[derive(Debug, Default)]
struct CliHost {
    /// `--weights` of the command.
    weights: WeightsArg,
}

/// A target and draft opened by [`PairFiles::open`], loaded with their `--weights`.
struct HostPair {
    files: PairFiles,
    weights: WeightsArg,
}

impl PairSource for HostPair {
    fn tokenizer(&self) -> &Tokenizer {
        self.files.tokenizer()
    }

    fn max_positions(&self) -> usize {
        self.files.max_positions()
    }

    fn build<B: KernelOps>(
        &self,
        positions: usize,
        dev: &B::Device,
    ) -> Result<harness::pair::Pair<B>, HarnessError> {
        // the evaluation measures the draft as it is: every id in its LM head
        Ok(self
            .files
            .build::<B>(positions, dev, self.weights, DraftVocab::Full)?)
    }
}

impl ModelHost for CliHost {
    type Pair = HostPair;

    fn model_path(&self, model: Option<&Path>) -> Result<PathBuf, HarnessError> {
        Ok(model_path(&model.map(Path::to_path_buf))?)
    }

    fn weight_format<B: KernelOps>(&self) -> dustin_qwen::WeightFormat {
        self.weights.format::<B>()
    }

    fn eval_draft<B: KernelOps>(
        &self,
        draft: &str,
        target: &Arc<Qwen2<B>>,
        positions: usize,
        dev: &B::Device,
        tok: Option<&Tokenizer>,
    ) -> Result<EvalDraft<B>, HarnessError> {
        Ok(eval_draft(
            draft,
            target,
            positions,
            dev,
            tok,
            self.weights,
        )?)
    }

    fn open_pair(&self, target: &str, draft: &str) -> Result<HostPair, HarnessError> {
        Ok(HostPair {
            files: PairFiles::open(target, draft)?,
            weights: self.weights,
        })
    }
}

/// The draft of an evaluation run (`--draft` of `eval fidelity`, `eval pg19`, `eval
/// longbench`): `(model, early-exit layers, whether it is the target itself)`. A separate
/// draft model is built for `positions` positions and, when `tok` is given, must share its
/// vocabulary.
///
/// # Errors
/// A self-draft with too many layers, `substitute:kv=target` (the harness prefills drafts on
/// caches of their own), the model's load and vocabulary errors.
fn eval_draft<B: KernelOps>(
    draft: &str,
    target: &Arc<Qwen2<B>>,
    positions: usize,
    dev: &B::Device,
    tok: Option<&Tokenizer>,
    weights: WeightsArg,
) -> Result<EvalDraft<B>, CliError> {
    Ok(match parse_draft(draft)? {
        DraftSpec::SelfLayers(n) => {
            if n >= target.config.num_hidden_layers {
                return Err(CliError::Usage(format!(
                    "--draft self:layers={n}: the target has {} layers",
                    target.config.num_hidden_layers
                )));
            }
            (target.clone(), Some(n), true)
        }
        DraftSpec::Model(p) => {
            let df = ModelFiles::open(&crate::models::resolve_model_path(&p)?)?;
            if let Some(tok) = tok {
                crate::generate::check_vocab(tok, &df.tokenizer)?;
            }
            (
                Arc::new(df.build_as::<B>(positions, dev, weights.format::<B>())?),
                None,
                false,
            )
        }
        DraftSpec::Substitute(sub) if sub.target_kv => {
            return Err(CliError::Usage(
                "--draft substitute:kv=target: the evaluation harness runs the draft on its own \
                 KV cache (kv=own); kv=target is for generate and dustin-bench subspec"
                    .into(),
            ))
        }
        DraftSpec::Substitute(sub) => (Arc::new(sub.build(target)?), None, false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;
    use dustin_qwen::WeightFormat;

    /// `--weights` reaches the harness: the default keeps block weights on the CPU (the
    /// backend with block kernels), `dense` decodes them, for the target the harness loads.
    #[test]
    fn the_weights_flag_sets_the_targets_format() {
        let host = |weights| CliHost { weights };
        assert_eq!(
            host(WeightsArg::Auto).weight_format::<Flex>(),
            WeightFormat::Blocks
        );
        assert_eq!(
            host(WeightsArg::Dense).weight_format::<Flex>(),
            WeightFormat::Dense
        );
        assert_eq!(
            host(WeightsArg::Blocks).weight_format::<Flex>(),
            WeightFormat::Blocks
        );
    }
}
