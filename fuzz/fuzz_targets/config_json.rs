//! `config.json`: parsing, validation and the derived sizes the loaders use.
#![no_main]

use dustin_qwen::QwenConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = QwenConfig::from_json(text, "fuzz/config.json") {
        let _ = (c.family(), c.kv_heads(), c.head_dim(), c.group(), c.qkv_bias());
        let _ = c.kv_bytes_per_token(2);
        let _ = c.eos_ids();
    }
});
