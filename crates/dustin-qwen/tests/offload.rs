//! Offloaded target layers (weights in host memory, staged on the device for each forward
//! pass, with and without prefetching) compute exactly what resident layers compute, on the
//! parity fixtures; the device holds less.

mod common;

use burn_flex::FlexDevice;
use common::{fixture_files, forward_logits, B};
use dustin_qwen::{Qwen2, Weight};

fn load(name: &str, offloaded: &[usize]) -> Qwen2<B> {
    let (cfg, src) = fixture_files(name);
    Qwen2::load_offloaded(&cfg, &src, 64, &FlexDevice, offloaded).unwrap()
}

/// Logits of a prefill then two decode steps (the cache written by offloaded layers is read
/// back by the next steps).
fn logits(m: &Qwen2<B>) -> Vec<f32> {
    let mut cache = m.new_cache(2, 32, None);
    let steps = [
        vec![vec![5u32, 17, 33, 2, 90], vec![61, 7, 44, 12, 3]],
        vec![vec![71u32], vec![9]],
        vec![vec![4u32], vec![88]],
    ];
    steps
        .iter()
        .flat_map(|tokens| forward_logits(m, &mut cache, tokens))
        .collect()
}

#[test]
fn offloaded_layers_compute_what_resident_layers_compute() {
    for name in ["llama", "qwen2-tied"] {
        let resident = load(name, &[]);
        let want = logits(&resident);
        assert!(want.iter().all(|v| v.is_finite()) && want.iter().any(|&v| v != 0.0));
        for off in [vec![1usize], vec![0, 1], vec![0, 7]] {
            let m = load(name, &off);
            let listed: Vec<usize> = off.iter().copied().filter(|&l| l < 2).collect();
            assert_eq!(m.offloaded_layers(), listed, "{name} {off:?}");
            for l in &listed {
                assert!(m.layers[*l]
                    .linears()
                    .iter()
                    .all(|lin| matches!(lin.weight, Weight::Host(_))));
            }
            // norms and biases stay; the seven matrices of each offloaded layer leave
            let moved: usize = listed
                .iter()
                .map(|&l| {
                    resident.layers[l]
                        .linears()
                        .iter()
                        .map(|lin| lin.weight.device_bytes())
                        .sum::<usize>()
                })
                .sum();
            assert!(moved > 0);
            assert_eq!(
                m.device_bytes() + moved,
                resident.device_bytes(),
                "{name} {off:?}"
            );
            for prefetch in [true, false] {
                let m = m.clone().with_prefetch(prefetch);
                assert_eq!(
                    logits(&m),
                    want,
                    "{name} offloaded {off:?} prefetch {prefetch}"
                );
            }
        }
    }
}

/// `pin_offloaded` on a backend without page-locked memory (the CPU) leaves every weight
/// pageable and in place, and the model computes exactly what it did.
#[test]
fn pinning_without_page_locked_memory_changes_nothing() {
    let want = logits(&load("llama", &[]));
    let mut m = load("llama", &[0, 1]);
    assert!(!m.offloaded_pinned());
    m.pin_offloaded().unwrap();
    assert!(!m.offloaded_pinned());
    assert_eq!(m.offloaded_layers(), vec![0, 1]);
    assert_eq!(logits(&m), want);
    assert_eq!(dustin_qwen::offload::pinned_fallbacks(), 0);
}
