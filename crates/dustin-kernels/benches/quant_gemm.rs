//! CPU cost of one linear layer with weights in GGUF block formats (`cpu_quant::quant_matmul`)
//! against the f32 skinny GEMM (`cpu_skinny::gemm_f32`) on the same shape, at Qwen2.5-1.5B
//! shapes: the MLP's gate `[8960 x 1536]` and down `[1536 x 8960]` projections and the LM
//! head `[151936 x 1536]`, for `m` = 1 (decoding), 5 (verification, gamma + 1) and 16 rows,
//! `Q4_K` and `Q6_K` (the formats of the Q4_K_M file); the 0.5B draft's gate projection
//! `[4864 x 896]` in `Q5_0` and `Q8_0`; and a prefill chunk of 512 rows of the 1.5B gate
//! projection, `Q4_K` through the block kernels and through the AMX product (`cpu_amx`, where
//! the machine has AMX) against Burn's f32 matmul (`burn_flex`).
//!
//! `cargo bench -p dustin-kernels --bench quant_gemm` (criterion; a filter such as `gate`
//! or `prefill` picks groups; `QUANT_ISA=avx2` (or another `QuantIsa` name) times that
//! instruction set instead of the detected one). Throughput is the weight's bytes read per second (decimal
//! GB/s): the block bytes for `quant_matmul`, the f32 bytes for the others. The weights are
//! cold, as in a model forward: each call takes the next of several copies of the weight
//! that together exceed [`COLD_BYTES`] (more than a 300 MB L3).

use std::hint::black_box;

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Tensor, TensorData};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dustin_kernels::cpu_quant::{self, QuantIsa, QuantMatrix, QuantType};
use dustin_kernels::cpu_skinny;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `(name, rows = out_features, cols = in_features, formats)`: Qwen2.5-1.5B's layers in the
/// formats of its Q4_K_M file, and the 0.5B draft's gate projection (896 columns: not whole
/// super-blocks, hence `Q5_0` in the Q4_K_M file, and `Q8_0`).
const SHAPES: [(&str, usize, usize, &[QuantType]); 4] = [
    (
        "gate 8960x1536",
        8960,
        1536,
        &[QuantType::Q4K, QuantType::Q6K],
    ),
    (
        "down 1536x8960",
        1536,
        8960,
        &[QuantType::Q4K, QuantType::Q6K],
    ),
    (
        "lm_head 151936x1536",
        151936,
        1536,
        &[QuantType::Q4K, QuantType::Q6K],
    ),
    (
        "draft gate 4864x896",
        4864,
        896,
        &[QuantType::Q5_0, QuantType::Q8_0],
    ),
];

/// Rows of `x` per call.
const ROWS: [usize; 3] = [1, 5, 16];

/// Bytes of weight copies each implementation cycles through.
const COLD_BYTES: usize = 400 << 20;

/// Rows of the prefill chunk.
const PREFILL_ROWS: usize = 512;

/// A random weight in `ty`: random quants, finite f16 scale fields in `[-0.05, 0.05]`.
fn random_quant(ty: QuantType, rows: usize, cols: usize, seed: u64) -> QuantMatrix {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut data = vec![0u8; rows * cols / ty.block_elems() * ty.block_bytes()];
    rng.fill_bytes(&mut data);
    let fields: &[usize] = match ty {
        QuantType::Q6K => &[208],
        QuantType::Q4K | QuantType::Q5K | QuantType::Q4_1 | QuantType::Q5_1 => &[0, 2],
        _ => &[0],
    };
    for blk in data.chunks_exact_mut(ty.block_bytes()) {
        for &at in fields {
            let v = half::f16::from_f32(rng.random_range(-0.05f32..0.05));
            blk[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    QuantMatrix::new(ty, rows, cols, data).expect("sizes fit")
}

fn random_f32(len: usize, amp: f32, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-amp..amp)).collect()
}

/// Copies of `one` that together hold at least [`COLD_BYTES`] (at least one).
fn copies<T: Clone>(one: T, bytes: usize) -> Vec<T> {
    let n = COLD_BYTES.div_ceil(bytes).max(1);
    vec![one; n]
}

/// The instruction set to time: `QUANT_ISA` if set (and available), else the detected one.
fn isa() -> QuantIsa {
    let want = std::env::var("QUANT_ISA").unwrap_or_default();
    QuantIsa::available()
        .into_iter()
        .find(|i| i.name() == want)
        .unwrap_or_else(QuantIsa::detect)
}

fn quant_matmul(x: &[f32], m: usize, w: &QuantMatrix, bias: Option<&[f32]>) -> Vec<f32> {
    cpu_quant::quant_matmul_with(isa(), x, m, w, bias).expect("shapes fit")
}

fn bench(c: &mut Criterion) {
    println!(
        "quant_matmul: {} (detected: {}), f32 skinny GEMM: {}, rayon threads: {}",
        isa().name(),
        cpu_quant::quant_isa(),
        cpu_skinny::kernel_name(),
        rayon::current_num_threads()
    );
    for (s, &(name, rows, cols, types)) in SHAPES.iter().enumerate() {
        let mut g = c.benchmark_group(name);
        if rows > 100_000 {
            g.sample_size(10);
        }
        let bias = random_f32(rows, 0.02, 7);
        let xs: Vec<Vec<f32>> = ROWS
            .iter()
            .map(|&m| random_f32(m * cols, 1.0, 100 + m as u64))
            .collect();
        for &ty in types {
            let w = random_quant(ty, rows, cols, 10 * s as u64);
            let bytes = w.bytes();
            let ws = copies(w, bytes);
            g.throughput(Throughput::BytesDecimal(bytes as u64));
            for (x, &m) in xs.iter().zip(&ROWS) {
                let mut i = 0;
                g.bench_with_input(BenchmarkId::new(ty.name(), m), &m, |b, &m| {
                    b.iter(|| {
                        i += 1;
                        black_box(quant_matmul(x, m, &ws[i % ws.len()], Some(&bias)))
                    })
                });
            }
        }
        // f32 in the skinny GEMM's layout: `[in, out]`
        let bytes = rows * cols * 4;
        let ws = copies(random_f32(rows * cols, 0.02, 11), bytes);
        g.throughput(Throughput::BytesDecimal(bytes as u64));
        for (x, &m) in xs.iter().zip(&ROWS) {
            let mut i = 0;
            g.bench_with_input(BenchmarkId::new("f32 skinny", m), &m, |b, &m| {
                b.iter(|| {
                    i += 1;
                    let w = &ws[i % ws.len()];
                    black_box(
                        cpu_skinny::gemm_f32(x, w, Some(&bias), [m, cols, rows]).expect("fit"),
                    )
                })
            });
        }
        g.finish();
    }

    // a prefill chunk of the gate projection: compute-bound, one copy of each weight
    let (rows, cols) = (8960, 1536);
    let m = PREFILL_ROWS;
    let mut g = c.benchmark_group("prefill gate 8960x1536");
    g.sample_size(10);
    let x = random_f32(m * cols, 1.0, 5);
    let w = random_quant(QuantType::Q4K, rows, cols, 21);
    g.throughput(Throughput::BytesDecimal(w.bytes() as u64));
    g.bench_with_input(BenchmarkId::new("Q4_K", m), &m, |b, &m| {
        b.iter(|| black_box(quant_matmul(&x, m, &w, None)))
    });
    if dustin_kernels::cpu_amx::available() {
        g.bench_with_input(BenchmarkId::new("Q4_K amx", m), &m, |b, &m| {
            b.iter(|| {
                black_box(dustin_kernels::cpu_amx::amx_matmul(&x, m, &w, None).expect("fits"))
            })
        });
    }
    let dev = FlexDevice;
    let xt: Tensor<Flex, 2> = Tensor::from_data(TensorData::new(x.clone(), [m, cols]), &dev);
    let wt: Tensor<Flex, 2> = Tensor::from_data(
        TensorData::new(random_f32(rows * cols, 0.02, 22), [cols, rows]),
        &dev,
    );
    g.throughput(Throughput::BytesDecimal((rows * cols * 4) as u64));
    g.bench_with_input(BenchmarkId::new("f32 burn matmul", m), &m, |b, _| {
        b.iter(|| black_box(xt.clone().matmul(wt.clone()).into_data()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
