//! The selectors and budgets of a run, as the `--selectors`, `--knobs`, `--select` and
//! `--budget` options give them, and the fingerprints that key their results.

use std::collections::BTreeMap;

use dustin_kernels::KernelOps;
use dustin_select::registry::build_budgeted;
use dustin_select::{BudgetedPolicy, SelectConfig};
use dustin_spec::LookaheadLayers;

use super::HarnessError;

/// A budget as given: absolute tokens or a fraction of the context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum BudgetSpec {
    Tokens(usize),
    Fraction(f64),
}

impl BudgetSpec {
    pub(crate) fn parse(s: &str) -> Result<Self, HarnessError> {
        let s = s.trim();
        let bad = || HarnessError::Usage(format!("--budget {s}: expected K, a/b or a fraction"));
        if let Some((a, b)) = s.split_once('/') {
            let (a, b): (f64, f64) = (
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            );
            if b > 0.0 && a > 0.0 && a <= b {
                return Ok(Self::Fraction(a / b));
            }
            return Err(bad());
        }
        if let Ok(k) = s.parse::<usize>() {
            if k == 0 {
                return Err(HarnessError::Usage(format!(
                    "--budget {s}: a budget of 0 tokens reads nothing; expected at least 1"
                )));
            }
            return Ok(Self::Tokens(k));
        }
        match s.parse::<f64>() {
            Ok(f) if f > 0.0 && f <= 1.0 => Ok(Self::Fraction(f)),
            _ => Err(bad()),
        }
    }

    pub(crate) fn tokens(&self, ctx: usize) -> usize {
        match *self {
            Self::Tokens(k) => k,
            Self::Fraction(f) => (f * ctx as f64).round() as usize,
        }
    }
}

/// The selectors' budgets and their tuning: the flags `dustin eval fidelity`, `eval pg19` and
/// `eval longbench` share (flattened into each command's options).
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct SelectorFlags {
    /// Token budgets (comma-separated): absolute (`512`) or fractions of the context
    /// (`1/8`, `0.125`).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ',', required = true))]
    pub budget: Vec<String>,
    /// Estimator knobs of one selector label as JSON, e.g. `dustin={"alpha":0.7}`
    /// (repeatable).
    #[cfg_attr(feature = "clap", arg(long = "knobs"))]
    pub knobs: Vec<String>,
    /// Selector-config overrides of one selector label as JSON, e.g. `dustin={"refresh":1}`
    /// (repeatable; the budget always comes from `--budget`).
    #[cfg_attr(feature = "clap", arg(long = "select"))]
    pub select: Vec<String>,
}

impl SelectorFlags {
    /// The selectors of `--selectors` (`selectors`), with their `--knobs` and `--select`.
    pub(crate) fn selectors(
        &self,
        selectors: &[String],
    ) -> Result<Vec<SelectorSpec>, HarnessError> {
        selector_specs_from(selectors, &self.knobs, &self.select)
    }

    /// The budgets of `--budget`, each with the text it was given as.
    pub(crate) fn budgets(&self) -> Result<Vec<(String, BudgetSpec)>, HarnessError> {
        budget_specs(&self.budget)
    }
}

/// Parses budgets as given (`--budget`), each kept with its trimmed text.
pub(crate) fn budget_specs(given: &[String]) -> Result<Vec<(String, BudgetSpec)>, HarnessError> {
    given
        .iter()
        .map(|b| BudgetSpec::parse(b).map(|s| (b.trim().to_string(), s)))
        .collect()
}

/// One selector of the run: its label in reports, the registry spec and its configs.
#[derive(Debug, Clone)]
pub(crate) struct SelectorSpec {
    /// The label in reports and store keys (`label=` of `--selectors`, else the spec).
    pub(crate) label: String,
    /// The registry spec (`dustin`, `pyramid(dustin)`, ...).
    pub(crate) spec: String,
    /// Estimator knobs (`--knobs label=JSON`).
    pub(crate) knobs: Option<serde_json::Value>,
    /// Selector-config overrides (`--select label=JSON`).
    pub(crate) select: Option<serde_json::Value>,
}

impl SelectorSpec {
    /// The selector config at `budget`: the `dustin` family (`dustin`, `history-only` and
    /// their pyramids) starts from the recommended config (`recommended_select_config`: a
    /// new selection every second verification, re-ranked with the new lookahead in between,
    /// as tuned in docs/fidelity.md; early refresh when acceptance halves), every baseline
    /// from the defaults (recomputed every verification, its own rule); `--select` overrides
    /// either.
    pub(crate) fn select_config(&self, budget: usize) -> Result<SelectConfig, HarnessError> {
        let dustin_family = self.spec.contains("dustin") || self.spec.contains("history-only");
        let mut cfg = if dustin_family {
            dustin_select::estimators::dustin::recommended_select_config(budget)
        } else {
            SelectConfig::with_budget(budget)
        };
        if let Some(v) = &self.select {
            let Some(o) = v.as_object() else {
                return Err(HarnessError::Usage(format!(
                    "--select {}={v}: expected a JSON object of selector-config fields",
                    self.label
                )));
            };
            if o.contains_key("budget") {
                return Err(HarnessError::Usage(format!(
                    "--select {}: `budget` is --budget's alone (as in generate's --config)",
                    self.label
                )));
            }
            let mut base =
                serde_json::to_value(&cfg).map_err(|e| HarnessError::Usage(e.to_string()))?;
            if let Some(b) = base.as_object_mut() {
                for (k, val) in o {
                    b.insert(k.clone(), val.clone());
                }
            }
            cfg = serde_json::from_value(base)
                .map_err(|e| HarnessError::Usage(format!("--select {}: {e}", self.label)))?;
            cfg.budget = budget;
        }
        Ok(cfg)
    }

    pub(crate) fn build<B: KernelOps>(
        &self,
        budget: usize,
    ) -> Result<Box<dyn BudgetedPolicy<B>>, HarnessError> {
        let cfg = self.select_config(budget)?;
        build_budgeted::<B>(&self.spec, &cfg, self.knobs.clone())
            .map_err(|e| HarnessError::Usage(format!("selector {}: {e}", self.label)))
    }

    /// What identifies this selector's results at `budget`, hashed into store keys: the spec
    /// and the *resolved* configs (defaults included), so that a changed default recomputes.
    pub(crate) fn fingerprint(&self, budget: usize) -> Result<String, HarnessError> {
        let est = dustin_select::registry::resolved_config(&self.spec, self.knobs.clone())
            .map_err(|e| HarnessError::Usage(format!("selector {}: {e}", self.label)))?;
        let sel = serde_json::to_value(self.select_config(budget)?)
            .map_err(|e| HarnessError::Usage(e.to_string()))?;
        Ok(format!("{}|{est}|{sel}", self.spec))
    }
}

/// `label=JSON` pairs of a repeatable option (`flag` names it in errors).
pub(crate) fn parse_label_json(
    flag: &str,
    items: &[String],
) -> Result<BTreeMap<String, serde_json::Value>, HarnessError> {
    let mut out = BTreeMap::new();
    for it in items {
        let (label, json) = it
            .split_once('=')
            .ok_or_else(|| HarnessError::Usage(format!("{flag} {it}: expected label=JSON")))?;
        let v: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| HarnessError::Usage(format!("{flag} {it}: {e}")))?;
        out.insert(label.trim().to_string(), v);
    }
    Ok(out)
}

/// The selectors of `--selectors`, with their `--knobs` and `--select` (shared by every
/// `dustin eval` command).
pub(crate) fn selector_specs_from(
    selectors: &[String],
    knobs: &[String],
    select: &[String],
) -> Result<Vec<SelectorSpec>, HarnessError> {
    let knobs = parse_label_json("--knobs", knobs)?;
    let select = parse_label_json("--select", select)?;
    let mut out: Vec<SelectorSpec> = Vec::new();
    for s in selectors {
        let s = s.trim();
        if s.is_empty() {
            continue;
        }
        let (label, spec) = match s.split_once('=') {
            Some((l, sp)) => (l.trim().to_string(), sp.trim().to_string()),
            None => (s.to_string(), s.to_string()),
        };
        if out.iter().any(|o| o.label == label) {
            return Err(HarnessError::Usage(format!("--selectors: {label} twice")));
        }
        out.push(SelectorSpec {
            knobs: knobs.get(&label).cloned(),
            select: select.get(&label).cloned(),
            label,
            spec,
        });
    }
    for l in knobs.keys().chain(select.keys()) {
        if !out.iter().any(|o| &o.label == l) {
            return Err(HarnessError::Usage(format!(
                "--knobs/--select for {l}, which is not in --selectors"
            )));
        }
    }
    if out.is_empty() {
        return Err(HarnessError::Usage("--selectors: none given".into()));
    }
    Ok(out)
}

/// FNV-1a, for short stable fingerprints in store keys.
pub(crate) fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The part of a result store's key that names `--lookahead-layers` (`eval fidelity`, `eval
/// longbench`): nothing for `all`, so that stores written before the setting keep their keys,
/// else `|la=<setting as given, trimmed>`.
pub(crate) fn lookahead_key(setting: &str) -> String {
    match setting.parse::<LookaheadLayers>() {
        Ok(LookaheadLayers::All) => String::new(),
        _ => format!("|la={}", setting.trim()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_as_tokens_or_fractions() {
        assert_eq!(BudgetSpec::parse("512").unwrap().tokens(4096), 512);
        assert_eq!(BudgetSpec::parse("1/8").unwrap().tokens(4096), 512);
        assert_eq!(BudgetSpec::parse(" 1/16 ").unwrap().tokens(8192), 512);
        assert_eq!(BudgetSpec::parse("0.125").unwrap().tokens(8192), 1024);
        for bad in ["", "x", "0", "0/8", "9/8", "1.5", "-1"] {
            assert!(BudgetSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_json_pairs_parse() {
        let m = parse_label_json("--knobs", &[r#"d2={"alpha":0.7,"beta":0.9}"#.into()]).unwrap();
        assert_eq!(m["d2"]["beta"], serde_json::json!(0.9));
        assert!(parse_label_json("--knobs", &["nojson".into()]).is_err());
    }

    #[test]
    fn select_overrides_must_be_objects_without_a_budget() {
        let spec = |select: serde_json::Value| SelectorSpec {
            label: "d".into(),
            spec: "dustin".into(),
            knobs: None,
            select: Some(select),
        };
        let err = |v| match spec(v).select_config(512) {
            Err(HarnessError::Usage(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(err(serde_json::json!(5)).contains("expected a JSON object"));
        assert!(err(serde_json::json!({"budget": 5})).contains("`budget` is --budget's alone"));
        let cfg = spec(serde_json::json!({"window": 32}))
            .select_config(512)
            .unwrap();
        assert_eq!((cfg.window, cfg.budget), (32, 512));
    }
}
