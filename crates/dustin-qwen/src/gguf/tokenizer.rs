//! The byte-level BPE tokenizer embedded in GGUF metadata (`tokenizer.ggml.model == "gpt2"`).

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{QwenError, Result};

use super::GgufFile;

/// The Qwen2 split regex (Qwen2's `tokenizer.json`; llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`).
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Llama 3 split regex (Llama 3's `tokenizer.json`; llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: i128 = 3;
const TOKEN_TYPE_USER_DEFINED: i128 = 4;

/// The `tokenizer.ggml.pre` names we know, for error messages.
const KNOWN_PRE: &str = "gpt2, gpt-2, default (or none), smollm, starcoder, qwen2, \
                         deepseek-r1-qwen, llama3, llama-v3, llama-bpe";

/// How text is split before BPE, by `tokenizer.ggml.pre` (llama.cpp's `llm_tokenizer_bpe`
/// regexes, written as the HF `tokenizer.json` pre-tokenizers they mirror).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreKind {
    /// GPT-2 regex inside `ByteLevel(use_regex = true)`.
    Gpt2,
    /// `Digits(individual_digits = true)` then GPT-2 `ByteLevel` (SmolLM, StarCoder).
    DigitsGpt2,
    /// `Split(QWEN2_PATTERN, Isolated)` then `ByteLevel(use_regex = false)`; `nfc`: Qwen2's
    /// own tokenizer normalises to NFC first.
    Qwen2 { nfc: bool },
    /// `Split(LLAMA3_PATTERN, Isolated)` then `ByteLevel(use_regex = false)`, BPE with
    /// `ignore_merges`.
    Llama3,
}

fn pre_kind(pre: Option<&str>) -> Option<PreKind> {
    Some(match pre {
        None | Some("default" | "gpt2" | "gpt-2") => PreKind::Gpt2,
        Some("smollm" | "starcoder") => PreKind::DigitsGpt2,
        Some("qwen2") => PreKind::Qwen2 { nfc: true },
        Some("deepseek-r1-qwen") => PreKind::Qwen2 { nfc: false },
        Some("llama3" | "llama-v3" | "llama-bpe") => PreKind::Llama3,
        Some(_) => return None,
    })
}

fn tok_err(g: &GgufFile, msg: impl std::fmt::Display) -> QwenError {
    QwenError::Tokenizer(format!("{}: {msg}", g.path().display()))
}

/// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata, as the
/// model's own Hugging Face `tokenizer.json` would be:
///
/// - model: byte-level BPE from `tokenizer.ggml.tokens` (id = position) and
///   `tokenizer.ggml.merges` (`"left right"`, rank = position), no unknown token, no byte
///   fallback;
/// - normalizer: none, except NFC for `tokenizer.ggml.pre == "qwen2"` (as Qwen2's own
///   tokenizer);
/// - pre-tokenizer by `tokenizer.ggml.pre`, following llama.cpp's choice of regex per name:
///   `gpt2` / `default` / absent: GPT-2 byte-level regex; `smollm`, `starcoder`: single digits
///   split off first, then GPT-2; `qwen2`, `deepseek-r1-qwen`: the Qwen2 regex; `llama3`,
///   `llama-v3`, `llama-bpe`: the Llama 3 regex (and whole-word vocabulary hits skip merges);
/// - added tokens: `tokenizer.ggml.token_type` 3 (control) become special added tokens,
///   4 (user-defined, such as `<think>`) non-special added tokens, both matched verbatim;
/// - post-processor: prepends `tokenizer.ggml.bos_token_id` when
///   `tokenizer.ggml.add_bos_token` is true (default: false, true for the Llama 3 names) and
///   appends `tokenizer.ggml.eos_token_id` when `tokenizer.ggml.add_eos_token` is true;
/// - decoder: byte-level.
///
/// # Errors
/// [`QwenError::Tokenizer`] naming the file for another tokenizer model (SentencePiece
/// `llama`, ...), an unknown `tokenizer.ggml.pre`, missing or malformed token/merge lists, a
/// token-type list of another length, or a BOS/EOS id outside the vocabulary.
pub fn tokenizer_from_gguf(g: &GgufFile) -> Result<tokenizers::Tokenizer> {
    let bad_type = |e: QwenError| tok_err(g, e);
    let model = g.get_str("tokenizer.ggml.model").map_err(bad_type)?;
    match model {
        Some("gpt2") => {}
        Some(m) => {
            return Err(tok_err(
                g,
                format!(
                    "tokenizer.ggml.model is \"{m}\"; only byte-level BPE (\"gpt2\") is supported"
                ),
            ))
        }
        None => {
            return Err(tok_err(
                g,
                "no tokenizer.ggml.model: the file carries no tokenizer",
            ))
        }
    }
    let pre = g.get_str("tokenizer.ggml.pre").map_err(bad_type)?;
    let kind = pre_kind(pre).ok_or_else(|| {
        tok_err(
            g,
            format!(
                "tokenizer.ggml.pre \"{}\" is not supported (known: {KNOWN_PRE})",
                pre.unwrap_or_default()
            ),
        )
    })?;

    let tokens = g
        .get_str_array("tokenizer.ggml.tokens")
        .map_err(bad_type)?
        .ok_or_else(|| tok_err(g, "no tokenizer.ggml.tokens"))?;
    let n = tokens.len();
    let n_u32 =
        u32::try_from(n).map_err(|_| tok_err(g, format!("{n} tokens do not fit u32 ids")))?;
    let vocab: Vocab = tokens
        .iter()
        .zip(0..n_u32)
        .map(|(t, i)| ((*t).to_string(), i))
        .collect();

    let merges_raw = g
        .get_str_array("tokenizer.ggml.merges")
        .map_err(bad_type)?
        .ok_or_else(|| tok_err(g, "no tokenizer.ggml.merges (needed for BPE)"))?;
    let mut merges = Vec::with_capacity(merges_raw.len());
    for (rank, m) in merges_raw.iter().enumerate() {
        // As llama.cpp: split at the first space after the first character.
        let split = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(i, _)| i);
        let Some(i) = split else {
            return Err(tok_err(
                g,
                format!("merge {rank} {m:?} is not two tokens separated by a space"),
            ));
        };
        merges.push((m[..i].to_string(), m[i + 1..].to_string()));
    }

    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(kind == PreKind::Llama3)
        .build()
        .map_err(|e| tok_err(g, format!("cannot build the BPE model: {e}")))?;
    let mut tk = tokenizers::Tokenizer::new(bpe);

    let pre_tok: PreTokenizerWrapper = match kind {
        PreKind::Gpt2 => ByteLevel::new(false, true, true).into(),
        PreKind::DigitsGpt2 => Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        PreKind::Qwen2 { .. } | PreKind::Llama3 => {
            let pattern = if kind == PreKind::Llama3 {
                LLAMA3_PATTERN
            } else {
                QWEN2_PATTERN
            };
            let split = Split::new(
                SplitPattern::Regex(pattern.into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| tok_err(g, format!("cannot compile the split regex: {e}")))?;
            Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, false, false).into(),
            ])
            .into()
        }
    };
    tk.with_pre_tokenizer(Some(pre_tok));
    if kind == (PreKind::Qwen2 { nfc: true }) {
        tk.with_normalizer(Some(NFC));
    }
    tk.with_decoder(Some(ByteLevelDecoder::default()));

    if let Some(types) = g.get("tokenizer.ggml.token_type") {
        let types = types.as_array().ok_or_else(|| {
            tok_err(
                g,
                format!(
                    "tokenizer.ggml.token_type is {}, expected an array",
                    types.describe()
                ),
            )
        })?;
        if types.len() != n {
            return Err(tok_err(
                g,
                format!(
                    "tokenizer.ggml.token_type has {} entries for {n} tokens",
                    types.len()
                ),
            ));
        }
        let mut special = Vec::new();
        let mut user = Vec::new();
        for (t, tok) in types.iter().zip(&tokens) {
            match t.as_int() {
                // An empty added token would match nowhere; llama.cpp renames such tokens.
                Some(_) if tok.is_empty() => {}
                Some(TOKEN_TYPE_CONTROL) => {
                    special.push(AddedToken::from(*tok, true).normalized(false))
                }
                Some(TOKEN_TYPE_USER_DEFINED) => {
                    user.push(AddedToken::from(*tok, false).normalized(false))
                }
                Some(_) => {}
                None => {
                    return Err(tok_err(
                        g,
                        format!(
                            "tokenizer.ggml.token_type holds {}, expected integers",
                            t.describe()
                        ),
                    ))
                }
            }
        }
        tk.add_special_tokens(&special);
        tk.add_tokens(&user);
    }

    let add_bos = g
        .get_bool("tokenizer.ggml.add_bos_token")
        .map_err(bad_type)?
        .unwrap_or(kind == PreKind::Llama3);
    let add_eos = g
        .get_bool("tokenizer.ggml.add_eos_token")
        .map_err(bad_type)?
        .unwrap_or(false);
    let special_id = |key: &str| -> Result<(String, u32)> {
        let id = g.get_u64(key).map_err(bad_type)?.ok_or_else(|| {
            tok_err(
                g,
                format!("{key} is needed (the file asks to add it) but absent"),
            )
        })?;
        let token = usize::try_from(id)
            .ok()
            .and_then(|i| tokens.get(i))
            .ok_or_else(|| tok_err(g, format!("{key} = {id} is outside the {n} tokens")))?;
        Ok(((*token).to_string(), id as u32))
    };
    if add_bos || add_eos {
        let bos = add_bos
            .then(|| special_id("tokenizer.ggml.bos_token_id"))
            .transpose()?;
        let eos = add_eos
            .then(|| special_id("tokenizer.ggml.eos_token_id"))
            .transpose()?;
        let mut single = Vec::new();
        let mut pair = Vec::new();
        let mut specials = Vec::new();
        if let Some((t, id)) = &bos {
            single.push(t.clone());
            pair.push(format!("{t}:0"));
            specials.push((t.clone(), *id));
        }
        single.push("$A".to_string());
        pair.push("$A:0".to_string());
        if let Some((t, id)) = &eos {
            single.push(t.clone());
            pair.push(format!("{t}:0"));
            if bos.as_ref().is_none_or(|b| b.0 != *t) {
                specials.push((t.clone(), *id));
            }
        }
        if let Some((t, _)) = &bos {
            pair.push(format!("{t}:1"));
        }
        pair.push("$B:1".to_string());
        if let Some((t, _)) = &eos {
            pair.push(format!("{t}:1"));
        }
        let template = TemplateProcessing::builder()
            .try_single(single)
            .and_then(|b| b.try_pair(pair))
            .map_err(|e| tok_err(g, format!("cannot build the BOS/EOS template: {e}")))?
            .special_tokens(specials)
            .build()
            .map_err(|e| tok_err(g, format!("cannot build the BOS/EOS template: {e}")))?;
        tk.with_post_processor(Some(template));
    }
    Ok(tk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_names() {
        assert_eq!(pre_kind(None), Some(PreKind::Gpt2));
        assert_eq!(pre_kind(Some("smollm")), Some(PreKind::DigitsGpt2));
        assert_eq!(pre_kind(Some("qwen2")), Some(PreKind::Qwen2 { nfc: true }));
        assert_eq!(pre_kind(Some("llama-bpe")), Some(PreKind::Llama3));
        assert_eq!(pre_kind(Some("tekken")), None);
    }
}
