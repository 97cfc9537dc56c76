//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The shared data folder (`/work/shared/data` next to the checkout), or `None` with a printed
/// note when it is absent (e.g. a checkout without it), so the test can skip.
pub fn shared_data(sub: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data")
        .join(sub);
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("note: {} is absent; skipping this test", dir.display());
        None
    }
}

/// A fresh empty temporary directory for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dustin-eval-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
