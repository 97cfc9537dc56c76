//! Greedy token choice on the device: the ids of each row's maximum read back instead of the
//! rows themselves (`batch` integers per step instead of `batch x vocab` floats; 151,936
//! floats a sequence for Qwen2.5).

use burn_tensor::{backend::Backend, Bool, Int, Tensor};

use crate::{CoreError, Result, TokenId};

/// Where `logits` hold NaN or +inf: values a greedy or sampled choice must refuse (an argmax
/// over them picks an arbitrary token).
pub fn refused_logits<B: Backend, const D: usize>(logits: Tensor<B, D>) -> Tensor<B, D, Bool> {
    logits
        .clone()
        .is_nan()
        .bool_or(logits.equal_elem(f32::INFINITY))
}

/// The greedy token of each row of `logits` (`[batch, vocab_padded]`, logits of the first
/// `vocab` ids considered), picked on the device: the caller reads back `batch` ids
/// instead of `batch x vocab` floats.
/// As on the host ([`crate::argmax`]): ties go to the lowest id (Flex and cubek's
/// argmax both keep the lower index on equality), and a row with no finite maximum (all
/// -inf) gives id 0 (cubek-reduce 0.2's argmax starts from `f32::MIN` at index `u32::MAX`, so
/// it returns `u32::MAX` there; any id outside the vocabulary is mapped back to 0).
///
/// # Errors
/// [`CoreError::NonFinite`] (its `what` is `what`) when a row holds NaN or +inf (an argmax would pick
/// an arbitrary token from them; the host path refuses them too), naming the sequence;
/// [`CoreError::InvalidInput`] for `vocab == 0`.
pub fn greedy_on_device<B: Backend>(
    logits: Tensor<B, 2>,
    vocab: usize,
    what: &str,
) -> Result<Vec<TokenId>> {
    let n = vocab.min(logits.dims()[1]);
    let ids = greedy_ids(logits, vocab)?;
    // one read back per step: the ids, with the refused rows marked
    let ids = read_ids(ids)?;
    ids_to_tokens(&ids, n, what, |seq| seq)
}

/// Marks a row with NaN or +inf in [`greedy_ids`] (argmax ids are >= 0, and cubek's "no
/// maximum" `u32::MAX` reads as -1 in i32).
const REFUSED: i64 = -2;

/// The greedy ids of [`greedy_on_device`], left on the device: `[batch]`, each row's argmax
/// over its first `vocab` logits, `-2` for a row holding NaN or +inf and possibly `-1` for a
/// row with no finite maximum. [`ids_to_tokens`] turns them into tokens once read back. Fed
/// to a model without that read back (a greedy draft's next step), the marked ones must be
/// clamped into the vocabulary, as `dustin_qwen::Qwen2::forward_ids` does.
///
/// # Errors
/// [`CoreError::InvalidInput`] for `vocab == 0` or logits of width 0.
pub fn greedy_ids<B: Backend>(logits: Tensor<B, 2>, vocab: usize) -> Result<Tensor<B, 1, Int>> {
    let [b, v] = logits.dims();
    if vocab == 0 || v == 0 {
        return Err(CoreError::invalid(
            "vocab",
            "at least 1 id with logits",
            format!("vocab {vocab}, logits width {v}"),
        ));
    }
    let logits = logits.slice([0..b, 0..vocab.min(v)]);
    let bad = refused_logits(logits.clone()).any_dim(1);
    Ok(logits.argmax(1).mask_fill(bad, REFUSED).reshape([b]))
}

/// `ids` (any shape) read back to the host as `i64`, in row-major order.
///
/// # Errors
/// [`CoreError::Model`] when the backend's read back fails.
pub fn read_ids<B: Backend, const D: usize>(ids: Tensor<B, D, Int>) -> Result<Vec<i64>> {
    ids.into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(|e| CoreError::Model(format!("{e:?}")))
}

/// Tokens of [`greedy_ids`]' ids read back: an id in `0 .. n` (`n` the ids considered) as
/// it is, an id past them (no finite maximum) as 0.
///
/// # Errors
/// [`CoreError::NonFinite`] (its `what` is `what`) for the first refused row, naming the
/// sequence `seq_of(i)` of its position `i` in `ids`.
pub fn ids_to_tokens(
    ids: &[i64],
    n: usize,
    what: &str,
    seq_of: impl Fn(usize) -> usize,
) -> Result<Vec<TokenId>> {
    let n = n as i64;
    ids.iter()
        .enumerate()
        .map(|(i, &id)| match id {
            REFUSED => Err(CoreError::NonFinite {
                what: what.into(),
                seq: seq_of(i),
            }),
            id if (0..n).contains(&id) => Ok(id as TokenId),
            // no finite maximum: the host argmax's choice
            _ => Ok(0),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids of several steps read back at once (`[steps, batch]`, row-major): in-vocabulary
    /// ids pass, "no maximum" ids become 0, and a refused row names its own sequence, not
    /// its position among every step's ids.
    #[test]
    fn ids_of_several_steps_map_to_tokens_and_name_the_sequence() {
        let batch = 3;
        let ok = [5, 0, 7, -1, 2, 9];
        assert_eq!(
            ids_to_tokens(&ok, 8, "draft logits", |i| i % batch).unwrap(),
            vec![5, 0, 7, 0, 2, 0]
        );
        let bad = [5, 0, 7, 1, REFUSED, 2];
        match ids_to_tokens(&bad, 8, "draft logits", |i| i % batch) {
            Err(CoreError::NonFinite { what, seq }) => {
                assert_eq!(seq, 1);
                assert_eq!(what, "draft logits");
            }
            other => panic!("expected NonFinite for sequence 1, got {other:?}"),
        }
    }
}
