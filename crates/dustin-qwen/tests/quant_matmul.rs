//! The block-format products of `dustin_kernels::cpu_quant` against an independent reference:
//! the weight dequantized by `dustin_qwen::gguf::dequantize` (bit for bit the `gguf` Python
//! package, tests/gguf_dequant_fixtures.rs) times the original f32 `x`, in float64.
//!
//! Bound, per output `y_j = sum_i w_ji x_i + b_j`:
//! `|y - y_ref| <= 1.01 * sum_i |w_ji| amax(i) / 254 + 1e-4 * sum_i |w_ji x_i| + 2^-23 |b_j|`,
//! where `amax(i)` is the largest magnitude in `x`'s block of 32 holding `i`. The products
//! quantize each activation to the nearest of 255 steps of `amax / 127`, half a step or
//! less off (1% for the rounding of the step itself); the integer block sums are exact, and
//! the f32 operations after them (a few per block of 32, a sum over the blocks, the bias)
//! stay far below `1e-4` of the magnitude `sum |w x|` and half an ulp of the bias. A wrong
//! nibble order, scale, offset or min moves the result by about the size of the weights,
//! far past the bound. The largest error must also be above zero (the activations really are
//! quantized).
//!
//! Shapes: rows 3, 37 and 70 (not multiples of any tile), cols of 1, 2 and 5 super-blocks
//! (and 1, 3 and 28 blocks of 32 for the 32-element formats), `m` in {1, 2, 5, 17, 70}, with
//! bias. The ignored test does the same on the first 64 rows of real `Q4_K`, `Q6_K` (1.5B),
//! `Q5_0` and `Q8_0` (0.5B) tensors of the Qwen2.5-Coder Q4_K_M files in the model cache
//! (`$DUSTIN_CACHE` or `~/.cache/dustin`, `models/`):
//! `cargo test --release -p dustin-qwen --test quant_matmul -- --ignored --nocapture`.

mod common;

use common::{ggml, random_blocks, QUANT_TYPES as TYPES};
use dustin_kernels::cpu_quant::{quant_matmul, QuantMatrix, QuantType};
use dustin_qwen::gguf::{dequantize, GgufFile, GgufTensorInfo};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ROWS_M: [usize; 5] = [1, 2, 5, 17, 70];

/// `n` activations, mostly in `[-3, 3]` with a few outliers (as hidden states have).
fn random_x(n: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v: f32 = rng.random_range(-3.0..3.0);
            if rng.random_range(0..64) == 0 {
                v * 10.0
            } else {
                v
            }
        })
        .collect()
}

/// Largest error seen, and the largest error / bound.
#[derive(Default)]
struct Stats {
    max_err: f64,
    max_ratio: f64,
}

/// A weight as blocks and dequantized (`[rows, cols]`).
struct Weight {
    w: QuantMatrix,
    wf: Vec<f32>,
}

impl Weight {
    fn new(ty: QuantType, rows: usize, cols: usize, data: Vec<u8>) -> Self {
        let mut wf = vec![0.0f32; rows * cols];
        dequantize(ggml(ty), &data, &mut wf).expect("dequantize");
        let w = QuantMatrix::new(ty, rows, cols, data).expect("sizes fit");
        Self { w, wf }
    }
}

/// Checks `quant_matmul` of `x` `[m, cols]` with `weight` against the float64 product with
/// the dequantized weight, under the bound of the file docs.
fn check(
    weight: &Weight,
    x: &[f32],
    m: usize,
    bias: Option<&[f32]>,
    what: &str,
    stats: &mut Stats,
) {
    let (rows, cols, wf) = (weight.w.rows(), weight.w.cols(), &weight.wf);
    let y = quant_matmul(x, m, &weight.w, bias).expect("shapes fit");
    assert_eq!(y.len(), m * rows, "{what}");
    for r in 0..m {
        let xr = &x[r * cols..(r + 1) * cols];
        let amax: Vec<f64> = xr
            .chunks(32)
            .map(|b| b.iter().fold(0.0f64, |a, &v| a.max(f64::from(v.abs()))))
            .collect();
        for j in 0..rows {
            let wr = &wf[j * cols..(j + 1) * cols];
            let b = bias.map_or(0.0, |b| f64::from(b[j]));
            let (mut want, mut quant, mut mag) = (b, 0.0, 0.0);
            for (i, (&wv, &xv)) in wr.iter().zip(xr).enumerate() {
                let (wv, xv) = (f64::from(wv), f64::from(xv));
                want += wv * xv;
                quant += wv.abs() * amax[i / 32] / 254.0;
                mag += (wv * xv).abs();
            }
            let bound = 1.01 * quant + 1e-4 * mag + 2f64.powi(-23) * b.abs();
            let got = f64::from(y[r * rows + j]);
            let err = (got - want).abs();
            assert!(
                err <= bound,
                "{what} m={m} [{r}, {j}]: {got} vs {want}, error {err:e} > bound {bound:e}"
            );
            stats.max_err = stats.max_err.max(err);
            stats.max_ratio = stats.max_ratio.max(err / bound);
        }
    }
}

#[test]
fn every_format_matches_dequantized_f64_product() {
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    for (ty, _) in TYPES {
        let mut stats = Stats::default();
        let mut widths: Vec<usize> = [1, 2, 5].iter().map(|k| 256 * k).collect();
        if ty.block_elems() == 32 {
            widths.extend([1, 3, 28].iter().map(|k| 32 * k));
        }
        for rows in [3, 37, 70] {
            for &cols in &widths {
                let weight = Weight::new(ty, rows, cols, random_blocks(ty, rows, cols, &mut rng));
                let bias: Vec<f32> = (0..rows).map(|_| rng.random_range(-1.0..1.0)).collect();
                for m in ROWS_M {
                    let x = random_x(m * cols, &mut rng);
                    let what = format!("{} [{rows}, {cols}]", ty.name());
                    check(&weight, &x, m, Some(&bias), &what, &mut stats);
                }
            }
        }
        println!(
            "{}: max error {:.3e}, max error / bound {:.3}",
            ty.name(),
            stats.max_err,
            stats.max_ratio
        );
        assert!(
            stats.max_err > 0.0,
            "{}: no rounding at all: are the activations quantized?",
            ty.name()
        );
    }
}

/// The first 2-D tensor of `ty` in `file` (of a layer where there is one), its first 64 rows (or all, if fewer), times
/// random activations.
fn check_real(file: &GgufFile, ty: QuantType, rng: &mut ChaCha8Rng) {
    let of_type = |t: &&GgufTensorInfo| t.ggml_type == ggml(ty) && t.dims.len() == 2;
    // a layer's weight where there is one, else the embedding or the LM head
    let info = file
        .tensors()
        .iter()
        .filter(of_type)
        .find(|t| t.name.starts_with("blk."))
        .or_else(|| file.tensors().iter().find(of_type))
        .unwrap_or_else(|| panic!("no 2-D {} tensor in {}", ty.name(), file.path().display()))
        .clone();
    let cols = info.dims[0] as usize;
    let rows = (info.dims[1] as usize).min(64);
    let row_bytes = cols / ty.block_elems() * ty.block_bytes();
    let data = file.tensor_data(&info.name).expect("tensor data")[..rows * row_bytes].to_vec();
    let weight = Weight::new(ty, rows, cols, data);
    let mut stats = Stats::default();
    for m in [1, 5, 17] {
        let x = random_x(m * cols, rng);
        let what = format!("{} `{}` [{rows}, {cols}]", ty.name(), info.name);
        check(&weight, &x, m, None, &what, &mut stats);
    }
    println!(
        "{} `{}` [{rows} of {}, {cols}]: max error {:.3e}, max error / bound {:.3}",
        ty.name(),
        info.name,
        info.dims[1],
        stats.max_err,
        stats.max_ratio
    );
    assert!(stats.max_err > 0.0);
}

#[test]
#[ignore = "needs the Qwen2.5-Coder 0.5B and 1.5B Q4_K_M GGUF files in the model cache"]
fn real_tensors_match_dequantized_f64_product() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let big = GgufFile::open(&common::cached_model(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ))
    .expect("open");
    check_real(&big, QuantType::Q4K, &mut rng);
    check_real(&big, QuantType::Q6K, &mut rng);
    let small = GgufFile::open(&common::cached_model(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ))
    .expect("open");
    check_real(&small, QuantType::Q5_0, &mut rng);
    check_real(&small, QuantType::Q8_0, &mut rng);
}
