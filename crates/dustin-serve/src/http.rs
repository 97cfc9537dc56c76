//! The routes: request parsing and checks, the queue, and the responses (one JSON body, or
//! server-sent events in OpenAI's chunk format).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use dustin_core::SamplingConfig;
use dustin_qwen::chat::{ChatTemplate, Message};
use dustin_qwen::Tokenizer;
use futures_util::stream::{self, Stream};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::{
    ChatChoice, ChatDelta, ChatRequest, ChatResponse, CompletionChoice, CompletionRequest,
    CompletionResponse, GenOptions, ModelCard, ModelList, Usage,
};
use crate::engine::{Command, Event, GenRequest};
use crate::error::ApiError;
use crate::metrics::Metrics;

/// Request limits of the HTTP side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Prompt tokens at most (after the chat template).
    pub max_prompt_tokens: usize,
    /// `max_tokens` at most.
    pub max_tokens: usize,
    /// `max_tokens` of a request that gives none (at most `max_tokens`).
    pub default_max_tokens: usize,
    /// Requests waiting for admission at most; more are answered 429.
    pub max_queue: usize,
    /// Stop strings per request at most.
    pub max_stop: usize,
}

/// What every handler shares.
pub(crate) struct AppState {
    pub model_id: String,
    pub created: u64,
    pub tok: Arc<Tokenizer>,
    pub chat: Option<ChatTemplate>,
    /// EOS ids of chats: the tokenizer's and the template's end-of-turn tokens
    pub chat_eos: Vec<u32>,
    pub limits: Limits,
    pub engine: Mutex<Sender<Command>>,
    pub metrics: Arc<Metrics>,
    pub shutting_down: AtomicBool,
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Largest request body read, in bytes (axum's default, 2 MiB, stated here so that the 413
/// answer can name it); a prompt of 32k tokens is typically 0.1-0.3 MB of JSON text or ids.
pub(crate) const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// The router of every route.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|uri: Uri| async move { ApiError::no_route(uri.path()) })
        .method_not_allowed_fallback(|method: axum::http::Method, uri: Uri| async move {
            ApiError::wrong_method(method.as_str(), uri.path())
        })
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

async fn models(State(st): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: vec![ModelCard {
            id: st.model_id.clone(),
            object: "model".into(),
            created: st.created,
            owned_by: "dustin".into(),
        }],
    })
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.shutting_down.load(Ordering::SeqCst) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "shutting_down"})),
        )
            .into_response()
    } else {
        Json(serde_json::json!({"status": "ok", "model": st.model_id})).into_response()
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

/// Parses a JSON body, answering OpenAI-style errors for a body that cannot be read or is not
/// the expected JSON (unknown fields included).
fn parse<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(format!(
                "the request body is larger than this server's limit of {BODY_LIMIT} bytes"
            ))
        } else {
            ApiError::bad_body(e.body_text())
        }
    })?;
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_body(format!("the request body is not valid: {e}")))
}

/// Checks the options against the limits; the request's max_tokens, sampling and seed.
fn check_options(o: &GenOptions, l: &Limits) -> Result<(usize, SamplingConfig, u64), ApiError> {
    if let Some(n) = o.n {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("n = {n}: this server returns one choice per request (n = 1)"),
            ));
        }
    }
    let max_tokens = o.max_tokens.unwrap_or(l.default_max_tokens);
    if max_tokens == 0 || max_tokens > l.max_tokens {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "max_tokens = {max_tokens}: expected 1 ..= {} (the server's limit)",
                l.max_tokens
            ),
        ));
    }
    let temperature = o.temperature.unwrap_or(0.0);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature = {temperature}: expected a number in [0, 2]"),
        ));
    }
    let top_p = o.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p = {top_p}: expected a number in (0, 1]"),
        ));
    }
    if o.stop.len() > l.max_stop {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "{} stop strings: expected at most {}",
                o.stop.len(),
                l.max_stop
            ),
        ));
    }
    if o.stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop string is empty".into()));
    }
    let sampling = if temperature == 0.0 {
        SamplingConfig::greedy()
    } else {
        SamplingConfig {
            temperature,
            top_p,
            top_k: o.top_k.unwrap_or(0),
        }
    };
    // an unseeded sampled request draws a seed of its own
    let seed = o.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    Ok((max_tokens, sampling, seed))
}

/// The queued request's events and its prompt length.
struct Queued {
    rx: UnboundedReceiver<Event>,
    prompt_tokens: usize,
    created: u64,
    id: String,
}

/// Checks, tokenizes and queues one request.
fn submit(
    st: &AppState,
    prompt: &str,
    o: &GenOptions,
    eos: Vec<u32>,
    id_prefix: &str,
) -> Result<Queued, ApiError> {
    let reject = |e: ApiError, why: &str| {
        st.metrics.rejected(why);
        e
    };
    let (max_tokens, sampling, seed) =
        check_options(o, &st.limits).map_err(|e| reject(e, "invalid"))?;
    if prompt.trim().is_empty() {
        return Err(reject(
            ApiError::invalid("prompt", "the prompt is empty".into()),
            "invalid",
        ));
    }
    let ids = st
        .tok
        .encode(prompt)
        .map_err(|e| reject(ApiError::invalid("prompt", e.to_string()), "invalid"))?;
    if ids.is_empty() || ids.len() > st.limits.max_prompt_tokens {
        return Err(reject(
            ApiError::invalid(
                "prompt",
                format!(
                    "the prompt has {} tokens: expected 1 ..= {} (the server's limit)",
                    ids.len(),
                    st.limits.max_prompt_tokens
                ),
            ),
            "too_long",
        ));
    }
    if st.shutting_down.load(Ordering::SeqCst) {
        return Err(reject(ApiError::shutting_down(), "shutting_down"));
    }
    let q = &st.metrics.queued;
    if q.fetch_add(1, Ordering::SeqCst) >= st.limits.max_queue {
        q.fetch_sub(1, Ordering::SeqCst);
        return Err(reject(
            ApiError::queue_full(st.limits.max_queue),
            "queue_full",
        ));
    }
    let (tx, rx) = unbounded_channel();
    let prompt_tokens = ids.len();
    let req = GenRequest {
        prompt: ids,
        max_tokens,
        sampling,
        seed,
        stop: o.stop.clone(),
        eos,
        arrived: Instant::now(),
        events: tx,
    };
    let sent = st
        .engine
        .lock()
        .map_err(|_| ApiError::internal("the engine channel is poisoned".into()))
        .and_then(|s| {
            s.send(Command::Submit(req))
                .map_err(|_| ApiError::shutting_down())
        });
    if let Err(e) = sent {
        q.fetch_sub(1, Ordering::SeqCst);
        return Err(reject(e, "shutting_down"));
    }
    st.metrics.update(|c| c.requests += 1);
    let created = unix_now();
    let id = format!(
        "{id_prefix}-{:x}{:04x}",
        created,
        st.metrics.snapshot().requests
    );
    Ok(Queued {
        rx,
        prompt_tokens,
        created,
        id,
    })
}

fn check_model(st: &AppState, model: &str) -> Result<(), ApiError> {
    if model != st.model_id {
        st.metrics.rejected("invalid");
        return Err(ApiError::unknown_model(model, &st.model_id));
    }
    Ok(())
}

/// Waits for the whole text: `(text, finish_reason, completion_tokens)`.
async fn collect(rx: &mut UnboundedReceiver<Event>) -> Result<(String, String, usize), ApiError> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done {
                finish_reason,
                completion_tokens,
            } => return Ok((text, finish_reason.to_string(), completion_tokens)),
            Event::Error(e) => return Err(e),
        }
    }
    Err(ApiError::internal(
        "the engine stopped before the request finished".into(),
    ))
}

async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match completions_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn completions_inner(
    st: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(body).inspect_err(|_| st.metrics.rejected("invalid"))?;
    check_model(&st, &req.model)?;
    let (prompt, o) = req
        .split()
        .inspect_err(|_| st.metrics.rejected("invalid"))?;
    let eos = st.tok.eos_ids.clone();
    let mut q = submit(&st, &prompt, &o, eos, "cmpl")?;
    let model = st.model_id.clone();
    let (id, created, prompt_tokens) = (q.id.clone(), q.created, q.prompt_tokens);
    let chunk =
        move |text: String, finish: Option<String>, usage: Option<Usage>| CompletionResponse {
            id: id.clone(),
            object: "text_completion".into(),
            created,
            model: model.clone(),
            choices: if usage.is_some() && finish.is_none() && text.is_empty() {
                Vec::new()
            } else {
                vec![CompletionChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: finish,
                }]
            },
            usage,
        };
    if o.stream {
        let s = sse_stream(q.rx, prompt_tokens, o.include_usage, move |ev| match ev {
            Piece::Start => None,
            Piece::Text(t) => Some(json(&chunk(t, None, None))),
            Piece::End(f) => Some(json(&chunk(String::new(), Some(f), None))),
            Piece::Usage(u) => Some(json(&chunk(String::new(), None, Some(u)))),
        });
        return Ok(Sse::new(s).keep_alive(KeepAlive::default()).into_response());
    }
    let (text, finish, n) = collect(&mut q.rx).await?;
    Ok(Json(chunk(
        text,
        Some(finish),
        Some(Usage::new(prompt_tokens, n)),
    ))
    .into_response())
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match chat_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Roles a chat message may have.
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

async fn chat_inner(
    st: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse(body).inspect_err(|_| st.metrics.rejected("invalid"))?;
    check_model(&st, &req.model)?;
    let (messages, o) = req
        .split()
        .inspect_err(|_| st.metrics.rejected("invalid"))?;
    let bad = |e: ApiError| {
        st.metrics.rejected("invalid");
        e
    };
    if messages.is_empty() {
        return Err(bad(ApiError::invalid(
            "messages",
            "no message: expected at least one".into(),
        )));
    }
    if let Some((i, m)) = messages
        .iter()
        .enumerate()
        .find(|(_, m)| !ROLES.contains(&m.role.as_str()))
    {
        return Err(bad(ApiError::invalid(
            &format!("messages[{i}].role"),
            format!("role `{}`: expected one of {}", m.role, ROLES.join(", ")),
        )));
    }
    let Some(tpl) = &st.chat else {
        return Err(bad(ApiError::invalid(
            "messages",
            format!(
                "the model `{}` has no chat template: use /v1/completions",
                st.model_id
            ),
        )));
    };
    let conv: Vec<Message> = messages
        .iter()
        .map(|m| Message::new(m.role.clone(), m.content.clone()))
        .collect();
    let prompt = tpl.render(&conv, true).map_err(|e| {
        bad(ApiError::invalid(
            "messages",
            format!("the chat template failed: {e}"),
        ))
    })?;
    let mut q = submit(&st, &prompt, &o, st.chat_eos.clone(), "chatcmpl")?;
    let model = st.model_id.clone();
    let (id, created, prompt_tokens) = (q.id.clone(), q.created, q.prompt_tokens);
    let resp = move |object: &str, choice: Option<ChatChoice>, usage: Option<Usage>| ChatResponse {
        id: id.clone(),
        object: object.into(),
        created,
        model: model.clone(),
        choices: choice.into_iter().collect(),
        usage,
    };
    let delta = |role: Option<&str>, content: Option<String>, finish: Option<String>| ChatChoice {
        index: 0,
        message: None,
        delta: Some(ChatDelta {
            role: role.map(str::to_string),
            content,
        }),
        logprobs: None,
        finish_reason: finish,
    };
    if o.stream {
        let k = "chat.completion.chunk";
        let s = sse_stream(q.rx, prompt_tokens, o.include_usage, move |ev| {
            Some(json(&match ev {
                Piece::Start => resp(
                    k,
                    Some(delta(Some("assistant"), Some(String::new()), None)),
                    None,
                ),
                Piece::Text(t) => resp(k, Some(delta(None, Some(t), None)), None),
                Piece::End(f) => resp(k, Some(delta(None, None, Some(f))), None),
                Piece::Usage(u) => resp(k, None, Some(u)),
            }))
        });
        return Ok(Sse::new(s).keep_alive(KeepAlive::default()).into_response());
    }
    let (text, finish, n) = collect(&mut q.rx).await?;
    let choice = ChatChoice {
        index: 0,
        message: Some(ChatDelta {
            role: Some("assistant".into()),
            content: Some(text),
        }),
        delta: None,
        logprobs: None,
        finish_reason: Some(finish),
    };
    Ok(Json(resp(
        "chat.completion",
        Some(choice),
        Some(Usage::new(prompt_tokens, n)),
    ))
    .into_response())
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// What a stream sends, in order: `Start`, `Text`..., `End`, `Usage` (when asked).
enum Piece {
    Start,
    Text(String),
    End(String),
    Usage(Usage),
}

enum Phase {
    Start,
    Body,
    Usage(Usage),
    Done,
    Over,
}

/// The SSE stream of a request: each piece rendered by `render` (`None`: not sent), then
/// `data: [DONE]`; an engine error is sent as an `{"error": ...}` event and ends the stream.
fn sse_stream(
    rx: UnboundedReceiver<Event>,
    prompt_tokens: usize,
    include_usage: bool,
    render: impl Fn(Piece) -> Option<String> + Send + Sync + 'static,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    stream::unfold(
        (rx, Phase::Start, render),
        move |(rx, phase, render)| async move {
            let (ev, next) = match phase {
                Phase::Start => match render(Piece::Start) {
                    Some(d) => (SseEvent::default().data(d), Phase::Body),
                    None => return next_body(rx, render, prompt_tokens, include_usage).await,
                },
                Phase::Body => return next_body(rx, render, prompt_tokens, include_usage).await,
                Phase::Usage(u) => match render(Piece::Usage(u)) {
                    Some(d) => (SseEvent::default().data(d), Phase::Done),
                    None => (SseEvent::default().data("[DONE]"), Phase::Over),
                },
                Phase::Done => (SseEvent::default().data("[DONE]"), Phase::Over),
                Phase::Over => return None,
            };
            Some((Ok(ev), (rx, next, render)))
        },
    )
}

type Step<R> = Option<(
    Result<SseEvent, Infallible>,
    (UnboundedReceiver<Event>, Phase, R),
)>;

async fn next_body<R: Fn(Piece) -> Option<String>>(
    mut rx: UnboundedReceiver<Event>,
    render: R,
    prompt_tokens: usize,
    include_usage: bool,
) -> Step<R> {
    loop {
        let Some(ev) = rx.recv().await else {
            let e = ApiError::internal("the engine stopped before the request finished".into());
            return Some((
                Ok(SseEvent::default().data(e.body_json())),
                (rx, Phase::Over, render),
            ));
        };
        match ev {
            Event::Text(t) if t.is_empty() => continue,
            Event::Text(t) => {
                if let Some(d) = render(Piece::Text(t)) {
                    return Some((Ok(SseEvent::default().data(d)), (rx, Phase::Body, render)));
                }
            }
            Event::Done {
                finish_reason,
                completion_tokens,
            } => {
                let next = if include_usage {
                    Phase::Usage(Usage::new(prompt_tokens, completion_tokens))
                } else {
                    Phase::Done
                };
                let d = render(Piece::End(finish_reason.to_string())).unwrap_or_default();
                return Some((Ok(SseEvent::default().data(d)), (rx, next, render)));
            }
            Event::Error(e) => {
                return Some((
                    Ok(SseEvent::default().data(e.body_json())),
                    (rx, Phase::Over, render),
                ));
            }
        }
    }
}
