//! [`LinearOps`] on CUDA: the skinny GEMMs, the prefill GEMMs (cuBLAS) and the quantized products.

mod blas;
mod kernels;
mod skinny;

use super::*;
use skinny::*;

pub use skinny::{AUTO_MMA_MAX_ROWS, AUTO_RING_MIN_ROWS, MMA_MAX_ROWS};

impl<F: FloatElement, I: IntElement, BT: BoolElement> LinearOps for Cube<F, I, BT> {
    fn skinny_linear(
        x: Tensor<Self, 2>,
        w: Tensor<Self, 2>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        let ([m, k], [_, n]) = (x.dims(), w.dims());
        check_skinny([m, k], w.dims(), bias.as_ref().map(|b| b.dims()))?;
        let wp = w.into_primitive().tensor();
        let xp = x.into_primitive().tensor();
        let Some(path) = skinny_path(m, k, &xp, &[&wp]) else {
            let x = Tensor::from_primitive(TensorPrimitive::Float(xp));
            let w = Tensor::from_primitive(TensorPrimitive::Float(wp));
            return crate::plain::skinny_linear(x, w, bias);
        };
        let fd = xp.dtype;
        let (rows, splits) = skinny_plan(k, m, &[n], path, sm_count(&xp));
        let part = empty(&xp, vec![splits, m, n], DType::F32);
        let out = empty(&xp, vec![m, n], fd);
        let client = xp.client.clone();
        let has_bias = bias.is_some();
        // without a bias the kernels read none; x stands in for the binding
        let b = match bias {
            Some(b) => contiguous(b.into_primitive().tensor()),
            None => xp.clone(),
        };
        if fuses_split(&xp, path, m, &[n]) {
            let fin = Finish::outputs(&xp, [&out; 3], [&b; 3], u32::from(has_bias));
            skinny_gemm_into(&xp, &[(wp, 0)], &part, k, n, rows, splits, path, &fin);
            return Ok(Tensor::from_primitive(TensorPrimitive::Float(out)));
        }
        skinny_gemm_into(
            &xp,
            &[(wp, 0)],
            &part,
            k,
            n,
            rows,
            splits,
            path,
            &Finish::partials(&xp),
        );
        kernels::skinny_reduce_kernel::launch::<CudaRuntime>(
            &client,
            elementwise_count(m * n)?,
            CubeDim::new_1d(ELEM_THREADS as u32),
            part.into_array_arg(),
            b.into_array_arg(),
            out.clone().into_array_arg(),
            (m * n) as u32,
            n as u32,
            splits as u32,
            has_bias,
            fd.into(),
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn skinny_linear3(
        x: Tensor<Self, 2>,
        ws: [crate::LinearParts<Self>; 3],
    ) -> Result<[Tensor<Self, 2>; 3]> {
        let [m, k] = x.dims();
        for (i, (w, b)) in ws.iter().enumerate() {
            check_skinny([m, k], w.dims(), b.as_ref().map(|b| b.dims())).map_err(|e| match e {
                KernelError::Shape {
                    name,
                    expected,
                    found,
                } => KernelError::Shape {
                    name: if name == "w" {
                        ["w_0", "w_1", "w_2"][i]
                    } else {
                        ["bias_0", "bias_1", "bias_2"][i]
                    },
                    expected,
                    found,
                },
                e => e,
            })?;
        }
        let [(w0, b0), (w1, b1), (w2, b2)] = ws;
        let wps = [
            w0.into_primitive().tensor(),
            w1.into_primitive().tensor(),
            w2.into_primitive().tensor(),
        ];
        let xp = x.into_primitive().tensor();
        let Some(path) = skinny_path(m, k, &xp, &[&wps[0], &wps[1], &wps[2]]) else {
            let x = Tensor::from_primitive(TensorPrimitive::Float(xp));
            let [w0, w1, w2] = wps.map(|w| Tensor::from_primitive(TensorPrimitive::Float(w)));
            return crate::skinny_linear3_each(x, [(w0, b0), (w1, b1), (w2, b2)]);
        };
        let ns = wps.clone().map(|w| w.meta.shape()[1]);
        let ldp: usize = ns.iter().sum();
        let fd = xp.dtype;
        let (rows, splits) = skinny_plan(k, m, &ns, path, sm_count(&xp));
        let part = empty(&xp, vec![splits, m, ldp], DType::F32);
        let outs = ns.map(|n| empty(&xp, vec![m, n], fd));
        let client = xp.client.clone();
        let offs = [0, ns[0], ns[0] + ns[1]];
        let ws: Vec<(Ct, usize)> = wps.into_iter().zip(offs).collect();
        let has = [b0.is_some(), b1.is_some(), b2.is_some()];
        // a missing bias is not read; x stands in for its binding
        let bias = |b: Option<Tensor<Self, 1>>| match b {
            Some(b) => contiguous(b.into_primitive().tensor()),
            None => xp.clone(),
        };
        let (b0, b1, b2) = (bias(b0), bias(b1), bias(b2));
        if fuses_split(&xp, path, m, &ns) {
            let mask = u32::from(has[0]) | u32::from(has[1]) << 1 | u32::from(has[2]) << 2;
            let fin = Finish::outputs(&xp, [&outs[0], &outs[1], &outs[2]], [&b0, &b1, &b2], mask);
            skinny_gemm_into(&xp, &ws, &part, k, ldp, rows, splits, path, &fin);
            return Ok(outs.map(|o| Tensor::from_primitive(TensorPrimitive::Float(o))));
        }
        skinny_gemm_into(
            &xp,
            &ws,
            &part,
            k,
            ldp,
            rows,
            splits,
            path,
            &Finish::partials(&xp),
        );
        kernels::skinny_reduce3_kernel::launch::<CudaRuntime>(
            &client,
            elementwise_count(m * ldp)?,
            CubeDim::new_1d(ELEM_THREADS as u32),
            part.into_array_arg(),
            b0.into_array_arg(),
            b1.into_array_arg(),
            b2.into_array_arg(),
            outs[0].clone().into_array_arg(),
            outs[1].clone().into_array_arg(),
            outs[2].clone().into_array_arg(),
            (m * ldp) as u32,
            ldp as u32,
            ns[0] as u32,
            ns[1] as u32,
            splits as u32,
            has[0],
            has[1],
            has[2],
            fd.into(),
        );
        Ok(outs.map(|o| Tensor::from_primitive(TensorPrimitive::Float(o))))
    }

    fn skinny_swiglu(
        x: Tensor<Self, 2>,
        w_gate: Tensor<Self, 2>,
        w_up: Tensor<Self, 2>,
    ) -> Result<Tensor<Self, 2>> {
        let [m, k] = x.dims();
        crate::check_swiglu([m, k], w_gate.dims(), w_up.dims())?;
        let n = w_gate.dims()[1];
        let (g, u) = (
            w_gate.into_primitive().tensor(),
            w_up.into_primitive().tensor(),
        );
        let xp = x.into_primitive().tensor();
        let Some(path) = skinny_path(m, k, &xp, &[&g, &u]) else {
            let x = Tensor::from_primitive(TensorPrimitive::Float(xp));
            let (g, u) = (
                Tensor::from_primitive(TensorPrimitive::Float(g)),
                Tensor::from_primitive(TensorPrimitive::Float(u)),
            );
            return crate::skinny_swiglu_each(x, g, u);
        };
        let fd = xp.dtype;
        let (rows, splits) = skinny_plan(k, m, &[n, n], path, sm_count(&xp));
        let part = empty(&xp, vec![splits, m, 2 * n], DType::F32);
        let out = empty(&xp, vec![m, n], fd);
        let client = xp.client.clone();
        let ws = [(g, 0), (u, n)];
        if fuses_split(&xp, path, m, &[n, n]) {
            let fin = Finish::swiglu(&xp, &out);
            skinny_gemm_into(&xp, &ws, &part, k, 2 * n, rows, splits, path, &fin);
            return Ok(Tensor::from_primitive(TensorPrimitive::Float(out)));
        }
        skinny_gemm_into(
            &xp,
            &ws,
            &part,
            k,
            2 * n,
            rows,
            splits,
            path,
            &Finish::partials(&xp),
        );
        kernels::skinny_reduce_swiglu_kernel::launch::<CudaRuntime>(
            &client,
            elementwise_count(m * n)?,
            CubeDim::new_1d(ELEM_THREADS as u32),
            part.into_array_arg(),
            out.clone().into_array_arg(),
            (m * n) as u32,
            n as u32,
            splits as u32,
            fd.into(),
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn prefill_linear(
        x: Tensor<Self, 2>,
        w: Tensor<Self, 2>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        // the one-part case of prefill_linear_many (one output for one part)
        let mut outs = Self::prefill_linear_many(x, vec![(w, bias)])?;
        Ok(outs.remove(0))
    }

    fn prefill_linear_many(
        x: Tensor<Self, 2>,
        parts: Vec<crate::LinearParts<Self>>,
    ) -> Result<Vec<Tensor<Self, 2>>> {
        for (w, bias) in &parts {
            check_skinny(x.dims(), w.dims(), bias.as_ref().map(|b| b.dims()))?;
        }
        let plain = |x: Tensor<Self, 2>, parts: Vec<crate::LinearParts<Self>>| {
            parts
                .into_iter()
                .map(|(w, bias)| crate::plain::linear(x.clone(), w, bias))
                .collect::<Result<Vec<_>>>()
        };
        if !blas::available() {
            return plain(x, parts);
        }
        let xp = x.into_primitive().tensor();
        let ps: Vec<(Ct, Option<Ct>)> = parts
            .into_iter()
            .map(|(w, b)| {
                (
                    w.into_primitive().tensor(),
                    b.map(|b| b.into_primitive().tensor()),
                )
            })
            .collect();
        if let Some(outs) = blas::linear_many(xp.clone(), ps.clone())? {
            return Ok(outs
                .into_iter()
                .map(|o| Tensor::from_primitive(TensorPrimitive::Float(o)))
                .collect());
        }
        plain(
            Tensor::from_primitive(TensorPrimitive::Float(xp)),
            ps.into_iter()
                .map(|(w, b)| {
                    (
                        Tensor::from_primitive(TensorPrimitive::Float(w)),
                        b.map(|b| Tensor::from_primitive(TensorPrimitive::Float(b))),
                    )
                })
                .collect(),
        )
    }

    fn skinny_max_rows(config: &KernelConfig) -> usize {
        match config.skinny_kernel {
            SkinnyKernel::Mma | SkinnyKernel::Ring | SkinnyKernel::Auto => MMA_MAX_ROWS,
            SkinnyKernel::NoRing => AUTO_MMA_MAX_ROWS,
            SkinnyKernel::Cores => crate::SKINNY_MAX_ROWS,
        }
    }

    fn prefill_gemm_name(_device: &Self::Device) -> &'static str {
        if blas::available() {
            "cublas"
        } else {
            "burn"
        }
    }
}
