//! Dequantisation of Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS against the `gguf` Python
//! package (`gguf.quants.dequantize`), bit for bit.
//!
//! Fixtures in tests/fixtures/dequant come from scripts/gguf_dequant_fixtures.py (its header
//! gives the file format): per type, random blocks (random bytes with finite f16 scale fields),
//! edge blocks (f16 fields +0, -0, a subnormal, 65504) and, for Q5_0 only, real blocks from
//! Qwen2.5-Coder-0.5B-Instruct Q4_K_M. None of the other types occurs in the model files the
//! script reads, so they are checked on random and edge blocks only.
//!
//! The ignored test loads every tensor of that 0.5B GGUF from the model cache
//! (`$DUSTIN_CACHE` or `~/.cache/dustin`, `models/`); run it with
//! `cargo test -p dustin-qwen --test gguf_dequant_fixtures -- --ignored`.

use std::path::{Path, PathBuf};

use dustin_qwen::gguf::{dequantize, DequantError, GgmlType, GgufFile, SUPPORTED_TYPES};
use dustin_qwen::{QwenError, WeightSource};

/// The types with fixtures, and whether their fixture holds real model blocks.
const TYPES: [(GgmlType, bool); 7] = [
    (GgmlType::Q5_0, true),
    (GgmlType::Q5_1, false),
    (GgmlType::Q2K, false),
    (GgmlType::Q3K, false),
    (GgmlType::Q5K, false),
    (GgmlType::IQ4NL, false),
    (GgmlType::IQ4XS, false),
];

const KIND_RANDOM: u8 = 0;
const KIND_EDGE: u8 = 1;
const KIND_REAL: u8 = 2;

/// One test case of a fixture file: blocks and the expected `f32` bit patterns.
struct Case {
    kind: u8,
    label: String,
    blocks: Vec<u8>,
    expected: Vec<u32>,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dequant")
}

/// A little-endian reader over a fixture file that panics (with the file name) on truncation.
struct Cursor<'a> {
    name: &'a str,
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = self
            .b
            .get(self.at..self.at + n)
            .unwrap_or_else(|| panic!("{}: truncated at byte {}", self.name, self.at));
        self.at += n;
        s
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().unwrap())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
}

/// The cases of `<TYPE>.bin` (format: see scripts/gguf_dequant_fixtures.py).
fn load_cases(ty: GgmlType) -> Vec<Case> {
    let path = fixtures().join(format!("{}.bin", ty.name()));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = ty.name();
    let mut c = Cursor {
        name,
        b: &bytes,
        at: 0,
    };
    assert_eq!(c.take(4), b"DQFX", "{name}: magic");
    assert_eq!(c.u32(), 1, "{name}: version");
    assert_eq!(c.u32(), ty.id(), "{name}: ggml type id");
    let n_cases = c.u32();
    let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
    let cases = (0..n_cases)
        .map(|_| {
            let kind = c.u8();
            let len = c.u16() as usize;
            let label = String::from_utf8(c.take(len).to_vec()).expect("UTF-8 label");
            let n_blocks = c.u32() as usize;
            let blocks = c.take(n_blocks * ts).to_vec();
            let expected = c
                .take(n_blocks * bs * 4)
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
                .collect();
            Case {
                kind,
                label,
                blocks,
                expected,
            }
        })
        .collect();
    assert_eq!(c.at, bytes.len(), "{name}: trailing bytes");
    cases
}

/// Bit-exact comparison (so -0.0 vs 0.0 counts), naming the element and its block.
fn assert_bits_eq(what: &str, block: usize, got: &[f32], want: &[u32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w,
            "{what}: element {i} (block {}): got {g:e} ({:#010x}), want {:e} ({w:#010x})",
            i / block,
            g.to_bits(),
            f32::from_bits(w),
        );
    }
}

#[test]
fn new_types_are_supported_and_listed() {
    for (ty, _) in TYPES {
        assert!(ty.is_supported(), "{ty}");
        assert!(SUPPORTED_TYPES.split(", ").any(|n| n == ty.name()), "{ty}");
    }
}

#[test]
fn fixtures_match_gguf_python_bit_for_bit() {
    for (ty, has_real) in TYPES {
        let cases = load_cases(ty);
        let kinds: Vec<u8> = cases.iter().map(|c| c.kind).collect();
        assert!(kinds.contains(&KIND_RANDOM), "{ty}: no random blocks");
        assert!(kinds.contains(&KIND_EDGE), "{ty}: no edge blocks");
        assert_eq!(kinds.contains(&KIND_REAL), has_real, "{ty}: real blocks");
        let bs = ty.block_size() as usize;
        for case in &cases {
            assert!(!case.blocks.is_empty(), "{ty} {}: empty", case.label);
            let what = format!("{ty} {}", case.label);
            // all blocks at once
            let mut out = vec![f32::NAN; case.expected.len()];
            dequantize(ty, &case.blocks, &mut out).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_bits_eq(&what, bs, &out, &case.expected);
            // and block by block
            let ts = ty.type_size() as usize;
            for (i, (b, want)) in case
                .blocks
                .chunks_exact(ts)
                .zip(case.expected.chunks_exact(bs))
                .enumerate()
            {
                let mut one = vec![f32::NAN; bs];
                dequantize(ty, b, &mut one).unwrap();
                assert_bits_eq(&format!("{what}, block {i} alone"), bs, &one, want);
            }
        }
    }
}

/// Over 2^20 elements `dequantize` splits the work over threads by whole blocks; the result
/// must not change.
#[test]
fn large_buffers_match_fixtures() {
    for (ty, _) in TYPES {
        let cases = load_cases(ty);
        let case = &cases[0];
        let reps = (1usize << 20) / case.expected.len() + 3;
        let data = case.blocks.repeat(reps);
        let mut out = vec![0.0f32; case.expected.len() * reps];
        dequantize(ty, &data, &mut out).unwrap();
        for (r, got) in out.chunks_exact(case.expected.len()).enumerate() {
            assert_bits_eq(
                &format!("{ty} {} repeat {r}", case.label),
                ty.block_size() as usize,
                got,
                &case.expected,
            );
        }
    }
}

#[test]
fn truncated_or_partial_input_is_an_error() {
    for (ty, _) in TYPES {
        let cases = load_cases(ty);
        let case = &cases[0];
        let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
        let n = case.expected.len();
        let mut out = vec![0.0f32; n];
        // one byte short, one byte long, one block short, nothing at all
        for data in [
            &case.blocks[..case.blocks.len() - 1],
            &[case.blocks.as_slice(), &[0]].concat()[..],
            &case.blocks[..case.blocks.len() - ts],
            &[][..],
        ] {
            match dequantize(ty, data, &mut out) {
                Err(DequantError::Size {
                    ty: t,
                    n: m,
                    expected,
                    found,
                }) => {
                    assert_eq!((t, m, found), (ty, n, data.len()));
                    assert_eq!(expected, case.blocks.len() as u64);
                }
                other => panic!(
                    "{ty}, {} bytes: expected a size error, got {other:?}",
                    data.len()
                ),
            }
        }
        // an element count that is not a whole number of blocks
        for m in [1, bs - 1, n - 1, n + 1] {
            let mut out = vec![0.0f32; m];
            assert!(
                matches!(
                    dequantize(ty, &case.blocks, &mut out),
                    Err(DequantError::PartialBlock { .. })
                ),
                "{ty}, {m} elements"
            );
        }
    }
}

#[test]
fn still_unsupported_types_are_reported() {
    for ty in [GgmlType::IQ2XXS, GgmlType::TQ1_0, GgmlType::Q8K] {
        assert!(!ty.is_supported(), "{ty}");
        let data = vec![0u8; ty.type_size() as usize];
        let mut out = vec![0.0f32; ty.block_size() as usize];
        let e = dequantize(ty, &data, &mut out).unwrap_err();
        assert_eq!(e, DequantError::Unsupported(ty));
        let msg = e.to_string();
        assert!(
            msg.contains(ty.name()) && msg.contains(SUPPORTED_TYPES),
            "{msg}"
        );
    }
}

fn qwen_0_5b_path() -> Option<PathBuf> {
    let root = std::env::var_os("DUSTIN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dustin")))?;
    let p = root.join("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipped: {} absent", p.display());
        None
    }
}

#[test]
#[ignore = "needs the Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF in the model cache"]
fn qwen_0_5b_loads_every_tensor() {
    let Some(path) = qwen_0_5b_path() else { return };
    let g = GgufFile::open(&path).unwrap();
    let mut by_type = std::collections::BTreeMap::<&str, usize>::new();
    for t in g.tensors() {
        let h = g
            .load_gguf(&t.name)
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert_eq!(h.shape, t.shape(), "{}", t.name);
        assert!(
            h.data.iter().all(|v| v.is_finite()),
            "{}: non-finite",
            t.name
        );
        *by_type.entry(t.ggml_type.name()).or_default() += 1;
    }
    println!("{} tensors loaded: {by_type:?}", g.tensors().len());
    assert!(by_type.contains_key("Q5_0"));
    // and in HF naming (the embeddings are Q5_0)
    let emb = g.load("model.embed_tokens.weight").unwrap();
    assert_eq!(emb.shape, [151936, 896]);
    for name in g.hf_tensor_names() {
        match g.load(&name) {
            Ok(_) => {}
            Err(e @ QwenError::UnsupportedDtype { .. }) => panic!("{e}"),
            Err(e) => panic!("{name}: {e}"),
        }
    }
}
