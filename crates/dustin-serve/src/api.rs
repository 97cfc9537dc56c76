//! The OpenAI request and response bodies this server reads and writes. Requests refuse
//! unknown fields (`deny_unknown_fields`), so a misspelt option is an error rather than
//! silently ignored.

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// A string or a list of strings (`stop`, `prompt`). Anything else (a list of token ids,
/// a number) is refused with "expected a string or an array of strings".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// A list of strings.
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany::One(v.to_owned()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<OneOrMany, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(OneOrMany::Many(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl OneOrMany {
    /// The strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// `stream_options` of a streamed request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with the token usage before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling and length options shared by both endpoints.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenOptions {
    /// Tokens to generate at most (`max_tokens`; the server's default when absent).
    pub max_tokens: Option<usize>,
    /// Softmax temperature, `>= 0`; `0` (the default) is greedy decoding.
    pub temperature: Option<f32>,
    /// Nucleus mass kept, `(0, 1]`.
    pub top_p: Option<f32>,
    /// Keep only the `top_k` most likely tokens (`0`: off).
    pub top_k: Option<usize>,
    /// Seed of a sampled request (its output is then the same at every call).
    pub seed: Option<u64>,
    /// Stop strings: generation ends where one appears, and the text is cut before it.
    pub stop: Vec<String>,
    /// Choices per request; only 1 is served.
    pub n: Option<usize>,
    /// Server-sent events instead of one JSON body.
    pub stream: bool,
    /// Usage chunk at the end of a stream.
    pub include_usage: bool,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    /// The served model's id (`GET /v1/models`).
    pub model: String,
    /// The prompt: a string, or a list holding one string.
    pub prompt: OneOrMany,
    /// See [`GenOptions::max_tokens`].
    pub max_tokens: Option<usize>,
    /// See [`GenOptions::temperature`].
    pub temperature: Option<f32>,
    /// See [`GenOptions::top_p`].
    pub top_p: Option<f32>,
    /// See [`GenOptions::top_k`].
    pub top_k: Option<usize>,
    /// See [`GenOptions::seed`].
    pub seed: Option<u64>,
    /// See [`GenOptions::stop`].
    pub stop: Option<OneOrMany>,
    /// See [`GenOptions::n`].
    pub n: Option<usize>,
    /// See [`GenOptions::stream`].
    #[serde(default)]
    pub stream: bool,
    /// See [`StreamOptions`].
    pub stream_options: Option<StreamOptions>,
    /// An end-user id (accepted, not used).
    pub user: Option<String>,
}

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// A participant's name (accepted, not rendered).
    #[serde(default, skip_serializing)]
    pub name: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The served model's id (`GET /v1/models`).
    pub model: String,
    /// The conversation, rendered with the model's chat template.
    pub messages: Vec<ChatMessage>,
    /// See [`GenOptions::max_tokens`].
    pub max_tokens: Option<usize>,
    /// The newer name of `max_tokens` (either may be given, not both).
    pub max_completion_tokens: Option<usize>,
    /// See [`GenOptions::temperature`].
    pub temperature: Option<f32>,
    /// See [`GenOptions::top_p`].
    pub top_p: Option<f32>,
    /// See [`GenOptions::top_k`].
    pub top_k: Option<usize>,
    /// See [`GenOptions::seed`].
    pub seed: Option<u64>,
    /// See [`GenOptions::stop`].
    pub stop: Option<OneOrMany>,
    /// See [`GenOptions::n`].
    pub n: Option<usize>,
    /// See [`GenOptions::stream`].
    #[serde(default)]
    pub stream: bool,
    /// See [`StreamOptions`].
    pub stream_options: Option<StreamOptions>,
    /// An end-user id (accepted, not used).
    pub user: Option<String>,
}

impl CompletionRequest {
    /// The prompt text and the generation options.
    ///
    /// # Errors
    /// [`ApiError`] (400) naming `prompt` when it is a list of other than one string.
    pub fn split(self) -> Result<(String, GenOptions), ApiError> {
        let prompt = match self.prompt {
            OneOrMany::One(s) => s,
            OneOrMany::Many(mut v) if v.len() == 1 => v.remove(0),
            OneOrMany::Many(v) => {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("expected one prompt, found a list of {}", v.len()),
                ))
            }
        };
        let opts = GenOptions {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            stop: self.stop.map(OneOrMany::into_vec).unwrap_or_default(),
            n: self.n,
            stream: self.stream,
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
        };
        Ok((prompt, opts))
    }
}

impl ChatRequest {
    /// The messages and the generation options.
    ///
    /// # Errors
    /// [`ApiError`] (400) naming `max_completion_tokens` when both it and `max_tokens` are
    /// given.
    pub fn split(self) -> Result<(Vec<ChatMessage>, GenOptions), ApiError> {
        if self.max_tokens.is_some() && self.max_completion_tokens.is_some() {
            return Err(ApiError::invalid(
                "max_completion_tokens",
                "give max_tokens or max_completion_tokens, not both".into(),
            ));
        }
        let opts = GenOptions {
            max_tokens: self.max_tokens.or(self.max_completion_tokens),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            stop: self.stop.map(OneOrMany::into_vec).unwrap_or_default(),
            n: self.n,
            stream: self.stream,
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
        };
        Ok((self.messages, opts))
    }
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// Usage of `prompt` and `completion` tokens.
    pub fn new(prompt: usize, completion: usize) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }
}

/// One choice of a completion (`text_completion`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Always 0 (`n` = 1).
    pub index: usize,
    /// The generated text (the whole of it, or a stream chunk's new part).
    pub text: String,
    /// Log-probabilities: not served, always null.
    pub logprobs: Option<serde_json::Value>,
    /// `stop` (EOS, end of turn or a stop string), `length` (`max_tokens`), `cancelled`
    /// (the server shut down); null in stream chunks before the last.
    pub finish_reason: Option<String>,
}

/// A completion or one chunk of a streamed completion.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// `cmpl-...`, the same in every chunk of one request.
    pub id: String,
    /// `text_completion`.
    pub object: String,
    /// Unix seconds at the request's arrival.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// One choice (none in a usage chunk).
    pub choices: Vec<CompletionChoice>,
    /// Token counts (the whole body, or the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The assistant's message, or a stream chunk's delta of it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatDelta {
    /// `assistant` (in the whole message and the first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The text (or its new part).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Always 0 (`n` = 1).
    pub index: usize,
    /// The whole message (`chat.completion`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatDelta>,
    /// The new part (`chat.completion.chunk`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<ChatDelta>,
    /// Log-probabilities: not served, always null.
    pub logprobs: Option<serde_json::Value>,
    /// As [`CompletionChoice::finish_reason`].
    pub finish_reason: Option<String>,
}

/// A chat completion or one chunk of a streamed one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatResponse {
    /// `chatcmpl-...`, the same in every chunk of one request.
    pub id: String,
    /// `chat.completion` or `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds at the request's arrival.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// One choice (none in a usage chunk).
    pub choices: Vec<ChatChoice>,
    /// Token counts (the whole body, or the usage chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelCard {
    /// The id requests name in `model`.
    pub id: String,
    /// `model`.
    pub object: String,
    /// Unix seconds at the server's start.
    pub created: u64,
    /// `dustin`.
    pub owned_by: String,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The served model.
    pub data: Vec<ModelCard>,
}
