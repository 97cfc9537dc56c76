//! The block-format products of `cpu_quant`: argument errors, batch invariance, every
//! instruction set against the portable path bit for bit, and a `Q8_0` product whose exact
//! value is known. The accuracy against dequantized weights in float64 is tested in
//! `crates/dustin-qwen/tests/quant_matmul.rs` (with `dustin_qwen::gguf::dequantize` as the
//! independent decoder).

use dustin_kernels::cpu_quant::{self, quant_matmul, QuantIsa, QuantMatrix, QuantType};
use dustin_kernels::KernelError;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TYPES: [QuantType; 8] = [
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q8_0,
    QuantType::Q4K,
    QuantType::Q5K,
    QuantType::Q6K,
];

/// Byte offsets of the f16 scales (`d`, `m`, `dmin`) in a block of `ty`.
fn half_fields(ty: QuantType) -> &'static [usize] {
    match ty {
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => &[0],
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
        QuantType::Q6K => &[208],
    }
}

/// A random weight: random bytes for the quants, finite f16 scales in `[-0.05, 0.05]`.
fn random_matrix(ty: QuantType, rows: usize, cols: usize, seed: u64) -> QuantMatrix {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let blocks = rows * cols / ty.block_elems();
    let mut data = vec![0u8; blocks * ty.block_bytes()];
    rng.fill_bytes(&mut data);
    for blk in data.chunks_exact_mut(ty.block_bytes()) {
        for &at in half_fields(ty) {
            let v = half::f16::from_f32(rng.random_range(-0.05f32..0.05));
            blk[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    QuantMatrix::new(ty, rows, cols, data).expect("sizes fit")
}

fn random_x(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn type_table() {
    let ids = [2, 3, 6, 7, 8, 12, 13, 14];
    let bytes = [18, 20, 22, 24, 34, 144, 176, 210];
    let names = [
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
    ];
    for (i, ty) in TYPES.into_iter().enumerate() {
        assert_eq!(QuantType::from_ggml_id(ids[i]), Some(ty));
        assert_eq!(ty.block_bytes(), bytes[i]);
        assert_eq!(ty.name(), names[i]);
        assert_eq!(ty.block_elems(), if i < 5 { 32 } else { 256 });
    }
    for id in [0, 1, 4, 5, 9, 10, 11, 15, 30, 1000] {
        assert_eq!(QuantType::from_ggml_id(id), None, "{id}");
    }
}

#[test]
fn matrix_errors_name_the_argument() {
    match QuantMatrix::new(QuantType::Q4K, 2, 100, vec![0; 0]) {
        Err(KernelError::InvalidInput { name: "cols", .. }) => {}
        other => panic!("expected cols error, got {other:?}"),
    }
    match QuantMatrix::new(QuantType::Q8_0, 2, 64, vec![0; 4 * 34 - 1]) {
        Err(KernelError::InvalidInput {
            name: "data",
            found,
            ..
        }) => {
            assert!(found.contains("135"), "{found}")
        }
        other => panic!("expected data error, got {other:?}"),
    }
    match QuantMatrix::new(QuantType::Q6K, usize::MAX, 256, vec![]) {
        Err(KernelError::InvalidInput { name: "data", .. }) => {}
        other => panic!("expected data error on overflow, got {other:?}"),
    }
    let w = QuantMatrix::new(QuantType::Q6K, 3, 512, vec![0; 3 * 2 * 210]).expect("fits");
    assert_eq!(
        (w.rows(), w.cols(), w.row_bytes(), w.bytes(), w.quant_type()),
        (3, 512, 420, 1260, QuantType::Q6K)
    );
    assert_eq!(w.data().len(), 1260);
}

#[test]
fn product_shape_errors_name_the_argument() {
    let w = random_matrix(QuantType::Q4_0, 5, 64, 1);
    match quant_matmul(&[0.0; 127], 2, &w, None) {
        Err(KernelError::Shape { name: "x", .. }) => {}
        other => panic!("expected x error, got {other:?}"),
    }
    match quant_matmul(&[0.0; 128], 2, &w, Some(&[0.0; 4])) {
        Err(KernelError::Shape { name: "bias", .. }) => {}
        other => panic!("expected bias error, got {other:?}"),
    }
    match quant_matmul(&[0.0; 64], usize::MAX, &w, None) {
        Err(KernelError::Shape { name: "x", .. }) => {}
        other => panic!("expected x error on overflow, got {other:?}"),
    }
    assert_eq!(
        quant_matmul(&[], 0, &w, None).expect("empty"),
        Vec::<f32>::new()
    );
    let missing = [
        QuantIsa::AvxVnni,
        QuantIsa::Avx512Vnni,
        QuantIsa::Avx2,
        QuantIsa::NeonDot,
        QuantIsa::Neon,
    ]
    .into_iter()
    .find(|i| !QuantIsa::available().contains(i));
    if let Some(isa) = missing {
        match cpu_quant::quant_matmul_with(isa, &[0.0; 64], 1, &w, None) {
            Err(KernelError::Unsupported(_)) => {}
            other => panic!("expected Unsupported for {}, got {other:?}", isa.name()),
        }
    }
}

/// `(rows, cols)` per type: ragged row counts, groups of 32-element blocks cut short (cols
/// not a multiple of 256), and one weight past the parallel threshold.
fn shapes(ty: QuantType) -> Vec<(usize, usize)> {
    if ty.block_elems() == 32 {
        vec![(3, 32), (37, 96), (70, 896), (300, 1056)]
    } else {
        vec![(3, 256), (37, 512), (300, 1280)]
    }
}

/// Every instruction set gives the portable path's values bit for bit, for every format,
/// with and without bias, for `m` within one chunk of rows and past it.
#[test]
fn every_instruction_set_matches_portable_bit_for_bit() {
    let isas = QuantIsa::available();
    assert_eq!(isas.last(), Some(&QuantIsa::Portable));
    println!(
        "instruction sets: {isas:?}, quant_isa() = {}",
        cpu_quant::quant_isa()
    );
    for (t, ty) in TYPES.into_iter().enumerate() {
        for (s, (rows, cols)) in shapes(ty).into_iter().enumerate() {
            let w = random_matrix(ty, rows, cols, 10 * t as u64 + s as u64);
            let bias = random_x(rows, 99);
            for m in [1, 5, 17, 70] {
                let x = random_x(m * cols, 1000 + m as u64);
                for b in [None, Some(bias.as_slice())] {
                    let want = cpu_quant::quant_matmul_with(QuantIsa::Portable, &x, m, &w, b)
                        .expect("fits");
                    assert!(want.iter().all(|v| v.is_finite()));
                    assert!(want.iter().any(|&v| v != 0.0));
                    for &isa in &isas {
                        let got = cpu_quant::quant_matmul_with(isa, &x, m, &w, b).expect("fits");
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{} {} [{rows}, {cols}] m={m} bias={}",
                            ty.name(),
                            isa.name(),
                            b.is_some()
                        );
                    }
                }
            }
        }
    }
}

/// Row `r` of a product of `m` rows is bit for bit the product of that row alone (and of
/// any sub-batch holding it): greedy outputs do not depend on the batch.
#[test]
fn rows_do_not_depend_on_their_neighbours() {
    for (t, ty) in TYPES.into_iter().enumerate() {
        let (rows, cols) = if ty.block_elems() == 32 {
            (333, 1056)
        } else {
            (333, 1536)
        };
        let w = random_matrix(ty, rows, cols, 500 + t as u64);
        let bias = random_x(rows, 7);
        // 70 rows: past one chunk of rows at these widths
        let m = 70;
        let x = random_x(m * cols, 600 + t as u64);
        let all = quant_matmul(&x, m, &w, Some(&bias)).expect("fits");
        for r in [0, 1, 5, 33, 63, 64, 69] {
            let one = quant_matmul(&x[r * cols..(r + 1) * cols], 1, &w, Some(&bias)).expect("fits");
            assert_eq!(
                bits(&one),
                bits(&all[r * rows..(r + 1) * rows]),
                "{} row {r}",
                ty.name()
            );
        }
        let (r0, k) = (3, 5);
        let some = quant_matmul(&x[r0 * cols..(r0 + k) * cols], k, &w, Some(&bias)).expect("fits");
        assert_eq!(
            bits(&some),
            bits(&all[r0 * rows..(r0 + k) * rows]),
            "{} rows {r0}..{}",
            ty.name(),
            r0 + k
        );
    }
}

/// `Q8_0` weights with power-of-two scales times `x` already on an int8 grid (each block's
/// largest magnitude is 127 steps of a power of two, so quantizing `x` loses nothing): every
/// partial sum is an integer multiple of `d_w d_x` below `2^24` of them, so the product is
/// exactly the float64 one, bias included.
#[test]
fn q8_0_on_the_int8_grid_is_exact() {
    let (rows, cols, m) = (45, 512, 6);
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    let dw_of = |j: usize| 2f32.powi(-3 - (j % 4) as i32);
    let mut data = Vec::with_capacity(rows * cols / 32 * 34);
    let mut wq = vec![0i32; rows * cols];
    for j in 0..rows {
        for b in 0..cols / 32 {
            data.extend_from_slice(&half::f16::from_f32(dw_of(j)).to_bits().to_le_bytes());
            for i in 0..32 {
                // the extremes of both ranges, then random values
                let q: i8 = match (j + b + i) % 11 {
                    0 => -128,
                    1 => 127,
                    _ => rng.random(),
                };
                wq[j * cols + b * 32 + i] = i32::from(q);
                data.push(q as u8);
            }
        }
    }
    let w = QuantMatrix::new(QuantType::Q8_0, rows, cols, data).expect("fits");
    let dx_of = |r: usize| 2f32.powi(-5 - (r % 3) as i32);
    let mut xq = vec![0i32; m * cols];
    for r in 0..m {
        for (i, q) in xq[r * cols..(r + 1) * cols].iter_mut().enumerate() {
            *q = match i % 32 {
                0 if (r + i / 32) % 2 == 0 => 127,
                0 => -127,
                _ => rng.random_range(-127..=127),
            };
        }
    }
    let x: Vec<f32> = xq
        .iter()
        .enumerate()
        .map(|(i, &q)| q as f32 * dx_of(i / cols))
        .collect();
    // bias: small multiples of `d_w d_x` for every x row of weight row j
    let bias: Vec<f32> = (0..rows)
        .map(|j| (j as f32 - 20.0) * dw_of(j) * 2f32.powi(-5))
        .collect();
    for isa in QuantIsa::available() {
        let y = cpu_quant::quant_matmul_with(isa, &x, m, &w, Some(&bias)).expect("fits");
        for r in 0..m {
            for j in 0..rows {
                let dot: i64 = (0..cols)
                    .map(|i| i64::from(wq[j * cols + i]) * i64::from(xq[r * cols + i]))
                    .sum();
                let want =
                    dot as f64 * f64::from(dw_of(j)) * f64::from(dx_of(r)) + f64::from(bias[j]);
                assert_eq!(
                    f64::from(y[r * rows + j]),
                    want,
                    "{} [{r}, {j}]",
                    isa.name()
                );
            }
        }
    }
}

/// Hand-made blocks whose products are known: a `Q4_0` block of nibble 9 with `d = 0.5`
/// (every weight 0.5), a `Q6_K` block of `q = 33`, scales 2 with `d = 0.25` (every weight
/// 0.5), a `Q4_K` block with every sub-block `sc = 1`, `m = 1`, `d = 1`, `dmin = 0.5`,
/// nibble 3 (every weight 2.5): times `x = 127 / 64` everywhere (activation scale 1/64, so
/// every step is exact).
#[test]
fn hand_made_blocks() {
    let half = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
    let mut q4_0 = half(0.5).to_vec();
    q4_0.extend([0x99u8; 16]);
    let mut q6k = vec![0x11u8; 128]; // low 4 bits 1 in both nibbles
    q6k.extend([0xAAu8; 64]); // high 2 bits 2 for all four: q = 1 | 2 << 4 = 33
    q6k.extend([2u8; 16]);
    q6k.extend(half(0.25));
    let mut q4k = half(1.0).to_vec();
    q4k.extend(half(0.5));
    // sc = m = 1 for all 8 sub-blocks: bytes 0..4 sc, 4..8 m (6 bits), 8..12 low bits of 4..8
    q4k.extend([1, 1, 1, 1, 1, 1, 1, 1, 0x11, 0x11, 0x11, 0x11]);
    q4k.extend([0x33u8; 128]);
    for (ty, data, cols, each) in [
        (QuantType::Q4_0, q4_0, 32, 0.5f32),
        (QuantType::Q6K, q6k, 256, 0.5),
        (QuantType::Q4K, q4k, 256, 2.5),
    ] {
        let w = QuantMatrix::new(ty, 1, cols, data).expect("fits");
        for isa in QuantIsa::available() {
            let x = vec![127.0 / 64.0; cols];
            let y = cpu_quant::quant_matmul_with(isa, &x, 1, &w, Some(&[1.0])).expect("fits");
            let want = each * (127.0 / 64.0) * cols as f32 + 1.0;
            assert_eq!(y, [want], "{} {}", ty.name(), isa.name());
        }
    }
}

/// A NaN in `x` makes its row's outputs NaN (and only its row's).
#[test]
fn nan_propagates_to_its_row() {
    let w = random_matrix(QuantType::Q4K, 4, 256, 3);
    let mut x = random_x(2 * 256, 4);
    x[256 + 17] = f32::NAN;
    let y = quant_matmul(&x, 2, &w, None).expect("fits");
    assert!(y[..4].iter().all(|v| v.is_finite()));
    assert!(y[4..].iter().all(|v| v.is_nan()));
}
