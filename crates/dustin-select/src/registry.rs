//! Selection policies by name: `dense`, `streaming`, `h2o`, `snapkv`, `quest`, `oracle`,
//! `draft-only`, `history-only`, `dustin`, and `pyramid(<name>)` around any of them.
//!
//! Estimator knobs come as a JSON value (a TOML table converts with
//! `serde_json::to_value(&toml_value)`): the estimator's config struct, every field optional
//! (`dense`, `streaming`, `h2o`, `oracle` and `draft-only` have none: `{}` or nothing). For
//! `pyramid(<name>)` the same object may hold a `"pyramid"` key with a [`PyramidConfig`]; the
//! rest goes to `<name>`.
//!
//! Adding an estimator: its file in `estimators/`, one arm in `build_selector`, its name in
//! [`NAMES`], and it runs through the shared test matrix automatically.

use dustin_core::SelectionPolicy;
use dustin_kernels::KernelOps;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::estimators::{
    Dense, DraftOnly, Dustin, DustinConfig, H2o, HistoryOnly, Oracle, Quest, QuestConfig, SnapKv,
    SnapKvConfig, Streaming,
};
use crate::{BudgetedPolicy, Pyramid, PyramidConfig, SelectConfig, SelectError, Selector};

/// The estimator names [`build`] knows (each also works as `pyramid(<name>)`).
pub const NAMES: &[&str] = &[
    "dense",
    "streaming",
    "h2o",
    "snapkv",
    "quest",
    "oracle",
    "draft-only",
    "history-only",
    "dustin",
];

/// The estimator names [`build`] knows (each also works as `pyramid(<name>)`).
pub fn names() -> &'static [&'static str] {
    NAMES
}

/// The config of an estimator without knobs: an empty object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoConfig {}

/// The selection policy `spec` with the estimator's default knobs.
///
/// # Errors
/// As [`build_with`].
pub fn build<B: KernelOps>(
    spec: &str,
    cfg: &SelectConfig,
) -> Result<Box<dyn SelectionPolicy<B>>, SelectError> {
    build_with(spec, cfg, None)
}

/// The selection policy `spec` (`name` or `pyramid(<name>)`, see the module doc) under `cfg`,
/// with estimator knobs `estimator_cfg` (missing fields take their defaults).
///
/// # Errors
/// [`SelectError::UnknownName`] listing the known names; [`SelectError::Config`] when
/// `estimator_cfg` does not parse as that estimator's config; [`SelectError::Core`] for a
/// config that parses but does not validate (for example `budget <= n_sink + window`).
pub fn build_with<B: KernelOps>(
    spec: &str,
    cfg: &SelectConfig,
    estimator_cfg: Option<serde_json::Value>,
) -> Result<Box<dyn SelectionPolicy<B>>, SelectError> {
    cfg.validate()?;
    let p: Box<dyn BudgetedPolicy<B>> = build_budgeted(spec, cfg, estimator_cfg)?;
    Ok(p)
}

/// As [`build_with`], as a [`BudgetedPolicy`] (what a wrapper such as [`Pyramid`] takes).
///
/// # Errors
/// As [`build_with`].
pub fn build_budgeted<B: KernelOps>(
    spec: &str,
    cfg: &SelectConfig,
    estimator_cfg: Option<serde_json::Value>,
) -> Result<Box<dyn BudgetedPolicy<B>>, SelectError> {
    let spec = spec.trim();
    if let Some((inner, pcfg, value)) = split_pyramid(spec, estimator_cfg.clone())? {
        let inner = build_budgeted::<B>(inner, cfg, value)?;
        return Ok(Box::new(Pyramid::new(inner, pcfg)?));
    }
    build_selector(spec, cfg, estimator_cfg)
}

/// A `pyramid(<inner>)` spec taken apart: inner spec, wrapper knobs, inner estimator config.
type PyramidParts<'a> = (&'a str, PyramidConfig, Option<serde_json::Value>);

/// For `pyramid(<inner>)`: the inner spec, the wrapper's knobs (taken from the `"pyramid"`
/// key of `estimator_cfg`, defaults otherwise) and the rest of `estimator_cfg` for the inner
/// estimator; `None` for any other spec.
fn split_pyramid(
    spec: &str,
    mut estimator_cfg: Option<serde_json::Value>,
) -> Result<Option<PyramidParts<'_>>, SelectError> {
    let Some(inner) = spec
        .strip_prefix("pyramid(")
        .and_then(|s| s.strip_suffix(')'))
    else {
        return Ok(None);
    };
    let pcfg = match estimator_cfg
        .as_mut()
        .and_then(|v| v.as_object_mut())
        .and_then(|o| o.remove("pyramid"))
    {
        Some(p) => parse::<PyramidConfig>(spec, Some(p))?,
        None => PyramidConfig::default(),
    };
    Ok(Some((inner, pcfg, estimator_cfg)))
}

/// The estimator config `spec` (`name` or `pyramid(<name>)`) runs with: `estimator_cfg` over
/// the estimator's defaults, as JSON (under `"pyramid"` for the wrapper's own knobs). What a
/// report or a results store records, so that a changed default is a different run.
///
/// # Errors
/// As [`build_with`], except validation.
pub fn resolved_config(
    spec: &str,
    estimator_cfg: Option<serde_json::Value>,
) -> Result<serde_json::Value, SelectError> {
    let spec = spec.trim();
    if let Some((inner, pcfg, value)) = split_pyramid(spec, estimator_cfg.clone())? {
        let mut out = resolved_config(inner, value)?;
        let p = to_json(spec, &pcfg)?;
        if let Some(o) = out.as_object_mut() {
            o.insert("pyramid".into(), p);
        }
        return Ok(out);
    }
    match spec {
        "dense" | "streaming" | "h2o" | "oracle" | "draft-only" => {
            to_json(spec, &parse::<NoConfig>(spec, estimator_cfg)?)
        }
        "snapkv" => to_json(spec, &parse::<SnapKvConfig>(spec, estimator_cfg)?),
        "quest" => to_json(spec, &parse::<QuestConfig>(spec, estimator_cfg)?),
        "dustin" | "history-only" => to_json(spec, &parse::<DustinConfig>(spec, estimator_cfg)?),
        _ => Err(SelectError::UnknownName {
            name: spec.to_string(),
            known: NAMES.join(", "),
        }),
    }
}

fn to_json<T: serde::Serialize>(name: &str, v: &T) -> Result<serde_json::Value, SelectError> {
    serde_json::to_value(v).map_err(|source| SelectError::Config {
        name: name.to_string(),
        source,
    })
}

fn parse<T: DeserializeOwned + Default>(
    name: &str,
    value: Option<serde_json::Value>,
) -> Result<T, SelectError> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(T::default()),
        Some(v) => from_json_named(v).map_err(|source| SelectError::Config {
            name: name.to_string(),
            source,
        }),
    }
}

/// `serde_json::from_value`, with the error naming the key at fault when `v` is an object
/// whose keys parse one at a time (as a config struct with `#[serde(default)]` does): serde's
/// own message for a mistyped field names the type but not the field (`invalid type: string
/// "yes", expected a boolean`).
///
/// # Errors
/// The parse error, prefixed with `` `key`: `` where one key alone fails.
pub fn from_json_named<T: DeserializeOwned>(v: serde_json::Value) -> Result<T, serde_json::Error> {
    let culprit = v.as_object().and_then(|o| {
        o.iter().find_map(|(k, x)| {
            let one = serde_json::Value::Object([(k.clone(), x.clone())].into_iter().collect());
            serde_json::from_value::<T>(one)
                .err()
                .map(|e| (k.clone(), e))
        })
    });
    serde_json::from_value(v).map_err(|e| match culprit {
        Some((k, e1)) => serde::de::Error::custom(format!("`{k}`: {e1}")),
        None => e,
    })
}

fn selector<
    B: KernelOps,
    E: dustin_core::ImportanceEstimator<B> + crate::EstimationCost + Clone + 'static,
>(
    est: E,
    cfg: &SelectConfig,
) -> Result<Box<dyn BudgetedPolicy<B>>, SelectError> {
    Ok(Box::new(Selector::new(est, cfg.clone())?))
}

fn build_selector<B: KernelOps>(
    name: &str,
    cfg: &SelectConfig,
    value: Option<serde_json::Value>,
) -> Result<Box<dyn BudgetedPolicy<B>>, SelectError> {
    match name {
        "dense" => {
            parse::<NoConfig>(name, value)?;
            selector(Dense, cfg)
        }
        "streaming" => {
            parse::<NoConfig>(name, value)?;
            selector(Streaming, cfg)
        }
        "h2o" => {
            parse::<NoConfig>(name, value)?;
            selector(H2o::<B>::new(), cfg)
        }
        "snapkv" => selector(SnapKv::<B>::new(parse::<SnapKvConfig>(name, value)?)?, cfg),
        "quest" => selector(Quest::<B>::new(parse::<QuestConfig>(name, value)?)?, cfg),
        "oracle" => {
            parse::<NoConfig>(name, value)?;
            selector(Oracle, cfg)
        }
        "draft-only" => {
            parse::<NoConfig>(name, value)?;
            selector(DraftOnly::<B>::new(), cfg)
        }
        "history-only" => selector(
            HistoryOnly::<B>::with_config(parse::<DustinConfig>(name, value)?)?,
            cfg,
        ),
        "dustin" => selector(
            Dustin::<B>::with_config(parse::<DustinConfig>(name, value)?)?,
            cfg,
        ),
        _ => Err(SelectError::UnknownName {
            name: name.to_string(),
            known: NAMES.join(", "),
        }),
    }
}
