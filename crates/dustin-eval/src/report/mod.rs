//! Reporting: result tables (Markdown and JSON), SVG line plots, and a resumable JSONL store of
//! finished records, and the confidence intervals of the tables.

pub mod interval;
mod plot;
mod store;
mod table;

pub use interval::{
    bootstrap_mean, bootstrap_ratio, bootstrap_ratio_of_means, wilson, Interval, IntervalError,
};
pub use plot::plot_lines;
pub use store::ResultStore;
pub use table::{Cell, Table};

/// Where a table's rows ran, for its title: `on <device>` when every row names the same one,
/// `on <a> (n rows), <b> (m rows)` otherwise, in first-seen order; rows stored before their
/// device was kept (empty) count as `device not recorded`. Empty for no rows.
pub fn devices_note<'a>(devices: impl IntoIterator<Item = &'a str>) -> String {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for d in devices {
        let d = if d.is_empty() {
            "device not recorded"
        } else {
            d
        };
        match seen.iter_mut().find(|(s, _)| *s == d) {
            Some((_, n)) => *n += 1,
            None => seen.push((d, 1)),
        }
    }
    match seen.as_slice() {
        [] => String::new(),
        [(d, _)] => format!("on {d}"),
        _ => format!(
            "on {}",
            seen.iter()
                .map(|(d, n)| format!("{d} ({n} row{})", if *n == 1 { "" } else { "s" }))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::devices_note;

    #[test]
    fn devices_note_names_one_device_or_counts_each() {
        assert_eq!(devices_note([]), "");
        assert_eq!(
            devices_note(["cuda:0 H100", "cuda:0 H100"]),
            "on cuda:0 H100"
        );
        assert_eq!(
            devices_note([
                "cpu: Xeon, 2 threads",
                "",
                "cpu: Xeon, 2 threads",
                "cuda:0 H100"
            ]),
            "on cpu: Xeon, 2 threads (2 rows), device not recorded (1 row), cuda:0 H100 (1 row)"
        );
    }
}
