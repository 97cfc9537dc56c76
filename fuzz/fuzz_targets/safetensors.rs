//! Safetensors: the header and tensor extents of a `model.safetensors`, and (when the input
//! is UTF-8) a `model.safetensors.index.json`.
#![no_main]

use dustin_qwen::safetensors_loader::{parse_index, parse_safetensors};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_safetensors(data, "fuzz.safetensors");
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_index(text, "fuzz.index.json");
    }
});
