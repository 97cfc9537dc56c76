//! Tokenizers: HF `tokenizer.json` or the tokenizer embedded in GGUF metadata, wrapped with
//! the model's special ids.

use std::path::Path;

use crate::error::{QwenError, Result};

/// A tokenizer plus the ids generation needs.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Ids that end a sequence (from `generation_config.json`, `config.json` or GGUF).
    pub eos_ids: Vec<u32>,
}

impl Tokenizer {
    /// Wraps a `tokenizers` tokenizer.
    pub fn new(inner: tokenizers::Tokenizer, eos_ids: Vec<u32>) -> Self {
        Self { inner, eos_ids }
    }

    /// Loads `tokenizer.json`.
    ///
    /// # Errors
    /// [`QwenError::Tokenizer`] naming the file when it does not parse.
    pub fn from_file(path: &Path, eos_ids: Vec<u32>) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| QwenError::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Self { inner, eos_ids })
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Number of tokens, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encodes text to ids without adding special tokens.
    ///
    /// # Errors
    /// [`QwenError::Tokenizer`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| QwenError::Tokenizer(e.to_string()))
    }

    /// Decodes ids to text, special tokens kept.
    ///
    /// # Errors
    /// [`QwenError::Tokenizer`].
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| QwenError::Tokenizer(e.to_string()))
    }

    /// The id of a token string, if it exists.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `a` and `b` map every token string to the same id (checked over `a`'s vocabulary,
    /// including added tokens). Returns the first mismatch found.
    pub fn first_mismatch(&self, other: &Tokenizer) -> Option<(String, Option<u32>, Option<u32>)> {
        let va = self.inner.get_vocab(true);
        let vb = other.inner.get_vocab(true);
        let mut keys: Vec<_> = va.keys().chain(vb.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter().find_map(|k| {
            let (x, y) = (va.get(k).copied(), vb.get(k).copied());
            (x != y).then(|| (k.clone(), x, y))
        })
    }
}

/// A streaming decoder: feed ids one by one, get the new text once it is complete UTF-8.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    emitted: usize,
}

impl StreamDecoder {
    /// Adds ids; returns the text that became printable.
    ///
    /// # Errors
    /// [`QwenError::Tokenizer`].
    pub fn push(&mut self, tok: &Tokenizer, ids: &[u32]) -> Result<String> {
        self.ids.extend_from_slice(ids);
        let text = tok.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let new = text.get(self.emitted..).unwrap_or("").to_string();
        self.emitted = text.len();
        Ok(new)
    }
}
