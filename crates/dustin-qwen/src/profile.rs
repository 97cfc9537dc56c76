//! Where a forward pass spends its time, phase by phase (opt-in, for benchmarks).
//!
//! A model with a profile label ([`crate::Qwen2::with_profile`]) times each phase of every
//! forward pass: it waits for the device before the phase starts and again before the clock
//! stops ([`burn_tensor::backend::Backend::sync`]), so a phase's time is the wall time of its
//! kernels *and* of the host work that launches them (op dispatch, allocation, autotune
//! lookups), which is what an overhead-bound decode step is made of. The waits themselves
//! remove the overlap between phases, so a profiled run is slower than an unprofiled one: use
//! the shares, not the sum, and time the real run without the label. Under tensor parallelism
//! only rank 0 records.
//!
//! Phases of a layer: `input_norm`, `qkv` (the q, k, v projections), `rope`, `kv_append`
//! (or `rope_kv_append` for both as one op, `Qwen2::with_rope_kv_write`), `select` (the attention hook: estimation and selection), `key_mass` (scoring kernel for
//! hooks that want the mass per key), `attention` (fused kernel or the plain path), `o_proj`,
//! `all_reduce` (tensor parallel only), `post_norm`, `mlp` (gate, up, SiLU, product, down),
//! `stage` (copying an offloaded layer in without prefetching); per pass: `embed`, `lm_head`
//! (final norm and LM head).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use burn_tensor::backend::Backend;

/// Accumulated time of one phase.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PhaseTime {
    /// The model's profile label (for example `target` or `draft`).
    pub model: &'static str,
    /// `prefill` or `decode` (decode steps and verifications).
    pub stage: &'static str,
    /// The phase (see the module docs).
    pub phase: &'static str,
    /// Times the phase ran (once per layer per pass for layer phases).
    pub calls: u64,
    /// Seconds in all.
    pub secs: f64,
}

static TABLE: Mutex<Vec<PhaseTime>> = Mutex::new(Vec::new());

/// Whether profiled phases are also written to standard error ([`set_trace`]).
static TRACE: AtomicBool = AtomicBool::new(false);

/// Writes `[phase] start <model> <stage> <phase>` and `[phase] end ...` to standard error
/// around every phase a profiled model times, once the device is idle on both sides, so that
/// a backend log written to standard error in the same order (CubeCL's memory logger with
/// `stderr = true`) shows which phase made each allocation. Off by default; process-wide.
pub fn set_trace(on: bool) {
    TRACE.store(on, Ordering::Relaxed);
}

/// Clears every recorded time.
pub fn reset() {
    if let Ok(mut t) = TABLE.lock() {
        t.clear();
    }
}

/// The recorded times, in the order phases first ran.
pub fn snapshot() -> Vec<PhaseTime> {
    TABLE.lock().map(|t| t.clone()).unwrap_or_default()
}

fn record(model: &'static str, stage: &'static str, phase: &'static str, secs: f64) {
    if let Ok(mut t) = TABLE.lock() {
        match t
            .iter_mut()
            .find(|p| p.model == model && p.stage == stage && p.phase == phase)
        {
            Some(p) => {
                p.calls += 1;
                p.secs += secs;
            }
            None => t.push(PhaseTime {
                model,
                stage,
                phase,
                calls: 1,
                secs,
            }),
        }
    }
}

/// What a profiled forward pass needs to time its phases: the label and stage, and the
/// device to wait for. `None` label: nothing is timed and nothing waits.
pub(crate) struct Timer<'a, B: Backend> {
    pub(crate) label: Option<&'static str>,
    pub(crate) stage: &'static str,
    pub(crate) device: &'a B::Device,
}

// by hand: a derive would ask `B: Copy`
impl<B: Backend> Clone for Timer<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for Timer<'_, B> {}

impl<B: Backend> Timer<'_, B> {
    /// Runs `f` as phase `phase`, timed when the model is profiled.
    pub(crate) fn time<T>(&self, phase: &'static str, f: impl FnOnce() -> T) -> T {
        let Some(label) = self.label else {
            return f();
        };
        let trace = TRACE.load(Ordering::Relaxed);
        let _ = B::sync(self.device);
        if trace {
            eprintln!("[phase] start {label} {} {phase}", self.stage);
        }
        let t = Instant::now();
        let out = f();
        let _ = B::sync(self.device);
        record(label, self.stage, phase, t.elapsed().as_secs_f64());
        if trace {
            eprintln!("[phase] end {label} {} {phase}", self.stage);
        }
        out
    }
}
