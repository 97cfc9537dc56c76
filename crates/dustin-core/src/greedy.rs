//! Greedy token choice on the device: the ids of each row's maximum read back instead of the
//! rows themselves (`batch` integers per step instead of `batch x vocab` floats; 151,936
//! floats a sequence for Qwen2.5).

use burn_tensor::{backend::Backend, Bool, Tensor};

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
    /// Marks a row with NaN or +inf in the one read back (argmax ids are >= 0, and cubek's
    /// "no maximum" `u32::MAX` reads as -1 in i32).
    const BAD: i64 = -2;
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
    // one read back per step: the ids, with the refused rows marked
    let ids = logits
        .argmax(1)
        .mask_fill(bad, BAD)
        .reshape([b])
        .into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(|e| CoreError::Model(format!("{e:?}")))?;
    let n = vocab.min(v) as i64;
    ids.into_iter()
        .enumerate()
        .map(|(seq, id)| match id {
            BAD => Err(CoreError::NonFinite {
                what: what.into(),
                seq,
            }),
            id if (0..n).contains(&id) => Ok(id as TokenId),
            // no finite maximum: the host argmax's choice
            _ => Ok(0),
        })
        .collect()
}
