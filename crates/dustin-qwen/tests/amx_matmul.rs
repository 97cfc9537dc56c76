//! The AMX prefill product of `dustin_kernels::cpu_amx` and the block decoder it reads
//! weights through, against independent references: the weight dequantized by
//! `dustin_qwen::gguf::dequantize` (bit for bit the `gguf` Python package,
//! tests/gguf_dequant_fixtures.rs) and the product of it with the original f32 `x` in
//! float64.
//!
//! Bound, per output `y_j = sum_i w_ji x_i + b_j`:
//! `|y - y_ref| <= 2^-14 * sum_i |w_ji x_i| + 2^-23 |b_j|`. Splitting each operand into two
//! bf16 parts leaves at most `2^-17` of it (twice a rounding to 8 bits), the dropped
//! `x_lo w_lo` term is below `2^-18` of `|w x|`, and the tile products add exact bf16
//! products in f32; the f32 sums over `k` (up to 8,960 here) stay far below `2^-14` of the
//! magnitude for these sign-mixed random terms. A plain bf16 product (one term) misses it by
//! about 2^-9 per term; a wrong layout moves outputs by the size of the weights.
//!
//! On a machine without AMX the product must refuse with an error instead.

mod common;

use common::{ggml, random_blocks, QUANT_TYPES as TYPES};
use dustin_kernels::cpu_amx::{amx_matmul, available};
use dustin_kernels::cpu_quant::{dequantize_rows, QuantMatrix, QuantType};
use dustin_kernels::KernelError;
use dustin_qwen::gguf::dequantize;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn dequantize_rows_matches_gguf_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for (ty, _) in TYPES {
        let (rows, cols) = (7, 512);
        let data = random_blocks(ty, rows, cols, &mut rng);
        let mut want = vec![0.0f32; rows * cols];
        dequantize(ggml(ty), &data, &mut want).expect("dequantize");
        let w = QuantMatrix::new(ty, rows, cols, data).expect("sizes");
        let mut got = vec![0.0f32; 3 * cols];
        dequantize_rows(&w, 2..5, &mut got).expect("in range");
        for (i, (g, r)) in got.iter().zip(&want[2 * cols..5 * cols]).enumerate() {
            assert_eq!(
                g.to_bits(),
                r.to_bits(),
                "{} element {i}: {g} vs {r}",
                ty.name()
            );
        }
        let err = dequantize_rows(&w, 5..8, &mut got).expect_err("past the rows");
        assert!(err.to_string().contains("rows"), "{err}");
        let err = dequantize_rows(&w, 0..2, &mut got).expect_err("wrong length");
        assert!(err.to_string().contains("out"), "{err}");
    }
}

#[test]
fn amx_product_matches_dequantized_f64_product() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let ty = QuantType::Q4K;
    let w = QuantMatrix::new(ty, 40, 256, random_blocks(ty, 40, 256, &mut rng)).expect("sizes");
    if !available() {
        let err = amx_matmul(&[0.0; 256], 1, &w, None).expect_err("no AMX here");
        assert!(matches!(err, KernelError::Unsupported(_)), "{err}");
        println!("no AMX on this machine: the product refuses, as it must");
        return;
    }
    let mut worst = 0.0f64;
    // rows not multiples of 32 (a partial panel), m around the row blocks, k of 1 to 35 steps
    for (ty, rows, cols) in [
        (QuantType::Q4K, 70, 1536),
        (QuantType::Q6K, 64, 256),
        (QuantType::Q5_0, 37, 896),
        (QuantType::Q8_0, 33, 32),
        (QuantType::Q4_1, 3, 96),
        (QuantType::Q5K, 32, 512),
        (QuantType::Q4_0, 20, 64),
        (QuantType::Q5_1, 45, 8960),
    ] {
        let data = random_blocks(ty, rows, cols, &mut rng);
        let mut wf = vec![0.0f32; rows * cols];
        dequantize(ggml(ty), &data, &mut wf).expect("dequantize");
        let w = QuantMatrix::new(ty, rows, cols, data).expect("sizes");
        let bias: Vec<f32> = (0..rows).map(|_| rng.random_range(-1.0..1.0)).collect();
        for m in [1, 31, 33, 70] {
            let x: Vec<f32> = (0..m * cols)
                .map(|_| rng.random_range(-3.0f32..3.0))
                .collect();
            let with_bias = m != 31;
            let b = with_bias.then_some(bias.as_slice());
            let y = amx_matmul(&x, m, &w, b).expect("shapes fit");
            assert_eq!(y.len(), m * rows);
            for r in 0..m {
                for j in 0..rows {
                    let bj = b.map_or(0.0, |b| f64::from(b[j]));
                    let (mut want, mut mag) = (bj, 0.0);
                    for i in 0..cols {
                        let t = f64::from(wf[j * cols + i]) * f64::from(x[r * cols + i]);
                        want += t;
                        mag += t.abs();
                    }
                    let bound = 2f64.powi(-14) * mag + 2f64.powi(-23) * bj.abs();
                    let err = (f64::from(y[r * rows + j]) - want).abs();
                    assert!(
                        err <= bound,
                        "{} [{rows}, {cols}] m={m} [{r}, {j}]: {} vs {want}, error {err:e} > {bound:e}",
                        ty.name(),
                        y[r * rows + j]
                    );
                    worst = worst.max(err / bound);
                }
            }
        }
    }
    println!("largest error / bound: {worst:.4}");
}

#[test]
fn amx_product_refuses_bad_shapes() {
    if !available() {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let ty = QuantType::Q8_0;
    let w = QuantMatrix::new(ty, 4, 64, random_blocks(ty, 4, 64, &mut rng)).expect("sizes");
    let err = amx_matmul(&[0.0; 65], 1, &w, None).expect_err("x too long");
    assert!(matches!(err, KernelError::Shape { name: "x", .. }), "{err}");
    let err = amx_matmul(&[0.0; 64], 1, &w, Some(&[0.0; 3])).expect_err("short bias");
    assert!(
        matches!(err, KernelError::Shape { name: "bias", .. }),
        "{err}"
    );
    assert!(amx_matmul(&[], 0, &w, None).expect("no rows").is_empty());
}
