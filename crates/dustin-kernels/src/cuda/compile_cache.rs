//! CubeCL's on-disk PTX cache, on by default.
//!
//! A CUDA process compiles each kernel at its first use, for each set of compile-time
//! settings (tile shapes, row counts, the batch's shape): on an H100 the first iteration of
//! the Qwen2.5-Coder pair at 32k and batch 16 took 3.45 s autoregressive and 8.2 s with dense
//! verification against 9 and 33 ms once compiled (`docs/perf.md`, "The real weights in
//! batches"). CubeCL 0.10 can keep the compiled PTX on disk (`[compilation] cache` in a
//! `cubecl.toml`), so that only a machine's first run of a kernel pays for it; it is off
//! unless configured, and [`init_runtime_config`] turns it on.
//!
//! CubeCL keys a cached kernel by its name and settings, not by its code, so a rebuilt
//! binary must not read the PTX of an older one: [`cache_dir`] is one folder per build.

use std::path::PathBuf;
use std::sync::{Arc, Once};

use cubecl::config::cache::CacheConfig;
use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

/// Environment variable naming the PTX cache folder; `off` turns the cache off.
pub const CACHE_ENV: &str = "DUSTIN_CUBECL_CACHE";

/// The PTX cache folder of this build: [`CACHE_ENV`] when set (`None` for `off`), else
/// `$XDG_CACHE_HOME/dustin/cubecl/<build>` (`~/.cache` without `XDG_CACHE_HOME`), where
/// `<build>` is the crate version and a hash of the running executable's size and
/// modification time; `None` where neither folder can be named.
pub fn cache_dir() -> Option<PathBuf> {
    if let Ok(v) = std::env::var(CACHE_ENV) {
        return (v != "off" && !v.is_empty()).then(|| PathBuf::from(v));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(
        base.join("dustin")
            .join("cubecl")
            .join(build_tag(std::env::current_exe().ok())),
    )
}

/// `<version>-<16 hex digits>`: FNV-1a of the executable's size and modification time
/// (nanoseconds since the epoch); `<version>-unknown` when it cannot be read.
fn build_tag(exe: Option<PathBuf>) -> String {
    let version = env!("CARGO_PKG_VERSION");
    let meta = exe.and_then(|p| std::fs::metadata(p).ok());
    let Some(meta) = meta else {
        return format!("{version}-unknown");
    };
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in meta
        .len()
        .to_le_bytes()
        .iter()
        .chain(mtime.to_le_bytes().iter())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{version}-{h:016x}")
}

/// Sets CubeCL's runtime configuration for this process, once: the `cubecl.toml` that CubeCL
/// itself would read (the current folder or a parent; its environment overrides applied),
/// with [`cache_dir`] as the PTX cache where that file names none. Call it before the first
/// use of a CUDA device; if CubeCL has read its configuration already, it stays as it is.
pub fn init_runtime_config() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut cfg = CubeClRuntimeConfig::from_current_dir().override_from_env();
        if cfg.compilation.cache.is_none() {
            cfg.compilation.cache = cache_dir().map(CacheConfig::File);
        }
        let mut state = CubeClRuntimeConfig::storage().lock();
        if state.is_none() {
            *state = Some(Arc::new(cfg));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_build_gets_its_own_folder() {
        let dir = std::env::temp_dir().join(format!("dustin-tag-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("exe");
        std::fs::write(&exe, b"one").unwrap();
        let a = build_tag(Some(exe.clone()));
        assert_eq!(a, build_tag(Some(exe.clone())), "stable for one file");
        std::fs::write(&exe, b"one more").unwrap();
        let b = build_tag(Some(exe.clone()));
        assert_ne!(a, b, "a rebuilt (resized) binary must not share the folder");
        assert!(a.starts_with(env!("CARGO_PKG_VERSION")));
        assert_eq!(
            build_tag(Some(dir.join("missing"))),
            format!("{}-unknown", env!("CARGO_PKG_VERSION"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
