//! Tensor names: llama.cpp's GGUF names <-> Hugging Face names, and the Llama q/k row
//! permutation.

/// Per-layer tensors: `(GGUF suffix after "blk.N.", HF suffix after "model.layers.N.")`.
const LAYER: &[(&str, &str)] = &[
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
];

/// Whole-model tensors: `(GGUF name, HF name)`.
const GLOBAL: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// Splits `"<prefix>N.<rest>"` into `(N, rest)`.
fn layer_split<'a>(name: &'a str, prefix: &str) -> Option<(usize, &'a str)> {
    let rest = name.strip_prefix(prefix)?;
    let (n, suffix) = rest.split_once('.')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0'))
    {
        return None;
    }
    Some((n.parse().ok()?, suffix))
}

/// The GGUF name of an HF tensor name (`model.layers.3.mlp.up_proj.weight` ->
/// `blk.3.ffn_up.weight`); `None` for names this mapping does not know.
pub fn hf_to_gguf(hf: &str) -> Option<String> {
    if let Some(&(g, _)) = GLOBAL.iter().find(|(_, h)| *h == hf) {
        return Some(g.to_string());
    }
    let (layer, suffix) = layer_split(hf, "model.layers.")?;
    let &(g, _) = LAYER.iter().find(|(_, h)| *h == suffix)?;
    Some(format!("blk.{layer}.{g}"))
}

/// The HF name of a GGUF tensor name (`blk.3.ffn_up.weight` ->
/// `model.layers.3.mlp.up_proj.weight`); `None` for names this mapping does not know.
pub fn gguf_to_hf(gguf: &str) -> Option<String> {
    if let Some(&(_, h)) = GLOBAL.iter().find(|(g, _)| *g == gguf) {
        return Some(h.to_string());
    }
    let (layer, suffix) = layer_split(gguf, "blk.")?;
    let &(_, h) = LAYER.iter().find(|(g, _)| *g == suffix)?;
    Some(format!("model.layers.{layer}.{h}"))
}

/// Undoes llama.cpp's q/k row permutation in place, for a tensor of `rows` rows of `cols`
/// values (row-major; `cols == 1` for a bias).
///
/// `convert_hf_to_gguf.py` (`LlamaModel.permute`) stores Llama's q and k projections as
/// `w.reshape(n_head, 2, rows / n_head / 2, cols).swapaxes(1, 2)`, turning HF's rotate-half
/// RoPE pairs `(i, i + d/2)` into adjacent pairs `(2i, 2i + 1)`. So within each head of width
/// `d`, GGUF row `2i + j` holds HF row `j * d/2 + i`; this puts it back.
///
/// Returns `false` (and leaves `data` alone) when `rows` is not a multiple of `2 * n_head`
/// or `data` is not `rows * cols` long.
pub fn unpermute_rows(data: &mut [f32], rows: usize, cols: usize, n_head: usize) -> bool {
    if n_head == 0 || !rows.is_multiple_of(2 * n_head) || rows.checked_mul(cols) != Some(data.len())
    {
        return false;
    }
    let head = rows / n_head;
    let half = head / 2;
    let src = data.to_vec();
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let from = (h * head + 2 * i + j) * cols;
                let to = (h * head + j * half + i) * cols;
                data[to..to + cols].copy_from_slice(&src[from..from + cols]);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for hf in [
            "model.embed_tokens.weight",
            "model.norm.weight",
            "lm_head.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.q_proj.bias",
            "model.layers.12.self_attn.k_proj.bias",
            "model.layers.29.self_attn.o_proj.weight",
            "model.layers.7.mlp.down_proj.weight",
            "model.layers.7.input_layernorm.weight",
            "model.layers.7.post_attention_layernorm.weight",
        ] {
            let g = hf_to_gguf(hf).unwrap();
            assert_eq!(gguf_to_hf(&g).as_deref(), Some(hf), "{g}");
        }
        assert_eq!(
            hf_to_gguf("model.layers.3.mlp.up_proj.weight").unwrap(),
            "blk.3.ffn_up.weight"
        );
        assert_eq!(hf_to_gguf("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(hf_to_gguf("model.layers.03.mlp.up_proj.weight"), None);
        assert_eq!(hf_to_gguf("model.layers.3.mlp.up_proj"), None);
        assert_eq!(gguf_to_hf("rope_freqs.weight"), None);
    }

    /// The forward permutation of `LlamaModel.permute`, written as the numpy reshape says.
    fn permute(w: &[f32], rows: usize, cols: usize, n_head: usize) -> Vec<f32> {
        let half = rows / n_head / 2;
        // reshape(n_head, 2, half, cols).swapaxes(1, 2) -> index [h][i][j][c] = w[h][j][i][c]
        let mut out = Vec::with_capacity(w.len());
        for h in 0..n_head {
            for i in 0..half {
                for j in 0..2 {
                    let r = h * 2 * half + j * half + i;
                    out.extend_from_slice(&w[r * cols..(r + 1) * cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_permute() {
        let (rows, cols, n_head) = (24, 3, 3);
        let w: Vec<f32> = (0..rows * cols).map(|x| x as f32).collect();
        let mut p = permute(&w, rows, cols, n_head);
        assert_ne!(p, w);
        assert!(unpermute_rows(&mut p, rows, cols, n_head));
        assert_eq!(p, w);
        // A bias is one column.
        let b: Vec<f32> = (0..8).map(|x| x as f32).collect();
        let mut pb = permute(&b, 8, 1, 2);
        assert_eq!(pb, vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        assert!(unpermute_rows(&mut pb, 8, 1, 2));
        assert_eq!(pb, b);
        assert!(!unpermute_rows(&mut pb, 8, 1, 3));
    }
}
