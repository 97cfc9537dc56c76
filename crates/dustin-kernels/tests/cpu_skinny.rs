//! The CPU skinny GEMM (`cpu_skinny`, `KernelOps::skinny_linear` on `Flex`, f32) against
//! the float64 product `reference::linear`.
//!
//! Bound, per output element `y_j = sum_i x_i w_ij + b_j` with `k` terms:
//! `|y - y_ref| <= 2 sqrt(k + 1) 2^-24 (sum_i |x_i w_ij| + |b_j|)`. A sum of `k + 1` terms
//! in f32 is within `(k + 1) 2^-24` of that scale in the worst case (each rounding is at most
//! `2^-24` relative to a partial sum, itself at most the scale); the roundings of independent
//! data add like a random walk, `sqrt(k)` (the usual rule of thumb), and the factor 2 leaves
//! room for the two roundings of a multiply and add where there is no fused multiply-add.
//! Sizes: `m` in {1, 2, 5, 16, 17, 64}, `k` and `n` not multiples of the SIMD width among
//! them, products small enough for one thread and large enough for the rayon pool.

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Tensor, TensorData};
use dustin_kernels::cpu_skinny::{self, Isa, CPU_SKINNY_MAX_ROWS};
use dustin_kernels::prelude::*;
use dustin_kernels::reference;
use dustin_kernels::KernelError;

const ROWS: [usize; 6] = [1, 2, 5, 16, 17, 64];

/// `(k, n)`: tiny, ragged (not multiples of 4, 8 or 16), and past the parallel threshold
/// (`k n >= 65536`) with a ragged last tile.
const SIZES: [(usize, usize); 7] = [
    (1, 1),
    (3, 5),
    (7, 13),
    (64, 40),
    (37, 129),
    (300, 517),
    (1030, 260),
];

fn host(t: Tensor<Flex, 2>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().expect("f32 data")
}

fn tensor<const D: usize>(v: &[f32], shape: [usize; D]) -> Tensor<Flex, D> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), &FlexDevice)
}

struct Case {
    m: usize,
    k: usize,
    n: usize,
    x: Vec<f32>,
    w: Vec<f32>,
    bias: Vec<f32>,
}

impl Case {
    fn new(m: usize, k: usize, n: usize, seed: u64) -> Self {
        Self {
            m,
            k,
            n,
            x: reference::random_bf16(m * k, 2.0, seed),
            w: reference::random_bf16(k * n, 0.1, seed + 1),
            bias: reference::random_bf16(n, 0.5, seed + 2),
        }
    }

    fn bias(&self, with: bool) -> Option<&[f32]> {
        with.then_some(self.bias.as_slice())
    }

    /// Checks `out` `[m, n]` against the f64 product under the bound of the file docs.
    fn check(&self, out: &[f32], with_bias: bool, what: &str) {
        let (m, k, n) = (self.m, self.k, self.n);
        assert_eq!(out.len(), m * n, "{what}: length");
        let y = reference::linear(&self.x, &self.w, self.bias(with_bias), m, k, n);
        let u = 2f64.powi(-24);
        for r in 0..m {
            for c in 0..n {
                let mut scale = self.bias(with_bias).map_or(0.0, |b| b[c].abs() as f64);
                for i in 0..k {
                    scale += (self.x[r * k + i] as f64 * self.w[i * n + c] as f64).abs();
                }
                let bound =
                    2.0 * ((k + 1) as f64).sqrt() * u * scale + f64::from(f32::MIN_POSITIVE);
                let got = out[r * n + c] as f64;
                let err = (got - y[r * n + c]).abs();
                assert!(
                    err <= bound,
                    "{what} m={m} k={k} n={n} bias={with_bias} [{r}, {c}]: {got} vs {}, \
                     error {err:e} > bound {bound:e}",
                    y[r * n + c]
                );
            }
        }
    }
}

#[test]
fn gemm_f32_matches_f64_reference() {
    for (s, &(k, n)) in SIZES.iter().enumerate() {
        for &m in &ROWS {
            let case = Case::new(m, k, n, 100 * s as u64 + m as u64);
            for with_bias in [false, true] {
                let out = cpu_skinny::gemm_f32(&case.x, &case.w, case.bias(with_bias), [m, k, n])
                    .expect("shapes fit");
                case.check(&out, with_bias, "gemm_f32");
            }
        }
    }
}

/// Every instruction set of this machine, not only the one `gemm_f32` picks; those with
/// fused multiply-adds give the same values bit for bit (one order of sums).
#[test]
fn every_instruction_set_matches_f64_reference() {
    let isas = Isa::available();
    for (s, &(k, n)) in SIZES.iter().enumerate() {
        for &m in &ROWS {
            let case = Case::new(m, k, n, 50 + 100 * s as u64 + m as u64);
            let mut fused: Option<Vec<f32>> = None;
            for &isa in &isas {
                let out =
                    cpu_skinny::gemm_f32_with(isa, &case.x, &case.w, Some(&case.bias), [m, k, n])
                        .expect("shapes fit");
                case.check(&out, true, isa.name());
                if isa != Isa::Portable {
                    match &fused {
                        Some(f) => assert_eq!(&out, f, "{} m={m} k={k} n={n}", isa.name()),
                        None => fused = Some(out),
                    }
                }
            }
        }
    }
    let missing = [Isa::Avx512, Isa::Avx2, Isa::Neon]
        .into_iter()
        .find(|i| !isas.contains(i));
    if let Some(isa) = missing {
        match cpu_skinny::gemm_f32_with(isa, &[1.0], &[1.0], None, [1, 1, 1]) {
            Err(KernelError::Unsupported(_)) => {}
            other => panic!("expected Unsupported for {}, got {other:?}", isa.name()),
        }
    }
}

#[test]
fn skinny_linear_on_flex_matches_f64_reference() {
    for (s, &(k, n)) in SIZES.iter().enumerate() {
        for &m in &ROWS {
            let case = Case::new(m, k, n, 7 + 100 * s as u64 + m as u64);
            for with_bias in [false, true] {
                let y = Flex::skinny_linear(
                    tensor(&case.x, [m, k]),
                    tensor(&case.w, [k, n]),
                    with_bias.then(|| tensor(&case.bias, [n])),
                )
                .expect("shapes fit");
                assert_eq!(y.dims(), [m, n]);
                case.check(&host(y), with_bias, "Flex::skinny_linear");
            }
        }
    }
}

/// Each row's sum is taken in the same order whatever the other rows: a row of a 5-row
/// product is bit for bit the product of that row alone (decoding and verification agree).
#[test]
fn rows_do_not_depend_on_their_neighbours() {
    let (m, k, n) = (5, 300, 517);
    let case = Case::new(m, k, n, 42);
    let all = cpu_skinny::gemm_f32(&case.x, &case.w, Some(&case.bias), [m, k, n]).expect("fit");
    for r in 0..m {
        let one = cpu_skinny::gemm_f32(
            &case.x[r * k..(r + 1) * k],
            &case.w,
            Some(&case.bias),
            [1, k, n],
        )
        .expect("fit");
        assert_eq!(one, all[r * n..(r + 1) * n], "row {r}");
    }
}

/// A strided `x` (a transposed view) is copied and gives the same values, bit for bit; a
/// strided `w` and more than `CPU_SKINNY_MAX_ROWS` rows take Burn's matmul, within the bound.
#[test]
fn strided_inputs_and_tall_products_fall_back() {
    let (m, k, n) = (5, 37, 129);
    let case = Case::new(m, k, n, 9);
    let bias = || Some(tensor(&case.bias, [n]));
    let plain = host(
        Flex::skinny_linear(tensor(&case.x, [m, k]), tensor(&case.w, [k, n]), bias()).expect("fit"),
    );

    let mut xt = vec![0.0f32; k * m];
    for r in 0..m {
        for i in 0..k {
            xt[i * m + r] = case.x[r * k + i];
        }
    }
    let x_view = tensor(&xt, [k, m]).transpose();
    let y = Flex::skinny_linear(x_view, tensor(&case.w, [k, n]), bias()).expect("fit");
    assert_eq!(host(y), plain, "transposed x");

    let mut wt = vec![0.0f32; n * k];
    for i in 0..k {
        for c in 0..n {
            wt[c * k + i] = case.w[i * n + c];
        }
    }
    let w_view = tensor(&wt, [n, k]).transpose();
    let y = Flex::skinny_linear(tensor(&case.x, [m, k]), w_view, bias()).expect("fit");
    case.check(&host(y), true, "transposed w (Burn's matmul)");

    let tall = CPU_SKINNY_MAX_ROWS + 1;
    let case = Case::new(tall, k, n, 11);
    let y = Flex::skinny_linear(
        tensor(&case.x, [tall, k]),
        tensor(&case.w, [k, n]),
        Some(tensor(&case.bias, [n])),
    )
    .expect("fit");
    case.check(&host(y), true, "more rows than the skinny GEMM takes");
}

#[test]
fn bad_shapes_are_errors() {
    let x = tensor(&[1.0; 6], [2, 3]);
    let w = tensor(&[1.0; 8], [4, 2]);
    match Flex::skinny_linear(x.clone(), w, None) {
        Err(KernelError::Shape { name: "w", .. }) => {}
        other => panic!("expected a shape error naming w, got {other:?}"),
    }
    let w = tensor(&[1.0; 6], [3, 2]);
    match Flex::skinny_linear(x, w, Some(tensor(&[0.0; 3], [3]))) {
        Err(KernelError::Shape { name: "bias", .. }) => {}
        other => panic!("expected a shape error naming bias, got {other:?}"),
    }
    match cpu_skinny::gemm_f32(&[1.0; 5], &[1.0; 6], None, [2, 3, 2]) {
        Err(KernelError::Shape { name: "x", .. }) => {}
        other => panic!("expected a shape error naming x, got {other:?}"),
    }
    match cpu_skinny::gemm_f32(&[1.0; 6], &[1.0; 6], Some(&[0.0; 3]), [2, 3, 2]) {
        Err(KernelError::Shape { name: "bias", .. }) => {}
        other => panic!("expected a shape error naming bias, got {other:?}"),
    }
    assert_eq!(
        cpu_skinny::gemm_f32(&[], &[1.0; 6], None, [0, 3, 2]).expect("no rows"),
        Vec::<f32>::new()
    );
}
