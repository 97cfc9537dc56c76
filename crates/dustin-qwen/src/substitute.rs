//! Substitute layers for SubSpec-style drafting ("Speculate Deep and Accurate").
//!
//! When a target's layers do not all fit in GPU memory, some are offloaded to host memory.
//! SubSpec drafts with the target itself in which every offloaded layer is replaced by a
//! low-bit quantized copy (a *substitute*) kept on the GPU, while the resident layers, the
//! embedding, the final norm and the LM head are the target's own; the full-precision target
//! then verifies. This module builds such a draft model.
//!
//! # Quantization
//! Group-wise asymmetric integer quantization with round-to-nearest, applied to each linear
//! weight `W` stored `[in, out]` (see [`crate::model::Linear`]): the input dimension is cut
//! into groups of `group` consecutive rows (the last group may be shorter), and for each group
//! and each output column
//!
//! ```text
//! min = min(w), max = max(w) over the group's rows of that column
//! scale = (max - min) / (2^bits - 1)
//! q = clamp(round((w - min) / scale), 0, 2^bits - 1)      (q = 0 when scale = 0)
//! w' = q * scale + min
//! ```
//!
//! This is the min/max asymmetric scheme that is the round-to-nearest baseline of GPTQ / AWQ
//! style group quantization, and the scheme of llama.cpp's `Q4_1` blocks (4 bits, groups of 32
//! along the input dimension, `d` = scale and `m` = min). Every dequantized value is within
//! `scale / 2` of the original (up to f32 rounding), and a constant group is reproduced exactly.
//!
//! # Memory
//! The packed form ([`PackedWeight`]) holds `bits` bits per weight (codes packed in 32-bit
//! words) plus a scale and a min per group and column in the compute dtype (bf16 on the GPU):
//! [`SubstituteConfig::bytes_per_weight`] `= bits / 8 + 2 * 2 / group` bytes (4 bits, group
//! 64: 0.5625 bytes, against 2 for bf16). That is what a substitute layer keeps on the device;
//! each product dequantizes the matrix into a transient dense copy first.
//!
//! # Numerics
//! Quantization runs in f32 on the host. On the CPU backend (f32) the dequantized values are
//! bit for bit those of [`QuantizedMatrix::dequantize`] (`q * scale + min` in f32); on a bf16
//! backend scale and min are rounded to bf16 once.

use burn_tensor::{backend::Backend, Int, Tensor, TensorData};

use crate::error::{QwenError, Result};
use crate::model::{Layer, Linear, Qwen2, Weight};
use dustin_kernels::KernelOps;

/// Default code width of a substitute weight (bits).
pub const DEFAULT_BITS: u32 = 4;
/// Default group length along the input dimension (rows of the `[in, out]` weight).
pub const DEFAULT_GROUP: usize = 64;

/// Quantization settings of substitute layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubstituteConfig {
    /// Bits per code, `2 ..= 8` (default [`DEFAULT_BITS`]).
    pub bits: u32,
    /// Consecutive input rows sharing one scale and min per output column, `>= 1` (default
    /// [`DEFAULT_GROUP`]).
    pub group: usize,
}

impl Default for SubstituteConfig {
    fn default() -> Self {
        Self {
            bits: DEFAULT_BITS,
            group: DEFAULT_GROUP,
        }
    }
}

impl SubstituteConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`QwenError::ConfigValue`] naming `substitute.bits` (outside `2 ..= 8`) or
    /// `substitute.group` (0).
    pub fn validate(&self) -> Result<()> {
        if !(2..=8).contains(&self.bits) {
            return Err(QwenError::ConfigValue {
                key: "substitute.bits",
                value: self.bits.to_string(),
                expected: "2 ..= 8".into(),
            });
        }
        if self.group == 0 {
            return Err(QwenError::ConfigValue {
                key: "substitute.group",
                value: "0".into(),
                expected: "at least 1 input row per group".into(),
            });
        }
        Ok(())
    }

    /// Largest code, `2^bits - 1` (the number of quantization steps between min and max).
    pub fn levels(&self) -> u32 {
        (1u32 << self.bits.min(31)) - 1
    }

    /// Bytes per weight of the packed form: `bits / 8` for the code plus a scale and a min
    /// per group, both f16 (`2 * 16 / 8 / group`). 4 bits, group 64: 0.5625.
    pub fn bytes_per_weight(&self) -> f64 {
        self.bits as f64 / 8.0 + 4.0 / self.group.max(1) as f64
    }
}

/// A weight matrix `[rows = in, cols = out]` (row-major) in packed group-quantized form:
/// one code per weight and a scale and a min per (group, column).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedMatrix {
    /// Input rows.
    pub rows: usize,
    /// Output columns.
    pub cols: usize,
    /// The settings it was made with.
    pub cfg: SubstituteConfig,
    /// Codes `0 ..= 2^bits - 1`, row-major `[rows, cols]` (one byte each here; a GPU form
    /// would pack them to `bits` bits).
    pub codes: Vec<u8>,
    /// Step per group and column, row-major `[ceil(rows / group), cols]`.
    pub scale: Vec<f32>,
    /// Minimum per group and column (the value of code 0), `[ceil(rows / group), cols]`.
    pub min: Vec<f32>,
}

impl QuantizedMatrix {
    /// Number of groups along the input dimension, `ceil(rows / group)`.
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(self.cfg.group.max(1))
    }

    /// The dequantized weights `q * scale + min`, row-major `[rows, cols]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let g = self.cfg.group.max(1);
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            let p = (r / g) * self.cols;
            for c in 0..self.cols {
                let q = self.codes[r * self.cols + c] as f32;
                out.push(q * self.scale[p + c] + self.min[p + c]);
            }
        }
        out
    }
}

/// Quantizes `w` (row-major `[rows = in, cols = out]`, f32) group-wise along the rows (see
/// the module documentation).
///
/// # Errors
/// [`QwenError::ConfigValue`] for bad settings ([`SubstituteConfig::validate`]);
/// [`QwenError::TensorShape`] when `w.len() != rows * cols`; [`QwenError::ConfigValue`] naming
/// `substitute weight` for a non-finite value (its min/max would make every step NaN).
pub fn quantize(
    w: &[f32],
    rows: usize,
    cols: usize,
    cfg: SubstituteConfig,
) -> Result<QuantizedMatrix> {
    cfg.validate()?;
    if rows == 0 || cols == 0 {
        return Err(QwenError::TensorShape {
            name: "substitute weight".into(),
            expected: vec![rows.max(1), cols.max(1)],
            found: vec![rows, cols],
        });
    }
    // a group longer than the matrix is one group of all its rows
    let cfg = SubstituteConfig {
        group: cfg.group.min(rows),
        ..cfg
    };
    if w.len() != rows * cols {
        return Err(QwenError::TensorShape {
            name: "substitute weight".into(),
            expected: vec![rows, cols],
            found: vec![w.len()],
        });
    }
    if let Some(bad) = w.iter().find(|v| !v.is_finite()) {
        return Err(QwenError::ConfigValue {
            key: "substitute weight",
            value: bad.to_string(),
            expected: "finite values".into(),
        });
    }
    let levels = cfg.levels() as f32;
    let groups = rows.div_ceil(cfg.group);
    let mut scale = vec![0.0f32; groups * cols];
    let mut min = vec![0.0f32; groups * cols];
    let mut codes = vec![0u8; rows * cols];
    for gi in 0..groups {
        let r0 = gi * cfg.group;
        let r1 = (r0 + cfg.group).min(rows);
        let mut lo = vec![f32::INFINITY; cols];
        let mut hi = vec![f32::NEG_INFINITY; cols];
        for r in r0..r1 {
            for (c, &v) in w[r * cols..(r + 1) * cols].iter().enumerate() {
                lo[c] = lo[c].min(v);
                hi[c] = hi[c].max(v);
            }
        }
        let p = gi * cols;
        for c in 0..cols {
            min[p + c] = lo[c];
            scale[p + c] = (hi[c] - lo[c]) / levels;
        }
        for r in r0..r1 {
            for c in 0..cols {
                let s = scale[p + c];
                let q = if s > 0.0 {
                    ((w[r * cols + c] - lo[c]) / s).round().clamp(0.0, levels)
                } else {
                    0.0
                };
                codes[r * cols + c] = q as u8;
            }
        }
    }
    Ok(QuantizedMatrix {
        rows,
        cols,
        cfg,
        codes,
        scale,
        min,
    })
}

/// `quantize` then `dequantize`: the values a substitute layer computes with.
///
/// # Errors
/// As [`quantize`].
pub fn fake_quantize(
    w: &[f32],
    rows: usize,
    cols: usize,
    cfg: SubstituteConfig,
) -> Result<Vec<f32>> {
    Ok(quantize(w, rows, cols, cfg)?.dequantize())
}

/// Codes packed per 32-bit word for `bits`-bit codes: `32 / bits` (8 at 4 bits, 10 at 3).
pub fn codes_per_word(bits: u32) -> usize {
    (32 / bits.max(1)) as usize
}

/// A group-quantized weight `[in, out]` resident on the device in packed form: what a
/// substitute layer keeps on the GPU.
///
/// Layout: the input rows are padded to whole groups; within group `g`, the code of row
/// `g * group + w * P + k` and column `c` sits in bits `k * bits ..` of word `[g, w, c]`, with
/// `P` = [`codes_per_word`]. Scale and min are `[groups, 1, out]` in the backend's float dtype
/// (bf16 on our CUDA backend: a relative rounding of at most 2^-9 each, against a quantization
/// step of `scale`). [`PackedWeight::dequantize`] computes `q * scale + min` with tensor ops:
/// on the CPU backend (f32) the same values, bit for bit, as [`QuantizedMatrix::dequantize`].
#[derive(Debug, Clone)]
pub struct PackedWeight<B: Backend> {
    /// Input rows.
    pub rows: usize,
    /// Output columns.
    pub cols: usize,
    /// The settings it was made with.
    pub cfg: SubstituteConfig,
    words: Tensor<B, 3, Int>,
    scale: Tensor<B, 3>,
    min: Tensor<B, 3>,
}

/// A quantized matrix made on a worker thread: packed for the device, or dequantized
/// `[rows, cols]` where the model keeps dense values.
enum HostWeight {
    Packed(PackedHost),
    Dense(Vec<f32>, [usize; 2]),
}

/// A packed matrix still in host memory (the words of [`PackedWeight`]'s layout; the
/// one-byte codes are dropped once packed).
#[derive(Debug, Clone)]
struct PackedHost {
    rows: usize,
    cols: usize,
    cfg: SubstituteConfig,
    words: Vec<i32>,
    wpg: usize,
    scale: Vec<f32>,
    min: Vec<f32>,
}

impl PackedHost {
    fn new(q: QuantizedMatrix) -> Self {
        let (rows, cols, bits) = (q.rows, q.cols, q.cfg.bits);
        let group = q.cfg.group.max(1);
        let per = codes_per_word(bits);
        let wpg = group.div_ceil(per);
        let mut words = vec![0u32; q.groups() * wpg * cols];
        for r in 0..rows {
            let (gi, rr) = (r / group, r % group);
            let (wi, k) = (rr / per, rr % per);
            let base = (gi * wpg + wi) * cols;
            let shift = k as u32 * bits;
            for (w, &code) in words[base..base + cols]
                .iter_mut()
                .zip(&q.codes[r * cols..(r + 1) * cols])
            {
                *w |= (code as u32) << shift;
            }
        }
        // two's-complement reinterpretation: the unpacking masks the sign-extended bits away
        let words = words.into_iter().map(|w| w as i32).collect();
        Self {
            rows,
            cols,
            cfg: q.cfg,
            words,
            wpg,
            scale: q.scale,
            min: q.min,
        }
    }

    fn upload<B: Backend>(self, device: &B::Device) -> PackedWeight<B> {
        let cols = self.cols;
        let groups = self.rows.div_ceil(self.cfg.group.max(1));
        PackedWeight {
            rows: self.rows,
            cols,
            cfg: self.cfg,
            words: Tensor::from_data(
                TensorData::new(self.words, [groups, self.wpg, cols]),
                device,
            ),
            scale: Tensor::from_data(TensorData::new(self.scale, [groups, 1, cols]), device),
            min: Tensor::from_data(TensorData::new(self.min, [groups, 1, cols]), device),
        }
    }
}

impl<B: dustin_kernels::KernelOps> PackedWeight<B> {
    /// [`PackedWeight::dequantize`] through [`KernelOps::dequantize_packed`](dustin_kernels::ElementwiseOps::dequantize_packed):
    /// one kernel on CUDA (reads the 4-bit words once, writes the dense matrix) where the
    /// Burn ops write and read `[groups, words, codes, cols]` integer intermediates.
    ///
    /// # Errors
    /// The kernel's (the layout is checked again there).
    pub fn dequantize_fused(&self) -> dustin_kernels::Result<Tensor<B, 2>> {
        B::dequantize_packed(
            self.words.clone(),
            self.scale.clone(),
            self.min.clone(),
            self.cfg.bits,
            self.cfg.group.max(1),
            self.rows,
        )
    }
}

impl<B: Backend> PackedWeight<B> {
    /// Packs `q` and moves it to `device`.
    ///
    /// # Errors
    /// [`QwenError::ConfigValue`] for bad settings in `q.cfg`; [`QwenError::TensorShape`]
    /// naming `substitute codes` / `substitute scale` when the vectors do not match
    /// `rows x cols` (a hand-built matrix; [`quantize`]'s output always does).
    pub fn new(q: &QuantizedMatrix, device: &B::Device) -> Result<Self> {
        q.cfg.validate()?;
        let shape_err = |name: &str, expected: Vec<usize>, found: usize| QwenError::TensorShape {
            name: name.into(),
            expected,
            found: vec![found],
        };
        if q.rows == 0 || q.cols == 0 || q.codes.len() != q.rows * q.cols {
            return Err(shape_err(
                "substitute codes",
                vec![q.rows, q.cols],
                q.codes.len(),
            ));
        }
        let g = q.groups() * q.cols;
        if q.scale.len() != g || q.min.len() != g {
            return Err(shape_err(
                "substitute scale",
                vec![q.groups(), q.cols],
                q.scale.len().min(q.min.len()),
            ));
        }
        Ok(PackedHost::new(q.clone()).upload(device))
    }

    /// The dequantized weight `q * scale + min`, `[in, out]`, in the backend's float dtype.
    pub fn dequantize(&self) -> Tensor<B, 2> {
        dustin_kernels::plain::dequantize_packed_unchecked(
            self.words.clone(),
            self.scale.clone(),
            self.min.clone(),
            self.cfg.bits,
            self.cfg.group.max(1),
            self.rows,
        )
    }

    /// Bytes held on the device: the words, scale and min.
    pub fn device_bytes(&self) -> usize {
        let n = |d: &[usize]| d.iter().product::<usize>();
        n(&self.words.dims()) * self.words.dtype().size()
            + 2 * n(&self.scale.dims()) * self.scale.dtype().size()
    }
}

fn host_matrix<B: Backend>(w: &Weight<B>) -> Result<Vec<f32>> {
    match w {
        Weight::Host(h) => h.to_f32(),
        Weight::Blocks(q) => crate::blocks::host_t(q),
        w => w
            .to_dense(&dense_device(w)?)?
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|e| QwenError::Core(dustin_core::CoreError::Model(format!("{e:?}")))),
    }
}

fn dense_device<B: Backend>(w: &Weight<B>) -> Result<B::Device> {
    match w {
        Weight::Dense(t) => Ok(t.device()),
        Weight::Packed(p) => Ok(p.words.device()),
        Weight::Host(_) | Weight::Blocks(_) => Err(QwenError::Core(dustin_core::CoreError::Model(
            "a host or block weight has no device".into(),
        ))),
    }
}

/// Quantizes and packs a layer's seven matrices on the host, one thread per matrix.
fn pack_layer<B: Backend>(layer: &Layer<B>, cfg: SubstituteConfig) -> Result<Vec<PackedHost>> {
    let hosts = layer
        .linears()
        .iter()
        .map(|l| Ok((host_matrix(&l.weight)?, l.weight.dims())))
        .collect::<Result<Vec<_>>>()?;
    std::thread::scope(|s| {
        let handles: Vec<_> = hosts
            .into_iter()
            .map(|(w, [rows, cols])| {
                s.spawn(move || quantize(&w, rows, cols, cfg).map(PackedHost::new))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(QwenError::Core(dustin_core::CoreError::Model(
                        "a quantization thread panicked".into(),
                    )))
                })
            })
            .collect()
    })
}

fn upload_layer<B: Backend>(
    layer: &Layer<B>,
    packed: Vec<PackedHost>,
    device: &B::Device,
) -> Result<Layer<B>> {
    let mut packed = packed.into_iter();
    layer.map_linears(|l| {
        let p = packed.next().ok_or_else(|| {
            QwenError::Core(dustin_core::CoreError::Model(
                "seven packed matrices".into(),
            ))
        })?;
        Ok(Linear {
            weight: Weight::Packed(p.upload(device)),
            bias: l.bias.clone(),
        })
    })
}

/// A copy of `layer` whose seven linear weights (q, k, v, o, gate, up, down) are replaced by
/// packed group-quantized copies ([`PackedWeight`]) on `device`; biases and norms are shared
/// with `layer` (exact). The layer's weights may be on the device or in host memory (an
/// offloaded target layer).
///
/// # Errors
/// As [`quantize`]; a device read-back failure as [`QwenError::Core`].
pub fn substitute_layer<B: Backend>(
    layer: &Layer<B>,
    cfg: SubstituteConfig,
    device: &B::Device,
) -> Result<Layer<B>> {
    cfg.validate()?;
    upload_layer(layer, pack_layer(layer, cfg)?, device)
}

/// The layers that would be offloaded by default: the second half, `n / 2 .. n` (15..30 of
/// SmolLM2-135M's 30 layers).
pub fn second_half(num_layers: usize) -> Vec<usize> {
    (num_layers / 2..num_layers).collect()
}

/// The SubSpec draft model of `target`: each layer listed in `layers` (any order, repeats
/// ignored) carries group-quantized copies of its linear weights: packed
/// ([`Weight::Packed`], dequantized per product) on backends with fused kernels
/// ([`KernelOps::FUSED`](dustin_kernels::KernelBackend::FUSED), the GPU), dequantized once ([`Weight::Dense`], the same values) on
/// the others, where the unpacking would cost more than the matmul. Every other layer, the
/// embedding, the final norm, the LM head and the RoPE tables are the target's own tensors
/// (clones of Burn tensors share their storage: nothing is copied).
///
/// # Errors
/// [`QwenError::ConfigValue`] naming `substitute.layers` for an index `>=` the target's layer
/// count, `substitute.bits` or `substitute.group` for bad settings;
/// [`CoreError::Cancelled`](dustin_core::CoreError::Cancelled) when the target's cancel token
/// ([`Qwen2::with_cancel`]) is set before the last matrix is quantized.
pub fn substitute_model<B: KernelOps>(
    target: &Qwen2<B>,
    layers: &[usize],
    cfg: SubstituteConfig,
) -> Result<Qwen2<B>> {
    cfg.validate()?;
    let n = target.layers.len();
    if let Some(&bad) = layers.iter().find(|&&l| l >= n) {
        return Err(QwenError::ConfigValue {
            key: "substitute.layers",
            value: bad.to_string(),
            expected: format!(
                "layer indices 0 ..= {} (the target has {n} layers)",
                n.saturating_sub(1)
            ),
        });
    }
    let mut model = target.clone();
    let mut list = layers.to_vec();
    list.sort_unstable();
    list.dedup();
    // quantize and pack every (layer, matrix) on a pool of host threads; this thread uploads
    // each packed matrix as soon as it is ready (host memory holds a few at a time)
    let jobs: Vec<(usize, usize)> = list
        .iter()
        .flat_map(|&l| (0..7).map(move |m| (l, m)))
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let device = target.device();
    let mut done: Vec<Option<Weight<B>>> = (0..jobs.len()).map(|_| None).collect();
    let mut first_err = None;
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Result<HostWeight>)>();
        for _ in 0..threads {
            let tx = tx.clone();
            let (jobs, next) = (&jobs, &next);
            s.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(l, m)) = jobs.get(i) else { break };
                // the target's cancel token (`Qwen2::with_cancel`) stops the quantization
                // between matrices (Ctrl-C while `dustin generate --draft substitute` builds)
                if target.cancelled() {
                    let _ = tx.send((
                        i,
                        Err(QwenError::Core(dustin_core::CoreError::Cancelled {
                            during: "substitute's quantization",
                        })),
                    ));
                    break;
                }
                let lin = target.layers[l].linears()[m];
                let [rows, cols] = lin.weight.dims();
                // without fused kernels (the CPU) memory is not what SubSpec saves and the
                // per-product unpacking costs more than the matmul: the dequantized values
                // (bit for bit the packed form's, see `PackedWeight`), made here on the host
                // (Burn's integer ops unpacking the words took about 1.5 s a layer at the
                // 1.5B's shapes on a 2-core CPU)
                let r = host_matrix(&lin.weight)
                    .and_then(|w| quantize(&w, rows, cols, cfg))
                    .map(|q| {
                        if B::FUSED {
                            HostWeight::Packed(PackedHost::new(q))
                        } else {
                            HostWeight::Dense(q.dequantize(), [rows, cols])
                        }
                    });
                if tx.send((i, r)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (i, r) in rx {
            match r {
                Ok(HostWeight::Packed(p)) => done[i] = Some(Weight::Packed(p.upload(device))),
                Ok(HostWeight::Dense(v, shape)) => {
                    done[i] = Some(Weight::Dense(Tensor::from_data(
                        TensorData::new(v, shape),
                        device,
                    )))
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                    // stop handing out jobs; the workers finish the ones they hold
                    next.store(jobs.len(), std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
    });
    if let Some(e) = first_err {
        return Err(e);
    }
    let mut done = done.into_iter();
    for &l in &list {
        let mut seven = Vec::with_capacity(7);
        for _ in 0..7 {
            seven.push(done.next().flatten().ok_or_else(|| {
                QwenError::Core(dustin_core::CoreError::Model(
                    "a quantization thread panicked".into(),
                ))
            })?);
        }
        let mut seven = seven.into_iter();
        model.layers[l] = target.layers[l].map_linears(|lin| {
            let weight = seven.next().ok_or_else(|| {
                QwenError::Core(dustin_core::CoreError::Model(
                    "seven packed matrices".into(),
                ))
            })?;
            Ok::<_, QwenError>(Linear {
                weight,
                bias: lin.bias.clone(),
            })
        })?;
    }
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(bits: u32, group: usize) -> SubstituteConfig {
        SubstituteConfig { bits, group }
    }

    #[test]
    fn two_bit_group_of_four_by_hand() {
        // min -1, max 2, 3 steps: scale 1; codes round(0, 0.6, 1.3, 3) = 0, 1, 1, 3
        let w = [-1.0f32, -0.4, 0.3, 2.0];
        let q = quantize(&w, 4, 1, cfg(2, 4)).unwrap();
        assert_eq!(q.codes, vec![0, 1, 1, 3]);
        assert_eq!(q.scale, vec![1.0]);
        assert_eq!(q.min, vec![-1.0]);
        assert_eq!(q.dequantize(), vec![-1.0, 0.0, 0.0, 2.0]);
    }

    #[test]
    fn groups_run_along_the_input_rows_per_column() {
        // [in 4, out 2], group 2: column 0 rows {0,1} and {2,3}, column 1 likewise
        let w = [0.0f32, 10.0, 3.0, 40.0, -6.0, 7.0, -3.0, 7.0];
        let q = quantize(&w, 4, 2, cfg(2, 2)).unwrap();
        assert_eq!(q.groups(), 2);
        assert_eq!(q.min, vec![0.0, 10.0, -6.0, 7.0]);
        assert_eq!(q.scale, vec![1.0, 10.0, 1.0, 0.0]);
        // each pair is its group's min and max: reproduced exactly; the constant group too
        assert_eq!(q.dequantize(), w.to_vec());
        // a short last group (rows 4, group 3): groups {0,1,2} and {3}
        let q = quantize(&w, 4, 2, cfg(2, 3)).unwrap();
        assert_eq!(q.groups(), 2);
        assert_eq!(q.min, vec![-6.0, 7.0, -3.0, 7.0]);
        assert_eq!(q.scale, vec![3.0, 11.0, 0.0, 0.0]);
        // column 0 rows 0..3 = 0, 3, -6 over min -6 step 3: codes 2, 3, 0
        assert_eq!(&q.codes[..6], &[2, 0, 3, 3, 0, 0]);
    }

    #[test]
    fn error_is_at_most_half_a_step_on_random_data() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (rows, cols) = (200, 9); // 200 is not a multiple of 64: a short last group
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-0.3f32..0.3) * if rng.random::<bool>() { 1.0 } else { 5.0 })
            .collect();
        for bits in 2..=8 {
            let c = cfg(bits, 64);
            let q = quantize(&w, rows, cols, c).unwrap();
            let d = q.dequantize();
            let mut worst = 0.0f32;
            for r in 0..rows {
                for col in 0..cols {
                    let s = q.scale[(r / 64) * cols + col];
                    let e = (d[r * cols + col] - w[r * cols + col]).abs();
                    assert!(
                        e <= s / 2.0 * (1.0 + 1e-4) + 1e-6,
                        "bits {bits}: {e} > {s}/2"
                    );
                    assert!(q.codes[r * cols + col] as u32 <= c.levels());
                    worst = worst.max(e);
                }
            }
            if bits == 8 {
                // range at most 3 over 255 steps: error below 0.006
                assert!(worst < 0.006, "bits 8: {worst}");
            }
            if bits == 2 {
                assert!(worst > 0.05, "bits 2 must actually round: {worst}");
            }
        }
    }

    #[test]
    fn q4_1_blocks_requantize_exactly() {
        // a llama.cpp Q4_1 block (codes 0..=15 with both ends present, w = q d + m) is
        // reproduced by 4 bits with groups of 32 aligned on the block: the codes come back and
        // the values move by f32 rounding only (why tau is 5.00 on the Q4_1 SmolLM2 target)
        let (d, m) = (0.021_3f32, -0.37f32);
        let codes: Vec<u8> = (0..32u8).map(|i| (i * 7 + 3) % 16).collect();
        assert!(codes.contains(&0) && codes.contains(&15));
        let w: Vec<f32> = codes.iter().map(|&q| q as f32 * d + m).collect();
        let q = quantize(&w, 32, 1, cfg(4, 32)).unwrap();
        assert_eq!(q.codes, codes);
        for (a, b) in q.dequantize().iter().zip(&w) {
            assert!((a - b).abs() <= 1e-6, "{a} vs {b}");
        }
        // two blocks of different scales in one group of 64 are not reproduced
        let mut w2 = w.clone();
        w2.extend(w.iter().map(|v| v * 0.3));
        let d2 = fake_quantize(&w2, 64, 1, cfg(4, 64)).unwrap();
        assert!(d2.iter().zip(&w2).any(|(a, b)| (a - b).abs() > 1e-3));
    }

    #[test]
    fn constant_group_is_exact() {
        let w = vec![0.123_456_7f32; 64 * 3];
        for bits in [2, 4, 8] {
            assert_eq!(fake_quantize(&w, 64, 3, cfg(bits, 64)).unwrap(), w);
        }
    }

    #[test]
    fn bytes_per_weight() {
        assert_eq!(cfg(4, 64).bytes_per_weight(), 0.5625);
        assert_eq!(cfg(4, 32).bytes_per_weight(), 0.625); // llama.cpp Q4_1: 20 bytes / 32
        assert_eq!(cfg(2, 128).bytes_per_weight(), 0.28125);
        assert_eq!(cfg(8, 64).levels(), 255);
        assert_eq!(cfg(3, 64).levels(), 7);
    }

    #[test]
    fn bad_settings_are_named() {
        for (c, want) in [
            (
                cfg(1, 64),
                "invalid config value `substitute.bits` = 1: 2 ..= 8",
            ),
            (
                cfg(9, 64),
                "invalid config value `substitute.bits` = 9: 2 ..= 8",
            ),
            (cfg(4, 0), "invalid config value `substitute.group` = 0"),
        ] {
            let e = quantize(&[0.0; 4], 4, 1, c).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let e = quantize(&[0.0; 5], 4, 1, cfg(4, 2))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("substitute weight") && e.contains("[4, 1]"),
            "{e}"
        );
        let e = quantize(&[0.0, f32::NAN], 2, 1, cfg(4, 2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`substitute weight` = NaN"), "{e}");
    }

    #[test]
    fn second_half_of_the_layers() {
        assert_eq!(second_half(30), (15..30).collect::<Vec<_>>());
        assert_eq!(second_half(2), vec![1]);
        assert_eq!(second_half(5), vec![2, 3, 4]);
    }
}
