//! What a Codex send (`turn/start`, `turn/steer`) ends as, in the six send results of
//! [`outbox_core::adapter::SendResult`] (OB-08, OB-09).
//!
//! Every failure is classified by one table, [`SEND_FAILURE_TABLE`], read top to bottom
//! (the first matching row wins; the last rows catch everything, so no failure is
//! unclassified). The rules behind the rows:
//!
//! - A failure before the request was written proves nothing reached Codex: proven
//!   unadmitted (OB-09, "failed before").
//! - After the write every failure is uncertain (OB-09: an error reply, a failed write,
//!   a closed channel, a deadline, the process ending), except the error replies that
//!   prove Codex refused the request before acting on it:
//!   - `turn/steer` answered `-32600` (a stale `expectedTurnId`: "expected active turn
//!     id `X` but found `Y`", recorded in `03-steer-and-queue`): the seed's "steer reply
//!     that proves the guidance was not admitted". Custody holds such a send with its
//!     error and auto-drain off (see `outbox_core::custody`).
//!   - `-32001` (overloaded): Codex refuses the request at its inbound queue, before any
//!     handler reads it. Not deferred: nothing here holds the message back on purpose,
//!     and deferring would make the next drain send into the same overload at once.
//! - A `turn/start` answered `-32600` stays uncertain: the seed names "an error reply"
//!   among the uncertain failures and no recording shows what that answer proves.
//!
//! Success: a `turn/start` or `turn/steer` answer is [`SendResult::Accepted`] with the
//! turn it names; only the echo (`userMessage.clientId`, [`crate::proof`]) makes it
//! delivered.

use outbox_core::adapter::SendResult;
use outbox_core::entry::Acceptance;
use outbox_core::ids::{RunId, ThreadId, TurnId};
use timeline_core::time::Millis;

use crate::codec::{RpcError, INVALID_REQUEST, OVERLOADED};

/// The two send methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendMethod {
    /// `turn/start`.
    TurnStart,
    /// `turn/steer`.
    TurnSteer,
}

/// How a send failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendFailure {
    /// Codex answered with an error.
    Rpc(RpcError),
    /// Nothing was written (the process was not running, the pipe was closed before the
    /// first byte).
    NotWritten {
        /// Why, in words for the user or the log.
        reason: String,
    },
    /// Writing the request failed part way, or after the write the channel closed.
    TransportAfterWrite {
        /// Why, in words for the user or the log.
        reason: String,
    },
    /// No answer within the reply deadline (30 s).
    ReplyTimeout,
    /// The process ended before answering.
    ProcessExited,
}

/// What a class of failure does to the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// Codex did not take the message.
    ProvenUnadmitted,
    /// Codex may have taken it: read its history.
    Uncertain,
}

/// Which methods a row applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MethodMatch {
    /// Either a start or a steer.
    Any,
    /// Only this one.
    Only(SendMethod),
}

/// Which failures a row applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureMatch {
    /// An error answer with this code.
    Code(i64),
    /// An error answer with any code.
    AnyCode,
    /// [`SendFailure::NotWritten`].
    NotWritten,
    /// [`SendFailure::TransportAfterWrite`].
    TransportAfterWrite,
    /// [`SendFailure::ReplyTimeout`].
    ReplyTimeout,
    /// [`SendFailure::ProcessExited`].
    ProcessExited,
}

/// One row of [`SEND_FAILURE_TABLE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureRow {
    /// The methods.
    pub method: MethodMatch,
    /// The failures.
    pub failure: FailureMatch,
    /// The class.
    pub class: FailureClass,
    /// The words the user sees with the held message.
    pub text: &'static str,
}

const fn row(
    method: MethodMatch,
    failure: FailureMatch,
    class: FailureClass,
    text: &'static str,
) -> FailureRow {
    FailureRow {
        method,
        failure,
        class,
        text,
    }
}

/// Every send failure and its class, first match wins (OB-08, OB-09).
pub static SEND_FAILURE_TABLE: &[FailureRow] = &[
    row(
        MethodMatch::Only(SendMethod::TurnSteer),
        FailureMatch::Code(INVALID_REQUEST),
        FailureClass::ProvenUnadmitted,
        "The run this message was meant to steer is no longer the running turn.",
    ),
    row(
        MethodMatch::Any,
        FailureMatch::Code(OVERLOADED),
        FailureClass::ProvenUnadmitted,
        "Codex is overloaded and did not take the message.",
    ),
    row(
        MethodMatch::Any,
        FailureMatch::NotWritten,
        FailureClass::ProvenUnadmitted,
        "Codex is not running; the message was not sent.",
    ),
    row(
        MethodMatch::Only(SendMethod::TurnStart),
        FailureMatch::Code(INVALID_REQUEST),
        FailureClass::Uncertain,
        "Codex answered the send with an error.",
    ),
    row(
        MethodMatch::Any,
        FailureMatch::AnyCode,
        FailureClass::Uncertain,
        "Codex answered the send with an error.",
    ),
    row(
        MethodMatch::Any,
        FailureMatch::TransportAfterWrite,
        FailureClass::Uncertain,
        "The connection to Codex failed after the message was written.",
    ),
    row(
        MethodMatch::Any,
        FailureMatch::ReplyTimeout,
        FailureClass::Uncertain,
        "Codex did not answer the send in time.",
    ),
    row(
        MethodMatch::Any,
        FailureMatch::ProcessExited,
        FailureClass::Uncertain,
        "Codex exited before answering the send.",
    ),
];

impl FailureRow {
    /// True when this row applies to `failure` of `method`.
    pub fn matches(&self, method: SendMethod, failure: &SendFailure) -> bool {
        let method_ok = match self.method {
            MethodMatch::Any => true,
            MethodMatch::Only(m) => m == method,
        };
        let failure_ok = match (self.failure, failure) {
            (FailureMatch::Code(c), SendFailure::Rpc(e)) => e.code == c,
            (FailureMatch::AnyCode, SendFailure::Rpc(_)) => true,
            (FailureMatch::NotWritten, SendFailure::NotWritten { .. }) => true,
            (FailureMatch::TransportAfterWrite, SendFailure::TransportAfterWrite { .. }) => true,
            (FailureMatch::ReplyTimeout, SendFailure::ReplyTimeout) => true,
            (FailureMatch::ProcessExited, SendFailure::ProcessExited) => true,
            _ => false,
        };
        method_ok && failure_ok
    }
}

/// The row that classifies `failure` of `method`.
pub fn classify(method: SendMethod, failure: &SendFailure) -> &'static FailureRow {
    const FALLBACK: FailureRow = row(
        MethodMatch::Any,
        FailureMatch::AnyCode,
        FailureClass::Uncertain,
        "The send failed after the hand-off.",
    );
    SEND_FAILURE_TABLE
        .iter()
        .find(|r| r.matches(method, failure))
        .unwrap_or(&FALLBACK)
}

/// The send result of a failure: the row's class, with the row's words and what Codex
/// said.
pub fn failed(method: SendMethod, failure: &SendFailure) -> SendResult {
    let r = classify(method, failure);
    let error = match failure {
        SendFailure::Rpc(e) => format!("{} ({}: {})", r.text, e.code, e.message),
        SendFailure::NotWritten { reason } | SendFailure::TransportAfterWrite { reason } => {
            format!("{} ({reason})", r.text)
        }
        SendFailure::ReplyTimeout | SendFailure::ProcessExited => r.text.to_owned(),
    };
    match r.class {
        FailureClass::ProvenUnadmitted => SendResult::ProvenUnadmitted { error },
        FailureClass::Uncertain => SendResult::AdmissionUncertain { error },
    }
}

/// The send result of an answered `turn/start` or `turn/steer`: accepted by `turn_id`.
/// A blank ID in the answer (which no recording shows) is uncertain, like "sending"
/// without an acceptance.
pub fn accepted(run: RunId, thread: &str, turn_id: &str, now: Millis) -> SendResult {
    match (ThreadId::new(thread), TurnId::new(turn_id)) {
        (Ok(thread_id), Ok(turn_id)) => SendResult::Accepted(Acceptance {
            run_id: run,
            thread_id,
            turn_id,
            accepted_at: now,
        }),
        _ => SendResult::AdmissionUncertain {
            error: "Codex accepted the send without naming its turn.".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc(code: i64) -> SendFailure {
        SendFailure::Rpc(RpcError {
            code,
            message: "m".into(),
        })
    }

    fn is_unadmitted(r: &SendResult) -> bool {
        matches!(r, SendResult::ProvenUnadmitted { .. })
    }

    fn is_uncertain(r: &SendResult) -> bool {
        matches!(r, SendResult::AdmissionUncertain { .. })
    }

    // OB-08, OB-09: the table, row by row, against expectations written out here.
    #[test]
    fn every_row_of_the_table_classifies_as_written() {
        use FailureClass::*;
        use SendMethod::*;
        let cases: Vec<(SendMethod, SendFailure, FailureClass)> = vec![
            (TurnSteer, rpc(INVALID_REQUEST), ProvenUnadmitted),
            (TurnStart, rpc(OVERLOADED), ProvenUnadmitted),
            (TurnSteer, rpc(OVERLOADED), ProvenUnadmitted),
            (
                TurnStart,
                SendFailure::NotWritten { reason: "x".into() },
                ProvenUnadmitted,
            ),
            (TurnStart, rpc(INVALID_REQUEST), Uncertain),
            (TurnStart, rpc(-32603), Uncertain),
            (TurnSteer, rpc(12345), Uncertain),
            (
                TurnSteer,
                SendFailure::TransportAfterWrite { reason: "x".into() },
                Uncertain,
            ),
            (TurnStart, SendFailure::ReplyTimeout, Uncertain),
            (TurnStart, SendFailure::ProcessExited, Uncertain),
        ];
        for (method, failure, class) in &cases {
            assert_eq!(
                classify(*method, failure).class,
                *class,
                "{method:?} {failure:?}"
            );
            let r = failed(*method, failure);
            match class {
                ProvenUnadmitted => assert!(is_unadmitted(&r), "{r:?}"),
                Uncertain => assert!(is_uncertain(&r), "{r:?}"),
            }
        }
        // Every row of the table is reached by at least one case (no dead rows).
        for (i, row) in SEND_FAILURE_TABLE.iter().enumerate() {
            assert!(
                cases
                    .iter()
                    .any(|(m, f, _)| std::ptr::eq(classify(*m, f), row)),
                "row {i} ({row:?}) is reached by no case"
            );
        }
    }

    // OB-08: an answer is an acceptance by the named turn, never a delivery.
    #[test]
    fn an_answer_is_accepted_with_its_turn() {
        let run = RunId::new("run-1").unwrap();
        let r = accepted(run.clone(), "th", "tu", Millis(5));
        let SendResult::Accepted(a) = r else {
            panic!("{r:?}")
        };
        assert_eq!(a.turn_id.as_str(), "tu");
        assert_eq!(a.accepted_at, Millis(5));
        assert!(is_uncertain(&accepted(run, "th", " ", Millis(5))));
    }

    #[test]
    fn the_error_text_keeps_what_codex_said() {
        let r = failed(
            SendMethod::TurnSteer,
            &SendFailure::Rpc(RpcError {
                code: INVALID_REQUEST,
                message: "expected active turn id `a` but found `b`".into(),
            }),
        );
        let SendResult::ProvenUnadmitted { error } = r else {
            panic!()
        };
        assert!(error.contains("expected active turn id"), "{error}");
    }
}
