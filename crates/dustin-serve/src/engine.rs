//! The engine thread: owns the models (through a [`DecoderFactory`]), takes requests from
//! the HTTP handlers over a channel, and runs them in one batch, one speculative iteration
//! at a time (continuous batching). Every request, greedy or sampled, joins the running
//! batch between two of its iterations, with its own sampling rule, seed and end tokens:
//! its prompt is prefilled in chunks of [`EngineConfig::prefill_chunk`] tokens, one chunk
//! per iteration of the batch, and it decodes from the iteration after its last chunk.
//! Requests leave the batch when they finish; a request whose client went away is
//! cancelled at the next iteration and its cache rows dropped (before or after it joined);
//! a batch whose sequences have all finished is dropped with its KV caches.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use burn_tensor::backend::Backend;
use dustin_core::{SamplingConfig, SeqSampling, TokenId};
use dustin_qwen::generate::FinishReason;
use dustin_qwen::{StreamDecoder, Tokenizer};
use dustin_spec::{
    AutoregressiveDecoder, JoinDrafter, JoinVerifier, SeqLimits, SpecConfig, SpecRun,
    SpeculativeDecoder,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// A decoder the engine drives one iteration at a time, taking sequences between
/// iterations: speculative ([`SpeculativeDecoder`]) or autoregressive
/// ([`AutoregressiveDecoder`]), over a drafter and a verifier that take joining sequences
/// ([`JoinDrafter`], [`JoinVerifier`]).
pub trait Decoder {
    /// An empty run (see [`SpeculativeDecoder::open`]).
    ///
    /// # Errors
    /// Configuration errors.
    fn open(&self, cfg: &SpecConfig) -> dustin_spec::Result<SpecRun>;

    /// Adds a sequence to `run`, to join once prefilled (see [`SpeculativeDecoder::join`]).
    ///
    /// # Errors
    /// Prompt and memory errors; `run` is unchanged then.
    fn join(
        &mut self,
        run: &mut SpecRun,
        prompt: &[TokenId],
        limits: &SeqLimits,
        room: usize,
    ) -> dustin_spec::Result<usize>;

    /// Prefill chunks of the joining sequences (see [`SpeculativeDecoder::prefill`]).
    ///
    /// # Errors
    /// Model errors.
    fn prefill(
        &mut self,
        run: &mut SpecRun,
        chunk: usize,
        budget: usize,
        tokenizer: &Tokenizer,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> dustin_spec::Result<usize>;

    /// One iteration of `run` (see [`SpeculativeDecoder::step`]).
    ///
    /// # Errors
    /// Model errors.
    fn step(
        &mut self,
        run: &mut SpecRun,
        tokenizer: &Tokenizer,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> dustin_spec::Result<()>;
}

impl<B: Backend, D: JoinDrafter<B>, V: JoinVerifier<B>> Decoder for SpeculativeDecoder<B, D, V> {
    fn open(&self, cfg: &SpecConfig) -> dustin_spec::Result<SpecRun> {
        SpeculativeDecoder::open(self, cfg)
    }

    fn join(
        &mut self,
        run: &mut SpecRun,
        prompt: &[TokenId],
        limits: &SeqLimits,
        room: usize,
    ) -> dustin_spec::Result<usize> {
        SpeculativeDecoder::join(self, run, prompt, limits, room)
    }

    fn prefill(
        &mut self,
        run: &mut SpecRun,
        chunk: usize,
        budget: usize,
        tokenizer: &Tokenizer,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> dustin_spec::Result<usize> {
        SpeculativeDecoder::prefill(self, run, chunk, budget, Some(tokenizer), on_tokens)
    }

    fn step(
        &mut self,
        run: &mut SpecRun,
        tokenizer: &Tokenizer,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> dustin_spec::Result<()> {
        SpeculativeDecoder::step(self, run, Some(tokenizer), on_tokens)
    }
}

impl<B: Backend, V: JoinVerifier<B>> Decoder for AutoregressiveDecoder<B, V> {
    fn open(&self, cfg: &SpecConfig) -> dustin_spec::Result<SpecRun> {
        AutoregressiveDecoder::open(self, cfg)
    }

    fn join(
        &mut self,
        run: &mut SpecRun,
        prompt: &[TokenId],
        limits: &SeqLimits,
        room: usize,
    ) -> dustin_spec::Result<usize> {
        AutoregressiveDecoder::join(self, run, prompt, limits, room)
    }

    fn prefill(
        &mut self,
        run: &mut SpecRun,
        chunk: usize,
        budget: usize,
        tokenizer: &Tokenizer,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> dustin_spec::Result<usize> {
        AutoregressiveDecoder::prefill(self, run, chunk, budget, Some(tokenizer), on_tokens)
    }

    fn step(
        &mut self,
        run: &mut SpecRun,
        tokenizer: &Tokenizer,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> dustin_spec::Result<()> {
        AutoregressiveDecoder::step(self, run, Some(tokenizer), on_tokens)
    }
}

/// Makes one decoder per batch; built on the engine thread, which owns it.
pub trait DecoderFactory {
    /// Checks that the KV caches of `batch` sequences with room for `capacity` tokens each
    /// fit in memory (the same check `dustin generate` makes before allocating) and returns
    /// their bytes.
    ///
    /// # Errors
    /// The check's message (needed and available bytes) when they do not fit.
    fn check_memory(&self, batch: usize, capacity: usize) -> Result<u64, String>;

    /// A fresh decoder (its own caches and selection policy state, no sequences yet; each
    /// sequence joins with its own room, [`Decoder::join`]); `extra_capacity` is the room
    /// past its prompt of the request that opens the batch.
    ///
    /// # Errors
    /// A message when the decoder cannot be made.
    fn build(&mut self, extra_capacity: usize) -> Result<Box<dyn Decoder>, String>;
}

/// How the engine batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Draft tokens per iteration (ignored by an autoregressive factory).
    pub gamma: usize,
    /// Sequences in the running batch at most (those being prefilled included).
    pub max_batch: usize,
    /// Prompt tokens prefilled per batch between two of its iterations (chunks of this
    /// size), so that a long prompt does not stall the sequences decoding.
    pub prefill_chunk: usize,
}

/// What a request's handler receives from the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New text (cut before any stop string).
    Text(String),
    /// The request finished.
    Done {
        /// `stop`, `length` or `cancelled`.
        finish_reason: &'static str,
        /// Tokens generated.
        completion_tokens: usize,
    },
    /// The request failed.
    Error(ApiError),
}

/// One request, tokenized and checked, as the engine runs it.
#[derive(Debug)]
pub struct GenRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<TokenId>,
    /// Tokens to generate at most (>= 1).
    pub max_tokens: usize,
    /// Sampling rule of this request (greedy and sampled requests share the batch).
    pub sampling: SamplingConfig,
    /// Seed of a sampled request: its text is that of its run alone with this seed,
    /// whatever shares its batch.
    pub seed: u64,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Token ids that end generation (EOS; for chats also the template's end of turn).
    pub eos: Vec<TokenId>,
    /// When the request arrived (for the time to first token).
    pub arrived: Instant,
    /// Where its events go; closed when the client went away.
    pub events: UnboundedSender<Event>,
}

/// A message to the engine thread.
#[derive(Debug)]
pub enum Command {
    /// Run a request (it was counted in [`Metrics::queued`] already).
    Submit(GenRequest),
    /// Finish everything queued and running, then stop.
    Drain,
    /// Cancel everything queued and running (finish reason `cancelled`), then stop.
    Cancel,
}

/// One request inside a running batch.
struct Member {
    events: UnboundedSender<Event>,
    stop: Vec<String>,
    /// end tokens: counted, not written into the text (OpenAI leaves them out)
    eos: Vec<TokenId>,
    arrived: Instant,
    stream: StreamDecoder,
    text: String,
    sent: usize,
    tokens: usize,
    done: bool,
}

impl Member {
    fn new(r: &GenRequest) -> Self {
        Self {
            events: r.events.clone(),
            stop: r.stop.clone(),
            eos: r.eos.clone(),
            arrived: r.arrived,
            stream: StreamDecoder::default(),
            text: String::new(),
            sent: 0,
            tokens: 0,
            done: false,
        }
    }

    /// Adds tokens and sends the text that can no longer be part of a stop string.
    fn push(&mut self, tok: &Tokenizer, ids: &[TokenId], metrics: &Metrics) {
        if self.tokens == 0 && !ids.is_empty() {
            let ttft = self.arrived.elapsed().as_secs_f64();
            metrics.update(|c| {
                c.ttft_sum += ttft;
                c.ttft_count += 1;
            });
        }
        self.tokens += ids.len();
        let text_ids: Vec<TokenId> = ids
            .iter()
            .copied()
            .filter(|t| !self.eos.contains(t))
            .collect();
        if let Ok(s) = self.stream.push(tok, &text_ids) {
            self.text.push_str(&s);
        }
        self.flush(false);
    }

    /// Sends the text up to the first stop string; before the end, holds back a tail that
    /// could still grow into one.
    fn flush(&mut self, last: bool) {
        let mut end = self.text.len();
        let mut stopped = false;
        for s in self.stop.iter().filter(|s| !s.is_empty()) {
            if let Some(i) = self.text.find(s.as_str()) {
                end = end.min(i);
                stopped = true;
            }
        }
        if !last && !stopped {
            let hold = self.stop.iter().map(String::len).max().unwrap_or(0);
            end = end.saturating_sub(hold.saturating_sub(1));
            while !self.text.is_char_boundary(end) {
                end -= 1;
            }
        }
        if end > self.sent {
            let _ = self
                .events
                .send(Event::Text(self.text[self.sent..end].to_string()));
            self.sent = end;
        }
    }

    /// Sends the rest of the text and the end of the request.
    fn finish(&mut self, reason: FinishReason, metrics: &Metrics) {
        self.done = true;
        self.flush(true);
        let finish_reason = match reason {
            FinishReason::Eos | FinishReason::StopString => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        };
        // counted first: a client that reads its end then the metrics sees itself counted
        metrics.finished(finish_reason);
        let _ = self.events.send(Event::Done {
            finish_reason,
            completion_tokens: self.tokens,
        });
    }
}

/// The running batch: its decoder (caches), its run state and its requests by sequence
/// index.
struct Batch {
    dec: Box<dyn Decoder>,
    run: SpecRun,
    members: Vec<Member>,
    /// tokens each sequence's cache holds (the longest prompt + room of those that joined)
    capacity: usize,
    /// KV bytes per sequence and token (from the factory's memory check)
    token_bytes: f64,
}

impl Batch {
    fn kv_bytes(&self) -> u64 {
        (self.token_bytes * (self.run.active().len() * self.capacity) as f64) as u64
    }
}

/// The engine's loop; returns when told to stop and nothing is left, or when every sender
/// is gone and nothing is left.
pub(crate) fn run_engine(
    mut factory: Box<dyn DecoderFactory>,
    tok: Arc<Tokenizer>,
    cfg: EngineConfig,
    rx: Receiver<Command>,
    metrics: Arc<Metrics>,
) {
    let mut waiting: VecDeque<GenRequest> = VecDeque::new();
    let mut batch: Option<Batch> = None;
    let mut stopping = false;
    let mut cancel = false;
    loop {
        // wait for work when there is none; then take everything that arrived
        if batch.is_none() && waiting.is_empty() {
            if stopping {
                break;
            }
            match rx.recv() {
                Ok(c) => take(c, &mut waiting, &mut stopping, &mut cancel),
                Err(_) => break,
            }
        }
        let busy = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(c) => take(c, &mut waiting, &mut stopping, &mut cancel),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    stopping = true;
                    break;
                }
            }
        }
        // requests whose client left before they started
        waiting.retain(|r| {
            if r.events.is_closed() {
                metrics.queued.fetch_sub(1, Ordering::SeqCst);
                metrics.finished("disconnected");
                false
            } else {
                true
            }
        });
        if cancel {
            for r in waiting.drain(..) {
                metrics.queued.fetch_sub(1, Ordering::SeqCst);
                let mut m = Member::new(&r);
                m.finish(FinishReason::Cancelled, &metrics);
            }
            if let Some(mut b) = batch.take() {
                b.run.cancel_all();
                for (s, m) in b.members.iter_mut().enumerate() {
                    if !m.done {
                        m.finish(
                            b.run.finish_reason(s).unwrap_or(FinishReason::Cancelled),
                            &metrics,
                        );
                    }
                }
            }
        }
        admit(&mut waiting, &mut batch, factory.as_mut(), &cfg, &metrics);
        if let Some(b) = &mut batch {
            advance(b, &tok, &cfg, &metrics);
        }
        if batch.as_ref().is_some_and(|b| b.run.is_done()) {
            batch = None;
        }
        let secs = busy.elapsed().as_secs_f64();
        metrics.update(|c| {
            c.engine_secs += secs;
            c.batches = u64::from(batch.is_some());
            c.active_sequences = batch.as_ref().map_or(0, |b| b.run.active().len() as u64);
            c.prefilling = batch.as_ref().map_or(0, |b| b.run.joining().len() as u64);
            c.kv_bytes = batch.as_ref().map_or(0, Batch::kv_bytes);
        });
    }
}

fn take(c: Command, waiting: &mut VecDeque<GenRequest>, stopping: &mut bool, cancel: &mut bool) {
    match c {
        Command::Submit(r) => waiting.push_back(r),
        Command::Drain => *stopping = true,
        Command::Cancel => {
            *stopping = true;
            *cancel = true;
        }
    }
}

/// Tokens a request's caches hold past its prompt: its generation and room for drafting.
fn room(r: &GenRequest, cfg: &EngineConfig) -> usize {
    r.max_tokens + 2 * (cfg.gamma + 2)
}

/// Admits waiting requests, oldest first, while sequences are free: each joins the running
/// batch, greedy or sampled, with its own sampling rule, seed and end tokens (a sampled
/// request's seed gives the same text whatever else runs), or opens the batch when none
/// runs. A request whose KV cache does not fit waits while the batch runs (its memory frees
/// as its requests finish) and is answered an error when nothing runs.
fn admit(
    waiting: &mut VecDeque<GenRequest>,
    batch: &mut Option<Batch>,
    factory: &mut dyn DecoderFactory,
    cfg: &EngineConfig,
    metrics: &Metrics,
) {
    while let Some(r) = waiting.front() {
        let running = batch.as_ref().map_or(0, |b| b.run.active().len());
        if running >= cfg.max_batch {
            return;
        }
        let need = r.prompt.len() + room(r, cfg);
        // a batch whose capacity grows is copied: every sequence at the new capacity
        let check = match batch.as_ref() {
            Some(b) if need > b.capacity => (b.run.active().len() + 1, need),
            Some(b) => (1, b.capacity),
            None => (1, need),
        };
        let token_bytes = match factory.check_memory(check.0, check.1) {
            Ok(b) => b as f64 / (check.0 * check.1).max(1) as f64,
            // memory frees when the running batch's requests finish
            Err(_) if batch.is_some() => return,
            Err(e) => {
                if let Some(r) = waiting.pop_front() {
                    metrics.queued.fetch_sub(1, Ordering::SeqCst);
                    metrics.finished("no_memory");
                    let _ = r.events.send(Event::Error(ApiError::no_memory(format!(
                        "the request's KV cache does not fit: {e}"
                    ))));
                }
                continue;
            }
        };
        let Some(r) = waiting.pop_front() else { return };
        metrics.queued.fetch_sub(1, Ordering::SeqCst);
        if batch.is_none() {
            match open_batch(&r, factory, cfg, token_bytes) {
                Ok(b) => {
                    *batch = Some(b);
                    metrics.update(|c| c.batches_opened += 1);
                }
                Err(e) => {
                    metrics.finished("error");
                    let _ = r.events.send(Event::Error(ApiError::internal(e)));
                    continue;
                }
            }
        }
        let Some(b) = batch.as_mut() else { return };
        let limits = SeqLimits {
            max_new_tokens: r.max_tokens,
            stop_strings: r.stop.clone(),
            eos: Some(r.eos.clone()),
            sampling: Some(SeqSampling::new(r.sampling, r.seed)),
        };
        match b.dec.join(&mut b.run, &r.prompt, &limits, room(&r, cfg)) {
            Ok(s) => {
                debug_assert_eq!(s, b.members.len());
                b.capacity = b.capacity.max(need);
                b.members.push(Member::new(&r));
                metrics.update(|c| c.prompt_tokens += r.prompt.len() as u64);
            }
            Err(e) => {
                metrics.finished("error");
                let _ = r.events.send(Event::Error(ApiError::internal(format!(
                    "cannot admit: {e}"
                ))));
            }
        }
    }
}

/// A new batch for `r` (its decoder and an empty run), before `r` joins it; every request
/// that joins it brings its own limits, end tokens and sampling rule.
fn open_batch(
    r: &GenRequest,
    factory: &mut dyn DecoderFactory,
    cfg: &EngineConfig,
    token_bytes: f64,
) -> Result<Batch, String> {
    let dec = factory.build(room(r, cfg))?;
    let spec = SpecConfig {
        gamma: cfg.gamma,
        max_new_tokens: r.max_tokens,
        ..SpecConfig::default()
    };
    let run = dec.open(&spec).map_err(|e| e.to_string())?;
    Ok(Batch {
        dec,
        run,
        members: Vec::new(),
        capacity: 0,
        token_bytes,
    })
}

/// Sends the end of every request whose sequence finished and was not reported yet.
fn report_finished(run: &mut SpecRun, members: &mut [Member], metrics: &Metrics) {
    for (s, m) in members.iter_mut().enumerate() {
        if !m.done {
            if let Some(r) = run.finish_reason(s) {
                m.finish(r, metrics);
            }
        }
    }
}

/// Answers every request of `b` still open with `msg` and ends the batch.
fn fail(b: &mut Batch, msg: &str, metrics: &Metrics) {
    b.run.cancel_all();
    for m in b.members.iter_mut().filter(|m| !m.done) {
        m.done = true;
        metrics.finished("error");
        let _ = m
            .events
            .send(Event::Error(ApiError::internal(msg.to_string())));
    }
}

/// Advances `b` by one round: cancels the sequences whose client left, prefills up to one
/// chunk of joining prompts (a sequence whose prompt is done emits its first token and
/// joins), runs one iteration of the sequences decoding, sends the new text and the ends,
/// and counts.
fn advance(b: &mut Batch, tok: &Tokenizer, cfg: &EngineConfig, metrics: &Metrics) {
    for (s, m) in b.members.iter_mut().enumerate() {
        if !m.done && m.events.is_closed() && b.run.cancel(s) {
            m.done = true;
            metrics.finished("disconnected");
        }
    }
    if !b.run.joining().is_empty() {
        let mut first = 0usize;
        let t = Instant::now();
        let members = &mut b.members;
        let chunk = cfg.prefill_chunk;
        let r = b.dec.prefill(&mut b.run, chunk, chunk, tok, &mut |s, ids| {
            first += ids.len();
            if let Some(m) = members.get_mut(s) {
                m.push(tok, ids, metrics);
            }
        });
        let secs = t.elapsed().as_secs_f64();
        metrics.update(|c| {
            c.prefill_secs += secs;
            c.completion_tokens += first as u64;
        });
        if let Err(e) = r {
            fail(b, &format!("prefill failed: {e}"), metrics);
            return;
        }
        report_finished(&mut b.run, &mut b.members, metrics);
    }
    if b.run.is_done() {
        return;
    }
    let before = b.run.iterations().len();
    let mut emitted = 0usize;
    let t = Instant::now();
    let members = &mut b.members;
    let r = b.dec.step(&mut b.run, tok, &mut |s, ids| {
        emitted += ids.len();
        if let Some(m) = members.get_mut(s) {
            m.push(tok, ids, metrics);
        }
    });
    let secs = t.elapsed().as_secs_f64();
    if let Err(e) = r {
        fail(b, &format!("generation failed: {e}"), metrics);
        return;
    }
    let last = b.run.iterations().get(before);
    metrics.update(|c| {
        if last.is_some() {
            c.step_secs += secs;
        }
        c.step_tokens += emitted as u64;
        c.completion_tokens += emitted as u64;
        if let Some(it) = last {
            c.seq_verifications += it.accepted.len() as u64;
            c.emitted_per_verification_sum +=
                it.accepted.iter().map(|&a| (a + 1) as f64).sum::<f64>();
            c.kv_fraction_sum += it.kv_read_fraction.iter().sum::<f64>();
        }
    });
    report_finished(&mut b.run, &mut b.members, metrics);
}
