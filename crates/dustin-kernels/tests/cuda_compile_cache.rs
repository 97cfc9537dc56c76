//! `dustin_kernels::cuda::compile_cache::init_runtime_config` turns CubeCL's PTX cache on in
//! the folder `DUSTIN_CUBECL_CACHE` names (its own process: CubeCL's configuration is set
//! once per process). Needs no GPU.
#![cfg(feature = "cuda")]

use cubecl::config::cache::CacheConfig;
use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use dustin_kernels::cuda::compile_cache::{init_runtime_config, CACHE_ENV};

#[test]
fn the_ptx_cache_is_on_in_the_named_folder() {
    let dir = std::env::temp_dir().join(format!("dustin-ptx-{}", std::process::id()));
    std::env::set_var(CACHE_ENV, &dir);
    init_runtime_config();
    // a second call changes nothing
    std::env::set_var(CACHE_ENV, "off");
    init_runtime_config();
    match &CubeClRuntimeConfig::get().compilation.cache {
        Some(CacheConfig::File(p)) => assert_eq!(p, &dir),
        other => panic!("expected the PTX cache in {}, got {other:?}", dir.display()),
    }
}
