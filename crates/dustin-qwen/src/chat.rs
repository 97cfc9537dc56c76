//! Chat templates: the Jinja template a chat model ships, rendered as Hugging Face
//! transformers' `apply_chat_template` renders it.
//!
//! Where the template comes from ([`ChatTemplate::from_gguf`], [`ChatTemplate::from_hf_dir`],
//! both read by [`ModelFiles::open`](crate::ModelFiles::open) into
//! [`ModelFiles::chat_template`](crate::ModelFiles::chat_template)):
//! - a GGUF file: the metadata string `tokenizer.chat_template` (llama.cpp's converter copies
//!   it from `tokenizer_config.json`), with `bos_token` / `eos_token` the tokens of
//!   `tokenizer.ggml.bos_token_id` / `eos_token_id`;
//! - an HF model directory: `chat_template.jinja` when present (transformers prefers it),
//!   else `chat_template` in `tokenizer_config.json`, a string or a list of
//!   `{"name", "template"}` of which the one named `default` is taken (as
//!   `apply_chat_template` does when no template is named); `bos_token` / `eos_token` from
//!   `tokenizer_config.json` (a string or an added-token object with `content`), else from
//!   `special_tokens_map.json`.
//!
//! Rendering ([`ChatTemplate::render`]) follows transformers' `render_jinja_template`: the
//! context holds `messages` (a list of `{role, content}`), `add_generation_prompt`,
//! `tools = None`, `documents = None` and the special tokens that are set (`bos_token`,
//! `eos_token`; an unset one is undefined, as it is absent from transformers'
//! `special_tokens_map`); the environment is `_compile_jinja_template`'s (trim_blocks and
//! lstrip_blocks on, keep_trailing_newline off, `tojson`, `raise_exception`,
//! `strftime_now`; see `pyjinja` for the details and the few known differences).
//!
//! The rendered text holds the template's control tokens (`<|im_start|>`, ...) as text;
//! [`Tokenizer::encode`] reads them back as the single special tokens they are, as
//! `apply_chat_template(tokenize=True)` does (special tokens inside message contents are read
//! as special tokens too: contents are not sanitised).
//!
//! [`ChatTemplate::stop_token_ids`] gives the ids that end an assistant turn.

use std::path::Path;

use minijinja::Value;
use serde::{Deserialize, Serialize};

use crate::error::{QwenError, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

mod pyjinja;

/// The name the template has inside its `minijinja` environment (shown in error locations).
const TEMPLATE_NAME: &str = "chat_template";

/// Stands for the user's text in [`ChatTemplate::user_affixes`]: private-use characters that
/// no template strips or rewrites.
const PROMPT_MARKER: &str = "\u{E000}dustin-prompt\u{E001}";

/// Markers that end a turn in the chat formats we know, stop tokens when the template uses
/// them: ChatML (`<|im_end|>`: Qwen, SmolLM), Llama 3 (`<|eot_id|>`, and `<|eom_id|>` after
/// a tool call in Llama 3.1), Phi-3 (`<|end|>`), Gemma (`<end_of_turn>`).
const END_OF_TURN_MARKERS: [&str; 5] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
];

/// One message of a conversation, as in OpenAI's chat API and transformers'
/// `apply_chat_template`: `{"role": "system" | "user" | "assistant" | ..., "content": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// Who speaks: `system`, `user`, `assistant` (templates may know others, such as `tool`).
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message of `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A model's chat template: its Jinja source, where it came from, and the special-token
/// strings the template may print (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    source: String,
    origin: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// A template from its Jinja source; `origin` names where it came from in errors (a
    /// file, a GGUF file). Nothing is checked until [`ChatTemplate::check`] or
    /// [`ChatTemplate::render`].
    pub fn new(source: impl Into<String>, origin: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            origin: origin.into(),
            bos_token: None,
            eos_token: None,
        }
    }

    /// Sets the `bos_token` and `eos_token` strings the template sees (`None`: undefined).
    pub fn with_special_tokens(mut self, bos: Option<String>, eos: Option<String>) -> Self {
        self.bos_token = bos;
        self.eos_token = eos;
        self
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Where the template came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The `bos_token` string the template sees.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The `eos_token` string the template sees.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The template of a GGUF file's `tokenizer.chat_template` metadata; `None` when the
    /// file has none.
    ///
    /// # Errors
    /// [`QwenError::Config`] when the key holds something other than a string.
    pub fn from_gguf(g: &GgufFile) -> Result<Option<Self>> {
        let Some(source) = g.get_str("tokenizer.chat_template")? else {
            return Ok(None);
        };
        let token = |key: &str| -> Result<Option<String>> {
            let Some(id) = g.get_u64(key)? else {
                return Ok(None);
            };
            Ok(g.get("tokenizer.ggml.tokens")
                .and_then(|t| t.as_array())
                .and_then(|t| t.get(usize::try_from(id).ok()?))
                .and_then(|t| t.as_str())
                .map(str::to_string))
        };
        let bos = token("tokenizer.ggml.bos_token_id")?;
        let eos = token("tokenizer.ggml.eos_token_id")?;
        let origin = format!("GGUF file {}", g.path().display());
        Ok(Some(
            Self::new(source, origin).with_special_tokens(bos, eos),
        ))
    }

    /// The template of an HF model directory: `chat_template.jinja`, else `chat_template` in
    /// `tokenizer_config.json` (see the module docs); `None` when neither has one.
    ///
    /// # Errors
    /// [`QwenError::Io`] when a file exists but cannot be read; [`QwenError::Config`] naming
    /// the file when `tokenizer_config.json` or `special_tokens_map.json` is not JSON, or
    /// `chat_template` is neither a string nor a list of named templates with a `default`.
    pub fn from_hf_dir(dir: &Path) -> Result<Option<Self>> {
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let jinja = dir.join("chat_template.jinja");
        let (source, origin) = if jinja.is_file() {
            let text = std::fs::read_to_string(&jinja).map_err(|source| QwenError::Io {
                path: jinja.clone(),
                source,
            })?;
            (text, jinja.display().to_string())
        } else {
            let Some(config) = &config else {
                return Ok(None);
            };
            let path = dir.join("tokenizer_config.json");
            let Some(source) = template_of_config(config, &path)? else {
                return Ok(None);
            };
            (source, path.display().to_string())
        };
        let map = read_json(&dir.join("special_tokens_map.json"))?;
        let special = |key: &str| {
            [&config, &map]
                .into_iter()
                .flatten()
                .find_map(|v| token_string(v.get(key)))
        };
        let (bos, eos) = (special("bos_token"), special("eos_token"));
        Ok(Some(
            Self::new(source, origin).with_special_tokens(bos, eos),
        ))
    }

    /// Compiles the template, without rendering it.
    ///
    /// # Errors
    /// [`QwenError::ChatTemplate`] naming the origin, the syntax error and its line.
    pub fn check(&self) -> Result<()> {
        self.environment().map(|_| ())
    }

    fn environment(&self) -> Result<minijinja::Environment<'static>> {
        let mut env = pyjinja::environment();
        env.add_template_owned(TEMPLATE_NAME, self.source.clone())
            .map_err(|e| self.error("does not compile", &e))?;
        Ok(env)
    }

    fn error(&self, what: &str, e: &minijinja::Error) -> QwenError {
        let mut msg = format!("{what}: {e}");
        let mut src = std::error::Error::source(e);
        while let Some(s) = src {
            msg.push_str(&format!(": {s}"));
            src = s.source();
        }
        QwenError::ChatTemplate {
            origin: self.origin.clone(),
            msg,
        }
    }

    /// Renders a conversation, as transformers' `apply_chat_template(messages,
    /// add_generation_prompt=..., tokenize=False)`: with `add_generation_prompt` the text
    /// ends with the opening of an assistant turn, for the model to continue.
    ///
    /// # Errors
    /// [`QwenError::ChatTemplate`] naming the origin for a syntax error, or a failure while
    /// rendering (the template's `raise_exception` message, an undefined value used, a type
    /// error), with the template line.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let env = self.environment()?;
        let template = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| self.error("does not compile", &e))?;
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from_serialize(messages)),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        if let Some(b) = &self.bos_token {
            ctx.push(("bos_token", Value::from(b.as_str())));
        }
        if let Some(e) = &self.eos_token {
            ctx.push(("eos_token", Value::from(e.as_str())));
        }
        let ctx: Value = ctx.into_iter().collect();
        template
            .render(ctx)
            .map_err(|e| self.error("failed to render", &e))
    }

    /// The text before and after a single user message's content, as rendered with
    /// `add_generation_prompt`: `prefix + text + suffix` is the template's rendering of
    /// `[user: text]` (for a template that does not rewrite the content, such as trimming
    /// it); used to wrap prompts that are tokenized and truncated apart from the wrapper.
    ///
    /// # Errors
    /// The rendering's errors; [`QwenError::ChatTemplate`] when the rendering does not hold
    /// the user's text exactly once.
    pub fn user_affixes(&self) -> Result<(String, String)> {
        let text = self.render(&[Message::user(PROMPT_MARKER)], true)?;
        let mut parts = text.split(PROMPT_MARKER);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(prefix), Some(suffix), None) => Ok((prefix.to_string(), suffix.to_string())),
            _ => Err(QwenError::ChatTemplate {
                origin: self.origin.clone(),
                msg: format!(
                    "a single user message's text appears {} times in its rendering, not once",
                    text.matches(PROMPT_MARKER).count()
                ),
            }),
        }
    }

    /// The ids that end an assistant turn: the tokenizer's EOS ids, then the template's
    /// `eos_token`, then each end-of-turn marker the template writes (`<|im_end|>` for
    /// ChatML, `<|eot_id|>` and `<|eom_id|>` for Llama 3, `<|end|>` for Phi-3,
    /// `<end_of_turn>` for Gemma) and, for ChatML, `<|endoftext|>`, each only where the
    /// tokenizer reads it as one token. Without duplicates, in that order.
    pub fn stop_token_ids(&self, tok: &Tokenizer) -> Vec<u32> {
        let single = |s: &str| -> Option<u32> {
            let id = tok.token_to_id(s)?;
            (tok.encode(s).ok()? == [id]).then_some(id)
        };
        let mut ids = tok.eos_ids.clone();
        let mut candidates: Vec<&str> = self.eos_token.as_deref().into_iter().collect();
        candidates.extend(
            END_OF_TURN_MARKERS
                .iter()
                .filter(|m| self.source.contains(*m)),
        );
        if self.source.contains("<|im_end|>") {
            candidates.push("<|endoftext|>");
        }
        for id in candidates.into_iter().filter_map(single) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }
}

/// A JSON file, or `None` when it does not exist.
fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| QwenError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| QwenError::Config {
            path: path.display().to_string(),
            msg: e.to_string(),
        })
}

/// `chat_template` of a `tokenizer_config.json`: a string, or the `default` of a list of
/// `{"name", "template"}`.
fn template_of_config(config: &serde_json::Value, path: &Path) -> Result<Option<String>> {
    let bad = |msg: String| QwenError::Config {
        path: path.display().to_string(),
        msg,
    };
    match config.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(list)) => {
            let mut names = Vec::new();
            for t in list {
                let name = t.get("name").and_then(|n| n.as_str());
                let template = t.get("template").and_then(|n| n.as_str());
                match (name, template) {
                    (Some("default"), Some(src)) => return Ok(Some(src.to_string())),
                    (Some(n), Some(_)) => names.push(n.to_string()),
                    _ => {
                        return Err(bad(
                            "`chat_template` lists an entry that is not {\"name\": ..., \
                             \"template\": ...}"
                                .into(),
                        ))
                    }
                }
            }
            Err(bad(format!(
                "`chat_template` lists templates named {} but none named \"default\"",
                names.join(", ")
            )))
        }
        Some(other) => Err(bad(format!(
            "`chat_template` is {other}, expected a string or a list of named templates"
        ))),
    }
}

/// A special token of `tokenizer_config.json`: a string or `{"content": ...}`.
fn token_string(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_templates_are_strings_or_a_named_default() {
        let p = Path::new("tokenizer_config.json");
        let get = |v: serde_json::Value| template_of_config(&v, p);
        assert_eq!(
            get(serde_json::json!({"chat_template": "x"})).unwrap(),
            Some("x".into())
        );
        assert_eq!(
            get(serde_json::json!({"chat_template": null})).unwrap(),
            None
        );
        assert_eq!(get(serde_json::json!({})).unwrap(), None);
        let named = serde_json::json!({"chat_template": [
            {"name": "tool_use", "template": "t"},
            {"name": "default", "template": "d"},
        ]});
        assert_eq!(get(named).unwrap(), Some("d".into()));
        let e = get(serde_json::json!({"chat_template": [{"name": "rag", "template": "r"}]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("named rag but none named \"default\""), "{e}");
        assert!(get(serde_json::json!({"chat_template": 3})).is_err());
    }

    #[test]
    fn special_tokens_are_strings_or_added_token_objects() {
        let v =
            serde_json::json!({"a": "<s>", "b": {"content": "</s>", "special": true}, "c": null});
        assert_eq!(token_string(v.get("a")), Some("<s>".into()));
        assert_eq!(token_string(v.get("b")), Some("</s>".into()));
        assert_eq!(token_string(v.get("c")), None);
        assert_eq!(token_string(v.get("d")), None);
    }

    #[test]
    fn unset_special_tokens_are_undefined() {
        let t = ChatTemplate::new(
            "{{ bos_token }}|{{ bos_token is defined }}|{{ eos_token }}",
            "test",
        );
        assert_eq!(t.render(&[], false).unwrap(), "|False|");
        let t = t.with_special_tokens(Some("<s>".into()), Some("</s>".into()));
        assert_eq!(t.render(&[], false).unwrap(), "<s>|True|</s>");
    }

    #[test]
    fn affixes_surround_the_user_text() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</>{% endfor %}\
             {% if add_generation_prompt %}<assistant>{% endif %}",
            "test",
        );
        assert_eq!(
            t.user_affixes().unwrap(),
            ("<user>".to_string(), "</><assistant>".to_string())
        );
        let twice = ChatTemplate::new("{{ messages[0].content * 2 }}", "test");
        let e = twice.user_affixes().unwrap_err().to_string();
        assert!(e.contains("appears 2 times"), "{e}");
    }
}
