//! The kernel traits, one per concern, and [`KernelOps`], the umbrella every backend gets by
//! implementing them all.

#[cfg(doc)]
use crate::{plain, KernelError};

mod attention;
mod backend;
mod collective;
mod elementwise;
mod linear;
mod memory;
mod selection;

pub use attention::AttentionOps;
pub(crate) use backend::cpu_model_name;
pub use backend::KernelBackend;
pub use collective::CollectiveOps;
pub use elementwise::ElementwiseOps;
pub use linear::LinearOps;
#[cfg(feature = "cuda")]
pub(crate) use memory::rope_kv_write_separate;
pub use memory::{check_rope_kv_write, MemoryOps, RopedKv};
pub use selection::SelectionOps;

/// Fused attention, scoring and selection ops; implemented per backend.
///
/// Every method validates its input and returns [`KernelError`] instead of panicking. Every
/// method defaults to the plain path ([`plain`], Burn tensor ops, correct on any backend), so
/// another backend joins with an empty impl of each trait below and overrides what it fuses.
///
/// The ops are grouped by concern: [`KernelBackend`] (fused or not, the kernel config),
/// [`AttentionOps`], [`SelectionOps`], [`ElementwiseOps`], [`LinearOps`], [`MemoryOps`] and
/// [`CollectiveOps`]. A backend implements each (empty impls take the plain path) and gets
/// this trait from the blanket impl; generic code bounds on `KernelOps`.
pub trait KernelOps:
    AttentionOps + SelectionOps + ElementwiseOps + LinearOps + MemoryOps + CollectiveOps
{
}

impl<B> KernelOps for B where
    B: AttentionOps + SelectionOps + ElementwiseOps + LinearOps + MemoryOps + CollectiveOps
{
}
