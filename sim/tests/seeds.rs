//! The CI-sized run: a range of seeds on two threads, no violation allowed. Every fault
//! kind must have struck and every kind of user action must have reached the host, so
//! a run that silently stops exercising something fails too.
//!
//! `SIM_SEEDS` sets how many seeds (2,000 by default; the soak command runs hundreds of
//! thousands), `SIM_FIRST_SEED` where they start.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sim::{Config, FaultCounts, FaultKind, Outcome, Stats};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn a_range_of_seeds_keeps_every_invariant() {
    let first = env("SIM_FIRST_SEED", 0);
    let seeds = env("SIM_SEEDS", 2000);
    let next = Arc::new(AtomicU64::new(first));
    let found: Arc<Mutex<(Vec<Outcome>, FaultCounts, Stats)>> = Arc::default();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (next, found) = (Arc::clone(&next), Arc::clone(&found));
            std::thread::spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= first + seeds {
                    break;
                }
                let mut cfg = Config::new(seed);
                cfg.trace = false;
                let outcome = sim::run(cfg.clone());
                let mut f = found
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                f.1.merge(&outcome.counts);
                f.2.merge(&outcome.stats);
                if outcome.violation.is_some() {
                    // Run it again with its trace, for the report.
                    cfg.trace = true;
                    f.0.push(sim::run(cfg));
                }
            })
        })
        .collect();
    for w in workers {
        assert!(w.join().is_ok(), "a worker panicked");
    }
    let (failures, counts, stats) = Arc::try_unwrap(found)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .expect("the workers are done");
    if let Some(first) = failures.iter().min_by_key(|o| o.config.seed) {
        let commands: Vec<String> = failures.iter().map(Outcome::command).collect();
        panic!(
            "{} of {seeds} seeds failed:\n{}\n\n{}",
            failures.len(),
            commands.join("\n"),
            first.report()
        );
    }
    assert_eq!(stats.runs, seeds);
    if seeds >= 100 {
        for kind in FaultKind::ALL {
            assert!(counts.get(*kind) > 0, "{} never struck", kind.name());
        }
        assert!(stats.delivered > 0 && stats.delivered < stats.messages);
        assert!(stats.decided > 0, "no decision was taken");
        assert!(stats.replays > 0 && stats.relay_events > 0 && stats.loads > 0);
        assert!(stats.restarts > 0);
        // Replace latest: rolled back on Codex, refused by Claude, and a thread gone
        // now and then, sent again to a fresh one.
        assert!(
            stats.rollback_sends > 0 && stats.rollbacks > 0,
            "no rollback"
        );
        assert!(
            stats.replace_refused > 0,
            "Claude never refused a replace latest"
        );
        assert!(
            stats.threads_gone > 0 && stats.fresh_sends > 0,
            "no thread was gone"
        );
        // OB-11: reorders reach the host, and some move a message.
        assert!(
            stats.reorders > 0 && stats.reordered > 0,
            "no reorder was carried out ({} asked)",
            stats.reorders
        );
    }
}
