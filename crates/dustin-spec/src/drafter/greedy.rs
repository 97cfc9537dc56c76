//! Greedy token choice on the device, and the row and width handling of the draft's logits
//! and attention masses.

use burn_tensor::{backend::Backend, DType, Tensor};
use dustin_core::TokenId;

/// Row `last[s]` of each sequence `s` of `logits` `[batch, n, vocab]`, as `[batch, vocab]`:
/// one slice when every sequence takes the same row (every draft step after the first, and
/// the first when the pending lengths agree), else one gather. A slice and a reshape per
/// sequence plus a `cat` cost `2 * batch + 1` kernel launches, and on CUDA a launch costs
/// more host time than this work (docs/perf.md, 2026-11-30).
pub(super) fn last_rows<B: Backend>(logits: Tensor<B, 3>, last: &[usize]) -> Tensor<B, 2> {
    let [b, n, v] = logits.dims();
    match last.first() {
        Some(&r) if last.iter().all(|&x| x == r) => {
            logits.slice([0..b, r..r + 1, 0..v]).reshape([b, v])
        }
        _ => {
            let idx: Vec<i64> = last
                .iter()
                .enumerate()
                .map(|(s, &r)| (s * n + r) as i64)
                .collect();
            let dev = logits.device();
            let idx = Tensor::<B, 1, burn_tensor::Int>::from_data(
                burn_tensor::TensorData::new(idx, [b]),
                &dev,
            );
            logits.reshape([b * n, v]).select(0, idx)
        }
    }
}

/// [`dustin_core::greedy::greedy_on_device`] on the draft's logits.
pub(super) fn greedy_on_device<B: Backend>(
    logits: Tensor<B, 2>,
    vocab: usize,
) -> dustin_core::Result<Vec<TokenId>> {
    dustin_core::greedy::greedy_on_device(logits, vocab, "draft logits")
}

/// `t` `[batch, kv_heads, w]` widened to `width >= w` with zeros of `t`'s dtype.
pub(super) fn pad_width<B: Backend>(t: Tensor<B, 3>, width: usize) -> Tensor<B, 3> {
    let [b, h, w] = t.dims();
    if w >= width {
        return t;
    }
    let dev = t.device();
    let zeros = Tensor::zeros([b, h, width - w], (&dev, t.dtype()));
    Tensor::cat(vec![t, zeros], 2)
}

/// `acc + m` (`[batch, kv_heads, w]` each), the narrower widened with zeros, in `acc`'s dtype;
/// `m` when there is no `acc` yet.
///
/// Burn adds two tensors without checking that their dtypes match, and the CUDA backend then
/// reads the right operand's bytes as the left's dtype (an f32 key mass added to bf16 zeros
/// gives NaN), so `m` is cast first where the two differ.
pub(super) fn add_padded<B: Backend>(acc: Option<Tensor<B, 3>>, m: Tensor<B, 3>) -> Tensor<B, 3> {
    match acc {
        Some(a) => {
            let w = a.dims()[2].max(m.dims()[2]);
            let m = if m.dtype() == a.dtype() {
                m
            } else {
                m.cast(a.dtype())
            };
            pad_width(a, w) + pad_width(m, w)
        }
        None => m,
    }
}

/// The rows of `parts` (`[batch, w_i]` each: key masses of draft steps or layers) summed in
/// f32, the narrower widened with zeros, then scaled to sum 1 per row (a row of zeros stays
/// zeros): a proposal's lookahead `[batch, max w_i]`. `None` for no parts.
///
/// Every part is cast to f32 before the sum: the parts can come in two dtypes (the CUDA
/// key-mass kernel writes f32 beside the backend's bf16), and Burn's addition does not
/// convert (see [`add_padded`]).
pub(super) fn normalised_sum<B: Backend>(parts: Vec<Tensor<B, 2>>) -> Option<Tensor<B, 2>> {
    let lmax = parts.iter().map(|p| p.dims()[1]).max()?;
    let mut acc: Option<Tensor<B, 2>> = None;
    for p in parts {
        let [b, l] = p.dims();
        let p = if p.dtype() == DType::F32 {
            p
        } else {
            p.cast(DType::F32)
        };
        let p = if l < lmax {
            let zeros = Tensor::zeros([b, lmax - l], (&p.device(), DType::F32));
            Tensor::cat(vec![p, zeros], 1)
        } else {
            p
        };
        acc = Some(match acc {
            Some(a) => a + p,
            None => p,
        });
    }
    let acc = acc?;
    let sum = acc.clone().sum_dim(1).clamp_min(1e-30);
    Some(acc / sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;
    use burn_tensor::TensorData;

    fn logits(rows: &[Vec<f32>]) -> Tensor<Flex, 2> {
        let v = rows[0].len();
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        Tensor::from_data(TensorData::new(flat, [rows.len(), v]), &Default::default())
    }

    /// The first index of the largest value, by a plain loop over the row.
    fn first_max(row: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in row.iter().enumerate() {
            if x > row[best] {
                best = i;
            }
        }
        best as u32
    }

    #[test]
    fn last_rows_takes_each_sequences_row_by_slice_or_gather() {
        // logits[s][i][j] = 100 s + 10 i + j
        let (b, n, v) = (3usize, 2usize, 4usize);
        let flat: Vec<f32> = (0..b * n * v)
            .map(|x| (100 * (x / (n * v)) + 10 * ((x / v) % n) + x % v) as f32)
            .collect();
        let t = Tensor::<Flex, 3>::from_data(TensorData::new(flat, [b, n, v]), &Default::default());
        let host = |x: Tensor<Flex, 2>| x.into_data().to_vec::<f32>().unwrap();
        let want = |rows: &[usize]| -> Vec<f32> {
            rows.iter()
                .enumerate()
                .flat_map(|(s, &r)| (0..v).map(move |j| (100 * s + 10 * r + j) as f32))
                .collect()
        };
        for rows in [[1usize, 1, 1], [0, 0, 0], [0, 1, 0], [1, 0, 1]] {
            assert_eq!(host(last_rows(t.clone(), &rows)), want(&rows), "{rows:?}");
        }
    }

    #[test]
    fn greedy_on_device_takes_the_first_max_within_the_vocabulary() {
        // a tie at the maximum (ids 1 and 3), a maximum past the vocabulary (id 4), -inf
        let rows = vec![
            vec![0.5, 3.0, -1.0, 3.0, 9.0],
            vec![f32::NEG_INFINITY, -2.0, -2.5, -7.0, 1.0],
        ];
        let ids = greedy_on_device(logits(&rows), 4).unwrap();
        assert_eq!(ids, vec![1, 1]);
        // no finite maximum: id 0, as the host argmax
        let rows = vec![vec![f32::NEG_INFINITY; 3], vec![1.0, 0.0, 2.0]];
        assert_eq!(greedy_on_device(logits(&rows), 3).unwrap(), vec![0, 2]);
        assert!(matches!(
            greedy_on_device(logits(&rows), 0),
            Err(dustin_core::CoreError::InvalidInput { .. })
        ));
    }

    #[test]
    fn greedy_on_device_matches_a_host_argmax_on_random_rows() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|_| (0..997).map(|_| rng.random_range(-8.0f32..8.0)).collect())
            .collect();
        let want: Vec<u32> = rows.iter().map(|r| first_max(&r[..900])).collect();
        assert_eq!(greedy_on_device(logits(&rows), 900).unwrap(), want);
    }

    #[test]
    fn greedy_on_device_refuses_nan_and_inf_naming_the_sequence() {
        for bad in [f32::NAN, f32::INFINITY] {
            let rows = vec![vec![0.0, 1.0, 2.0], vec![0.0, bad, 2.0]];
            match greedy_on_device(logits(&rows), 3) {
                Err(dustin_core::CoreError::NonFinite { seq, .. }) => assert_eq!(seq, 1),
                other => panic!("{bad}: expected NonFinite for sequence 1, got {other:?}"),
            }
        }
        // a NaN past the vocabulary is not read
        let rows = vec![vec![0.0, 1.0, f32::NAN]];
        assert_eq!(greedy_on_device(logits(&rows), 2).unwrap(), vec![1]);
    }

    /// A `[rows, cols]` tensor of `vals` in dtype `dt` (every value exact in bf16).
    fn mat(vals: &[f32], rows: usize, dt: DType) -> Tensor<Flex, 2> {
        let t = Tensor::<Flex, 2>::from_data(
            TensorData::new(vals.to_vec(), [rows, vals.len() / rows]),
            &Default::default(),
        );
        t.cast(dt)
    }

    fn host(t: Tensor<Flex, 2>) -> Vec<f32> {
        t.cast(DType::F32).into_data().to_vec::<f32>().unwrap()
    }

    #[test]
    fn the_lookahead_sums_parts_of_two_dtypes_in_f32() {
        // a bf16 part (the backend's float on CUDA) and a wider f32 one (the key-mass
        // kernel's): Burn's addition would read one as the other's dtype
        let a = mat(&[1.0, 2.0, 1.0, 0.0, 4.0, 0.0], 2, DType::BF16);
        let b = mat(
            &[0.5, 0.5, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
            2,
            DType::F32,
        );
        let got = normalised_sum(vec![a, b]).unwrap();
        assert_eq!(got.dtype(), DType::F32);
        // float64 by hand: rows [1.5, 2.5, 2, 2, 1] / 9 and [1, 5, 1, 1, 0] / 8
        let want = [
            1.5 / 9.0,
            2.5 / 9.0,
            2.0 / 9.0,
            2.0 / 9.0,
            1.0 / 9.0,
            1.0 / 8.0,
            5.0 / 8.0,
            1.0 / 8.0,
            1.0 / 8.0,
            0.0,
        ];
        for (g, w) in host(got).iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{g} vs {w}");
        }
        assert!(normalised_sum::<Flex>(Vec::new()).is_none());
    }

    #[test]
    fn padding_and_padded_sums_keep_the_accumulators_dtype() {
        let t = mat(&[1.0, 2.0], 1, DType::BF16).reshape([1, 1, 2]);
        let wide = pad_width(t.clone(), 4);
        assert_eq!(wide.dtype(), DType::BF16);
        let m = mat(&[0.5, 0.5, 0.5], 1, DType::F32).reshape([1, 1, 3]);
        let sum = add_padded(Some(t), m);
        assert_eq!(sum.dtype(), DType::BF16);
        assert_eq!(host(sum.reshape([1, 3])), vec![1.5, 2.5, 0.5]);
        assert_eq!(host(wide.reshape([1, 4])), vec![1.0, 2.0, 0.0, 0.0]);
    }
}
