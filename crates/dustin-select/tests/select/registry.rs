//! The registry: names, configs from JSON and TOML, errors; PyramidKV budgets.

use dustin_core::CoreError;
use dustin_select::{build, build_with, names, pyramid_budgets, SelectConfig, SelectError};
use serde_json::json;

use crate::common::B;

#[test]
fn every_name_builds_plain_and_under_pyramid() {
    let cfg = SelectConfig::default();
    for n in names() {
        assert_eq!(build::<B>(n, &cfg).unwrap().policy_name(), *n);
        let p = format!("pyramid({n})");
        assert_eq!(build::<B>(&p, &cfg).unwrap().policy_name(), p);
    }
    assert_eq!(
        build::<B>("pyramid(pyramid(quest))", &cfg)
            .unwrap()
            .policy_name(),
        "pyramid(pyramid(quest))"
    );
}

#[test]
fn unknown_name_lists_the_known_ones() {
    let err = build::<B>("snapkvv", &SelectConfig::default())
        .err()
        .expect("unknown");
    let msg = err.to_string();
    assert!(matches!(err, SelectError::UnknownName { .. }));
    for n in names() {
        assert!(msg.contains(n), "{msg}");
    }
    assert!(build::<B>("pyramid(nope)", &SelectConfig::default()).is_err());
}

#[test]
fn estimator_configs_parse_and_validate() {
    let cfg = SelectConfig::default();
    assert!(build_with::<B>("quest", &cfg, Some(json!({"page_size": 32}))).is_ok());
    assert!(build_with::<B>("dustin", &cfg, Some(json!({"alpha": 0.7, "heads": [0, 3]}))).is_ok());
    assert!(build_with::<B>("snapkv", &cfg, Some(json!({"obs_window": 16}))).is_ok());
    assert!(build_with::<B>("oracle", &cfg, Some(json!({}))).is_ok());
    assert!(build_with::<B>(
        "pyramid(quest)",
        &cfg,
        Some(json!({"page_size": 8, "pyramid": {"beta": 4.0}}))
    )
    .is_ok());
    // unknown field, wrong type
    let e = build_with::<B>("quest", &cfg, Some(json!({"pagesize": 8})))
        .err()
        .unwrap();
    assert!(matches!(e, SelectError::Config { .. }), "{e}");
    let e = build_with::<B>("oracle", &cfg, Some(json!({"k": 1})))
        .err()
        .unwrap();
    assert!(matches!(e, SelectError::Config { .. }), "{e}");
    // parses but does not validate
    let e = build_with::<B>("dustin", &cfg, Some(json!({"alpha": 1.5})))
        .err()
        .unwrap();
    assert!(
        matches!(e, SelectError::Core(CoreError::InvalidInput { ref name, .. }) if name == "alpha"),
        "{e}"
    );
    let e = build_with::<B>(
        "pyramid(dense)",
        &cfg,
        Some(json!({"pyramid": {"beta": 0.5}})),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("beta"), "{e}");
    // the shared config is validated too, naming `budget`
    let bad = SelectConfig {
        budget: 10,
        n_sink: 4,
        window: 6,
        ..SelectConfig::default()
    };
    let e = build::<B>("streaming", &bad).err().unwrap();
    assert!(
        matches!(e, SelectError::Core(CoreError::InvalidInput { ref name, .. }) if name == "budget"),
        "{e}"
    );
}

#[test]
fn configs_read_from_toml() {
    let text = r#"
        [select]
        budget = 512
        refresh = 4

        [estimator]
        alpha = 0.25
        heads_per_layer = 3
    "#;
    let doc: toml::Table = toml::from_str(text).unwrap();
    let select: SelectConfig = doc["select"].clone().try_into().unwrap();
    assert_eq!(
        select,
        SelectConfig {
            budget: 512,
            refresh: 4,
            ..SelectConfig::default()
        }
    );
    let est = serde_json::to_value(&doc["estimator"]).unwrap();
    let p = build_with::<B>("dustin", &select, Some(est)).unwrap();
    assert_eq!(p.policy_name(), "dustin");
}

#[test]
fn pyramid_budgets_shrink_and_keep_the_total() {
    let cfg = SelectConfig {
        budget: 1024,
        n_sink: 4,
        window: 64,
        ..SelectConfig::default()
    };
    for layers in [1usize, 2, 3, 28, 80] {
        let b = pyramid_budgets(&cfg, layers, 20.0);
        assert_eq!(b.len(), layers);
        assert_eq!(b.iter().sum::<usize>(), layers * 1024, "total kept");
        assert!(b.windows(2).all(|w| w[0] >= w[1]), "non-increasing: {b:?}");
        assert!(b.iter().all(|&x| x >= 68));
        if layers > 1 {
            // free parts: last = 956 / 20, first = 2 * 956 - last
            let (first, last) = ((b[0] - 68) as f64, (b[layers - 1] - 68) as f64);
            assert!((last - 956.0 / 20.0).abs() <= 1.0, "{last}");
            assert!(
                (first - (2.0 * 956.0 - 956.0 / 20.0)).abs() <= 1.0,
                "{first}"
            );
        }
    }
    assert!(
        pyramid_budgets(&cfg, 28, 1.0).iter().all(|&x| x == 1024),
        "beta 1 = uniform"
    );
}

#[test]
fn resolved_config_fills_defaults_and_names_unknown_selectors() {
    use dustin_select::registry::resolved_config;
    let v = resolved_config(
        "pyramid(dustin)",
        Some(json!({"alpha": 0.3, "pyramid": {"beta": 10.0}})),
    )
    .unwrap();
    assert_eq!(v["alpha"], json!(0.3), "given knob kept");
    assert_eq!(v["beta"], json!(0.8), "missing knob takes Dustin's default");
    assert_eq!(v["history_on_reuse"], json!(false));
    assert_eq!(
        v["pyramid"]["beta"],
        json!(10.0),
        "wrapper knobs under `pyramid`"
    );
    assert_eq!(resolved_config("h2o", None).unwrap(), json!({}));
    assert_eq!(
        resolved_config("quest", None).unwrap(),
        json!({"page_size": 16})
    );
    let err = resolved_config("quests", None).unwrap_err().to_string();
    assert!(err.contains("quests") && err.contains("quest"), "{err}");
    assert!(resolved_config("snapkv", Some(json!({"kernal": 7}))).is_err());
}
