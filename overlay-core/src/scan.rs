//! The Codex exact scan after a run's terminal event (OV-06), as a sans-IO machine.
//!
//! When a Codex run ends, the host first writes a journal row (session, run), then scans
//! history for the exact keys of that run in every target of the session: at +0, then
//! +100 ms and +250 ms after the terminal event while keys are still missing (three
//! scans in all), within a 2-minute budget for the whole cleanup. When every key is
//! settled the journal row goes; on failure, when the budget runs out, or when the app
//! quits, the row stays, and the same scans run again when a Codex target of that session
//! opens ([`ExactScans::target_opened`]). Claude has no such path: its rows wait for the
//! next latest window.
//!
//! # Drive loop
//!
//! ```
//! use overlay_core::scan::{ExactScans, ScanEffect, ScanReport};
//! use timeline_core::key::{RunId, SessionId};
//! use timeline_core::time::Millis;
//!
//! let (s, r) = (SessionId::new("s").unwrap(), RunId::new("run-1").unwrap());
//! let mut scans = ExactScans::new();
//! scans.run_ended(s.clone(), r.clone(), Millis(0));
//! assert_eq!(scans.poll_effect(), Some(ScanEffect::WriteJournal { session: s.clone(), run: r.clone() }));
//! scans.journal_written(&s, &r);
//! assert_eq!(scans.poll_effect(), Some(ScanEffect::Scan { session: s.clone(), run: r.clone(), attempt: 1 }));
//! // The embedding scans (see `settle_run`) and reports:
//! scans.handle_scan_result(&s, &r, Ok(ScanReport { all_settled: true }), Millis(5));
//! assert_eq!(scans.poll_effect(), Some(ScanEffect::RemoveJournal { session: s, run: r }));
//! assert_eq!(scans.poll_timeout(), None);
//! ```

use std::collections::{BTreeMap, HashSet, VecDeque};

use timeline_core::key::{BlockKey, RunId, SessionId, TargetId};
use timeline_core::time::Millis;

use crate::overlay::Change;
use crate::store::{self, OverlayError, OverlayStore, RowClass, StoredOverlay};

/// Scans in all.
pub const SCAN_ATTEMPTS: u32 = 3;
/// When the second and third scan are due, after the terminal event.
pub const SCAN_DELAYS: [Millis; 2] = [Millis(100), Millis(250)];
/// The budget of the whole cleanup.
pub const CLEANUP_BUDGET: Millis = Millis(120_000);

/// What the scan machine wants done.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScanEffect {
    /// Write the journal row, then call [`ExactScans::journal_written`].
    WriteJournal {
        /// The app session it concerns.
        session: SessionId,
        /// The run it concerns.
        run: RunId,
    },
    /// Scan history for the run's keys (see [`settle_run`]), then call
    /// [`ExactScans::handle_scan_result`].
    Scan {
        /// The app session it concerns.
        session: SessionId,
        /// The run it concerns.
        run: RunId,
        /// 1, 2 or 3.
        attempt: u32,
    },
    /// Every key settled: remove the journal row.
    RemoveJournal {
        /// The app session it concerns.
        session: SessionId,
        /// The run it concerns.
        run: RunId,
    },
    /// The scans ended without settling everything; the journal row stays for the
    /// restart repair.
    GaveUp {
        /// The app session it concerns.
        session: SessionId,
        /// The run it concerns.
        run: RunId,
    },
}

/// The result of one scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanReport {
    /// True when no ordinary row of the run is left in any target of the session.
    pub all_settled: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for the journal write.
    Journaling { started: Millis },
    /// A scan is running.
    Scanning { started: Millis, attempt: u32 },
    /// Waiting for the next scan.
    Waiting {
        started: Millis,
        attempt: u32,
        at: Millis,
    },
}

impl State {
    fn started(&self) -> Millis {
        match self {
            State::Journaling { started }
            | State::Scanning { started, .. }
            | State::Waiting { started, .. } => *started,
        }
    }
}

/// Every exact scan in progress, keyed by (session, run).
#[derive(Debug, Default)]
pub struct ExactScans {
    scans: BTreeMap<(SessionId, RunId), State>,
    effects: VecDeque<ScanEffect>,
}

impl ExactScans {
    /// No scans.
    pub fn new() -> Self {
        Self::default()
    }

    /// True while a cleanup of (session, run) is in progress.
    pub fn is_active(&self, session: &SessionId, run: &RunId) -> bool {
        self.scans.contains_key(&(session.clone(), run.clone()))
    }

    /// A Codex run ended: journal first, then scan.
    pub fn run_ended(&mut self, session: SessionId, run: RunId, now: Millis) {
        let k = (session.clone(), run.clone());
        if self.scans.contains_key(&k) {
            return;
        }
        self.scans.insert(k, State::Journaling { started: now });
        self.effects
            .push_back(ScanEffect::WriteJournal { session, run });
    }

    /// The journal row is written: the first scan starts at once. (The scan's budget
    /// counts from the run's end, so this takes no time.)
    pub fn journal_written(&mut self, session: &SessionId, run: &RunId) {
        let k = (session.clone(), run.clone());
        if let Some(State::Journaling { started }) = self.scans.get(&k).cloned() {
            self.start_scan(k, started, 1);
        }
    }

    /// A Codex target of `session` opened: restart the scans of every journal row the
    /// store still holds for it (`pending`, from [`crate::store::CleanupJournal`]).
    pub fn target_opened(&mut self, session: &SessionId, pending: &[RunId], now: Millis) {
        for run in pending {
            let k = (session.clone(), run.clone());
            if !self.scans.contains_key(&k) {
                self.start_scan(k, now, 1);
            }
        }
    }

    fn start_scan(&mut self, k: (SessionId, RunId), started: Millis, attempt: u32) {
        self.effects.push_back(ScanEffect::Scan {
            session: k.0.clone(),
            run: k.1.clone(),
            attempt,
        });
        self.scans.insert(k, State::Scanning { started, attempt });
    }

    /// The result of a scan. `Err` (the read failed) counts like a miss.
    pub fn handle_scan_result(
        &mut self,
        session: &SessionId,
        run: &RunId,
        result: Result<ScanReport, ()>,
        now: Millis,
    ) {
        let k = (session.clone(), run.clone());
        let Some(State::Scanning { started, attempt }) = self.scans.get(&k).cloned() else {
            return;
        };
        if result == Ok(ScanReport { all_settled: true }) {
            self.scans.remove(&k);
            self.effects.push_back(ScanEffect::RemoveJournal {
                session: k.0,
                run: k.1,
            });
            return;
        }
        if attempt >= SCAN_ATTEMPTS || now >= started.saturating_add(CLEANUP_BUDGET) {
            self.give_up(k);
            return;
        }
        let at = started.saturating_add(SCAN_DELAYS[(attempt - 1) as usize]);
        if at <= now {
            self.start_scan(k, started, attempt + 1);
        } else {
            self.scans.insert(
                k,
                State::Waiting {
                    started,
                    attempt,
                    at,
                },
            );
        }
    }

    fn give_up(&mut self, k: (SessionId, RunId)) {
        self.scans.remove(&k);
        self.effects.push_back(ScanEffect::GaveUp {
            session: k.0,
            run: k.1,
        });
    }

    /// The next deadline: a scan that is due, or the end of a budget.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.scans
            .values()
            .map(|s| match s {
                State::Waiting { at, .. } => *at,
                other => other.started().saturating_add(CLEANUP_BUDGET),
            })
            .min()
    }

    /// Starts due scans and gives up cleanups whose budget ran out. Safe to call early
    /// or twice.
    pub fn handle_timeout(&mut self, now: Millis) {
        let due: Vec<((SessionId, RunId), State)> = self
            .scans
            .iter()
            .filter(|(_, s)| match s {
                State::Waiting { at, .. } => *at <= now,
                other => other.started().saturating_add(CLEANUP_BUDGET) <= now,
            })
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        for (k, s) in due {
            match s {
                State::Waiting {
                    started, attempt, ..
                } if now < started.saturating_add(CLEANUP_BUDGET) => {
                    self.start_scan(k, started, attempt + 1)
                }
                _ => self.give_up(k),
            }
        }
    }

    /// Drops every scan, and every effect not yet taken, of the sessions `gone` says
    /// yes to: their host let them go, and the host that serves them now repeats the
    /// scans from the cleanup journal's rows.
    pub fn forget(&mut self, gone: impl Fn(&SessionId) -> bool) {
        self.scans.retain(|(s, _), _| !gone(s));
        self.effects.retain(|e| {
            let session = match e {
                ScanEffect::WriteJournal { session, .. }
                | ScanEffect::Scan { session, .. }
                | ScanEffect::RemoveJournal { session, .. }
                | ScanEffect::GaveUp { session, .. } => session,
            };
            !gone(session)
        });
    }

    /// Next effect to carry out.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<ScanEffect> {
        self.effects.pop_front()
    }
}

/// The keys of the run's ordinary rows in every target of the session: what a scan
/// looks for.
pub fn run_keys<S: OverlayStore + ?Sized>(
    store: &mut S,
    session: &SessionId,
    run: &RunId,
) -> Result<HashSet<BlockKey>, OverlayError> {
    let mut keys = HashSet::new();
    for target in store.targets(session)? {
        if let Some(o) = store.load(session, &target)? {
            keys.extend(
                o.blocks
                    .iter()
                    .filter(|b| b.class == RowClass::Ordinary && b.run_id.as_ref() == Some(run))
                    .map(|b| b.block.key()),
            );
        }
    }
    Ok(keys)
}

/// A store failure in the middle of [`settle_run`], with every snapshot stored before it:
/// what was saved must still reach the live sinks ("the producer saves first and sends
/// the saved snapshot").
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{error} (after {} saved snapshot(s))", written.len())]
pub struct SettleError {
    /// What the store said.
    #[source]
    pub error: OverlayError,
    /// The snapshots stored before the failure, with their targets, for the live sinks.
    pub written: Vec<(TargetId, StoredOverlay)>,
}

/// Applies one scan: in every target of the session, the run's ordinary rows whose keys
/// history holds (`found`) leave (epoch + 1 where any left) and the run's ephemeral rows
/// leave. Only the run's own keys are settled: a key of `found` that a row of another run
/// carries stays where it is. Returns the report and every snapshot stored with its
/// target (for the live sinks); on a store failure, the snapshots stored before it come back with the error.
pub fn settle_run<S: OverlayStore + ?Sized>(
    store: &mut S,
    session: &SessionId,
    run: &RunId,
    found: &HashSet<BlockKey>,
) -> Result<(ScanReport, Vec<(TargetId, StoredOverlay)>), SettleError> {
    let mut written = Vec::new();
    match settle_targets(store, session, run, found, &mut written) {
        Ok(all_settled) => Ok((ScanReport { all_settled }, written)),
        Err(error) => Err(SettleError { error, written }),
    }
}

fn settle_targets<S: OverlayStore + ?Sized>(
    store: &mut S,
    session: &SessionId,
    run: &RunId,
    found: &HashSet<BlockKey>,
    written: &mut Vec<(TargetId, StoredOverlay)>,
) -> Result<bool, OverlayError> {
    for target in store.targets(session)? {
        // The run's keys in this target that history holds: the exact keys of that run.
        let own: HashSet<BlockKey> = match store.load(session, &target)? {
            Some(o) => o
                .blocks
                .iter()
                .filter(|b| b.class == RowClass::Ordinary && b.run_id.as_ref() == Some(run))
                .map(|b| b.block.key())
                .filter(|k| found.contains(k))
                .collect(),
            None => HashSet::new(),
        };
        for change in [Change::Settle(own), Change::RunCleanup(run.clone())] {
            if let store::WriteResult::Written { stored, .. } =
                store::write(store, session, &target, &change)?
            {
                written.push((target.clone(), stored.into()));
            }
        }
    }
    Ok(run_keys(store, session, run)?.is_empty())
}
