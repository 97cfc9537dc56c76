//! The fixture the instruments' tests run on.

/// The `config.json` of `dustin-qwen`'s 2-layer Llama parity fixture (vocab 96): random
/// weights at its shapes are what the instruments build.
pub fn fixture() -> String {
    format!(
        "{}/../dustin-qwen/tests/fixtures/parity/llama/config.json",
        env!("CARGO_MANIFEST_DIR")
    )
}
