//! A profile of the host (CPU) side of `dustin-bench e2e`'s timed iterations
//! (`--host-profile DIR`).
//!
//! Why: on the GPU the per-layer time of decoding at batch 1 is several times what its
//! kernels take (docs/perf.md), so the host's own work (op dispatch, allocation, launches)
//! may set the speed. Two parts:
//! - every thread's CPU time over the window, exact, from Linux's
//!   `/proc/self/task/*/schedstat` (nanoseconds on a CPU), next to the window's wall time.
//!   A thread near 100% never sleeps, but it may be spinning: CUDA's default
//!   synchronisation and cubecl's task queue both spin-wait, so read it with the stacks and
//!   with the GPU's own utilization;
//! - with the cargo feature `host-profile`, sampled stacks (pprof-rs, `SIGPROF` at
//!   [`FREQUENCY_HZ`] of CPU time; the kernel's timer tick can deliver fewer, so read the
//!   samples as shares and take CPU time from the first part). The report lists functions
//!   by self samples (the innermost frame) and inclusive samples (anywhere on the stack,
//!   counted once per sample), over all threads and for each busy thread apart (on CUDA the
//!   caller's thread builds the ops and cubecl's device thread runs them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::CliError;

/// Samples per second of CPU time (pprof-rs's `SIGPROF` timer). 997 is prime, so the timer
/// does not beat with periodic work.
pub const FREQUENCY_HZ: i32 = 997;

/// Functions listed per table of the report (all threads).
const TOP: usize = 45;
/// Functions listed per table of one thread.
const THREAD_TOP: usize = 25;
/// Threads given tables of their own: the busiest, at most this many ...
const THREAD_TABLES: usize = 3;
/// ... of at least this share of the samples, in percent.
const THREAD_TABLE_SHARE: usize = 5;

/// A running profile; [`HostProfile::finish`] writes its report.
pub struct HostProfile {
    #[cfg(feature = "host-profile")]
    guard: pprof::ProfilerGuard<'static>,
    path: PathBuf,
    wall: Instant,
    cpu: HashMap<u64, (String, u64)>,
}

/// Every thread of this process: id -> (name, nanoseconds on a CPU so far), from
/// `/proc/self/task/*/{comm,schedstat}`; empty where /proc is missing (not Linux).
fn thread_cpu_ns() -> HashMap<u64, (String, u64)> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u64>().ok()) else {
            continue;
        };
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
        if let Some(ns) = schedstat_run_ns(&read("schedstat")) {
            out.insert(tid, (read("comm").trim().to_string(), ns));
        }
    }
    out
}

/// The time on a CPU, in nanoseconds, of one `/proc/<pid>/task/<tid>/schedstat` line: its
/// first field of three (run time, wait time, time slices; the kernel's
/// `Documentation/scheduler/sched-stats.rst`). `None` for anything else.
fn schedstat_run_ns(line: &str) -> Option<u64> {
    let mut fields = line.split_whitespace();
    let run = fields.next()?.parse::<u64>().ok()?;
    // wait time and time slices must follow as numbers
    for _ in 0..2 {
        fields.next()?.parse::<u64>().ok()?;
    }
    Some(run)
}

impl HostProfile {
    /// Starts the window (and sampling, with the `host-profile` feature); the report will go
    /// to `dir/name.txt`.
    ///
    /// # Errors
    /// [`CliError::Io`] when `dir` cannot be created; [`CliError::Usage`] when the sampling
    /// profiler cannot start.
    pub fn start(dir: &Path, name: &str) -> Result<Self, CliError> {
        std::fs::create_dir_all(dir).map_err(|source| CliError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let path = dir.join(format!("{name}.txt"));
        // samples that land in the unwinder or the dynamic loader are dropped (unwinding from
        // there can deadlock); those in libc (futex waits, sched_yield, memcpy) are kept
        #[cfg(feature = "host-profile")]
        {
            let guard = pprof::ProfilerGuardBuilder::default()
                .frequency(FREQUENCY_HZ)
                .blocklist(&["libgcc_s", "ld-linux", "vdso"])
                .build()
                .map_err(|e| CliError::Usage(format!("--host-profile: cannot start: {e}")))?;
            Ok(Self {
                guard,
                path,
                wall: Instant::now(),
                cpu: thread_cpu_ns(),
            })
        }
        #[cfg(not(feature = "host-profile"))]
        Ok(Self {
            path,
            wall: Instant::now(),
            cpu: thread_cpu_ns(),
        })
    }

    /// Stops sampling and writes the report (`label` heads it); returns the report's path.
    ///
    /// # Errors
    /// [`CliError::Io`] when the report cannot be written; [`CliError::Usage`] when the
    /// profiler cannot build its report.
    pub fn finish(self, label: &str) -> Result<PathBuf, CliError> {
        let wall_ns = self.wall.elapsed().as_nanos() as u64;
        let now = thread_cpu_ns();
        let threads: Vec<(String, u64)> = now
            .iter()
            .map(|(tid, (name, ns))| {
                let before = self.cpu.get(tid).map_or(0, |b| b.1);
                (format!("{name} ({tid})"), ns.saturating_sub(before))
            })
            .filter(|t| t.1 > 0)
            .collect();
        #[cfg(feature = "host-profile")]
        let stacks: Vec<(Vec<String>, String, usize)> = {
            let report = self
                .guard
                .report()
                .build()
                .map_err(|e| CliError::Usage(format!("--host-profile: no report: {e}")))?;
            report
                .data
                .iter()
                .map(|(frames, &n)| {
                    let names = frames
                        .frames
                        .iter()
                        .flat_map(|f| f.iter().map(|s| s.name()))
                        .collect();
                    // threads share a name (rayon's workers, the main thread): the id tells them apart
                    let thread = format!(
                        "{} (pthread {:#x})",
                        frames.thread_name_or_id(),
                        frames.thread_id
                    );
                    (names, thread, n.max(0) as usize)
                })
                .collect()
        };
        #[cfg(not(feature = "host-profile"))]
        let stacks: Vec<(Vec<String>, String, usize)> = Vec::new();
        let text = render(label, wall_ns, &threads, &stacks);
        std::fs::write(&self.path, text).map_err(|source| CliError::Io {
            path: self.path.display().to_string(),
            source,
        })?;
        Ok(self.path)
    }
}

/// Strips the hash suffix (`::h0123abcd...`) rustc adds to a symbol.
fn short(name: &str) -> &str {
    match name.rfind("::h") {
        Some(i) if name.len() - i == 19 && name[i + 3..].bytes().all(|b| b.is_ascii_hexdigit()) => {
            &name[..i]
        }
        _ => name,
    }
}

/// The report's text: the window's wall time and each thread's CPU time in it (`threads`:
/// name, nanoseconds), then, where `stacks` has samples (frames innermost first, thread,
/// samples), samples per thread and the top functions by self and by inclusive samples.
fn render(
    label: &str,
    wall_ns: u64,
    threads: &[(String, u64)],
    stacks: &[(Vec<String>, String, usize)],
) -> String {
    let mut out = format!(
        "host profile: {label}\nwall {:.2} ms; CPU time per thread (schedstat):\n",
        wall_ns as f64 / 1e6
    );
    let mut threads = threads.to_vec();
    threads.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    for (t, ns) in &threads {
        out += &format!(
            "{:>10.2} ms {:>5.1}%  {t}\n",
            *ns as f64 / 1e6,
            100.0 * *ns as f64 / wall_ns.max(1) as f64
        );
    }
    let total: usize = stacks.iter().map(|s| s.2).sum();
    if total == 0 {
        out += "\nno stack samples (the `host-profile` feature samples stacks)\n";
        return out;
    }
    let mut per_thread: HashMap<&str, usize> = HashMap::new();
    for (_, thread, n) in stacks {
        *per_thread.entry(thread.as_str()).or_default() += n;
    }
    let per_thread = sorted(per_thread);
    out += &format!("\n{total} stack samples (requested {FREQUENCY_HZ} Hz of CPU time)\n");
    for (t, n) in &per_thread {
        out += &format!("{n:>8} {:>5.1}%  {t}\n", pct(*n, total));
    }
    out += &function_tables("", stacks.iter(), TOP);
    // the busiest threads apart: the caller's thread and cubecl's device thread do different
    // work (building ops, launching them), which the tables of all threads mix
    for (t, n) in per_thread
        .iter()
        .filter(|(_, n)| *n * 100 >= total * THREAD_TABLE_SHARE)
        .take(THREAD_TABLES)
    {
        out += &format!("\nthread {t} ({n} samples):");
        out += &function_tables(
            &format!(" of thread {t}"),
            stacks.iter().filter(|s| &s.1 == t),
            THREAD_TOP,
        );
    }
    out
}

/// `100 n / total`.
fn pct(n: usize, total: usize) -> f64 {
    100.0 * n as f64 / total.max(1) as f64
}

/// `m`'s entries by count, largest first (ties by name).
fn sorted(m: HashMap<&str, usize>) -> Vec<(String, usize)> {
    let mut v: Vec<(String, usize)> = m.into_iter().map(|(k, n)| (k.to_string(), n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// The `top` functions of `stacks` (frames innermost first, thread, samples) by self samples
/// (the innermost frame) and by inclusive samples (anywhere on the stack, once per sample),
/// in percent of these stacks' samples; `of` follows "samples" in the titles.
fn function_tables<'a>(
    of: &str,
    stacks: impl Iterator<Item = &'a (Vec<String>, String, usize)>,
    top: usize,
) -> String {
    use std::collections::HashSet;
    let mut own: HashMap<&str, usize> = HashMap::new();
    let mut incl: HashMap<&str, usize> = HashMap::new();
    let mut total = 0;
    for (frames, _, n) in stacks {
        total += n;
        if let Some(f) = frames.first() {
            *own.entry(short(f)).or_default() += n;
        }
        let mut seen = HashSet::new();
        for f in frames {
            if seen.insert(short(f)) {
                *incl.entry(short(f)).or_default() += n;
            }
        }
    }
    let mut out = String::new();
    for (title, m) in [("self", own), ("inclusive", incl)] {
        out += &format!("\ntop {top} by {title} samples{of}:\n");
        for (f, n) in sorted(m).into_iter().take(top) {
            out += &format!("{n:>8} {:>5.1}%  {f}\n", pct(n, total));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_line_gives_run_time() {
        assert_eq!(schedstat_run_ns("1234567 890 12\n"), Some(1_234_567));
        assert_eq!(schedstat_run_ns("0 0 0"), Some(0));
        assert_eq!(schedstat_run_ns(""), None);
        assert_eq!(schedstat_run_ns("12 34"), None);
        assert_eq!(schedstat_run_ns("x 1 2"), None);
        assert_eq!(schedstat_run_ns("-5 1 2"), None);
    }

    #[test]
    fn the_calling_thread_is_listed() {
        let Ok(me) = std::fs::read_link("/proc/thread-self") else {
            return; // not Linux: no /proc
        };
        let tid: u64 = me
            .file_name()
            .and_then(|t| t.to_str())
            .and_then(|t| t.parse().ok())
            .expect("/proc/thread-self names a thread id");
        let threads = thread_cpu_ns();
        assert!(threads.contains_key(&tid), "{tid} missing from {threads:?}");
        assert!(!threads[&tid].0.is_empty(), "{threads:?}");
    }

    #[test]
    fn short_strips_only_a_rustc_hash() {
        assert_eq!(short("a::b::h0123456789abcdef"), "a::b");
        assert_eq!(short("a::b::hello"), "a::b::hello");
        assert_eq!(short("a::b::h0123456789abcdeg"), "a::b::h0123456789abcdeg");
    }

    #[test]
    fn render_counts_self_once_and_inclusive_once_per_sample() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // recursion: `f` twice on one stack counts once inclusive
        let stacks = vec![
            (s(&["leaf", "f", "f", "main"]), "main".to_string(), 3),
            (s(&["g", "main"]), "main".to_string(), 1),
            (s(&["leaf", "worker"]), "w".to_string(), 4),
        ];
        let r = render("x", 2_000_000, &[("main".into(), 1_500_000)], &stacks);
        assert!(r.contains("wall 2.00 ms"), "{r}");
        assert!(r.contains("      1.50 ms  75.0%  main"), "{r}");
        assert!(r.contains("8 stack samples"), "{r}");
        let self_part = &r[r.find("by self").unwrap()..r.find("by inclusive").unwrap()];
        assert!(self_part.contains("       7  87.5%  leaf"), "{self_part}");
        assert!(self_part.contains("       1  12.5%  g"), "{self_part}");
        let incl = &r[r.find("by inclusive").unwrap()..];
        assert!(incl.contains("       3  37.5%  f\n"), "{incl}");
        assert!(incl.contains("       4  50.0%  main"), "{incl}");
        assert!(
            r.contains("       4  50.0%  main\n       4  50.0%  w"),
            "{r}"
        );
        // each thread's own tables, in shares of its own samples
        let main = &r[r.find("thread main (4 samples)").expect("main's tables")..];
        let main = &main[..main.find("thread w (4 samples)").expect("w's tables")];
        assert!(
            main.contains(
                "by self samples of thread main:\n       3  75.0%  leaf\n       1  25.0%  g\n"
            ),
            "{main}"
        );
        assert!(main.contains("       3  75.0%  f\n"), "{main}");
        let w = &r[r.find("thread w (4 samples)").unwrap()..];
        assert!(
            w.contains("by self samples of thread w:\n       4 100.0%  leaf\n"),
            "{w}"
        );
        assert!(!w.contains("  main\n"), "{w}");
    }

    #[test]
    fn a_thread_under_the_share_gets_no_tables() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let stacks = vec![
            (s(&["a", "main"]), "main".to_string(), 99),
            (s(&["b"]), "quiet".to_string(), 1),
        ];
        let r = render("x", 1_000_000, &[], &stacks);
        assert!(r.contains("thread main (99 samples)"), "{r}");
        assert!(!r.contains("thread quiet"), "{r}");
    }
}
