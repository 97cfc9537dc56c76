//! Prompts, task names and runs of the LongBench harness.

use super::prompt::prompt_limit;
use super::*;
use crate::harness::selectors::{selector_specs_from, BudgetSpec};

#[test]
fn middle_truncation_keeps_head_and_tail_halves() {
    let ids: Vec<u32> = (0..10).collect();
    assert_eq!(truncate_middle(&ids, 6), [0, 1, 2, 7, 8, 9]);
    assert_eq!(truncate_middle(&ids, 4), [0, 1, 8, 9]);
    // odd limits keep 2 * floor(limit / 2), as pred.py's half = int(max_length / 2)
    assert_eq!(truncate_middle(&ids, 7), [0, 1, 2, 7, 8, 9]);
    assert_eq!(truncate_middle(&ids, 9), [0, 1, 2, 3, 6, 7, 8, 9]);
    assert_eq!(truncate_middle(&ids, 3), [0, 9]);
    // at or under the limit: unchanged
    assert_eq!(truncate_middle(&ids, 10), ids);
    assert_eq!(truncate_middle(&ids, 11), ids);
    let odd: Vec<u32> = (100..111).collect(); // 11 ids
    assert_eq!(truncate_middle(&odd, 5), [100, 101, 109, 110]);
    assert_eq!(
        truncate_middle(&odd, 8),
        [100, 101, 102, 103, 107, 108, 109, 110]
    );
}

#[test]
fn prompt_limits_leave_room_for_generation_and_the_last_block() {
    assert_eq!(prompt_limit("trec", 512, 64, 4, 0).unwrap(), 444);
    assert_eq!(prompt_limit("qasper", 1024, 128, 4, 9).unwrap(), 883);
    assert!(prompt_limit("gov_report", 512, 512, 4, 0)
        .unwrap_err()
        .to_string()
        .contains("--ctx 512: too short for task gov_report"));
    assert!(prompt_limit("trec", 69, 64, 4, 0).is_err());
    assert_eq!(prompt_limit("trec", 70, 64, 4, 0).unwrap(), 2);
}

#[test]
fn unknown_tasks_are_named() {
    assert_eq!(check_task("trec").unwrap(), 64);
    assert_eq!(check_task("gov_report").unwrap(), 512);
    let e = check_task("nope").unwrap_err().to_string();
    assert!(
        e.starts_with("--tasks nope: unknown LongBench task; known: narrativeqa, qasper"),
        "{e}"
    );
}

#[test]
fn dense_runs_once_and_budgets_resolve_per_context() {
    let specs = selector_specs_from(&["dense".into(), "streaming".into()], &[], &[]).unwrap();
    let budgets = vec![
        ("1/8".to_string(), BudgetSpec::parse("1/8").unwrap()),
        ("100".to_string(), BudgetSpec::parse("100").unwrap()),
    ];
    let runs = run_specs(&specs, &budgets, 1024).unwrap();
    let got: Vec<(String, Option<usize>)> = runs
        .iter()
        .map(|r| (r.sel.label.clone(), r.budget))
        .collect();
    assert_eq!(
        got,
        [
            ("dense".to_string(), None),
            ("streaming".to_string(), Some(128)),
            ("streaming".to_string(), Some(100)),
        ]
    );
    let tiny = vec![("1/4096".to_string(), BudgetSpec::parse("1/4096").unwrap())];
    assert!(run_specs(&specs, &tiny, 1024)
        .unwrap_err()
        .to_string()
        .contains("--budget 1/4096: 0 tokens"));
}
