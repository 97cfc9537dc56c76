//! CPU cost of one linear layer of decoding (`m = 1` row) and verification (`m = 5` rows,
//! gamma + 1, and other small `m`) at Qwen2.5-1.5B shapes: Burn's matmul on `Flex` against
//! the f32 skinny GEMM of `dustin_kernels::cpu_skinny` (`KernelOps::skinny_linear` on Flex).
//!
//! `cargo bench -p dustin-kernels --bench skinny_gemm`. The weights are cold, as in a model
//! forward (6.2 GB of f32 weights at 1.5B, far past any cache): each call takes the next of
//! several copies of the weight that together exceed 600 MB (more than a 300 MB L3). Calls
//! are interleaved (one call of each implementation and `m` per repetition) so that load from
//! other processes hits them alike; medians in milliseconds.

use std::time::Instant;

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Distribution, Tensor};
use dustin_kernels::cpu_skinny;
use dustin_kernels::prelude::*;

type B = Flex;

/// `(name, k, n)`: the `[in, out]` weights of one Qwen2.5-1.5B layer and the LM head.
const SHAPES: [(&str, usize, usize); 5] = [
    ("q/o 1536x1536", 1536, 1536),
    ("k/v 1536x256", 1536, 256),
    ("gate/up 1536x8960", 1536, 8960),
    ("down 8960x1536", 8960, 1536),
    ("lm_head 1536x151936", 1536, 151936),
];

/// Rows per call.
const ROWS: [usize; 7] = [1, 2, 5, 8, 16, 32, 64];

/// Bytes of weight copies each shape cycles through.
const COLD_BYTES: usize = 640 << 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn max_abs_diff(a: Tensor<B, 2>, b: Tensor<B, 2>) -> f32 {
    (a - b).abs().max().into_scalar()
}

fn main() {
    let dev = FlexDevice;
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    println!(
        "skinny GEMM kernel: {}, rayon threads: {}",
        cpu_skinny::kernel_name(),
        rayon::current_num_threads()
    );
    for (name, k, n) in SHAPES {
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        let bytes = k * n * 4;
        let copies = COLD_BYTES.div_ceil(bytes).max(2);
        let ws: Vec<Tensor<B, 2>> = (0..copies)
            .map(|_| Tensor::random([k, n], Distribution::Normal(0.0, 0.02), &dev))
            .collect();
        let bias: Tensor<B, 1> = Tensor::random([n], Distribution::Normal(0.0, 0.02), &dev);
        let xs: Vec<Tensor<B, 2>> = ROWS
            .iter()
            .map(|&m| Tensor::random([m, k], Distribution::Normal(0.0, 1.0), &dev))
            .collect();
        let reps = if n > 100_000 { 7 } else { 21 };
        // [impl][m]: 0 = Burn's matmul + bias, 1 = skinny GEMM
        let mut times = vec![vec![Vec::new(); ROWS.len()]; 2];
        let mut diff = 0.0f32;
        for x in &xs {
            let a = x.clone().matmul(ws[0].clone()) + bias.clone().unsqueeze::<2>();
            let b = B::skinny_linear(x.clone(), ws[0].clone(), Some(bias.clone())).expect("shape");
            diff = diff.max(max_abs_diff(a, b));
        }
        let mut c = 0;
        for _ in 0..reps {
            for (i, x) in xs.iter().enumerate() {
                for (imp, t_imp) in times.iter_mut().enumerate() {
                    let w = ws[c % copies].clone();
                    c += 1;
                    let t = Instant::now();
                    let y = if imp == 0 {
                        x.clone().matmul(w) + bias.clone().unsqueeze::<2>()
                    } else {
                        B::skinny_linear(x.clone(), w, Some(bias.clone())).expect("shape")
                    };
                    let _ = std::hint::black_box(y.into_data());
                    t_imp[i].push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        println!(
            "{name} ({:.1} MB, {copies} copies, {reps} reps, max |ours - burn| = {diff:.2e})",
            bytes as f64 / 1e6
        );
        let burn1 = median(times[0][0].clone());
        let ours1 = median(times[1][0].clone());
        for (i, &m) in ROWS.iter().enumerate() {
            let (tb, to) = (median(times[0][i].clone()), median(times[1][i].clone()));
            println!(
                "  m={m:<3} burn {tb:9.3} ms ({:5.2}x m=1)   ours {to:9.3} ms ({:5.2}x m=1)   \
                 ours/burn {:5.2}   ours GB/s {:5.1}",
                tb / burn1,
                to / ours1,
                to / tb,
                bytes as f64 / to / 1e6
            );
        }
    }
}
