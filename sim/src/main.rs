//! `sim`: runs seeds of the simulation.
//!
//! ```text
//! sim --seed N [--steps K] [--without kind,...] [--backend memory|sqlite] [--trace]
//!     [--no-replace-latest] [--no-reorder]
//! sim --seeds A..B [--steps K] [--jobs J] [--shrink] [--keep-going] [--no-replace-latest]
//!     [--no-reorder]
//! ```
//!
//! One seed prints its report (and with `--trace` every line of its trace). A range runs
//! across `--jobs` threads (all cores by default) and prints seeds per second, the faults
//! injected per kind and, for each failing seed, its report and the command that
//! replays it. The exit status is 1 when any seed failed.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sim::{Backend, Config, FaultCounts, FaultKind, Outcome};

struct Args {
    seed: Option<u64>,
    range: Option<(u64, u64)>,
    steps: usize,
    without: Vec<FaultKind>,
    backend: Option<Backend>,
    trace: bool,
    jobs: usize,
    shrink: bool,
    keep_going: bool,
    replace_latest: bool,
    reorder: bool,
}

const USAGE: &str = "usage: sim --seed N | --seeds A..B  [--steps K] [--without kind,...] \
[--backend memory|sqlite] [--trace] [--jobs J] [--shrink] [--keep-going] [--no-replace-latest] \
[--no-reorder]";

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seed: None,
        range: None,
        steps: sim::DEFAULT_STEPS,
        without: Vec::new(),
        backend: None,
        trace: false,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        shrink: false,
        keep_going: false,
        replace_latest: true,
        reorder: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--seed" => args.seed = Some(value()?.parse().map_err(|e| format!("--seed: {e}"))?),
            "--seeds" => {
                let v = value()?;
                let (a, b) = v
                    .split_once("..")
                    .ok_or_else(|| format!("--seeds wants A..B, got {v}"))?;
                let a: u64 = a.parse().map_err(|e| format!("--seeds: {e}"))?;
                let b: u64 = b.parse().map_err(|e| format!("--seeds: {e}"))?;
                args.range = Some((a, b));
            }
            "--steps" => args.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--jobs" => args.jobs = value()?.parse().map_err(|e| format!("--jobs: {e}"))?,
            "--without" => {
                for name in value()?.split(',').filter(|n| !n.is_empty()) {
                    let kind = FaultKind::parse(name).ok_or_else(|| {
                        let all: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                        format!("unknown fault kind {name}; kinds: {}", all.join(", "))
                    })?;
                    args.without.push(kind);
                }
            }
            "--backend" => {
                args.backend = Some(match value()?.as_str() {
                    "memory" => Backend::Memory,
                    "sqlite" => Backend::Sqlite,
                    other => return Err(format!("unknown backend {other}")),
                })
            }
            "--trace" => args.trace = true,
            "--shrink" => args.shrink = true,
            "--keep-going" => args.keep_going = true,
            "--no-replace-latest" => args.replace_latest = false,
            "--no-reorder" => args.reorder = false,
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if args.seed.is_none() && args.range.is_none() {
        return Err(USAGE.to_owned());
    }
    Ok(args)
}

fn config(args: &Args, seed: u64) -> Config {
    let mut cfg = Config::new(seed);
    cfg.steps = args.steps;
    cfg.without = args.without.clone();
    cfg.backend = args.backend;
    cfg.replace_latest = args.replace_latest;
    cfg.reorder = args.reorder;
    cfg
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = args.seed {
        let mut cfg = config(&args, seed);
        cfg.echo = args.trace;
        let outcome = sim::run(cfg);
        sim::say!("{}", outcome.report());
        sim::say!(
            "digest {:016x}, {} trace lines, faults: {}",
            outcome.digest,
            outcome.lines,
            summary(&outcome.counts)
        );
        if outcome.violation.is_some() {
            if args.shrink {
                shrink_and_print(&outcome);
            }
            return ExitCode::from(1);
        }
        return ExitCode::SUCCESS;
    }
    let Some((a, b)) = args.range else {
        return ExitCode::from(2);
    };
    soak(&args, a, b)
}

/// How often a run of many seeds prints its progress.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

fn soak(args: &Args, a: u64, b: u64) -> ExitCode {
    let next = Arc::new(AtomicU64::new(a));
    let stop = Arc::new(AtomicBool::new(false));
    let totals = Arc::new(Mutex::new((
        0u64,
        FaultCounts::default(),
        sim::Stats::default(),
    )));
    let failures: Arc<Mutex<Vec<Outcome>>> = Arc::new(Mutex::new(Vec::new()));
    let by_invariant: Arc<Mutex<BTreeMap<&'static str, u64>>> = Arc::default();
    let known: Arc<Mutex<BTreeMap<&'static str, (u64, u64)>>> = Arc::default();
    let start = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..args.jobs.max(1) {
        let (next, stop, totals, failures, by_invariant, known) = (
            Arc::clone(&next),
            Arc::clone(&stop),
            Arc::clone(&totals),
            Arc::clone(&failures),
            Arc::clone(&by_invariant),
            Arc::clone(&known),
        );
        let base = config(args, 0);
        let keep_going = args.keep_going;
        handles.push(std::thread::spawn(move || loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let seed = next.fetch_add(1, Ordering::Relaxed);
            if seed >= b {
                break;
            }
            let mut cfg = base.clone();
            cfg.seed = seed;
            // Without the trace; a failing seed runs again with it, to report.
            cfg.trace = false;
            let mut outcome = sim::run(cfg.clone());
            if outcome.violation.is_some() {
                cfg.trace = true;
                outcome = sim::run(cfg);
            }
            {
                let mut t = totals
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                t.0 += 1;
                t.1.merge(&outcome.counts);
                t.2.merge(&outcome.stats);
            }
            if !outcome.known.is_empty() {
                let mut k = known
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let mut kinds: Vec<&'static str> =
                    outcome.known.iter().map(|(k, _)| k.name()).collect();
                kinds.dedup();
                for kind in kinds {
                    let e = k.entry(kind).or_insert((0, seed));
                    e.0 += 1;
                    e.1 = e.1.min(seed);
                }
            }
            if let Some(v) = &outcome.violation {
                *by_invariant
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .entry(v.invariant.name())
                    .or_default() += 1;
                failures
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(outcome);
                if !keep_going {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }));
    }
    // A progress line on stderr every few seconds while the workers run (a soak runs
    // for many minutes); stdout keeps only the report.
    let mut printed = Instant::now();
    let mut progress_lost = 0u64;
    while !handles.iter().all(std::thread::JoinHandle::is_finished) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        if printed.elapsed() >= PROGRESS_EVERY {
            printed = Instant::now();
            let done = totals
                .lock()
                .map(|t| t.0)
                .unwrap_or_else(|e| e.into_inner().0);
            let failing = failures.lock().map_or(0, |f| f.len());
            let secs = start.elapsed().as_secs_f64();
            let rate = done as f64 / secs.max(f64::EPSILON);
            let left = b.saturating_sub(a).saturating_sub(done) as f64 / rate.max(f64::EPSILON);
            // A progress line that cannot be written stops nothing: the run goes on, the
            // next line tries again, and the report says how many were lost.
            if writeln!(
                std::io::stderr(),
                "progress: {done} of {} seeds, {rate:.0} seeds/s, {failing} failing, {secs:.0} s so far, about {left:.0} s left",
                b.saturating_sub(a)
            )
            .is_err()
            {
                progress_lost += 1;
            }
        }
    }
    for h in handles {
        if h.join().is_err() {
            eprintln!("a worker thread panicked");
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let (seeds, counts, stats) = totals
        .lock()
        .map(|t| t.clone())
        .unwrap_or_else(|e| e.into_inner().clone());
    let mut failures = failures
        .lock()
        .map(|f| f.clone())
        .unwrap_or_else(|e| e.into_inner().clone());
    failures.sort_by_key(|o| o.config.seed);
    sim::say!(
        "{seeds} seeds ({}..{b}, {} steps, {} jobs) in {secs:.1} s: {:.0} seeds/s",
        a,
        args.steps,
        args.jobs,
        seeds as f64 / secs.max(1e-9)
    );
    if progress_lost > 0 {
        sim::say!("{progress_lost} progress lines could not be written to stderr");
    }
    sim::say!("faults injected: {}", summary(&counts));
    sim::say!(
        "the runs did: {} messages ({} delivered), {} approvals asked ({} decisions taken), \
{} loads, {} replays, {} relay events, {} host restarts",
        stats.messages,
        stats.delivered,
        stats.approvals,
        stats.decided,
        stats.loads,
        stats.replays,
        stats.relay_events,
        stats.restarts
    );
    sim::say!(
        "replace latest: {} sent ({} refused by Claude), {} rollback sends, {} turns rolled back, \
{} rollbacks asked again, {} threads gone, {} fresh-thread sends",
        stats.replace_latest,
        stats.replace_refused,
        stats.rollback_sends,
        stats.rollbacks,
        stats.rollbacks_again,
        stats.threads_gone,
        stats.fresh_sends
    );
    sim::say!(
        "reorders: {} asked, {} carried out",
        stats.reorders,
        stats.reordered
    );
    let known = known
        .lock()
        .map(|k| k.clone())
        .unwrap_or_else(|e| e.into_inner().clone());
    for (kind, (n, seed)) in &known {
        sim::say!("known issue {kind}: met in {n} seed(s), first seed {seed}");
    }
    if failures.is_empty() {
        sim::say!("no violation");
        return ExitCode::SUCCESS;
    }
    let by = by_invariant
        .lock()
        .map(|m| m.clone())
        .unwrap_or_else(|e| e.into_inner().clone());
    sim::say!("{} failing seed(s): {by:?}", failures.len());
    for f in failures.iter().take(3) {
        sim::say!("\n{}", f.report());
    }
    for f in failures.iter().skip(3).take(50) {
        let v = f.violation.as_ref().map_or("?", |v| v.invariant.name());
        sim::say!("{v}: {}", f.command());
    }
    if args.shrink {
        if let Some(first) = failures.first() {
            shrink_and_print(first);
        }
    }
    ExitCode::from(1)
}

fn shrink_and_print(outcome: &Outcome) {
    let small = sim::shrink(outcome);
    sim::say!("shrunk: {}", sim::command(&small));
    let again = sim::run(small);
    sim::say!("{}", again.report());
}

fn summary(counts: &FaultCounts) -> String {
    let parts: Vec<String> = counts
        .injected()
        .iter()
        .map(|(k, n)| format!("{}={n}", k.name()))
        .collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        format!("{} (total {})", parts.join(" "), counts.total())
    }
}
