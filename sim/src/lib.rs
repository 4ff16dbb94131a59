//! # sim
//!
//! A deterministic simulation of the whole system, in the manner of TigerBeetle's VOPR
//! and FoundationDB's simulator: one seed drives a host (`host_core::Host` over memory
//! stores, or SQLite on a temporary file), a simulated agent, one to four clients (a
//! desktop window and phones, each a `timeline_core::Timeline`), a lossy relay between
//! the host and the phones, and a simulated clock. Every choice comes from one
//! [`rng::Rng`], so a seed replays its run bit for bit, and the host is driven only
//! through its public loop, as an embedder drives it.
//!
//! ```
//! let outcome = sim::run(sim::Config::new(7));
//! assert!(outcome.violation.is_none(), "{}", outcome.report());
//! // The same seed gives the same run.
//! assert_eq!(outcome.digest, sim::run(sim::Config::new(7)).digest);
//! ```
//!
//! - [`world`]: the world and its steps; the drive loop of the embedder.
//! - [`faults`]: the fault kinds, their per-run probabilities, the counts.
//! - [`agent`]: the simulated agent, truthful so its answers can be checked.
//! - [`check`]: the invariants, after every step and at quiescence.
//! - [`stores`]: memory and SQLite stores behind failure-injecting wrappers.
//!
//! A failing seed prints one command that replays it with its trace
//! ([`Outcome::report`]); [`shrink`] looks for fewer steps and fewer fault kinds that
//! fail the same way. `cargo run --release -p sim -- --help` lists the options.

#![warn(unreachable_pub)]

pub mod agent;
pub mod check;
pub mod client;
pub mod faults;
pub mod invariant;
pub mod net;
mod observed;
pub mod recorded;
pub mod rng;
pub mod stores;
pub mod trace;
mod user;
pub mod world;

use std::panic::{catch_unwind, AssertUnwindSafe};

pub use faults::{FaultCounts, FaultKind};
pub use invariant::{Invariant, Known, Violation};
pub use stores::Backend;
pub use world::{Config, Stats, World, DEFAULT_STEPS};

/// A deliberate defect a test switches on to show that a check catches it. Each one
/// breaks exactly one invariant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Defect {
    /// Every send reaches the agent twice ([`Invariant::SentTwice`]).
    DuplicateSend,
    /// The store forgets a saved entry the agent never got ([`Invariant::MessageLost`]).
    ForgetEntry,
    /// A sent ledger row is written back as sending ([`Invariant::LedgerWeakened`]).
    WeakenLedger,
    /// The checked rows of a client come out of order ([`Invariant::RowsOutOfOrder`]).
    ShuffleRows,
    /// A client drops its echo as soon as it sends ([`Invariant::EchoVanished`]).
    DropEcho,
    /// Desktop windows ignore every live update ([`Invariant::ViewDiffers`]).
    WindowIgnoresUpdates,
    /// A phone applies replayed events as live ones ([`Invariant::ReplaySideEffect`]).
    ReplayAsLive,
    /// Every decision reaches the agent twice ([`Invariant::ApprovalTwice`]).
    DuplicateDecision,
    /// A client is given a time at the end of all time ([`Invariant::TimerInfinite`]).
    EndlessTimer,
    /// The agent never tells the host a request was resolved
    /// ([`Invariant::ApprovalCardStale`]).
    SilentResolution,
    /// A client applies a live patch on whatever it holds of the same epoch, not only on
    /// the patch's base ([`Invariant::LiveRowsUnsaved`]); the next snapshot would heal it.
    PatchOnAnyBase,
    /// The simulated Codex reports a replace latest's rollback but keeps the rolled-back
    /// turn in its transcript ([`Invariant::ReplacedReappears`]).
    KeepRolledBackTurn,
}

/// What one run did.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The configuration it ran with.
    pub config: Config,
    /// The first violation, if any.
    pub violation: Option<Violation>,
    /// The digest of its trace.
    pub digest: u64,
    /// Trace lines written.
    pub lines: u64,
    /// Faults injected, per kind.
    pub counts: FaultCounts,
    /// The last lines of the trace.
    pub tail: Vec<String>,
    /// The backend it ran on.
    pub backend: Option<Backend>,
    /// Known issues of other crates met, with what was seen.
    pub known: Vec<(Known, String)>,
    /// What the run did.
    pub stats: Stats,
    /// The recorded client's commands and what it showed at the end (`Config::record`).
    pub recording: Option<Recording>,
}

/// What one client was given, as `timeline-wasm` commands, and what it showed at the
/// end: a vector made by the simulator.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Recording {
    /// The client recorded.
    pub client: usize,
    /// Its commands, in order, `new` first.
    pub commands: Vec<serde_json::Value>,
    /// Its timeline's rows at the end, as `{origin, block}`.
    pub rows: Vec<serde_json::Value>,
    /// Its conversation at the end, as `origin:seq:text` (`pending::text` for a
    /// placeholder).
    pub view: Vec<String>,
}

impl Outcome {
    /// The command that replays this run.
    pub fn command(&self) -> String {
        command(&self.config)
    }

    /// A report: the violation, the command that replays it, the last trace lines.
    pub fn report(&self) -> String {
        match &self.violation {
            None => format!("seed {} passed", self.config.seed),
            Some(v) => {
                let mut s = format!(
                    "seed {} violates {} at step {} (t={} ms): {}\nreplay: {}\nlast steps:\n",
                    self.config.seed,
                    v.invariant.name(),
                    v.step,
                    v.time.as_u64(),
                    v.detail,
                    self.command()
                );
                for line in &self.tail {
                    s.push_str("  ");
                    s.push_str(line);
                    s.push('\n');
                }
                s
            }
        }
    }
}

/// The command that replays `cfg`.
pub fn command(cfg: &Config) -> String {
    let mut s = format!("cargo run --release -p sim -- --seed {}", cfg.seed);
    if cfg.steps != DEFAULT_STEPS {
        s.push_str(&format!(" --steps {}", cfg.steps));
    }
    if !cfg.without.is_empty() {
        let names: Vec<&str> = cfg.without.iter().map(|k| k.name()).collect();
        s.push_str(&format!(" --without {}", names.join(",")));
    }
    if !cfg.replace_latest {
        s.push_str(" --no-replace-latest");
    }
    if !cfg.reorder {
        s.push_str(" --no-reorder");
    }
    if let Some(b) = cfg.backend {
        s.push_str(match b {
            Backend::Memory => " --backend memory",
            Backend::Sqlite => " --backend sqlite",
        });
    }
    s.push_str(" --trace");
    s
}

/// Lines of the trace a report shows.
pub const REPORT_LINES: usize = 60;

/// Runs one seed. A panic inside the system counts as a violation.
pub fn run(cfg: Config) -> Outcome {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let mut world = match World::new(cfg.clone()) {
            Ok(w) => w,
            Err(e) => return Err(e),
        };
        world.run();
        Ok(world)
    }));
    match result {
        Ok(Ok(world)) => Outcome {
            violation: world.violations.first().cloned(),
            digest: world.trace.digest(),
            lines: world.trace.len(),
            counts: world.counts.clone(),
            tail: world
                .trace
                .last(REPORT_LINES)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            backend: Some(world.stores_backend()),
            known: world.known.clone(),
            stats: world.stats.clone(),
            recording: world.recording(),
            config: cfg,
        },
        Ok(Err(e)) => failed(
            cfg,
            Invariant::HostDefect,
            format!("the world could not be built: {e}"),
        ),
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic".to_owned());
            failed(cfg, Invariant::HostDefect, format!("panic: {text}"))
        }
    }
}

fn failed(cfg: Config, invariant: Invariant, detail: String) -> Outcome {
    Outcome {
        violation: Some(Violation {
            invariant,
            detail,
            step: 0,
            time: timeline_core::Millis(0),
        }),
        digest: 0,
        lines: 0,
        counts: FaultCounts::default(),
        tail: Vec::new(),
        backend: cfg.backend,
        known: Vec::new(),
        stats: Stats::default(),
        recording: None,
        config: cfg,
    }
}

/// Looks for a smaller run that breaks the same invariant: fewer steps (halving, then
/// trimming), then each fault kind switched off in turn. Returns the smallest failing
/// configuration found (the original when nothing smaller fails).
pub fn shrink(failing: &Outcome) -> Config {
    let Some(v) = &failing.violation else {
        return failing.config.clone();
    };
    let same = |cfg: &Config| {
        run(cfg.clone())
            .violation
            .is_some_and(|w| w.invariant == v.invariant)
    };
    let mut best = failing.config.clone();
    best.backend = failing.backend;
    // Fewer steps: the run's first k steps draw the same numbers, so a prefix replays.
    let mut steps = best.steps.min(v.step.max(1));
    let mut trial = best.clone();
    trial.steps = steps;
    if same(&trial) {
        best = trial;
    } else {
        steps = best.steps;
    }
    let mut lo = 0usize;
    while lo + 1 < steps {
        let mid = (lo + steps) / 2;
        let mut trial = best.clone();
        trial.steps = mid;
        if same(&trial) {
            steps = mid;
            best = trial;
        } else {
            lo = mid;
        }
    }
    // Fewer faults.
    for kind in FaultKind::ALL {
        if best.without.contains(kind) {
            continue;
        }
        let mut trial = best.clone();
        trial.without.push(*kind);
        if same(&trial) {
            best = trial;
        }
    }
    best
}
