//! Identities of a message (OB-01) and the outbox scope of a session (OB-06).
//!
//! `sessionId`, `operationId` and `runId` are shared with the timeline
//! ([`timeline_core::key`]); the rest are defined here. Each is a distinct newtype that
//! refuses blank text, so a queue ID can never be passed where an operation ID belongs.

pub use timeline_core::key::{OperationId, RunId, SessionId};
use timeline_core::string_id;

string_id!(
    /// The visible entry in an outbox; kept when the message is edited.
    QueueId,
    "queue ID"
);
string_id!(
    /// The remote mutation request (its replay rules belong to the RPC layer).
    IdempotencyKey,
    "idempotency key"
);
string_id!(
    /// An agent thread.
    ThreadId,
    "thread ID"
);
string_id!(
    /// The exact agent turn that accepted an operation.
    TurnId,
    "turn ID"
);
string_id!(
    /// A tool call of an agent (`send_session_message`).
    CallId,
    "call ID"
);

/// The suffix of an alias session that shares its base session's outbox scope.
pub const ALIAS_SUFFIX: &str = "::skills-agent";

/// The base session of `session` (the session itself, or the session an alias names).
pub fn base_session(session: &SessionId) -> SessionId {
    match session.as_str().strip_suffix(ALIAS_SUFFIX) {
        Some(base) if !base.trim().is_empty() => {
            SessionId::new(base).unwrap_or_else(|_| session.clone())
        }
        _ => session.clone(),
    }
}

/// An outbox scope (OB-06): a base session and its alias (`s` and `s::skills-agent`)
/// share one outbox scope, one ledger and one run registry. A scope is named by its base
/// session, so a value of this type is never an alias: the ledger, custody's memory of
/// it and the scopes a host was granted are keyed by it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ScopeId(SessionId);

impl ScopeId {
    /// The scope `session` belongs to (its own, or its base's when it is an alias).
    pub fn of(session: &SessionId) -> ScopeId {
        ScopeId(base_session(session))
    }

    /// The base session, which names the scope.
    pub fn base(&self) -> &SessionId {
        &self.0
    }

    /// The base session, by value.
    pub fn into_base(self) -> SessionId {
        self.0
    }

    /// The alias of the base session.
    pub fn alias(&self) -> SessionId {
        SessionId::new(format!("{}{ALIAS_SUFFIX}", self.0.as_str()))
            .unwrap_or_else(|_| self.0.clone())
    }

    /// The sessions of the scope: its base session and the base's alias. A scope has no
    /// other member, so its members are found by key, never by a scan.
    pub fn members(&self) -> [SessionId; 2] {
        [self.0.clone(), self.alias()]
    }

    /// True when `session` is a member of the scope.
    pub fn contains(&self, session: &SessionId) -> bool {
        base_session(session) == self.0
    }
}

impl std::fmt::Display for ScopeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// True when `a` and `b` share one outbox scope.
pub fn same_scope(a: &SessionId, b: &SessionId) -> bool {
    base_session(a) == base_session(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    // OB-06
    #[test]
    fn the_scope_members_are_the_base_and_its_alias() {
        for id in ["s1", "s1::skills-agent", "::skills-agent"] {
            let session = SessionId::new(id).unwrap();
            let [base, alias] = ScopeId::of(&session).members();
            assert_eq!(base, base_session(&session));
            assert!(same_scope(&alias, &session) && same_scope(&base, &session));
            assert_ne!(base, alias);
        }
    }

    // OB-06, OB-07: a scope is named by its base whichever member names it, so the
    // ledger keyed by it is one for the base and its alias.
    #[test]
    fn a_scope_is_named_by_its_base_from_either_member() {
        let base = SessionId::new("s1").unwrap();
        let alias = SessionId::new("s1::skills-agent").unwrap();
        let scope = ScopeId::of(&alias);
        assert_eq!(scope, ScopeId::of(&base));
        assert_eq!(scope.base(), &base);
        assert_eq!(scope.alias(), alias);
        assert_eq!(scope.members(), [base.clone(), alias.clone()]);
        assert!(scope.contains(&alias) && scope.contains(&base));
        assert!(!scope.contains(&SessionId::new("s2").unwrap()));
        assert_eq!(scope.to_string(), "s1");
        assert_eq!(scope.into_base(), base);
    }

    // OB-06
    #[test]
    fn an_alias_belongs_to_its_base_scope() {
        let base = SessionId::new("s1").unwrap();
        let alias = SessionId::new("s1::skills-agent").unwrap();
        assert_eq!(base_session(&alias), base);
        assert_eq!(base_session(&base), base);
        assert!(same_scope(&alias, &base));
        assert!(!same_scope(&base, &SessionId::new("s2").unwrap()));
        // A bare suffix is not an alias of an empty base.
        let odd = SessionId::new("::skills-agent").unwrap();
        assert_eq!(base_session(&odd), odd);
    }

    // OB-01
    #[test]
    fn identities_refuse_blank_text_and_run_ids_have_their_form() {
        assert!(QueueId::new(" ").is_err());
        assert!(serde_json::from_str::<TurnId>("\"\"").is_err());
        let run = RunId::generate("0b7c", timeline_core::time::Millis(1_700));
        assert_eq!(run.as_str(), "run-0b7c-1700");
        assert_eq!(run.started_at(), Some(timeline_core::time::Millis(1_700)));
    }
}
