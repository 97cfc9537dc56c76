#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod engine;
pub mod error;
mod http;
pub mod metrics;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use dustin_qwen::chat::ChatTemplate;
use dustin_qwen::Tokenizer;

pub use engine::{Decoder, DecoderFactory, EngineConfig, GenRequest};
pub use error::{ApiError, ServeError};
pub use http::Limits;
pub use metrics::Metrics;

use engine::Command;
use http::AppState;

/// Everything a server is set up with besides the models.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The id clients name in `model` (`GET /v1/models`).
    pub model_id: String,
    /// Request limits.
    pub limits: Limits,
    /// Batching.
    pub engine: EngineConfig,
}

impl ServerConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`ServeError::Config`] naming the first setting out of range.
    pub fn check(&self) -> Result<(), ServeError> {
        let l = &self.limits;
        let e = &self.engine;
        let bad = |name: &'static str, expected: String, found: usize| {
            Err(ServeError::Config {
                name,
                expected,
                found: found.to_string(),
            })
        };
        if l.max_prompt_tokens == 0 {
            return bad("--max-prompt-tokens", "at least 1".into(), 0);
        }
        if l.max_tokens == 0 {
            return bad("--max-tokens", "at least 1".into(), 0);
        }
        if l.default_max_tokens == 0 || l.default_max_tokens > l.max_tokens {
            return bad(
                "--default-max-tokens",
                format!("1 ..= --max-tokens ({})", l.max_tokens),
                l.default_max_tokens,
            );
        }
        if e.max_batch == 0 {
            return bad("--max-batch", "at least 1".into(), 0);
        }
        if e.prefill_chunk == 0 {
            return bad("--prefill-chunk", "at least 1".into(), 0);
        }
        Ok(())
    }
}

/// A running server: the engine thread (started by [`Server::start`]) and the state its
/// routes share. Serve it with [`Server::serve`], or take [`Server::router`] into an axum
/// application of your own.
pub struct Server {
    state: Arc<AppState>,
    engine: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("model_id", &self.state.model_id)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Starts the engine thread, which runs `factory` to load the models (so that the
    /// thread owns them) and then serves requests. `tokenizer` and `chat` (the model's chat
    /// template, if it has one) are the handlers' own, for checking and rendering requests.
    ///
    /// # Errors
    /// [`ServeError::Config`] for a setting out of range; [`ServeError::Engine`] with the
    /// factory's message when the models cannot be loaded.
    pub fn start<F>(
        cfg: ServerConfig,
        tokenizer: Tokenizer,
        chat: Option<ChatTemplate>,
        factory: F,
    ) -> Result<Self, ServeError>
    where
        F: FnOnce() -> Result<Box<dyn DecoderFactory>, String> + Send + 'static,
    {
        cfg.check()?;
        let tok = Arc::new(tokenizer);
        let chat_eos = chat
            .as_ref()
            .map_or_else(|| tok.eos_ids.clone(), |t| t.stop_token_ids(&tok));
        let metrics = Arc::new(Metrics::default());
        let (tx, rx) = channel::<Command>();
        let (ready_tx, ready_rx) = channel::<Result<(), String>>();
        let (etok, emetrics, ecfg) = (tok.clone(), metrics.clone(), cfg.engine);
        let engine = std::thread::Builder::new()
            .name("dustin-engine".into())
            .spawn(move || match factory() {
                Ok(f) => {
                    let _ = ready_tx.send(Ok(()));
                    engine::run_engine(f, etok, ecfg, rx, emetrics);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| ServeError::Engine(format!("cannot start its thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(ServeError::Engine(e)),
            Err(_) => return Err(ServeError::Engine("its thread ended while loading".into())),
        }
        let state = Arc::new(AppState {
            model_id: cfg.model_id,
            created: http::unix_now(),
            tok,
            chat,
            chat_eos,
            limits: cfg.limits,
            engine: Mutex::new(tx),
            metrics,
            shutting_down: AtomicBool::new(false),
        });
        Ok(Self {
            state,
            engine: Some(engine),
        })
    }

    /// The routes (`/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/health`,
    /// `/metrics`).
    pub fn router(&self) -> axum::Router {
        http::router(self.state.clone())
    }

    /// The server's counters.
    pub fn metrics(&self) -> &Metrics {
        &self.state.metrics
    }

    fn send(&self, c: Command) {
        self.handle().send(c);
    }

    /// A handle that stops or cancels this server from elsewhere (a signal handler) while
    /// [`Server::serve`] runs.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle(self.state.clone())
    }

    /// Serves on `listener` until `shutdown` resolves, then shuts down gracefully: new
    /// requests are refused, open requests finish (or end as `cancelled` after
    /// [`ServerHandle::cancel_all`]), and the engine thread is joined.
    ///
    /// # Errors
    /// [`ServeError::Io`] when serving fails.
    pub async fn serve(
        mut self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let addr = listener
            .local_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        let state = self.state.clone();
        let app = self.router();
        let r = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                state.shutting_down.store(true, Ordering::SeqCst);
            })
            .await;
        self.send(Command::Drain);
        if let Some(h) = self.engine.take() {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        r.map_err(|source| ServeError::Io { addr, source })
    }
}

/// Stops or cancels a [`Server`] (see [`Server::handle`]).
#[derive(Clone)]
pub struct ServerHandle(Arc<AppState>);

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ServerHandle")
            .field(&self.0.model_id)
            .finish()
    }
}

impl ServerHandle {
    fn send(&self, c: Command) {
        if let Ok(s) = self.0.engine.lock() {
            let _ = s.send(c);
        }
    }

    /// Stops taking requests (new ones are answered 503); queued and running ones go on.
    pub fn begin_shutdown(&self) {
        self.0.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Cancels every queued and running request: each ends at once with finish reason
    /// `cancelled` (the text so far is kept); the engine then stops.
    pub fn cancel_all(&self) {
        self.begin_shutdown();
        self.send(Command::Cancel);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // the engine finishes what it holds and stops; the thread is not waited for here
        self.send(Command::Drain);
    }
}
