//! GGUF: header, metadata, tensor infos, then everything a model load does with them
//! (config, tokenizer, every tensor dequantised and mapped to its HF name).
#![no_main]

use dustin_qwen::gguf::{config_from_gguf, tokenizer_from_gguf, GgufFile};
use dustin_qwen::WeightSource;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    let _ = config_from_gguf(&g);
    let _ = tokenizer_from_gguf(&g);
    let names: Vec<String> = g.tensors().iter().map(|t| t.name.clone()).collect();
    for n in &names {
        let _ = g.load_gguf(n);
    }
    for n in g.hf_tensor_names() {
        let _ = g.load(&n);
    }
});
