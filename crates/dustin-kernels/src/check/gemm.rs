//! The skinny GEMMs' check (decode and verify rows) against float64 references.

use burn_tensor::{Tensor, TensorData};

use super::{row, CheckRow};
use crate::{reference, KernelOps};

/// The skinny GEMMs of decode and verify rows against float64 references:
/// [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear) (op `skinny`), [`KernelOps::skinny_linear3`](crate::LinearOps::skinny_linear3) (`skinny3`) and
/// [`KernelOps::skinny_swiglu`](crate::LinearOps::skinny_swiglu) (`swiglu`), with whichever kernel the backend picks (on CUDA
/// `dustin-kernels-gpu check --op skinny` runs them again with each kernel forced). One row per
/// output, error relative to the reference's largest magnitude, under `bound`.
pub fn check_skinny_gemms<B: KernelOps>(device: &B::Device, bound: f64) -> Vec<CheckRow> {
    let mut rows_out = Vec::new();
    let up = |v: Vec<f32>, shape: Vec<usize>| TensorData::new(v, shape);
    // Skinny GEMM (decode and verify rows): one row, a verify batch of 15 rows with bias, 16
    // rows (the most the kernel takes), 17 rows and n = 302 (Burn's matmul), k not a multiple
    // of the split; 0.5B's o_proj, whose 1792-byte rows cubecl-cuda pads to 2048 (the kernel
    // reads `w` through its row stride), as it does 1028 columns
    // on the CUDA-core kernel; then rows past its 16 that the tensor-core kernel takes (by
    // default up to 48 rows; `dustin-kernels-gpu check` runs these rows again with it forced
    // and with the CUDA-core kernel only): 40 (batch 8 x gamma + 1), 128 (its most), 33 with
    // a k of 64, 72
    // (two launches of its 48-row groups, the second of 24 rows: two 16-row tiles); then for
    // the ring kernel (33 to 128 rows by default, every row count when forced): 80 rows
    // (batch 16 x gamma + 1) over 1024 with a last column tile of 8 columns, 120 rows over
    // two 64-row stages (fewer than the default ring's 3), and k of 96, 32 and 48: whole
    // stages of the 32-row shapes (`--ring-config 64x32x4`) but not of the default 64-row
    // one, so by default they go to the tensor-core kernel (as the 48 does in every shape)
    let skinny: [(usize, usize, usize, bool); 15] = [
        (1, 896, 4864, true),
        (4, 896, 896, false),
        (15, 1000, 512, true),
        (16, 3584, 1028, false),
        (17, 200, 64, true),
        (3, 77, 302, false),
        (40, 3584, 512, true),
        (128, 256, 1040, false),
        (33, 64, 48, true),
        (72, 896, 136, true),
        (80, 1024, 200, true),
        (100, 96, 64, false),
        (50, 32, 72, true),
        (40, 48, 64, false),
        (120, 128, 136, true),
    ];
    for (i, &(m, k, n, with_bias)) in skinny.iter().enumerate() {
        let seed = 7400 + i as u64;
        let x = reference::random_bf16(m * k, 2.0, seed);
        let w = reference::random_bf16(k * n, 0.05, seed + 1);
        let b = reference::random_bf16(n, 1.0, seed + 2);
        let want = reference::linear(&x, &w, with_bias.then_some(&b[..]), m, k, n);
        let xt = Tensor::<B, 2>::from_data(up(x, vec![m, k]), device);
        let wt = Tensor::<B, 2>::from_data(up(w, vec![k, n]), device);
        let bt = with_bias.then(|| Tensor::<B, 1>::from_data(up(b, vec![n]), device));
        rows_out.push(row(
            format!(
                "[{m}, {k}] x [{k}, {n}]{}",
                if with_bias { " + bias" } else { "" }
            ),
            "skinny",
            B::skinny_linear(xt, wt, bt),
            &want,
            bound,
        ));
    }
    // Three weights of one x (q, k, v of a decode / verify step): 0.5B's q/k/v with bias at
    // 1 and 10 rows; odd widths where one weight falls back (n not a multiple of 4), no bias;
    // then split over k on the tensor-core kernel (8 rows) and the ring kernel (40 rows), a
    // bias on the first and last weight only, column tiles cut by n: the split reduction
    // inside the GEMM's launch sums each weight into its own output
    let three: [(usize, usize, [usize; 3], bool); 5] = [
        (1, 896, [896, 128, 128], true),
        (10, 1000, [512, 64, 260], true),
        (3, 77, [64, 302, 128], false),
        (8, 2048, [896, 136, 128], true),
        (40, 1024, [520, 128, 72], true),
    ];
    for (i, &(m, k, ns, with_bias)) in three.iter().enumerate() {
        let seed = 7500 + 10 * i as u64;
        let x = reference::random_bf16(m * k, 2.0, seed);
        let xt = Tensor::<B, 2>::from_data(up(x.clone(), vec![m, k]), device);
        let mut want = Vec::new();
        let ws: [crate::LinearParts<B>; 3] = std::array::from_fn(|j| {
            let n = ns[j];
            let w = reference::random_bf16(k * n, 0.05, seed + 1 + 2 * j as u64);
            let b = reference::random_bf16(n, 1.0, seed + 2 + 2 * j as u64);
            // the split cases (k 1024 and 2048) leave the middle weight without a bias
            let with_bias = with_bias && (k < 1024 || j != 1);
            want.push(reference::linear(
                &x,
                &w,
                with_bias.then_some(&b[..]),
                m,
                k,
                n,
            ));
            (
                Tensor::<B, 2>::from_data(up(w, vec![k, n]), device),
                with_bias.then(|| Tensor::<B, 1>::from_data(up(b, vec![n]), device)),
            )
        });
        let case = format!(
            "[{m}, {k}] x {ns:?}{}",
            match (with_bias, k >= 1024) {
                (true, true) => " + bias on #0 and #2",
                (true, false) => " + bias",
                _ => "",
            }
        );
        match B::skinny_linear3(xt, ws) {
            Ok(outs) => {
                for (j, (o, w)) in outs.into_iter().zip(&want).enumerate() {
                    rows_out.push(row(format!("{case} #{j}"), "skinny3", Ok(o), w, bound));
                }
            }
            Err(e) => rows_out.push(row::<B, 2>(case, "skinny3", Err(e), &want[0], bound)),
        }
    }
    // SwiGLU of a decode / verify step: 0.5B's MLP at 1 and 16 rows, an odd width (falls
    // back); then split over k on the tensor-core kernel (8 rows) and the ring kernel (40
    // rows, a last column tile of 8), where the gate's and the up projection's tiles of the
    // same columns finish together inside the GEMM's launch
    let swiglu: [(usize, usize, usize); 5] = [
        (1, 896, 4864),
        (16, 1000, 512),
        (5, 64, 302),
        (8, 3584, 1024),
        (40, 2048, 520),
    ];
    for (i, &(m, k, n)) in swiglu.iter().enumerate() {
        let seed = 7600 + 10 * i as u64;
        let x = reference::random_bf16(m * k, 2.0, seed);
        let g = reference::random_bf16(k * n, 0.05, seed + 1);
        let u = reference::random_bf16(k * n, 0.05, seed + 2);
        let gate = reference::linear(&x, &g, None, m, k, n);
        let upv = reference::linear(&x, &u, None, m, k, n);
        let want: Vec<f64> = gate
            .iter()
            .zip(&upv)
            .map(|(&a, &b)| a / (1.0 + (-a).exp()) * b)
            .collect();
        rows_out.push(row(
            format!("[{m}, {k}] x 2 x [{k}, {n}]"),
            "swiglu",
            B::skinny_swiglu(
                Tensor::<B, 2>::from_data(up(x, vec![m, k]), device),
                Tensor::<B, 2>::from_data(up(g, vec![k, n]), device),
                Tensor::<B, 2>::from_data(up(u, vec![k, n]), device),
            ),
            &want,
            bound,
        ));
    }
    rows_out
}
