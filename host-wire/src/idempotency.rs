//! Idempotency keys of remote mutations: the same key again gets the same answer, never
//! a second effect.
//!
//! A mutation ([`crate::Call::idempotency_key`]) is admitted once per key and client
//! scope (a device). While it runs, the same key again waits for its answer; once
//! answered, the same key again gets that answer, kept [`KEPT_FOR`] after it was given;
//! the same key with a different request is refused (`IDEMPOTENCY_KEY_REUSED`), since
//! answering it with another request's answer would be a lie. The seed leaves these
//! replay rules to the RPC layer; these are its choices, written here.
//!
//! An answer that says the request was not carried out by this host at all
//! ([`NOT_CARRIED_OUT`]: the session is served by another host) is given to whoever
//! waited and not kept: the same key may run again here once the session is served
//! here, as a client that follows its session from host to host retries it.
//!
//! The table is bounded: at most [`MAX_KEYS`] keys. When it is full, the oldest answered
//! key goes; when every key is still running, the new mutation is refused
//! (`INTERNAL_ERROR` with a text that says to retry), never admitted unguarded.
//!
//! Pure: time comes in as `now`; nothing here reads a clock.

use std::collections::{BTreeMap, HashMap};

use outbox_core::ids::IdempotencyKey;
use sha2::{Digest, Sha256};
use timeline_core::time::Millis;

use crate::error::{WireError, INTERNAL_ERROR, SERVER_ERROR};
use crate::frame::{Outcome, RequestId};
use crate::method::Call;

/// Keys kept at most.
pub const MAX_KEYS: usize = 4096;
/// Error codes of answers that are not kept for their key: the request did nothing.
pub const NOT_CARRIED_OUT: &[&str] = &["SESSION_ELSEWHERE"];

/// How long an answer is kept for its key.
pub const KEPT_FOR: Millis = Millis::from_secs(600);

/// What to do with a mutation.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Admission {
    /// New: hand it to the host, then call [`Idempotency::complete`] with its answer.
    Run,
    /// The same request is running: its answer will be given to this request ID too
    /// (returned by [`Idempotency::complete`]).
    Wait,
    /// The same request was answered: answer with this.
    Replay(Outcome),
    /// Refused (the key was used for another request, or the table is full of running
    /// mutations).
    Refused(WireError),
}

type Slot = (String, IdempotencyKey);

#[derive(Debug)]
enum State {
    Running { waiting: Vec<RequestId> },
    Answered { outcome: Outcome },
}

#[derive(Debug)]
struct Entry {
    fingerprint: [u8; 32],
    state: State,
}

/// The idempotency table of one host.
#[derive(Debug, Default)]
pub struct Idempotency {
    entries: HashMap<Slot, Entry>,
    /// Answered keys by the time they were answered (for expiry and eviction).
    answered: BTreeMap<(Millis, u64), Slot>,
    seq: u64,
}

impl Idempotency {
    /// An empty table.
    pub fn new() -> Idempotency {
        Idempotency::default()
    }

    /// Keys held (running and answered).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Admits `call` (a mutation with key `key`) from client `scope`, asked as request
    /// `id`.
    pub fn admit(
        &mut self,
        scope: &str,
        key: &IdempotencyKey,
        call: &Call,
        id: &RequestId,
        now: Millis,
    ) -> Admission {
        self.expire(now);
        let fingerprint = fingerprint(call);
        let slot = (scope.to_owned(), key.clone());
        if let Some(entry) = self.entries.get_mut(&slot) {
            if entry.fingerprint != fingerprint {
                return Admission::Refused(WireError::new(
                    SERVER_ERROR,
                    "IDEMPOTENCY_KEY_REUSED",
                    "This idempotency key was already used for another request. Send it with a new idempotencyKey.",
                ));
            }
            return match &mut entry.state {
                State::Running { waiting } => {
                    waiting.push(id.clone());
                    Admission::Wait
                }
                State::Answered { outcome, .. } => Admission::Replay(outcome.clone()),
            };
        }
        if self.entries.len() >= MAX_KEYS && !self.evict_oldest() {
            return Admission::Refused(WireError::new(
                INTERNAL_ERROR,
                "INTERNAL_ERROR",
                "Too many requests are running; try again shortly.",
            ));
        }
        self.entries.insert(
            slot,
            Entry {
                fingerprint,
                state: State::Running {
                    waiting: Vec::new(),
                },
            },
        );
        Admission::Run
    }

    /// The answer of a mutation admitted with [`Admission::Run`]: kept for its key.
    /// Returns the request IDs that waited for it, to answer with the same outcome. A
    /// key that is not running (never admitted, or already answered) is left as it is.
    pub fn complete(
        &mut self,
        scope: &str,
        key: &IdempotencyKey,
        outcome: Outcome,
        now: Millis,
    ) -> Vec<RequestId> {
        let slot = (scope.to_owned(), key.clone());
        let Some(entry) = self.entries.get_mut(&slot) else {
            return Vec::new();
        };
        let State::Running { waiting } = &mut entry.state else {
            return Vec::new();
        };
        let waiting = std::mem::take(waiting);
        if let Outcome::Error(e) = &outcome {
            if NOT_CARRIED_OUT.contains(&e.error_code()) {
                self.entries.remove(&slot);
                return waiting;
            }
        }
        entry.state = State::Answered { outcome };
        self.seq += 1;
        self.answered.insert((now, self.seq), slot);
        waiting
    }

    /// Forgets a running key whose request will not be answered (the connection went):
    /// the next request with the key runs again. Returns the request IDs that waited.
    pub fn abandon(&mut self, scope: &str, key: &IdempotencyKey) -> Vec<RequestId> {
        let slot = (scope.to_owned(), key.clone());
        match self.entries.get(&slot).map(|e| &e.state) {
            Some(State::Running { .. }) => match self.entries.remove(&slot) {
                Some(Entry {
                    state: State::Running { waiting },
                    ..
                }) => waiting,
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    fn expire(&mut self, now: Millis) {
        while let Some((&(at, seq), _)) = self.answered.first_key_value() {
            if at.saturating_add(KEPT_FOR) > now {
                break;
            }
            if let Some(slot) = self.answered.remove(&(at, seq)) {
                self.entries.remove(&slot);
            }
        }
    }

    fn evict_oldest(&mut self) -> bool {
        match self.answered.pop_first() {
            Some((_, slot)) => {
                self.entries.remove(&slot);
                true
            }
            None => false,
        }
    }
}

/// SHA-256 of the call's JSON: the same request gives the same bytes (serde writes a
/// struct's fields in their declared order).
fn fingerprint(call: &Call) -> [u8; 32] {
    let json = serde_json::to_vec(call).unwrap_or_default();
    Sha256::digest(&json).into()
}
