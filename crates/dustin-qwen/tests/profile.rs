//! A profiled model ([`Qwen2::with_profile`]) computes what it computes unprofiled and records
//! every phase of every layer once per pass, under its label and stage.

mod common;

use common::{forward_logits, load};
use dustin_qwen::profile;

#[test]
fn profiled_passes_record_each_phase_and_change_nothing() {
    let plain = load("llama");
    let layers = plain.layers.len() as u64;
    assert!(layers >= 2);
    let run = |m: &dustin_qwen::Qwen2<common::B>| {
        let mut cache = m.new_cache(2, 16, None);
        let mut out = forward_logits(m, &mut cache, &[vec![5u32, 17, 33], vec![61, 7, 44]]);
        out.extend(forward_logits(m, &mut cache, &[vec![4u32], vec![88]]));
        out.extend(forward_logits(m, &mut cache, &[vec![9u32], vec![2]]));
        out
    };
    let want = run(&plain);
    let profiled = plain.with_profile(Some("profile-test"));
    let got = run(&profiled);
    assert_eq!(got, want);
    let mine: Vec<_> = profile::snapshot()
        .into_iter()
        .filter(|p| p.model == "profile-test")
        .collect();
    let calls = |stage: &str, phase: &str| {
        mine.iter()
            .find(|p| p.stage == stage && p.phase == phase)
            .map_or(0, |p| p.calls)
    };
    // forward_logits runs its passes as decode steps: three passes
    for phase in [
        "input_norm",
        "qkv",
        "rope",
        "kv_append",
        "select",
        "attention",
        "o_proj",
        "post_norm",
        "mlp",
    ] {
        assert_eq!(calls("decode", phase), 3 * layers, "{phase}: {mine:?}");
    }
    assert_eq!(calls("decode", "embed"), 3);
    assert_eq!(calls("decode", "lm_head"), 3);
    // a whole model has no all-reduce, and nothing was offloaded
    assert_eq!(calls("decode", "all_reduce") + calls("decode", "stage"), 0);
    assert!(mine.iter().all(|p| p.secs >= 0.0 && p.secs.is_finite()));
}
