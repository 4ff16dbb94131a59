//! The history of ACP sessions, as the host's history source.
//!
//! ACP v1 has no call that pages a session's saved history: `session/load` replays the
//! whole conversation as `session/update` notifications, and that replay is history,
//! never live output. [`AcpHistory`] keeps, per session, the rows of that replay and of
//! every turn the agent ended since (its prompt answered), and serves them as a
//! [`HistorySource`] ([`AcpHistory::source`]). It is shared between the agent, which
//! writes it, and the host's history sources, which read it (an `Arc<Mutex<_>>`).
//!
//! Pages use the JSON cursor form the seed gives Claude: the ACP session ID names the
//! source (its boundary token) and an item's position is its row key.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use overlay_core::source::{
    HistorySource, SourceError, SourceItem, SourceKind, SourcePage, SourcePosition,
};
use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{OperationId, SessionId};
use timeline_core::order::SourceOrder;

#[derive(Debug, Default)]
struct Saved {
    acp_session: String,
    /// Rows oldest first, each with its position.
    rows: Vec<(String, Block)>,
    /// Position to index.
    at: BTreeMap<String, usize>,
    /// The operations its user rows carry (a history read is a lookup, not a scan).
    ops: BTreeSet<OperationId>,
    /// Whether the history was read from the agent (a replay) or began empty here.
    known: bool,
}

/// The history of every session one ACP agent serves. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct AcpHistory {
    inner: Arc<Mutex<BTreeMap<SessionId, Saved>>>,
}

impl AcpHistory {
    /// An empty history.
    pub fn new() -> AcpHistory {
        AcpHistory::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<SessionId, Saved>) -> R) -> R {
        // A panic elsewhere while the lock was held leaves whole rows behind (each
        // change below is one push or one replace), so the data stays usable.
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut g)
    }

    /// Replaces the history of `session` (ACP session `acp_session`) with `rows`, the
    /// rows of a `session/load` replay.
    pub fn replace(&self, session: &SessionId, acp_session: &str, rows: Vec<Block>) {
        self.with(|m| {
            let mut s = Saved {
                acp_session: acp_session.to_owned(),
                known: true,
                ..Saved::default()
            };
            for b in rows {
                push(&mut s, b);
            }
            m.insert(session.clone(), s);
        });
    }

    /// Starts an empty history for a new ACP session.
    pub fn begin(&self, session: &SessionId, acp_session: &str) {
        self.with(|m| {
            m.insert(
                session.clone(),
                Saved {
                    acp_session: acp_session.to_owned(),
                    known: true,
                    ..Saved::default()
                },
            );
        });
    }

    /// Appends the rows of a turn the agent ended.
    pub fn append(&self, session: &SessionId, rows: Vec<Block>) {
        self.with(|m| {
            if let Some(s) = m.get_mut(session) {
                for b in rows {
                    push(s, b);
                }
            }
        });
    }

    /// Forgets `session`.
    pub fn forget(&self, session: &SessionId) {
        self.with(|m| {
            m.remove(session);
        });
    }

    /// Whether the history holds a user row carrying `op`.
    pub fn holds(&self, session: &SessionId, op: &OperationId) -> bool {
        self.with(|m| m.get(session).is_some_and(|s| s.ops.contains(op)))
    }

    /// Whether the history of `session` was read (or begun) here.
    pub fn known(&self, session: &SessionId) -> bool {
        self.with(|m| m.get(session).is_some_and(|s| s.known))
    }

    /// The rows of `session`, oldest first.
    pub fn rows(&self, session: &SessionId) -> Vec<Block> {
        self.with(|m| {
            m.get(session)
                .map(|s| s.rows.iter().map(|(_, b)| b.clone()).collect())
                .unwrap_or_default()
        })
    }

    /// The history source of `session`'s main timeline.
    pub fn source(&self, session: &SessionId) -> AcpSource {
        AcpSource {
            history: self.clone(),
            session: session.clone(),
        }
    }
}

fn push(s: &mut Saved, b: Block) {
    if let Some(op) = &b.operation_id {
        s.ops.insert(op.clone());
    }
    let position = b.key().to_string();
    match s.at.get(&position) {
        Some(&i) => s.rows[i].1 = b.with_source_order(SourceOrder::history(0, i as u64)),
        None => {
            let i = s.rows.len();
            s.at.insert(position.clone(), i);
            s.rows.push((
                position,
                b.with_source_order(SourceOrder::history(0, i as u64)),
            ));
        }
    }
}

fn item((position, block): &(String, Block)) -> SourceItem {
    SourceItem {
        position: SourcePosition(position.clone()),
        blocks: vec![block.clone()],
    }
}

/// One session's history as a [`HistorySource`] (see the module doc).
#[derive(Clone, Debug)]
pub struct AcpSource {
    history: AcpHistory,
    session: SessionId,
}

impl HistorySource for AcpSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Claude {
            session: self.acp_session(),
        }
    }

    fn boundary_token(&self) -> BoundaryToken {
        BoundaryToken::claude(&self.acp_session())
    }

    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        self.history.with(|m| {
            let Some(s) = m.get(&self.session) else {
                return Ok(SourcePage::default());
            };
            let end = match before {
                None => s.rows.len(),
                Some(p) => *s.at.get(&p.0).ok_or(SourceError::PositionGone)?,
            };
            let start = end.saturating_sub(limit);
            let items = s.rows[start..end].iter().rev().map(item).collect();
            Ok(SourcePage {
                items,
                more: start > 0,
            })
        })
    }

    fn read_newer(
        &mut self,
        after: &SourcePosition,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        self.history.with(|m| {
            let s = m.get(&self.session).ok_or(SourceError::PositionGone)?;
            let from = *s.at.get(&after.0).ok_or(SourceError::PositionGone)? + 1;
            let end = from.saturating_add(limit).min(s.rows.len());
            let items = s.rows[from..end].iter().map(item).collect();
            Ok(SourcePage {
                items,
                more: end < s.rows.len(),
            })
        })
    }
}

impl AcpSource {
    fn acp_session(&self) -> String {
        self.history.with(|m| {
            m.get(&self.session)
                .map(|s| s.acp_session.clone())
                .unwrap_or_else(|| self.session.as_str().to_owned())
        })
    }
}
