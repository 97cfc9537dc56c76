//! Device choice: `cpu` (burn-flex, f32) or `cuda` (burn-cuda, when built with the feature).

use clap::ValueEnum;

/// Where to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum DeviceKind {
    /// The CPU through burn-flex (f32).
    #[default]
    Cpu,
    /// An NVIDIA GPU through burn-cuda (needs a build with `--features cuda`).
    Cuda,
}

/// Before the first CUDA device is used: CubeCL's configuration with its PTX cache on disk
/// (`dustin_kernels::cuda::compile_cache`: each kernel compiled once per build and machine,
/// not once per process; `DUSTIN_CUBECL_CACHE=off` turns it off, a `cubecl.toml` is read as
/// CubeCL reads it).
#[cfg(feature = "cuda")]
pub fn init_cuda_runtime() {
    dustin_kernels::cuda::compile_cache::init_runtime_config();
}

/// Calls `$body` with a type alias `B` for the chosen backend and a device `dev`; the second
/// form also binds `dev_of`, a function from a device index to that device (`CudaDevice::new`
/// on CUDA; the one CPU device on the CPU, whatever the index), for tensor-parallel groups.
///
/// The expansion names `burn_flex`, `burn_cuda` and `half`, and tests the `cuda` feature, of
/// the crate that calls it: a caller depends on those crates and has a `cuda` feature that
/// enables `burn-cuda` (and `dustin-cli/cuda`).
#[macro_export]
macro_rules! with_backend {
    ($kind:expr, |$b:ident, $dev:ident, $dev_of:ident| $body:expr) => {{
        match $kind {
            $crate::backend::DeviceKind::Cpu => {
                type $b = burn_flex::Flex;
                let $dev = burn_flex::FlexDevice::default();
                let $dev_of = |_: usize| burn_flex::FlexDevice::default();
                $body
            }
            $crate::backend::DeviceKind::Cuda => {
                #[cfg(feature = "cuda")]
                {
                    $crate::backend::init_cuda_runtime();
                    type $b = burn_cuda::Cuda<half::bf16, i32>;
                    let $dev = burn_cuda::CudaDevice::default();
                    let $dev_of = burn_cuda::CudaDevice::new;
                    $body
                }
                #[cfg(not(feature = "cuda"))]
                {
                    // the package named is the one whose code expands this macro
                    Err($crate::CliError::Usage(
                        concat!(
                            "--device cuda needs a CUDA build: cargo build --release --features cuda -p ",
                            env!("CARGO_PKG_NAME")
                        )
                        .into(),
                    ))
                }
            }
        }
    }};
    ($kind:expr, |$b:ident, $dev:ident| $body:expr) => {{
        $crate::with_backend!($kind, |$b, $dev, _dev_of| $body)
    }};
}
