//! Greedy token choice on the device, and the row and width handling of the draft's logits
//! and attention masses.

use burn_tensor::{backend::Backend, Tensor};
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

/// The greedy token of each row of `logits` (`[batch, vocab_padded]`, logits of the first
/// `vocab` ids considered), picked on the device: the draft loop then reads back `batch` ids
/// instead of `batch x vocab` floats at every step (151,936 floats per sequence for Qwen2.5).
/// As on the host ([`dustin_core::argmax`]): ties go to the lowest id (Flex and cubek's
/// argmax both keep the lower index on equality), and a row with no finite maximum (all
/// -inf) gives id 0 (cubek-reduce 0.2's argmax starts from `f32::MIN` at index `u32::MAX`, so
/// it returns `u32::MAX` there; any id outside the vocabulary is mapped back to 0).
///
/// # Errors
/// [`dustin_core::CoreError::NonFinite`] when a row holds NaN or +inf (an argmax would pick
/// an arbitrary token from them; the host path refuses them too), naming the sequence;
/// [`dustin_core::CoreError::InvalidInput`] for `vocab == 0`.
pub(super) fn greedy_on_device<B: Backend>(
    logits: Tensor<B, 2>,
    vocab: usize,
) -> dustin_core::Result<Vec<TokenId>> {
    /// Marks a row with NaN or +inf in the one read back (argmax ids are >= 0, and cubek's
    /// "no maximum" `u32::MAX` reads as -1 in i32).
    const BAD: i64 = -2;
    let [b, v] = logits.dims();
    if vocab == 0 || v == 0 {
        return Err(dustin_core::CoreError::invalid(
            "vocab",
            "at least 1 id with logits",
            format!("vocab {vocab}, logits width {v}"),
        ));
    }
    let logits = logits.slice([0..b, 0..vocab.min(v)]);
    let bad = crate::refused_logits(logits.clone()).any_dim(1);
    // one read back per step: the ids, with the refused rows marked
    let ids = logits
        .argmax(1)
        .mask_fill(bad, BAD)
        .reshape([b])
        .into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(|e| dustin_core::CoreError::Model(format!("{e:?}")))?;
    let n = vocab.min(v) as i64;
    ids.into_iter()
        .enumerate()
        .map(|(seq, id)| match id {
            BAD => Err(dustin_core::CoreError::NonFinite {
                what: "draft logits".into(),
                seq,
            }),
            id if (0..n).contains(&id) => Ok(id as TokenId),
            // no finite maximum: the host argmax's choice
            _ => Ok(0),
        })
        .collect()
}

/// `t` `[batch, kv_heads, w]` widened to `width >= w` with zeros.
pub(super) fn pad_width<B: Backend>(t: Tensor<B, 3>, width: usize) -> Tensor<B, 3> {
    let [b, h, w] = t.dims();
    if w >= width {
        return t;
    }
    let dev = t.device();
    Tensor::cat(vec![t, Tensor::zeros([b, h, width - w], &dev)], 2)
}

/// `acc + m` (`[batch, kv_heads, w]` each), the narrower widened with zeros; `m` when there
/// is no `acc` yet.
pub(super) fn add_padded<B: Backend>(acc: Option<Tensor<B, 3>>, m: Tensor<B, 3>) -> Tensor<B, 3> {
    match acc {
        Some(a) => {
            let w = a.dims()[2].max(m.dims()[2]);
            pad_width(a, w) + pad_width(m, w)
        }
        None => m,
    }
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
}
