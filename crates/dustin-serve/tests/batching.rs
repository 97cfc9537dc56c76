//! Continuous batching over HTTP: a request that arrives while another decodes joins its
//! batch (prefilled in chunks between the other's iterations) and both get their output
//! alone; a client that leaves frees its row while the batch goes on; greedy, seeded sampled
//! and chat requests share one batch, each with its sequential output.

mod common;

use std::time::Duration;

use common::*;
use dustin_core::SamplingConfig;
use serde_json::json;

fn slow() -> Factory {
    Factory {
        step_delay: Some(Duration::from_millis(15)),
        ..factory()
    }
}

async fn open_stream(base: &str, prompt: &str, max_tokens: usize) -> reqwest::Response {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "stream": true}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    r
}

/// Reads a stream to its end: its text and finish reason.
async fn read_stream(mut r: reqwest::Response, mut body: String) -> (String, String) {
    while let Some(c) = r.chunk().await.expect("chunk") {
        body.push_str(&String::from_utf8_lossy(&c));
    }
    stream_text(&sse_data(&body), false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_joins_the_batch_of_one_that_decodes() {
    let srv = spawn(config(), slow()).await;
    let (pa, pb) = (prompt(3, 12), prompt(4, 50));
    let (want_a, _) = reference(&pa, 40, &[], SamplingConfig::greedy(), 0);
    let (want_b, _) = reference(&pb, 12, &[], SamplingConfig::greedy(), 0);
    let mut a = open_stream(&srv.base, &pa, 40).await;
    let first =
        String::from_utf8_lossy(&a.chunk().await.expect("chunk").expect("first")).to_string();
    // a decodes; b's 50-token prompt runs in chunks of 16 between its iterations
    let b = open_stream(&srv.base, &pb, 12).await;
    let m = until_metrics(&srv.base, |m| {
        metric(m, "dustin_active_sequences") == Some(2.0)
    })
    .await;
    assert_eq!(metric(&m, "dustin_batches"), Some(1.0), "{m}");
    let (ta, tb) = tokio::join!(read_stream(a, first), read_stream(b, String::new()));
    assert_eq!(ta, (want_a, "length".to_string()));
    assert_eq!(tb, (want_b, "length".to_string()));
    let m = until_metrics(&srv.base, idle).await;
    assert_eq!(metric(&m, "dustin_batches_opened_total"), Some(1.0), "{m}");
    assert_eq!(metric(&m, "dustin_prompt_tokens_total"), Some(62.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_frees_its_row_while_the_batch_goes_on() {
    let srv = spawn(config(), slow()).await;
    let (pa, pb) = (prompt(8, 10), prompt(9, 14));
    let (want_a, _) = reference(&pa, 48, &[], SamplingConfig::greedy(), 0);
    let mut a = open_stream(&srv.base, &pa, 48).await;
    let first =
        String::from_utf8_lossy(&a.chunk().await.expect("chunk").expect("first")).to_string();
    let mut b = open_stream(&srv.base, &pb, 48).await;
    b.chunk().await.expect("chunk").expect("b's first chunk");
    let both = until_metrics(&srv.base, |m| {
        metric(m, "dustin_active_sequences") == Some(2.0)
    })
    .await;
    let kv2 = metric(&both, "dustin_kv_bytes").expect("kv");
    drop(b);
    let m = until_metrics(&srv.base, |m| {
        metric(m, "dustin_requests_finished_total{reason=\"disconnected\"}") == Some(1.0)
            && metric(m, "dustin_active_sequences") == Some(1.0)
    })
    .await;
    assert!(metric(&m, "dustin_kv_bytes").expect("kv") < kv2, "{m}");
    assert_eq!(metric(&m, "dustin_batches"), Some(1.0), "{m}");
    assert_eq!(read_stream(a, first).await, (want_a, "length".to_string()));
    until_metrics(&srv.base, idle).await;
}

/// Posts `body` to `path`, streamed or not: the text and the finish reason.
async fn complete(
    base: String,
    path: &'static str,
    mut body: serde_json::Value,
    stream: bool,
) -> (String, String) {
    let chat = path.contains("chat");
    body["stream"] = json!(stream);
    if stream {
        return stream_text(&post_stream(&base, path, body).await, chat);
    }
    let (s, v) = post(&base, path, body).await;
    assert_eq!(s, 200, "{v}");
    let c = &v["choices"][0];
    let text = if chat {
        &c["message"]["content"]
    } else {
        &c["text"]
    };
    (
        text.as_str().expect("text").to_string(),
        c["finish_reason"].as_str().expect("finish").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_sampled_and_chat_requests_share_one_batch_with_their_sequential_output() {
    // the chat template's end of turn: a token the model writes late in this chat (and not
    // before), so that the chat decodes beside the others for a while
    let rendered = "t1 t20 t21 t2 t3";
    let (_, free) = reference(rendered, 24, &[], SamplingConfig::greedy(), 0);
    let late = (0..20)
        .rev()
        .find(|&k| !free[..k].contains(&free[k]))
        .expect("a token");
    assert!(late >= 8, "{free:?}");
    let eos = free[late];
    let (want_chat, toks) = reference(rendered, 24, &[eos], SamplingConfig::greedy(), 0);
    assert_eq!(toks.last(), Some(&eos));
    let srv = spawn_with(config(), slow(), chat_template(eos)).await;
    let hot = SamplingConfig {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 40,
    };
    let flat = SamplingConfig {
        temperature: 1.4,
        top_p: 1.0,
        top_k: 0,
    };
    let (pg, p1, p2) = (prompt(11, 9), prompt(12, 13), prompt(13, 6));
    let (want_g, _) = reference(&pg, 48, &[], SamplingConfig::greedy(), 0);
    let (want_1, _) = reference(&p1, 20, &[], hot, 77);
    let (want_2, _) = reference(&p2, 24, &[], flat, 5);
    // the same prompt greedy: sampling changed the text
    assert_ne!(
        want_1,
        reference(&p1, 20, &[], SamplingConfig::greedy(), 0).0
    );
    let mut g = open_stream(&srv.base, &pg, 48).await;
    let first =
        String::from_utf8_lossy(&g.chunk().await.expect("chunk").expect("first")).to_string();
    // while the greedy request decodes: two seeded sampled completions (one streamed) and a
    // greedy chat ending at its end of turn
    let s1 = tokio::spawn(complete(
        srv.base.clone(),
        "/v1/completions",
        json!({"model": "tiny", "prompt": p1, "max_tokens": 20, "temperature": 0.8,
               "top_p": 0.95, "top_k": 40, "seed": 77}),
        false,
    ));
    let s2 = tokio::spawn(complete(
        srv.base.clone(),
        "/v1/completions",
        json!({"model": "tiny", "prompt": p2, "max_tokens": 24, "temperature": 1.4,
               "seed": 5}),
        true,
    ));
    let chat = tokio::spawn(complete(
        srv.base.clone(),
        "/v1/chat/completions",
        json!({"model": "tiny", "max_tokens": 24,
               "messages": [{"role": "user", "content": "t20 t21"}]}),
        true,
    ));
    let m = until_metrics(&srv.base, |m| {
        metric(m, "dustin_active_sequences") == Some(4.0)
    })
    .await;
    assert_eq!(metric(&m, "dustin_batches"), Some(1.0), "{m}");
    assert_eq!(s1.await.expect("s1"), (want_1, "length".to_string()));
    assert_eq!(s2.await.expect("s2"), (want_2, "length".to_string()));
    assert_eq!(chat.await.expect("chat"), (want_chat, "stop".to_string()));
    assert_eq!(read_stream(g, first).await, (want_g, "length".to_string()));
    let m = until_metrics(&srv.base, idle).await;
    assert_eq!(metric(&m, "dustin_batches_opened_total"), Some(1.0), "{m}");
    assert_eq!(metric(&m, "dustin_requests_total"), Some(4.0), "{m}");
}
