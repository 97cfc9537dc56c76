//! `dustin-bench upload-check`: host-to-device copies of weight matrices, Burn's pageable
//! `Tensor::from_data` against the page-locked path (`KernelOps::pin_host` /
//! `KernelOps::upload_pinned`) that offloaded layers use with `--upload pinned`.
//!
//! Each matrix is drawn at random on the device (so its bytes are not a pattern a stale buffer
//! could match), read back as the source, and copied to the device by both paths; each copy is
//! read back and compared with the source bit for bit. Then each path is timed (one untimed
//! copy, then `--reps`; a read-back of one element waits for each copy). Exit status 1 when a
//! copy differs or the backend has no page-locked memory.

use std::path::PathBuf;
use std::time::Instant;

use burn_tensor::{Distribution, Tensor};
use clap::Args;
use dustin_kernels::KernelOps;

use dustin_cli::backend::DeviceKind;
use dustin_cli::CliError;

/// Arguments of `dustin-bench upload-check`.
#[derive(Debug, Args)]
pub struct UploadCheckArgs {
    /// Matrices `ROWSxCOLS` (at most 2^32 elements each), comma-separated. Default: an odd 3x5, Qwen2.5-7B's gate/up
    /// [3584, 18944] and Qwen2.5-72B's [8192, 29568] (the published configs).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "3x5,3584x18944,8192x29568"
    )]
    pub sizes: Vec<String>,
    /// Timed copies per path and matrix.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Append one JSON line per matrix to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where to run (page-locked memory needs `cuda`).
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// One matrix's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UploadRow {
    /// `[rows, cols]`.
    pub rows: usize,
    /// See `rows`.
    pub cols: usize,
    /// Bytes of the matrix in the backend's float dtype.
    pub bytes: usize,
    /// Whether the pageable copy read back equal to the source, bit for bit.
    pub pageable_equal: bool,
    /// The same for the page-locked copy.
    pub pinned_equal: bool,
    /// Milliseconds per copy (read-back of one element included).
    pub pageable_ms: f64,
    /// See `pageable_ms`; `null` when the page-locked copy was wrong.
    pub pinned_ms: Option<f64>,
    /// `bytes / pageable_ms`, GB/s.
    pub pageable_gb_per_sec: f64,
    /// See `pageable_gb_per_sec`.
    pub pinned_gb_per_sec: Option<f64>,
}

/// A kernel-op error as the CLI reports it (through the model crate's error).
fn kernel(e: dustin_kernels::KernelError) -> CliError {
    CliError::Model(e.into())
}

fn parse_size(s: &str) -> Result<[usize; 2], CliError> {
    let bad = || {
        CliError::Usage(format!(
            "--sizes {s}: expected ROWSxCOLS with both at least 1 and at most 2^32 elements, e.g. 3584x18944"
        ))
    };
    let (r, c) = s.split_once('x').ok_or_else(bad)?;
    let (r, c): (usize, usize) = (
        r.trim().parse().map_err(|_| bad())?,
        c.trim().parse().map_err(|_| bad())?,
    );
    if r == 0 || c == 0 || r.checked_mul(c).is_none_or(|n| n > 1 << 32) {
        return Err(bad());
    }
    Ok([r, c])
}

/// `dustin-bench upload-check`.
pub fn run(a: UploadCheckArgs) -> Result<(), CliError> {
    let sizes = a
        .sizes
        .iter()
        .map(|s| parse_size(s))
        .collect::<Result<Vec<_>, _>>()?;
    if a.reps == 0 {
        return Err(CliError::Usage("--reps 0: expected at least 1".into()));
    }
    crate::jsonl::check_json_path(a.json.as_deref(), &[])?;
    // each matrix is printed and written as soon as it is measured
    let mut wrong = 0;
    let mut emit = |r: &UploadRow| -> Result<(), CliError> {
        println!(
            "upload {}x{} ({:.1} MB): pageable {:.2} ms ({:.2} GB/s, equal: {}), page-locked {} (equal: {})",
            r.rows,
            r.cols,
            r.bytes as f64 / 1e6,
            r.pageable_ms,
            r.pageable_gb_per_sec,
            r.pageable_equal,
            match (r.pinned_ms, r.pinned_gb_per_sec) {
                (Some(ms), Some(gb)) => format!("{ms:.2} ms ({gb:.2} GB/s)"),
                _ => "-".into(),
            },
            r.pinned_equal
        );
        if let Some(p) = &a.json {
            crate::jsonl::append_json(p, r)?;
        }
        wrong += usize::from(!r.pageable_equal) + usize::from(!r.pinned_equal);
        Ok(())
    };
    dustin_cli::with_backend!(a.device, |B, dev| run_on::<B>(
        &sizes, a.reps, &dev, &mut emit
    ))?;
    if wrong > 0 {
        return Err(CliError::Usage(format!(
            "upload-check failed: {wrong} copies differ from their source"
        )));
    }
    Ok(())
}

/// Seconds per call of `f` over `reps` calls after one untimed call; `f`'s result is read
/// back (one element) so the copy is finished.
fn time_copies<B: KernelOps>(
    reps: usize,
    mut f: impl FnMut() -> Result<Tensor<B, 2>, CliError>,
) -> Result<f64, CliError> {
    let _ = f()?.slice([0..1, 0..1]).into_data();
    let t = Instant::now();
    for _ in 0..reps {
        let _ = f()?.slice([0..1, 0..1]).into_data();
    }
    Ok(t.elapsed().as_secs_f64() / reps as f64)
}

fn run_on<B: KernelOps>(
    sizes: &[[usize; 2]],
    reps: usize,
    dev: &B::Device,
    emit: &mut dyn FnMut(&UploadRow) -> Result<(), CliError>,
) -> Result<(), CliError> {
    // a backend without page-locked memory is named before any matrix is drawn
    let probe = burn_tensor::TensorData::new(vec![0f32], [1, 1])
        .convert_dtype(<B::FloatElem as burn_tensor::Element>::dtype());
    if B::pin_host(&probe, dev).map_err(kernel)?.is_none() {
        return Err(CliError::Usage(
            "this backend has no page-locked memory (the CPU); run with --device cuda".into(),
        ));
    }
    for &[rows, cols] in sizes {
        let src =
            Tensor::<B, 2>::random([rows, cols], Distribution::Normal(0.0, 1.0), dev).into_data();
        let want = src.as_bytes().to_vec();
        let pinned = B::pin_host(&src, dev).map_err(kernel)?.ok_or_else(|| {
            CliError::Usage(
                "this backend has no page-locked memory (the CPU); run with --device cuda".into(),
            )
        })?;
        let pageable_equal = Tensor::<B, 2>::from_data(src.clone(), dev)
            .into_data()
            .as_bytes()
            == &want[..];
        let pinned_equal = B::upload_pinned(&pinned, dev)
            .map_err(kernel)?
            .into_data()
            .as_bytes()
            == &want[..];
        let pageable = time_copies::<B>(reps, || Ok(Tensor::from_data(src.clone(), dev)))?;
        let fast = if pinned_equal {
            Some(time_copies::<B>(reps, || {
                B::upload_pinned(&pinned, dev).map_err(kernel)
            })?)
        } else {
            None
        };
        let gb = want.len() as f64 / 1e9;
        emit(&UploadRow {
            rows,
            cols,
            bytes: want.len(),
            pageable_equal,
            pinned_equal,
            pageable_ms: pageable * 1e3,
            pinned_ms: fast.map(|s| s * 1e3),
            pageable_gb_per_sec: gb / pageable,
            pinned_gb_per_sec: fast.map(|s| gb / s),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_bad_ones_are_named() {
        assert_eq!(parse_size("3584x18944").unwrap(), [3584, 18944]);
        assert_eq!(parse_size(" 3 x 5 ").unwrap(), [3, 5]);
        for bad in ["3584", "0x5", "3x0", "ax5", "3x5x7", "100000x100000"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("--sizes {bad}")), "{bad}: {e}");
        }
    }

    #[test]
    fn the_cpu_says_it_has_no_page_locked_memory() {
        // named before anything is drawn: a matrix too large to draw gives the same error
        let mut rows = 0;
        let e = run_on::<burn_flex::Flex>(
            &[[1 << 16, 1 << 16]],
            1,
            &burn_flex::FlexDevice,
            &mut |_| {
                rows += 1;
                Ok(())
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no page-locked memory"), "{e}");
        assert_eq!(rows, 0);
    }
}
