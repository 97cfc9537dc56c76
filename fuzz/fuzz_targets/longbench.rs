//! LongBench: MiniLongBench JSON files and original JSONL files, and rendering each
//! sample's prompt.
#![no_main]

use std::path::Path;

use dustin_eval::longbench::{parse_jsonl, parse_shared};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for task in ["narrativeqa", "trec", "lcc"] {
        if let Ok(samples) = parse_shared(text, Path::new("fuzz.json"), task) {
            for s in &samples {
                let _ = s.prompt();
                let _ = s.max_new_tokens();
            }
        }
    }
    if let Ok(samples) = parse_jsonl(text, Path::new("fuzz.jsonl")) {
        for s in &samples {
            let _ = s.prompt();
            let _ = s.max_new_tokens();
        }
    }
});
