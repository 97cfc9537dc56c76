//! Errors: [`ApiError`] is what a client sees (an HTTP status and OpenAI's error body);
//! [`ServeError`] is what starting or running the server can fail with.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answered to a client: `status` and the body
/// `{"error": {"message", "type", "param", "code"}}` that OpenAI's clients read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, in words.
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `rate_limit_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A short machine-readable code, if any.
    pub code: Option<&'static str>,
    /// Seconds after which a retry may succeed (`Retry-After`, with 429 and 503).
    pub retry_after: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: String) -> Self {
        Self {
            status,
            message,
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 for a bad value of the request field `param`.
    pub fn invalid(param: &str, message: String) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400 for a body that is not the JSON this endpoint reads (`message` says where).
    pub fn bad_body(message: String) -> Self {
        Self {
            code: Some("invalid_json"),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 413 for a body past the server's limit (`message` states it).
    pub fn too_large(message: String) -> Self {
        Self {
            code: Some("request_too_large"),
            ..Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                message,
            )
        }
    }

    /// 404 for a model this server does not serve.
    pub fn unknown_model(asked: &str, served: &str) -> Self {
        Self {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "not_found_error",
                format!("model `{asked}` is not served here; this server serves `{served}`"),
            )
        }
    }

    /// 404 for a path this server has no route for.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no route {path}: the routes are POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health and GET /metrics"),
        )
    }

    /// 405 for a route asked with another method than its own (`GET /v1/completions`).
    pub fn wrong_method(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("{method} {path}: the routes are POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health and GET /metrics"),
        )
    }

    /// 429 with `Retry-After` when the queue holds `limit` requests already.
    pub fn queue_full(limit: usize) -> Self {
        Self {
            code: Some("queue_full"),
            retry_after: Some(1),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("the request queue is full ({limit} requests waiting); retry later"),
            )
        }
    }

    /// 503 while the server shuts down.
    pub fn shutting_down() -> Self {
        Self {
            code: Some("shutting_down"),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the server is shutting down and takes no new requests".into(),
            )
        }
    }

    /// 503 when a request's KV cache cannot fit even with nothing else running.
    pub fn no_memory(message: String) -> Self {
        Self {
            code: Some("insufficient_memory"),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    /// 500 for a failure inside the engine.
    pub fn internal(message: String) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body (also sent as an SSE event when a stream fails).
    pub fn body_json(&self) -> String {
        serde_json::to_string(&Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or_else(|_| "{\"error\":{}}".into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body_json(),
        )
            .into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// What starting or running the server fails with.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound or served.
    #[error("cannot serve on {addr}: {source}")]
    Io {
        /// `host:port`.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A setting out of range.
    #[error("{name}: expected {expected}, found {found}")]
    Config {
        /// The setting (as the command line names it).
        name: &'static str,
        /// What is allowed.
        expected: String,
        /// What was given.
        found: String,
    },
    /// The engine could not start (its models failed to load, ...).
    #[error("the engine could not start: {0}")]
    Engine(String),
}
