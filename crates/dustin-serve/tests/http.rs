//! The server over HTTP on a loopback port with tiny random-weight models: outputs equal the
//! library's for the same prompts (alone, streamed, and 16 clients at once), errors are
//! OpenAI error bodies, the queue limit answers 429, a client that leaves mid-stream is
//! cancelled and its batch freed, and a shutdown finishes what runs.

mod common;

use common::*;
use dustin_core::SamplingConfig;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_equals_the_library_alone_and_streamed() {
    let srv = spawn(config(), factory()).await;
    let p = prompt(1, 11);
    let (want, toks) = reference(&p, 20, &[], SamplingConfig::greedy(), 0);
    assert_eq!(toks.len(), 20);
    let (s, v) = post(
        &srv.base,
        "/v1/completions",
        json!({"model": "tiny", "prompt": p, "max_tokens": 20}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 11);
    assert_eq!(v["usage"]["completion_tokens"], 20);
    let chunks = post_stream(
        &srv.base,
        "/v1/completions",
        json!({"model": "tiny", "prompt": [p], "max_tokens": 20, "stream": true,
               "stream_options": {"include_usage": true}}),
    )
    .await;
    let (text, finish) = stream_text(&chunks, false);
    assert_eq!((text.as_str(), finish.as_str()), (want.as_str(), "length"));
    let usage: Value = serde_json::from_str(&chunks[chunks.len() - 2]).expect("usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 20);
    let m = metrics(&srv.base).await;
    assert_eq!(metric(&m, "dustin_completion_tokens_total"), Some(40.0));
    assert_eq!(
        metric(&m, "dustin_requests_finished_total{reason=\"length\"}"),
        Some(2.0)
    );
    // draft and target differ: acceptance length is 1 ..= gamma + 1; dense reads everything
    let tau = metric(&m, "dustin_mean_acceptance_length").expect("tau");
    assert!((1.0..=(GAMMA + 1) as f64).contains(&tau), "{m}");
    assert_eq!(metric(&m, "dustin_kv_fraction_read"), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stop_strings_and_seeded_sampling_equal_the_library() {
    // chat: rendered by the template, ending at its end-of-turn token (the sixth token the
    // model writes here), which the text leaves out
    let rendered = "t1 t20 t21 t22 t2 t1 t30 t31 t2 t3";
    let (_, free) = reference(rendered, 24, &[], SamplingConfig::greedy(), 0);
    let eos = free[5];
    let (want, toks) = reference(rendered, 24, &[eos], SamplingConfig::greedy(), 0);
    assert_eq!(toks.last(), Some(&eos));
    let srv = spawn_with(config(), factory(), chat_template(eos)).await;
    let body = json!({"model": "tiny", "max_tokens": 24, "messages": [
        {"role": "system", "content": "t20 t21 t22"}, {"role": "user", "content": "t30 t31"}]});
    let (s, v) = post(&srv.base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], toks.len());
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let chunks = post_stream(&srv.base, "/v1/chat/completions", streamed).await;
    let first: Value = serde_json::from_str(&chunks[0]).expect("first chunk");
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(stream_text(&chunks, true).0, want);

    // a stop string: the text ends before it, finish reason `stop`
    let p = prompt(2, 9);
    let (full, toks) = reference(&p, 30, &[], SamplingConfig::greedy(), 0);
    let word = format!("t{}", toks[6]);
    // OpenAI's rule: the text up to the first occurrence of the stop string
    let cut = &full[..full.find(&word).expect("word")];
    for stream in [false, true] {
        let body = json!({"model": "tiny", "prompt": p, "max_tokens": 30, "stop": [word],
                          "stream": stream});
        let (text, finish) = if stream {
            stream_text(
                &post_stream(&srv.base, "/v1/completions", body).await,
                false,
            )
        } else {
            let (s, v) = post(&srv.base, "/v1/completions", body).await;
            assert_eq!(s, 200, "{v}");
            let c = &v["choices"][0];
            (
                c["text"].as_str().expect("text").to_string(),
                c["finish_reason"].to_string().replace('"', ""),
            )
        };
        assert_eq!(
            (text.as_str(), finish.as_str()),
            (cut, "stop"),
            "stream {stream}"
        );
    }

    // a seeded sampled request: the library's sampled output for that seed
    let s = SamplingConfig {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 40,
    };
    let (want, _) = reference(&p, 16, &[], s, 1234);
    let (_, v) = post(
        &srv.base,
        "/v1/completions",
        json!({"model": "tiny", "prompt": p, "max_tokens": 16, "temperature": 0.9,
               "top_p": 0.95, "top_k": 40, "seed": 1234}),
    )
    .await;
    assert_eq!(v["choices"][0]["text"], want.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_clients_each_get_their_sequential_output() {
    let srv = spawn(config(), factory()).await;
    let cases: Vec<(String, usize)> = (0..16)
        .map(|i| (prompt(10 + i, 3 + (i * 5) % 23), 6 + (i * 7) % 30))
        .collect();
    let want: Vec<String> = cases
        .iter()
        .map(|(p, n)| reference(p, *n, &[], SamplingConfig::greedy(), 0).0)
        .collect();
    let mut tasks = Vec::new();
    for (i, (p, n)) in cases.iter().cloned().enumerate() {
        let base = srv.base.clone();
        tasks.push(tokio::spawn(async move {
            let body = json!({"model": "tiny", "prompt": p, "max_tokens": n, "stream": i % 2 == 0});
            if i % 2 == 0 {
                stream_text(&post_stream(&base, "/v1/completions", body).await, false).0
            } else {
                let (s, v) = post(&base, "/v1/completions", body).await;
                assert_eq!(s, 200, "{v}");
                v["choices"][0]["text"].as_str().expect("text").to_string()
            }
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.expect("client"), want[i], "request {i}");
    }
    let m = until_metrics(&srv.base, idle).await;
    assert_eq!(metric(&m, "dustin_requests_total"), Some(16.0));
    let total: usize = cases.iter().map(|c| c.1).sum();
    assert_eq!(
        metric(&m, "dustin_completion_tokens_total"),
        Some(total as f64)
    );
    assert_eq!(
        metric(&m, "dustin_requests_finished_total{reason=\"length\"}"),
        Some(16.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_error_bodies() {
    let srv = spawn(config(), factory()).await;
    let c = reqwest::Client::new();
    let raw = |body: &'static str| {
        c.post(format!("{}/v1/completions", srv.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let r = raw("{\"model\": \"tiny\", \"prompt\": ")
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "invalid_json");
    // a body past the 2 MiB limit: 413, the limit named
    let big = format!(
        "{{\"model\": \"tiny\", \"prompt\": \"{}\"}}",
        "t1 ".repeat(800_000)
    );
    let r = c
        .post(format!("{}/v1/completions", srv.base))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "request_too_large");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("limit of 2097152 bytes"), "{v}");
    let cases = [
        (
            json!({"model": "tiny", "prompt": "t1", "max_token": 3}),
            400,
            None,
            "unknown field `max_token`",
        ),
        (
            json!({"model": "tiny", "prompt": "t1", "max_tokens": 49}),
            400,
            Some("max_tokens"),
            "expected 1 ..= 48",
        ),
        (
            json!({"model": "tiny", "prompt": "t1", "max_tokens": 0}),
            400,
            Some("max_tokens"),
            "expected 1 ..= 48",
        ),
        (
            json!({"model": "tiny", "prompt": prompt(3, 65)}),
            400,
            Some("prompt"),
            "65 tokens: expected 1 ..= 64",
        ),
        (
            json!({"model": "tiny", "prompt": "t1", "n": 2}),
            400,
            Some("n"),
            "n = 1",
        ),
        (
            json!({"model": "tiny", "prompt": "t1", "temperature": -1}),
            400,
            Some("temperature"),
            "[0, 2]",
        ),
        (
            json!({"model": "tiny", "prompt": "t1", "top_p": 0}),
            400,
            Some("top_p"),
            "(0, 1]",
        ),
        (
            json!({"model": "tiny", "prompt": "  "}),
            400,
            Some("prompt"),
            "empty",
        ),
        // token ids are not a prompt here: named, not "did not match any variant"
        (
            json!({"model": "tiny", "prompt": [1, 2, 3]}),
            400,
            None,
            "expected a string",
        ),
        (
            json!({"model": "tiny", "prompt": 7}),
            400,
            None,
            "expected a string or an array of strings",
        ),
        (
            json!({"model": "big", "prompt": "t1"}),
            404,
            Some("model"),
            "serves `tiny`",
        ),
    ];
    for (body, status, param, msg) in cases {
        let (s, v) = post(&srv.base, "/v1/completions", body.clone()).await;
        assert_eq!(s, status, "{body}: {v}");
        assert_eq!(v["error"]["param"].as_str(), param, "{body}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .expect("message")
                .contains(msg),
            "{body}: {v}"
        );
    }
    let (s, v) = post(
        &srv.base,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": [{"role": "robot", "content": "t1"}]}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["param"].as_str()),
        (400, Some("messages[0].role")),
        "{v}"
    );
    let (s, v) = post(&srv.base, "/v1/nothing", json!({})).await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (404, Some("not_found_error")),
        "{v}"
    );
    let r = reqwest::get(format!("{}/v1/completions", srv.base))
        .await
        .expect("get");
    assert_eq!(r.status().as_u16(), 405);
    let v: Value = r.json().await.expect("an OpenAI error body");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("GET /v1/completions: the routes are POST")),
        "{v}"
    );
    let models: Value = reqwest::get(format!("{}/v1/models", srv.base))
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(models["data"][0]["id"], "tiny");
    let m = metrics(&srv.base).await;
    assert_eq!(metric(&m, "dustin_requests_total"), Some(0.0));
    // the server still serves after all of them
    let (s, _) = post(
        &srv.base,
        "/v1/completions",
        json!({"model": "tiny", "prompt": "t1 t2", "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_a_batch_that_cannot_fit_503() {
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    let mut f = factory();
    f.gate = Some((entered_tx, std::sync::Mutex::new(go_rx)));
    // room for 100 tokens of cache: small requests fit, 64 + 48 tokens and slack do not
    f.memory = kv_per_token(&f) * 100;
    let mut cfg = config();
    cfg.limits.max_queue = 1;
    let srv = spawn(cfg, f).await;
    let body = json!({"model": "tiny", "prompt": "t1 t2 t3", "max_tokens": 4});
    let base = srv.base.clone();
    let b = body.clone();
    let first = tokio::spawn(async move { post(&base, "/v1/completions", b).await });
    // the first request is admitted: the engine waits inside `build`
    tokio::task::spawn_blocking(move || entered.recv())
        .await
        .expect("join")
        .expect("entered");
    let base = srv.base.clone();
    let b = body.clone();
    let second = tokio::spawn(async move { post(&base, "/v1/completions", b).await });
    until_metrics(&srv.base, |m| metric(m, "dustin_queue_depth") == Some(1.0)).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", srv.base))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "queue_full");
    go.send(()).expect("go");
    go.send(()).expect("go");
    assert_eq!(first.await.expect("first").0, 200);
    assert_eq!(second.await.expect("second").0, 200);
    // 48 new tokens and a 64-token prompt need more than the memory allows
    let (s, v) = post(
        &srv.base,
        "/v1/completions",
        json!({"model": "tiny", "prompt": prompt(4, 64), "max_tokens": 48}),
    )
    .await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_is_cancelled_and_freed() {
    let srv = spawn(config(), factory()).await;
    let mut r = reqwest::Client::new()
        .post(format!("{}/v1/completions", srv.base))
        .json(&json!({"model": "tiny", "prompt": prompt(5, 20), "max_tokens": 48, "stream": true}))
        .send()
        .await
        .expect("send");
    let first = r.chunk().await.expect("chunk").expect("a first chunk");
    assert!(String::from_utf8_lossy(&first).contains("data:"));
    drop(r);
    let m = until_metrics(&srv.base, |m| {
        metric(m, "dustin_requests_finished_total{reason=\"disconnected\"}") == Some(1.0) && idle(m)
    })
    .await;
    assert!(
        metric(&m, "dustin_completion_tokens_total").expect("tokens") < 48.0,
        "{m}"
    );
    // the others go on
    let p = prompt(6, 7);
    let (want, _) = reference(&p, 10, &[], SamplingConfig::greedy(), 0);
    let (_, v) = post(
        &srv.base,
        "/v1/completions",
        json!({"model": "tiny", "prompt": p, "max_tokens": 10}),
    )
    .await;
    assert_eq!(v["choices"][0]["text"], want.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_running_requests() {
    let mut srv = spawn(config(), factory()).await;
    let p = prompt(7, 12);
    let (want, _) = reference(&p, 40, &[], SamplingConfig::greedy(), 0);
    let mut r = reqwest::Client::new()
        .post(format!("{}/v1/completions", srv.base))
        .json(&json!({"model": "tiny", "prompt": p, "max_tokens": 40, "stream": true}))
        .send()
        .await
        .expect("send");
    let mut body =
        String::from_utf8_lossy(&r.chunk().await.expect("chunk").expect("first")).to_string();
    srv.stop.take().expect("stop").send(()).expect("shutdown");
    while let Some(c) = r.chunk().await.expect("chunk") {
        body.push_str(&String::from_utf8_lossy(&c));
    }
    let (text, finish) = stream_text(&sse_data(&body), false);
    assert_eq!((text.as_str(), finish.as_str()), (want.as_str(), "length"));
    srv.done.await.expect("join").expect("served");
}
