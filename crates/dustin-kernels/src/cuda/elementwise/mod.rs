//! [`ElementwiseOps`] on CUDA: RMSNorm (with the residual add), the SwiGLU product, RoPE and dequantization.

mod kernels;

use super::*;

pub(super) use kernels::ELEM_THREADS;

impl<F: FloatElement, I: IntElement, BT: BoolElement> ElementwiseOps for Cube<F, I, BT> {
    fn rms_norm(x: Tensor<Self, 3>, weight: Tensor<Self, 1>, eps: f64) -> Result<Tensor<Self, 3>> {
        let [b, n, hidden] = x.dims();
        check_rms_norm([b, n, hidden], weight.dims(), eps)?;
        let rows = b * n;
        let x = x.reshape([rows, hidden]).into_primitive().tensor();
        let w = weight.into_primitive().tensor();
        let fd = x.dtype;
        let out = empty(&x, vec![b, n, hidden], fd);
        if rows > 0 && hidden > 0 {
            let client = x.client.clone();
            kernels::rms_norm_kernel::launch::<CudaRuntime>(
                &client,
                CubeCount::Static(rows as u32, 1, 1),
                CubeDim::new_1d(kernels::ELEM_THREADS as u32),
                x.clone().into_array_arg(),
                w.clone().into_array_arg(),
                out.clone().into_array_arg(),
                x.meta.strides()[0] as u32,
                x.meta.strides()[1] as u32,
                w.meta.strides()[0] as u32,
                eps as f32,
                1.0 / hidden as f32,
                hidden,
                fd.into(),
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn add_rms_norm(
        a: Tensor<Self, 3>,
        x: Tensor<Self, 3>,
        weight: Tensor<Self, 1>,
        eps: f64,
    ) -> Result<(Tensor<Self, 3>, Tensor<Self, 3>)> {
        let [b, n, hidden] = a.dims();
        check_same("x", [b, n, hidden], x.dims())?;
        check_rms_norm([b, n, hidden], weight.dims(), eps)?;
        let rows = b * n;
        let a = a.reshape([rows, hidden]).into_primitive().tensor();
        let x = x.reshape([rows, hidden]).into_primitive().tensor();
        if x.dtype != a.dtype {
            return Err(KernelError::Unsupported(
                "a and x of different dtypes".into(),
            ));
        }
        let w = weight.into_primitive().tensor();
        let fd = a.dtype;
        let sum = empty(&a, vec![b, n, hidden], fd);
        let out = empty(&a, vec![b, n, hidden], fd);
        if rows > 0 && hidden > 0 {
            let client = a.client.clone();
            kernels::add_rms_norm_kernel::launch::<CudaRuntime>(
                &client,
                CubeCount::Static(rows as u32, 1, 1),
                CubeDim::new_1d(kernels::ELEM_THREADS as u32),
                a.clone().into_array_arg(),
                x.clone().into_array_arg(),
                w.clone().into_array_arg(),
                sum.clone().into_array_arg(),
                out.clone().into_array_arg(),
                a.meta.strides()[0] as u32,
                a.meta.strides()[1] as u32,
                x.meta.strides()[0] as u32,
                x.meta.strides()[1] as u32,
                w.meta.strides()[0] as u32,
                eps as f32,
                1.0 / hidden as f32,
                hidden,
                fd.into(),
            );
        }
        Ok((
            Tensor::from_primitive(TensorPrimitive::Float(sum)),
            Tensor::from_primitive(TensorPrimitive::Float(out)),
        ))
    }

    fn silu_mul(gate: Tensor<Self, 3>, up: Tensor<Self, 3>) -> Result<Tensor<Self, 3>> {
        let [b, n, cols] = gate.dims();
        check_same("up", [b, n, cols], up.dims())?;
        let rows = b * n;
        let total = rows * cols;
        let g = gate.reshape([rows, cols]).into_primitive().tensor();
        let u = up.reshape([rows, cols]).into_primitive().tensor();
        let fd = g.dtype;
        let out = empty(&g, vec![b, n, cols], fd);
        if total > 0 {
            let client = g.client.clone();
            kernels::silu_mul_kernel::launch::<CudaRuntime>(
                &client,
                elementwise_count(total)?,
                CubeDim::new_1d(kernels::ELEM_THREADS as u32),
                g.into_tensor_arg(),
                u.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                total as u32,
                cols,
                fd.into(),
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn rope(
        x: Tensor<Self, 4>,
        cos: Tensor<Self, 4>,
        sin: Tensor<Self, 4>,
    ) -> Result<Tensor<Self, 4>> {
        let [b, h, n, d] = x.dims();
        check_rope([b, h, n, d], cos.dims(), sin.dims())?;
        let total = b * h * n * d;
        let x = float_prim(x).tensor();
        let cos = float_prim(cos).tensor();
        let sin = float_prim(sin).tensor();
        let fd = x.dtype;
        let out = empty(&x, vec![b, h, n, d], fd);
        if total > 0 {
            let client = x.client.clone();
            let (xs, cs, ss) = (x.meta.strides(), cos.meta.strides(), sin.meta.strides());
            kernels::rope_kernel::launch::<CudaRuntime>(
                &client,
                elementwise_count(total)?,
                CubeDim::new_1d(kernels::ELEM_THREADS as u32),
                x.clone().into_array_arg(),
                cos.clone().into_array_arg(),
                sin.clone().into_array_arg(),
                out.clone().into_array_arg(),
                xs[0] as u32,
                xs[1] as u32,
                xs[2] as u32,
                xs[3] as u32,
                cs[0] as u32,
                cs[2] as u32,
                cs[3] as u32,
                ss[0] as u32,
                ss[2] as u32,
                ss[3] as u32,
                total as u32,
                h as u32,
                n as u32,
                d,
                fd.into(),
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn dequantize_packed(
        words: Tensor<Self, 3, Int>,
        scale: Tensor<Self, 3>,
        min: Tensor<Self, 3>,
        bits: u32,
        group: usize,
        rows: usize,
    ) -> Result<Tensor<Self, 2>> {
        let per = check_packed(words.dims(), scale.dims(), min.dims(), bits, group, rows)?;
        let [_, wpg, cols] = words.dims();
        let total = rows * cols;
        // the kernel indexes the three inputs as contiguous
        let w = into_contiguous(words.into_primitive());
        let sc = into_contiguous(scale.into_primitive().tensor());
        let mn = into_contiguous(min.into_primitive().tensor());
        let (fd, id) = (sc.dtype, w.dtype);
        let out = empty(&sc, vec![rows, cols], fd);
        if total > 0 {
            let client = sc.client.clone();
            kernels::dequant_kernel::launch::<CudaRuntime>(
                &client,
                elementwise_count(total)?,
                CubeDim::new_1d(kernels::ELEM_THREADS as u32),
                w.into_tensor_arg(),
                sc.into_tensor_arg(),
                mn.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                total as u32,
                bits,
                cols,
                group,
                per,
                wpg,
                [fd.into(), id.into()],
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }
}
