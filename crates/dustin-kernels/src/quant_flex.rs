//! [`KernelOps::quant_linear`](crate::LinearOps::quant_linear) on [`Flex`]: the block kernels of [`crate::cpu_quant`]
//! on the f32 storage of Burn-flex tensors.

use burn_flex::{Flex, FlexTensor};
use burn_tensor::{DType, Tensor, TensorData, TensorPrimitive};

use crate::cpu_quant::{quant_matmul, QuantMatrix};
use crate::{KernelError, Result};

/// `x` `[m, k]` times `w` (`[n, k]`, GGUF layout) transposed, plus `bias` `[n]`: `[m, n]`
/// (f32). Any other dtype of `x` or `bias` is cast to f32 first.
///
/// # Errors
/// [`KernelError::Shape`] naming `x` or `bias` when they do not fit `w`.
pub(crate) fn quant_linear(
    x: Tensor<Flex, 2>,
    w: &QuantMatrix,
    bias: Option<Tensor<Flex, 1>>,
) -> Result<Tensor<Flex, 2>> {
    block_linear(x, w, bias, quant_matmul)
}

/// [`crate::cpu_amx::amx_matmul`] on Flex tensors: `x` `[m, k]`, `w` `[n, k]` in blocks,
/// `bias` `[n]`; `[m, n]`.
///
/// # Errors
/// As [`quant_linear`]; [`KernelError::Unsupported`] without AMX.
pub(crate) fn amx_linear(
    x: Tensor<Flex, 2>,
    w: &QuantMatrix,
    bias: Option<Tensor<Flex, 1>>,
) -> Result<Tensor<Flex, 2>> {
    block_linear(x, w, bias, crate::cpu_amx::amx_matmul)
}

/// A host product over block weights: `(x [m, k], m, w [n, k], bias [n]) -> [m, n]`.
type HostProduct = fn(&[f32], usize, &QuantMatrix, Option<&[f32]>) -> Result<Vec<f32>>;

/// `x` times the block weight `w` transposed plus `bias` through the host product
/// `product` (`(x, m, w, bias) -> [m, n]`), after checking the shapes.
fn block_linear(
    x: Tensor<Flex, 2>,
    w: &QuantMatrix,
    bias: Option<Tensor<Flex, 1>>,
    product: HostProduct,
) -> Result<Tensor<Flex, 2>> {
    let [m, k] = x.dims();
    if k != w.cols() {
        return Err(KernelError::Shape {
            name: "x",
            expected: vec![m, w.cols()],
            found: vec![m, k],
        });
    }
    if let Some(b) = &bias {
        if b.dims() != [w.rows()] {
            return Err(KernelError::Shape {
                name: "bias",
                expected: vec![w.rows()],
                found: b.dims().to_vec(),
            });
        }
    }
    let xs = host_f32(x.into_primitive().tensor());
    let bs = bias.map(|b| host_f32(b.into_primitive().tensor()));
    let y = product(as_f32(&xs), m, w, bs.as_ref().map(as_f32))?;
    let out = FlexTensor::from_data(TensorData::new(y, [m, w.rows()]));
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// `t` as a contiguous f32 tensor (itself when it already is one).
pub(crate) fn host_f32(t: FlexTensor) -> FlexTensor {
    let t = if t.dtype() == DType::F32 {
        t
    } else {
        let data = t.into_data().convert::<f32>();
        FlexTensor::from_data(data)
    };
    if t.as_slice::<f32>().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

/// The f32 values of a tensor made by [`host_f32`].
fn as_f32(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().unwrap_or(&[])
}
