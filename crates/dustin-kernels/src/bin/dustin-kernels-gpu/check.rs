//! `check`: the cases every op is checked on, the report of the results, the command itself.

use crate::op_checks::check_case;
use crate::{config, dev, tweak, B, BOUND};

pub(crate) struct Case {
    pub(crate) name: &'static str,
    pub(crate) batch: usize,
    pub(crate) q_heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) n: usize,
    pub(crate) d: usize,
    pub(crate) ctx: Vec<usize>,
    /// key scale grows along the context (exercises the rare rescale path)
    pub(crate) ramp: bool,
}

pub(crate) struct Report {
    pub(crate) failures: usize,
    pub(crate) lines: Vec<String>,
}

impl Report {
    pub(crate) fn add(&mut self, case: &str, op: &str, err: f64, bound: f64) {
        let ok = err < bound;
        if !ok {
            self.failures += 1;
        }
        let line = format!(
            "{case:<28} {op:<26} max rel err {err:>10.3e}  bound {bound:.0e}  {}",
            if ok { "ok" } else { "FAIL" }
        );
        println!("{line}");
        self.lines.push(line);
    }
}

pub(crate) fn check(op: &str) -> usize {
    dustin_kernels::cuda::set_poison_outputs(true);
    let cases = [
        Case {
            name: "g7 n1 d128 ragged",
            batch: 3,
            q_heads: 14,
            kv_heads: 2,
            n: 1,
            d: 128,
            ctx: vec![1000, 77, 2049],
            ramp: false,
        },
        Case {
            name: "g7 n5 d128 ragged",
            batch: 3,
            q_heads: 14,
            kv_heads: 2,
            n: 5,
            d: 128,
            ctx: vec![1000, 77, 2049],
            ramp: false,
        },
        Case {
            name: "g7 n16 d128 (2 row blocks)",
            batch: 2,
            q_heads: 14,
            kv_heads: 2,
            n: 16,
            d: 128,
            ctx: vec![1500, 0],
            ramp: false,
        },
        Case {
            name: "g5 n5 d128 ramp (rescale)",
            batch: 2,
            q_heads: 20,
            kv_heads: 4,
            n: 5,
            d: 128,
            ctx: vec![3001, 130],
            ramp: true,
        },
        Case {
            // 15 splits of 576 keys (split_plan::verify_splits(32, 8197, 132)): 9 tiles a
            // split, so both buffers of the flash kernel and both parities of their
            // barriers are used several times
            name: "g7 n5 d128 B8 8k (8 tiles a split)",
            batch: 8,
            q_heads: 28,
            kv_heads: 4,
            n: 5,
            d: 128,
            ctx: vec![8192, 8000, 7000, 8100, 5000, 8192, 100, 8191],
            ramp: false,
        },
        Case {
            // the 0.5B draft's decoding (7 rows of one warp's tile), 33 splits of 256 keys
            // (split_plan::verify_splits(8, 8193, 132)); an empty context
            name: "g7 n1 d64 B4 ramp (draft decode)",
            batch: 4,
            q_heads: 14,
            kv_heads: 2,
            n: 1,
            d: 64,
            ctx: vec![8192, 3001, 0, 6000],
            ramp: true,
        },
        Case {
            // 28 rows: two warps' row tiles, the second partly filled
            name: "g4 n7 d64 (28 rows)",
            batch: 2,
            q_heads: 8,
            kv_heads: 2,
            n: 7,
            d: 64,
            ctx: vec![2500, 64],
            ramp: false,
        },
        Case {
            name: "g8 n16 d128 (72B rows)",
            batch: 1,
            q_heads: 16,
            kv_heads: 2,
            n: 16,
            d: 128,
            ctx: vec![4099],
            ramp: false,
        },
        Case {
            name: "g7 n100 d128 prefill ragged",
            batch: 2,
            q_heads: 14,
            kv_heads: 2,
            n: 100,
            d: 128,
            ctx: vec![0, 333],
            ramp: false,
        },
        Case {
            name: "g7 n512 d128 prefill",
            batch: 1,
            q_heads: 14,
            kv_heads: 2,
            n: 512,
            d: 128,
            ctx: vec![1000],
            ramp: false,
        },
        Case {
            name: "g5 n37 d64 prefill ramp",
            batch: 2,
            q_heads: 10,
            kv_heads: 2,
            n: 37,
            d: 64,
            ctx: vec![700, 5],
            ramp: true,
        },
        Case {
            name: "g3 n5 d64",
            batch: 2,
            q_heads: 9,
            kv_heads: 3,
            n: 5,
            d: 64,
            ctx: vec![500, 33],
            ramp: false,
        },
    ];
    let mut rep = Report {
        failures: 0,
        lines: Vec::new(),
    };
    for (i, c) in cases.iter().enumerate() {
        check_case(c, 1000 * i as u64 + 17, op, &mut rep);
    }
    if op == "dustin" {
        for r in dustin_kernels::check::check_dustin_ops::<B>(&dev(), BOUND) {
            rep.add(&r.case, r.op, r.err, r.bound);
        }
    }
    if op == "all" || op == "elementwise" {
        for r in dustin_kernels::check::check_elementwise::<B>(&dev(), BOUND) {
            rep.add(&r.case, r.op, r.err, r.bound);
        }
    }
    if op == "all" || op == "elementwise" || op == "skinny" {
        use dustin_kernels::cuda::SkinnyKernel;
        // the skinny GEMM rows (with the SwiGLU and three-weight ones) with each kernel
        // forced wherever it takes the shape (the elementwise pass ran the default choice):
        // the tensor-core kernel, the ring kernel (in the `--ring-config` shape), and CUDA
        // cores only (rows past 16 on Burn's matmul, whose autotuning makes it the slow pass);
        // with `skinny` alone the default and the ring kernel only, each with the split
        // reduction as `--split-reduce` says (a reduce kernel by default) and then inside the
        // GEMM's launch
        use dustin_kernels::cuda::SplitReduce;
        let split_default = config().split_reduce;
        let kernels = if op == "skinny" {
            vec![
                (SkinnyKernel::Auto, split_default, "auto"),
                (SkinnyKernel::Ring, split_default, "ring"),
                (
                    SkinnyKernel::Auto,
                    SplitReduce::Fused,
                    "auto, fused reduction",
                ),
                (
                    SkinnyKernel::Ring,
                    SplitReduce::Fused,
                    "ring, fused reduction",
                ),
            ]
        } else {
            vec![
                (SkinnyKernel::Mma, split_default, "mma"),
                (SkinnyKernel::Ring, split_default, "ring"),
                (SkinnyKernel::Cores, split_default, "cores"),
            ]
        };
        for (kernel, split, label) in kernels {
            tweak(|c| c.skinny_kernel = kernel);
            tweak(|c| c.split_reduce = split);
            for r in dustin_kernels::check::check_skinny_gemms::<B>(&dev(), BOUND) {
                rep.add(&format!("{} ({label})", r.case), r.op, r.err, r.bound);
            }
        }
        tweak(|c| c.skinny_kernel = SkinnyKernel::Auto);
        tweak(|c| c.split_reduce = split_default);
    }
    dustin_kernels::cuda::set_poison_outputs(false);
    println!(
        "check: {} results, {} failures",
        rep.lines.len(),
        rep.failures
    );
    rep.failures
}
