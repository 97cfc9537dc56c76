//! Memory before loading: which target layers go to host memory (`--offload`,
//! `--gpu-memory`), and whether the KV caches fit.

use dustin_kernels::KernelOps;
use dustin_qwen::ModelFiles;

use super::{parse_draft, parse_layer_list, DraftSpec, GenerateArgs};
use crate::CliError;

/// The target layers to keep in host memory: `--offload`, or what `--gpu-memory` leaves
/// out (the plan goes to stderr).
pub(super) fn offload_plan<B: KernelOps>(
    args: &GenerateArgs,
    cfgs: &[&dustin_qwen::QwenConfig],
    batch: usize,
    capacity: usize,
    draft: Option<&ModelFiles>,
) -> Result<Vec<usize>, CliError> {
    let target = cfgs[0];
    let n = target.num_hidden_layers;
    if let Some(list) = &args.offload {
        let layers = parse_layer_list(list)
            .map_err(|m| CliError::Usage(format!("--offload {list}: {m}")))?;
        if let Some(&bad) = layers.iter().find(|&&l| l >= n) {
            return Err(CliError::Usage(format!(
                "--offload {list}: layer {bad} is past the target's {n} layers (0 ..= {})",
                n - 1
            )));
        }
        return Ok(layers);
    }
    let Some(budget) = args.gpu_memory else {
        return Ok(Vec::new());
    };
    let bytes = dustin_core::memory::float_bytes::<B>();
    let kv = u64::try_from(kv_per_token::<B>(cfgs).saturating_mul((batch * capacity) as u128))
        .unwrap_or(u64::MAX);
    let draft_weights = draft.map_or(0, |d| {
        crate::footprint::weight_bytes_per_forward(&d.config, bytes as f64) as u64
    });
    let substitute = match args.pair.draft.as_deref().map(parse_draft).transpose()? {
        Some(DraftSpec::Substitute(s)) => Some(s.cfg),
        _ => None,
    };
    let plan = dustin_qwen::plan_offload(
        target,
        budget,
        bytes as f64,
        kv.saturating_add(draft_weights),
        substitute,
        true,
    )
    .map_err(|e| CliError::Usage(format!("--gpu-memory: {e}")))?;
    eprintln!(
        "gpu memory {:.2} GB: {} of {n} target layers resident, {} offloaded to host ({:.2} GB planned: {:.2} embedding + LM head, {:.3} per layer, {:.3} per offloaded layer, {:.2} staging, {:.2} KV and draft)",
        budget as f64 / 1e9,
        plan.resident,
        plan.offloaded.len(),
        plan.total_bytes as f64 / 1e9,
        plan.fixed_bytes as f64 / 1e9,
        plan.layer_bytes as f64 / 1e9,
        plan.substitute_layer_bytes as f64 / 1e9,
        plan.staging_bytes as f64 / 1e9,
        plan.other_bytes as f64 / 1e9,
    );
    if substitute.is_some() && plan.offloaded.is_empty() {
        eprintln!(
            "note: the whole target fits the GPU budget: nothing is offloaded, and the substitute \
             draft quantizes the second half of the layers on top of the plan"
        );
    }
    Ok(plan.offloaded)
}

/// KV bytes per token of one sequence over the caches of `cfgs` (target and drafts).
fn kv_per_token<B: KernelOps>(cfgs: &[&dustin_qwen::QwenConfig]) -> u128 {
    let bytes = dustin_core::memory::float_bytes::<B>();
    cfgs.iter()
        .map(|c| c.kv_bytes_per_token(bytes) as u128)
        .sum()
}

/// Checks the KV caches' memory (target and draft, `batch` sequences of `capacity` tokens)
/// before the weights are loaded, so that an impossible request fails at once with the
/// figures.
pub fn check_kv_memory<B: KernelOps>(
    cfgs: &[&dustin_qwen::QwenConfig],
    batch: usize,
    capacity: usize,
    dev: &B::Device,
) -> Result<(), CliError> {
    let per_token = kv_per_token::<B>(cfgs);
    // prefill stacks per-sequence caches into the batch: both are alive at that moment
    let copies: u128 = if batch > 1 { 2 } else { 1 };
    let needed = per_token
        .saturating_mul(batch as u128)
        .saturating_mul(capacity as u128)
        .saturating_mul(copies);
    dustin_core::memory::check_alloc::<B>(
        &format!(
            "the KV caches (batch {batch} x {capacity} tokens, {} model(s), {} bytes per token)",
            cfgs.len(),
            per_token
        ),
        needed,
        dev,
    )?;
    Ok(())
}
