//! The engine thread: owns the models (through a [`DecoderFactory`]), takes requests from
//! the HTTP handlers over a channel, and runs them in batches, one speculative iteration of
//! each running batch in turn. Requests join between iterations as a new batch (prefilled
//! before the next round of iterations) and leave their batch when they finish; a request
//! whose client went away is cancelled at the next iteration and its cache rows dropped; a
//! batch whose sequences have all finished is dropped with its KV caches.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use burn_tensor::backend::Backend;
use dustin_core::{Drafter, SamplingConfig, TokenId, Verifier};
use dustin_qwen::generate::FinishReason;
use dustin_qwen::{StreamDecoder, Tokenizer};
use dustin_spec::{AutoregressiveDecoder, SeqLimits, SpecConfig, SpecRun, SpeculativeDecoder};
use tokio::sync::mpsc::UnboundedSender;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// A decoder the engine can drive one iteration at a time: speculative
/// ([`SpeculativeDecoder`]) or autoregressive ([`AutoregressiveDecoder`]).
pub trait Decoder {
    /// Prefills `prompts` and emits each sequence's first token (see
    /// [`SpeculativeDecoder::start`]).
    ///
    /// # Errors
    /// Configuration, prompt and model errors.
    fn start(
        &mut self,
        prompts: &[Vec<TokenId>],
        cfg: &SpecConfig,
        limits: &[SeqLimits],
        tokenizer: &Tokenizer,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> dustin_spec::Result<SpecRun>;

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

impl<B: Backend, D: Drafter<B>, V: Verifier<B>> Decoder for SpeculativeDecoder<B, D, V> {
    fn start(
        &mut self,
        prompts: &[Vec<TokenId>],
        cfg: &SpecConfig,
        limits: &[SeqLimits],
        tokenizer: &Tokenizer,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> dustin_spec::Result<SpecRun> {
        SpeculativeDecoder::start(self, prompts, cfg, limits, Some(tokenizer), on_tokens)
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

impl<B: Backend, V: Verifier<B>> Decoder for AutoregressiveDecoder<B, V> {
    fn start(
        &mut self,
        prompts: &[Vec<TokenId>],
        cfg: &SpecConfig,
        limits: &[SeqLimits],
        tokenizer: &Tokenizer,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> dustin_spec::Result<SpecRun> {
        AutoregressiveDecoder::start(self, prompts, cfg, limits, Some(tokenizer), on_tokens)
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

    /// A fresh decoder (its own caches and selection policy state) with room for
    /// `extra_capacity` tokens past the longest prompt of the batch it will run.
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
    /// Sequences in running batches at most, all batches together.
    pub max_batch: usize,
    /// Batches running at once at most (each iteration steps every one of them in turn).
    pub max_batches: usize,
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
    /// Sampling rule (greedy requests share batches).
    pub sampling: SamplingConfig,
    /// Seed of a sampled request.
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

/// A running batch: its decoder (caches), its run state and its requests by sequence index.
struct Batch {
    dec: Box<dyn Decoder>,
    run: SpecRun,
    members: Vec<Member>,
    kv_bytes: u64,
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
    let mut batches: Vec<Batch> = Vec::new();
    let mut stopping = false;
    let mut cancel = false;
    loop {
        // wait for work when there is none; then take everything that arrived
        if batches.is_empty() && waiting.is_empty() {
            if stopping {
                break;
            }
            match rx.recv() {
                Ok(c) => take(c, &mut waiting, &mut stopping, &mut cancel),
                Err(_) => break,
            }
        }
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
            for b in &mut batches {
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
            batches.clear();
        }
        admit(
            &mut waiting,
            &mut batches,
            factory.as_mut(),
            &tok,
            &cfg,
            &metrics,
        );
        for b in &mut batches {
            step(b, &tok, &metrics);
        }
        batches.retain(|b| !b.run.is_done());
        metrics.update(|c| {
            c.batches = batches.len() as u64;
            c.active_sequences = batches.iter().map(|b| b.run.active().len() as u64).sum();
            c.kv_bytes = batches.iter().map(|b| b.kv_bytes).sum();
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

/// Whether two requests can share a batch: greedy both, with the same end tokens.
fn same_batch(a: &GenRequest, b: &GenRequest) -> bool {
    a.sampling.is_greedy() && b.sampling.is_greedy() && a.eos == b.eos
}

/// Starts new batches from the waiting requests while there is room: the first waiting
/// request and, when it is greedy, every later greedy request with the same end tokens (up to
/// the free sequences); a sampled request runs in a batch of its own, so that its seed gives
/// the same text whatever else runs.
fn admit(
    waiting: &mut VecDeque<GenRequest>,
    batches: &mut Vec<Batch>,
    factory: &mut dyn DecoderFactory,
    tok: &Tokenizer,
    cfg: &EngineConfig,
    metrics: &Metrics,
) {
    while batches.len() < cfg.max_batches && !waiting.is_empty() {
        let running: usize = batches.iter().map(|b| b.run.active().len()).sum();
        let room = cfg.max_batch.saturating_sub(running);
        if room == 0 {
            return;
        }
        let Some(head) = waiting.front() else { return };
        let mut pick = vec![0usize];
        for (i, r) in waiting.iter().enumerate().skip(1) {
            if pick.len() >= room {
                break;
            }
            if same_batch(head, r) {
                pick.push(i);
            }
        }
        let slack = 2 * (cfg.gamma + 2);
        let shape = |pick: &[usize]| {
            let longest = pick
                .iter()
                .map(|&i| waiting[i].prompt.len())
                .max()
                .unwrap_or(0);
            let most = pick
                .iter()
                .map(|&i| waiting[i].max_tokens)
                .max()
                .unwrap_or(0);
            (most + slack, longest + most + slack)
        };
        let (mut extra, mut capacity) = shape(&pick);
        let mut kv = factory.check_memory(pick.len(), capacity);
        if kv.is_err() && pick.len() > 1 {
            pick.truncate(1);
            (extra, capacity) = shape(&pick);
            kv = factory.check_memory(1, capacity);
        }
        let kv_bytes = match kv {
            Ok(b) => b,
            // memory frees when a running batch finishes
            Err(_) if !batches.is_empty() => return,
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
        // take the picked requests out of the queue, in order
        let mut reqs = Vec::with_capacity(pick.len());
        for &i in pick.iter().rev() {
            if let Some(r) = waiting.remove(i) {
                reqs.push(r);
            }
        }
        reqs.reverse();
        metrics.queued.fetch_sub(reqs.len(), Ordering::SeqCst);
        if let Some(b) = start_batch(reqs, extra, factory, tok, cfg, metrics) {
            batches.push(Batch { kv_bytes, ..b });
        }
    }
}

/// Builds a decoder for `reqs` and prefills them; a failure answers each request with it.
fn start_batch(
    reqs: Vec<GenRequest>,
    extra: usize,
    factory: &mut dyn DecoderFactory,
    tok: &Tokenizer,
    cfg: &EngineConfig,
    metrics: &Metrics,
) -> Option<Batch> {
    let mut members: Vec<Member> = reqs.iter().map(Member::new).collect();
    let fail = |members: &mut [Member], msg: String| {
        for m in members {
            metrics.finished("error");
            let _ = m.events.send(Event::Error(ApiError::internal(msg.clone())));
        }
    };
    let mut dec = match factory.build(extra) {
        Ok(d) => d,
        Err(e) => {
            fail(&mut members, e);
            return None;
        }
    };
    let head = &reqs[0];
    let spec = SpecConfig {
        gamma: cfg.gamma,
        max_new_tokens: reqs.iter().map(|r| r.max_tokens).max().unwrap_or(0),
        sampling: head.sampling,
        seed: head.seed,
        eos: head.eos.clone(),
        stop_strings: Vec::new(),
    };
    let limits: Vec<SeqLimits> = reqs
        .iter()
        .map(|r| SeqLimits {
            max_new_tokens: r.max_tokens,
            stop_strings: r.stop.clone(),
        })
        .collect();
    let prompts: Vec<Vec<TokenId>> = reqs.iter().map(|r| r.prompt.clone()).collect();
    let t = Instant::now();
    let started = dec.start(&prompts, &spec, &limits, tok, &mut |s, ids| {
        if let Some(m) = members.get_mut(s) {
            m.push(tok, ids, metrics);
        }
    });
    let secs = t.elapsed().as_secs_f64();
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    metrics.update(|c| {
        c.prefill_secs += secs;
        c.prompt_tokens += prompt_tokens as u64;
        c.completion_tokens += members.iter().map(|m| m.tokens as u64).sum::<u64>();
    });
    let mut run = match started {
        Ok(r) => r,
        Err(e) => {
            fail(&mut members, e.to_string());
            return None;
        }
    };
    report_finished(&mut run, &mut members, metrics);
    Some(Batch {
        dec,
        run,
        members,
        kv_bytes: 0,
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

/// One iteration of `b`: cancels the sequences whose client left, steps, sends the new text
/// and the ends, and counts.
fn step(b: &mut Batch, tok: &Tokenizer, metrics: &Metrics) {
    for (s, m) in b.members.iter_mut().enumerate() {
        if !m.done && m.events.is_closed() && b.run.cancel(s) {
            m.done = true;
            metrics.finished("disconnected");
        }
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
        let msg = format!("generation failed: {e}");
        b.run.cancel_all();
        for m in b.members.iter_mut().filter(|m| !m.done) {
            m.done = true;
            metrics.finished("error");
            let _ = m.events.send(Event::Error(ApiError::internal(msg.clone())));
        }
        return;
    }
    let last = b.run.iterations().get(before);
    metrics.update(|c| {
        c.step_secs += secs;
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
