//! The draft's lookahead: which layers feed it ([`LookaheadConfig`], [`LookaheadLayers`]),
//! when it is scored ([`LookaheadScoring`]), and the hook that records the attention mass
//! while the draft runs.

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{AttentionHook, LayerAttnCtx, LayerSelection, Phase};

use crate::{Result, SpecError};

/// Which draft layers feed the lookahead signal (DESIGN.md step 1: "configured draft
/// layers/heads"), and when their attention mass is computed. Its `Default` is every layer
/// (`layers: None`); [`ModelDrafter::new`](crate::ModelDrafter::new) starts from [`LookaheadLayers::Half`] of its
/// draft's layers instead (the measured default, see there).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LookaheadConfig {
    /// Draft layers whose attention is summed; `None` = all of the draft's layers (the
    /// paper's average of the draft's attention).
    pub layers: Option<Vec<usize>>,
    /// When the mass is computed; the same signal either way.
    #[serde(default)]
    pub scoring: LookaheadScoring,
}

/// Which draft layers feed the lookahead signal, as written before the draft's layer count is
/// known (`--lookahead-layers`; [`LookaheadLayers::resolve`] turns it into
/// [`LookaheadConfig::layers`]). DESIGN.md step 1 sums the draft's attention "over configured
/// draft layers/heads"; which layers is our choice to make and to measure (docs/fidelity.md).
///
/// Written as `all`, `stride:S` (every `S`-th layer counted back from the last, the last
/// included: `stride:2` of 24 layers is 1, 3, .., 23), `last:N` (the last `N` layers),
/// `half` (the later half: the last `ceil(L / 2)` of `L` layers, whatever the depth) or a
/// list of layer indices (`0,5,9`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LookaheadLayers {
    /// Every layer of the draft (the paper's average of the draft's attention).
    All,
    /// Every `S`-th layer counted back from the last.
    Stride(usize),
    /// The last `N` layers.
    Last(usize),
    /// The later half of the layers: the last `ceil(L / 2)` of `L`; the default. `last:10`
    /// of 20 selected as well as every layer at 4096 and 8192 tokens (docs/fidelity.md), and
    /// `half` of Qwen2.5-0.5B's 24 layers made `dustin` 1.15x (7B) and 1.22x (72B shapes)
    /// faster than `all` on the H200 (docs/perf.md, "GPU: end to end at Qwen2.5-7B and 72B
    /// shapes").
    #[default]
    Half,
    /// These layers.
    List(Vec<usize>),
}

impl std::str::FromStr for LookaheadLayers {
    type Err = SpecError;

    /// Parses the forms of [`LookaheadLayers`].
    ///
    /// # Errors
    /// [`SpecError::Config`] naming `lookahead layers` for anything else, a stride or count
    /// of 0, or a list with a repeated layer.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            SpecError::Config {
            name: "lookahead layers",
            expected:
                "`all`, `half`, `stride:S`, `last:N` (S, N >= 1) or a list of layer indices like `0,5,9`"
                    .into(),
            found: format!("`{s}`"),
        }
        };
        let t = s.trim();
        let pos = |v: &str| v.trim().parse::<usize>().ok().filter(|&n| n >= 1);
        if t == "all" {
            return Ok(Self::All);
        }
        if t == "half" {
            return Ok(Self::Half);
        }
        if let Some(v) = t.strip_prefix("stride:") {
            return pos(v).map(Self::Stride).ok_or_else(bad);
        }
        if let Some(v) = t.strip_prefix("last:") {
            return pos(v).map(Self::Last).ok_or_else(bad);
        }
        let list: Vec<usize> = t
            .split(',')
            .map(|v| v.trim().parse::<usize>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad())?;
        let mut seen = std::collections::BTreeSet::new();
        if list.iter().any(|&l| !seen.insert(l)) {
            return Err(bad());
        }
        Ok(Self::List(list))
    }
}

impl std::fmt::Display for LookaheadLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::All => write!(f, "all"),
            Self::Stride(s) => write!(f, "stride:{s}"),
            Self::Last(n) => write!(f, "last:{n}"),
            Self::Half => write!(f, "half"),
            Self::List(l) => {
                let v: Vec<String> = l.iter().map(usize::to_string).collect();
                write!(f, "{}", v.join(","))
            }
        }
    }
}

impl LookaheadLayers {
    /// The layers of a draft of `num_layers` layers, ascending: `None` for
    /// [`LookaheadLayers::All`] (every layer, without a list).
    ///
    /// # Errors
    /// [`SpecError::Config`] naming `lookahead layers` when a listed layer is not below
    /// `num_layers` or `last:N` asks for more layers than the draft has.
    pub fn resolve(&self, num_layers: usize) -> Result<Option<Vec<usize>>> {
        let out_of = |found: String| SpecError::Config {
            name: "lookahead layers",
            expected: format!(
                "layers of a draft of {num_layers} layers (0 to {})",
                num_layers.saturating_sub(1)
            ),
            found,
        };
        Ok(match self {
            Self::All => None,
            Self::Stride(s) => Some(
                (0..num_layers)
                    .filter(|l| (num_layers - 1 - l).is_multiple_of(*s))
                    .collect(),
            ),
            Self::Last(n) => {
                if *n > num_layers {
                    return Err(out_of(format!("the last {n}")));
                }
                Some((num_layers - n..num_layers).collect())
            }
            Self::Half => Some((num_layers / 2..num_layers).collect()),
            Self::List(l) => {
                if let Some(&bad) = l.iter().find(|&&x| x >= num_layers) {
                    return Err(out_of(format!("layer {bad}")));
                }
                let mut v = l.clone();
                v.sort_unstable();
                Some(v)
            }
        })
    }
}

/// When a [`ModelDrafter`](crate::ModelDrafter) computes the attention mass of its draft steps' queries.
///
/// The signal is the same either way (each query's softmax over the keys visible at its
/// position, summed): the keys a step's query sees are in the draft cache from that step on
/// and are not changed by later steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LookaheadScoring {
    /// Each layer keeps its queries; after the last draft step one scoring call per layer
    /// ([`Qwen2::key_mass`](dustin_qwen::Qwen2::key_mass)) covers every step's rows, so the draft's keys are read once per
    /// layer for the lookahead instead of once per step, with one set of launches. The
    /// first step's rows join them when every sequence fed the same number of tokens; else
    /// they are scored in the first step's pass.
    #[default]
    Deferred,
    /// Every draft step's pass scores its own rows at every layer (the attention
    /// probabilities on the plain path, the scoring kernel with fused kernels).
    PerStep,
}

/// Records the draft's attention mass per position during drafting, and hands the draft's
/// own selection (if any) to every layer.
#[derive(Debug)]
pub(super) struct LookaheadHook<B: Backend> {
    pub(super) on: bool,
    pub(super) layers: Option<Vec<usize>>,
    /// whether this pass's queries are kept for [`Qwen2::key_mass`](dustin_qwen::Qwen2::key_mass) after drafting instead
    /// of being scored in the pass
    pub(super) keep: bool,
    /// whether only this pass's first query row is kept (a sparse draft's first step with
    /// unequal pending counts: row 0 is every sequence's first pending token)
    pub(super) keep_first_row: bool,
    /// per forward step or deferred scoring: `[batch, keys_len]`
    pub(super) parts: Vec<Tensor<B, 2>>,
    /// kept queries per layer, one `[batch, heads, n, head_dim]` per kept pass
    pub(super) queries: std::collections::BTreeMap<usize, Vec<Tensor<B, 4>>>,
    /// kept first rows per layer, `[batch, heads, 1, head_dim]`
    pub(super) first_rows: std::collections::BTreeMap<usize, Tensor<B, 4>>,
    /// what the layers of this pass attend to (a sparse draft): one selection for every
    /// layer, or one per layer; empty = dense
    pub(super) selections: Vec<LayerSelection<B>>,
}

impl<B: Backend> LookaheadHook<B> {
    /// Whether `layer`'s attention feeds the signal in a pass of `phase`.
    pub(super) fn records(&self, layer: usize, phase: Phase) -> bool {
        self.on && phase == Phase::Decode && self.layers.as_ref().is_none_or(|l| l.contains(&layer))
    }
}

impl<B: Backend> AttentionHook<B> for LookaheadHook<B> {
    fn on_layer(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
    ) -> dustin_core::Result<Option<LayerSelection<B>>> {
        if self.records(ctx.layer, ctx.phase) {
            if self.keep {
                self.queries
                    .entry(ctx.layer)
                    .or_default()
                    .push(ctx.q.clone());
            } else if self.keep_first_row {
                let [b, h, _, d] = ctx.q.dims();
                self.first_rows
                    .insert(ctx.layer, ctx.q.clone().slice([0..b, 0..h, 0..1, 0..d]));
            }
        }
        Ok(match (ctx.phase, self.selections.len()) {
            (Phase::Prefill { .. }, _) | (_, 0) => None,
            (Phase::Decode, 1) => Some(self.selections[0].clone()),
            (Phase::Decode, _) => self.selections.get(ctx.layer).cloned(),
        })
    }
    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        !self.keep && !self.keep_first_row && self.records(layer, phase)
    }
    fn on_probs(
        &mut self,
        _layer: usize,
        _phase: Phase,
        probs: &Tensor<B, 4>,
    ) -> dustin_core::Result<()> {
        let [b, h, n, l] = probs.dims();
        // sum over heads and query rows: [batch, keys_len]
        self.parts
            .push(probs.clone().sum_dim(1).sum_dim(2).reshape([b, l]));
        let _ = (h, n);
        Ok(())
    }
    fn wants_key_mass(&self, layer: usize, phase: Phase) -> bool {
        self.wants_probs(layer, phase)
    }
    fn on_key_mass(
        &mut self,
        _layer: usize,
        _phase: Phase,
        mass: &Tensor<B, 3>,
    ) -> dustin_core::Result<()> {
        let [b, _, l] = mass.dims();
        // sum over KV heads (each already summed over its query heads and the rows)
        self.parts.push(mass.clone().sum_dim(1).reshape([b, l]));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookahead_layers_parse_and_resolve() {
        let p = |s: &str| s.parse::<LookaheadLayers>().unwrap();
        assert_eq!(p("all").resolve(24).unwrap(), None);
        // every second layer counted back from the last: the odd layers of 24
        assert_eq!(
            p("stride:2").resolve(24).unwrap(),
            Some(vec![1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23])
        );
        assert_eq!(p("stride:3").resolve(10).unwrap(), Some(vec![0, 3, 6, 9]));
        assert_eq!(p("stride:1").resolve(3).unwrap(), Some(vec![0, 1, 2]));
        assert_eq!(p("last:4").resolve(24).unwrap(), Some(vec![20, 21, 22, 23]));
        assert_eq!(p("half").resolve(24).unwrap(), Some((12..24).collect()));
        // odd depths round the half up; one layer is itself
        assert_eq!(p("half").resolve(5).unwrap(), Some(vec![2, 3, 4]));
        assert_eq!(p("half").resolve(1).unwrap(), Some(vec![0]));
        assert_eq!(p(" 9, 0,5 ").resolve(10).unwrap(), Some(vec![0, 5, 9]));
        // the written form reads back as the same value
        for s in ["all", "half", "stride:2", "last:12", "0,5,9"] {
            assert_eq!(p(s).to_string(), s);
        }
    }

    #[test]
    fn bad_lookahead_layers_are_named_errors() {
        for s in [
            "", "stride:0", "last:0", "stride:", "every:2", "0,0", "1,-2", "last:x",
        ] {
            let e = s.parse::<LookaheadLayers>().unwrap_err().to_string();
            assert!(
                e.contains("lookahead layers") && e.contains(&format!("`{s}`")),
                "{s}: {e}"
            );
        }
        let e = "last:25".parse::<LookaheadLayers>().unwrap().resolve(24);
        assert!(e.unwrap_err().to_string().contains("the last 25"));
        let e = "3,24".parse::<LookaheadLayers>().unwrap().resolve(24);
        assert!(e.unwrap_err().to_string().contains("layer 24"));
    }
}
