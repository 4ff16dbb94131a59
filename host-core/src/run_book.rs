//! The runs the host told its clients about, per session: the one running now, the last
//! one that ended, and the one a stop was sent for.

use std::collections::BTreeMap;

use timeline_core::key::{RunId, SessionId};

/// A session's runs as its clients know them.
#[derive(Clone, Debug, Default)]
struct SessionRuns {
    /// The run the clients were told started and not yet that it ended.
    live: Option<RunId>,
    /// The last run that ended (its late end or rows are old news).
    gone: Option<RunId>,
    /// The run custody sent a stop for: when custody lets it go, it was stopped, not
    /// failed.
    stopping: Option<RunId>,
}

/// Every session's runs, in one place.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunBook {
    sessions: BTreeMap<SessionId, SessionRuns>,
}

impl RunBook {
    /// The run running in `session`, as its clients know.
    pub(crate) fn live(&self, session: &SessionId) -> Option<&RunId> {
        self.sessions.get(session)?.live.as_ref()
    }

    /// The last run of `session` that ended.
    pub(crate) fn gone(&self, session: &SessionId) -> Option<&RunId> {
        self.sessions.get(session)?.gone.as_ref()
    }

    /// The run of `session` a stop was sent for.
    pub(crate) fn stopping(&self, session: &SessionId) -> Option<&RunId> {
        self.sessions.get(session)?.stopping.as_ref()
    }

    /// Every live run.
    pub(crate) fn live_runs(&self) -> impl Iterator<Item = (&SessionId, &RunId)> {
        self.sessions
            .iter()
            .filter_map(|(s, r)| r.live.as_ref().map(|run| (s, run)))
    }

    /// `run` is the one running in `session` now (any other is simply replaced).
    pub(crate) fn set_live(&mut self, session: &SessionId, run: &RunId) {
        self.sessions.entry(session.clone()).or_default().live = Some(run.clone());
    }

    /// A stop was sent for `run`.
    pub(crate) fn stop_sent(&mut self, session: &SessionId, run: &RunId) {
        self.sessions.entry(session.clone()).or_default().stopping = Some(run.clone());
    }

    /// The live `run` of `session` ended; false (and nothing changes) when it is not the
    /// live one.
    pub(crate) fn end(&mut self, session: &SessionId, run: &RunId) -> bool {
        let Some(runs) = self.sessions.get_mut(session) else {
            return false;
        };
        if runs.live.as_ref() != Some(run) {
            return false;
        }
        runs.live = None;
        if runs.stopping.as_ref() == Some(run) {
            runs.stopping = None;
        }
        runs.gone = Some(run.clone());
        true
    }
}
