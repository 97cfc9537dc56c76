//! Continuous batching over HTTP: a request that arrives while another decodes joins its
//! batch (prefilled in chunks between the other's iterations) and both get their output
//! alone; a client that leaves frees its row while the batch goes on; a sampled request
//! runs beside greedy ones with its seeded output.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampled_request_runs_beside_greedy_ones_with_its_seeded_output() {
    let srv = spawn(config(), slow()).await;
    let sampled = SamplingConfig {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 40,
    };
    let (pg, ps) = (prompt(11, 9), prompt(12, 13));
    let (want_g, _) = reference(&pg, 30, &[], SamplingConfig::greedy(), 0);
    let (want_s, _) = reference(&ps, 20, &[], sampled, 77);
    let mut g = open_stream(&srv.base, &pg, 30).await;
    let first =
        String::from_utf8_lossy(&g.chunk().await.expect("chunk").expect("first")).to_string();
    let (s, v) = post(
        &srv.base,
        "/v1/completions",
        json!({"model": "tiny", "prompt": ps, "max_tokens": 20, "temperature": 0.8,
               "top_p": 0.95, "top_k": 40, "seed": 77}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], want_s.as_str());
    assert_eq!(read_stream(g, first).await, (want_g, "length".to_string()));
    let m = until_metrics(&srv.base, idle).await;
    assert_eq!(metric(&m, "dustin_batches_opened_total"), Some(2.0), "{m}");
}
