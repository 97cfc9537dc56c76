//! `prefill`: causal prefill attention in chunks, and the settings of its variants.

use std::time::Instant;

use burn_tensor::{Distribution, Tensor};
use dustin_kernels::cuda::AttentionKernel;
use dustin_kernels::prelude::*;

use crate::{dev, tweak, B};

/// Causal prefill attention at 4k, 16k, 32k tokens (28 heads, d 128: Qwen2.5-7B): ours in
/// chunks against the cache so far (4 KV heads): `flash_kernel` in chunks of
/// [`PREFILL_CHUNK`], 2048 and 4096; `prefill_kernel` with one K/V buffer (`x2-sync`), a
/// ring of two (`x2`) and K and V staged apart (`x2-kv`) in chunks of 2048 to the whole
/// prompt (the model's CUDA chunk is 16384), and `x2-kv` again with the grid in runs of 1
/// and 28 heads (`-run1`, `-run28`; the default is 7) and with eager rescaling (`-eager`)
/// in chunks of 512, 2048, 16384 and the whole prompt; the split kernel and (up to 16k) the
/// plain path in chunks of [`PREFILL_CHUNK`]; then Burn's attention op at 4k (K/V expanded to 28
/// heads: the op wants equal head counts). One JSON line a shape to `emit`; TFLOP/s count the causal
/// half, `2 * 2 * heads * d * n^2 / 2`.
pub(crate) fn prefill_attention(emit: &mut dyn FnMut(String), quick: bool) {
    let dev = dev();
    let (heads, d) = (28usize, 128usize);
    // the causal half of `2 * 2 * heads * d * n^2`
    let causal_flops = |n: usize| 2.0 * 2.0 * (heads * d) as f64 * (n as f64) * (n as f64) / 2.0;
    let sizes: &[usize] = if quick {
        &[16384]
    } else {
        &[4096, 16384, 32768]
    };
    for &n in sizes {
        let flops = causal_flops(n);
        // ours: the same causal prefill as the model runs it, chunks of PREFILL_CHUNK queries
        // against the cache so far, GQA (7B: 4 KV heads, nothing expanded), through
        // `prefill_attention` (the kernel) and, up to 16k, the plain path (Burn ops; about
        // 1.6 s a pass at 32k)
        // (label, chunk, plain path, kernel, flash tile buffers: 1 = no cp.async, flash
        // prefill warps, m-tiles a warp: 2 = prefill_kernel, 32 rows a warp, 3 = the same with
        // K and V staged apart by cp.async)
        let pc = PREFILL_CHUNK;
        let mut rows = vec![
            ("flash", pc, false, AttentionKernel::Flash, 2, 4, 1),
            ("flash-x2-kv", pc, false, AttentionKernel::Flash, 1, 4, 3),
            ("flash", 2048, false, AttentionKernel::Flash, 2, 4, 1),
            (
                "flash-x2-sync",
                2048,
                false,
                AttentionKernel::Flash,
                1,
                4,
                2,
            ),
            ("flash-x2-kv", 2048, false, AttentionKernel::Flash, 1, 4, 3),
            ("flash-x2", 2048, false, AttentionKernel::Flash, 2, 4, 2),
            ("flash", 4096, false, AttentionKernel::Flash, 2, 4, 1),
        ];
        // larger chunks (up to the whole prompt in one call, as SDPA's row takes it)
        for c in [4096, 8192, 16384, 32768] {
            if c <= n {
                rows.push(("flash-x2-sync", c, false, AttentionKernel::Flash, 1, 4, 2));
                rows.push(("flash-x2-kv", c, false, AttentionKernel::Flash, 1, 4, 3));
                rows.push(("flash-x2", c, false, AttentionKernel::Flash, 2, 4, 2));
            }
        }
        // head runs of prefill_kernel's grid (automatic: one KV head's query heads, 7 here;
        // 1 = row blocks along x; 28 = all heads) and rescaling wherever a maximum moves, K
        // and V staged apart (the automatic choice), at the model's chunkings
        for c in [512, 2048, 16384, 32768] {
            if c > n {
                continue;
            }
            for (run, path) in [(1, "flash-x2-kv-run1"), (28, "flash-x2-kv-run28")] {
                rows.push((path, c, false, AttentionKernel::Flash, 1, 4, 3 + run * RUN));
            }
            rows.push((
                "flash-x2-kv-eager",
                c,
                false,
                AttentionKernel::Flash,
                1,
                4,
                3 + EAGER,
            ));
        }
        rows.push(("split", pc, false, AttentionKernel::Split, 2, 4, 1));
        rows.push(("plain", pc, true, AttentionKernel::Auto, 2, 4, 1));
        for (path, chunk, plain, kern, bufs, warps, tiles) in rows {
            if plain && n > 16384 {
                continue;
            }
            set_prefill_variant(kern, bufs, warps, tiles);
            let r = prefill_chunks(n, chunk, heads, 4, d, plain);
            reset_prefill_variant();
            match r {
                Ok(us) => emit(format!(
                    "{{\"op\":\"prefill-attention-chunked\",\"path\":\"{path}\",\"heads\":{heads},\"kv_heads\":4,\"d\":{d},\"n\":{n},\"chunk\":{chunk},\"us\":{us:.1},\"tflops\":{:.2}}}",
                    flops / us / 1e6
                )),
                Err(e) => emit(
                    serde_json::json!({
                        "op": "prefill-attention-chunked",
                        "path": path,
                        "n": n,
                        "error": e.to_string(),
                    })
                    .to_string(),
                ),
            }
        }
    }
    // Burn's attention op last, at 4k only: its autotuning at 16k did not finish in 100 s on
    // the H200 (2026-11-30); ../shared/docs/GPU.md has 184 ms at 16k
    for &n in sizes.iter().filter(|&&n| n <= 4096) {
        let mk = || Tensor::<B, 4>::random([1, heads, n, d], Distribution::Normal(0.0, 1.0), &dev);
        let (q, k, v) = (mk(), mk(), mk());
        let opts = burn_tensor::ops::AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: true,
        };
        let run =
            || burn_tensor::module::attention(q.clone(), k.clone(), v.clone(), None, None, opts);
        for _ in 0..3 {
            let o = run();
            let _ = o.slice([0..1, 0..1, 0..1, 0..1]).into_data();
        }
        let reps = 3;
        let t = Instant::now();
        let mut o = run();
        for _ in 1..reps {
            o = run();
        }
        let _ = o.slice([0..1, 0..1, 0..1, 0..1]).into_data();
        let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
        let flops = causal_flops(n);
        emit(format!(
            "{{\"op\":\"attention-causal-prefill\",\"heads\":{heads},\"d\":{d},\"n\":{n},\"us\":{us:.1},\"tflops\":{:.2}}}",
            flops / us / 1e6
        ));
    }
}

/// Times this, added to a prefill variant's m-tile code (`tiles`, [`set_prefill_variant`]):
/// the query heads per run of `prefill_kernel`'s grid (`KernelConfig::prefill_head_run`; none
/// added: automatic).
pub(crate) const RUN: usize = 1000;

/// Added to a prefill variant's m-tile code: `prefill_kernel` rescales wherever a maximum
/// moves (`KernelConfig::prefill_lazy_rescale` false).
pub(crate) const EAGER: usize = 500;

/// Forces one causal-prefill variant: `kern`, `bufs` flash tile buffers (1: plain copies),
/// `warps` flash prefill warps, and `tiles` the m-tiles a warp (1 `flash_kernel`; 2
/// `prefill_kernel`; 3 the same with K and V staged apart; 32 `prefill_kernel` in 32-key
/// steps) plus a head run times [`RUN`] and / or [`EAGER`].
pub(crate) fn set_prefill_variant(kern: AttentionKernel, bufs: usize, warps: usize, tiles: usize) {
    let (run, eager, t) = (tiles / RUN, tiles % RUN >= EAGER, tiles % EAGER);
    tweak(|c| c.prefill_lazy_rescale = !eager);
    tweak(|c| c.prefill_kernel = kern);
    tweak(|c| c.flash_buffers = bufs);
    tweak(|c| c.prefill_warps = warps);
    tweak(|c| c.prefill_tiles = if t == 32 { 2 } else { t });
    tweak(|c| c.prefill_key_step = if t == 32 { 32 } else { 64 });
    tweak(|c| c.prefill_head_run = run);
}

/// Puts every causal-prefill setting back to its default.
pub(crate) fn reset_prefill_variant() {
    tweak(|c| c.prefill_kernel = AttentionKernel::Auto);
    tweak(|c| c.flash_buffers = dustin_kernels::cuda::FLASH_BUFFERS);
    tweak(|c| c.prefill_warps = dustin_kernels::cuda::PREFILL_WARPS);
    tweak(|c| c.prefill_tiles = dustin_kernels::cuda::PREFILL_TILES);
    tweak(|c| c.prefill_key_step = dustin_kernels::cuda::PREFILL_KEY_STEP);
    tweak(|c| c.prefill_head_run = 0);
    tweak(|c| c.prefill_lazy_rescale = dustin_kernels::cuda::PREFILL_LAZY_RESCALE);
}

/// Query tokens per prefill chunk of the first rows: the model's chunk where a hook wants
/// the probabilities, an offloaded model's and the CPU's (`DEFAULT_PREFILL_CHUNK`).
pub(crate) const PREFILL_CHUNK: usize = 512;

/// Microseconds of one causal prefill of `n` tokens, attention only, one layer: chunks of
/// `chunk` queries each attending to the cache before it and causally to itself,
/// the cache `[1, kv_heads, n, d]` filled beforehand (random). One warm-up pass, then the
/// mean of two, the device waited for at the end of each.
pub(crate) fn prefill_chunks(
    n: usize,
    chunk: usize,
    heads: usize,
    kvh: usize,
    d: usize,
    plain: bool,
) -> Result<f64, dustin_kernels::KernelError> {
    let dev = dev();
    let k = Tensor::<B, 4>::random([1, kvh, n, d], Distribution::Normal(0.0, 1.0), &dev);
    let v = Tensor::<B, 4>::random([1, kvh, n, d], Distribution::Normal(0.0, 1.0), &dev);
    let q = Tensor::<B, 4>::random([1, heads, chunk, d], Distribution::Normal(0.0, 1.0), &dev);
    let scale = 1.0 / (d as f32).sqrt();
    let pass = || -> Result<Tensor<B, 4>, dustin_kernels::KernelError> {
        let mut last = None;
        let mut start = 0;
        while start < n {
            let m = chunk.min(n - start);
            let qc = q.clone().slice([0..1, 0..heads, 0..m, 0..d]);
            // the keys up to the chunk's end, padded to 64 like the model's KV view
            let keys = (start + m).next_multiple_of(64).min(n);
            let (kc, vc) = (B::kv_prefix(k.clone(), keys), B::kv_prefix(v.clone(), keys));
            let o = if plain {
                dustin_kernels::plain::prefill_attention(qc, kc, vc, &[start], scale)?
            } else {
                B::prefill_attention(qc, kc, vc, &[start], scale)?
            };
            last = Some(o);
            start += m;
        }
        Ok(last.expect("n > 0"))
    };
    let wait = |o: Tensor<B, 4>| {
        let _ = o.slice([0..1, 0..1, 0..1, 0..1]).into_data();
    };
    wait(pass()?);
    let reps = 2;
    let t = Instant::now();
    for _ in 0..reps {
        wait(pass()?);
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / reps as f64)
}
