//! Cursor codecs and boundary tokens (TL-09, TL-10).
//!
//! A cursor remembers where an older page starts: the history source, the seam (the
//! oldest row the window held when the cursor was issued) and the window revision.
//! Clients treat cursors as opaque text. Both forms carry a MAC under the [`HostKey`], so
//! a cursor the host did not write is rejected instead of read.
//!
//! - Codex: `thread-items-v5:` + base64url JSON + `.` + base64url MAC.
//! - Claude: JSON `{session, before, anchor, revision, mac}`, at most 4,096 characters.
//!   The MAC covers the exact payload bytes the host wrote and is checked over the exact
//!   bytes received, before they are parsed: a cursor whose whitespace, key order or
//!   escapes differ from the host's, or with any one byte changed, is refused.
//!
//! ```
//! use timeline_core::cursor::{BoundaryToken, CodexCursor};
//! use timeline_core::key::{BlockKey, BlockType};
//! use timeline_core::seal::HostKey;
//!
//! let key = HostKey::from_bytes([1; 32]);
//! let source = BoundaryToken::codex_rollout("/home/me/.codex/sessions/rollout-1.jsonl");
//! let cursor = CodexCursor {
//!     thread_id: "thread-1".into(),
//!     sidecar_cursor: Some("c-42".into()),
//!     generation: 3,
//!     source_token: source.clone(),
//!     seam: BlockKey::parse(BlockType::Activity, "item-120").unwrap(),
//!     window_revision: 1,
//! };
//! let text = cursor.encode(&key);
//! assert!(text.starts_with("thread-items-v5:"));
//! assert_eq!(CodexCursor::decode(&text, &key, "thread-1", &source), Ok(cursor));
//! ```

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::key::BlockKey;
use crate::policy::CLAUDE_CURSOR_MAX_CHARS;
use crate::seal::{hex, HostKey};

/// The prefix of a Codex cursor.
pub const CODEX_CURSOR_PREFIX: &str = "thread-items-v5:";

const CODEX_DOMAIN: &str = "thread-items-v5";
const CLAUDE_DOMAIN: &str = "claude-cursor-v1";

/// Why a cursor was refused. [`CursorError::reload_required`] tells the caller whether to
/// answer with an empty page and `reloadRequired` rather than an invalid-params error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CursorError {
    /// Not a cursor this host wrote (bad prefix, encoding, JSON or MAC).
    #[error("The timeline cursor is invalid; reload the timeline")]
    Invalid,
    /// A Claude cursor longer than 4,096 characters.
    #[error("invalid params: beforeCursor is longer than {max} characters")]
    TooLong {
        /// The limit.
        max: usize,
    },
    /// A Codex cursor of another thread.
    #[error("The timeline cursor belongs to another thread")]
    OtherThread,
    /// A Claude cursor of another conversation or subagent.
    #[error("The timeline cursor belongs to another conversation")]
    OtherSession,
    /// The history source changed since the cursor was written.
    #[error("Timeline source changed")]
    SourceChanged,
}

impl CursorError {
    /// True when the right answer is an empty page with `reloadRequired`.
    pub fn reload_required(&self) -> bool {
        matches!(self, CursorError::SourceChanged)
    }
}

/// The token that names a history source, not a page (TL-10). Clients send it back as
/// `expectedBoundaryToken`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct BoundaryToken(String);

impl BoundaryToken {
    /// Codex, history in a rollout file: hex SHA-256 of the rollout path.
    pub fn codex_rollout(path: &str) -> BoundaryToken {
        BoundaryToken(hex(&Sha256::digest(path.as_bytes())))
    }

    /// Codex, history in the owned thread store: hex SHA-256 of `owned-thread-store`
    /// plus the owner ID. A NUL byte separates the two so no owner ID can collide with a
    /// rollout path.
    pub fn codex_owned_thread_store(owner_id: &str) -> BoundaryToken {
        let mut h = Sha256::new();
        h.update(b"owned-thread-store");
        h.update([0u8]);
        h.update(owner_id.as_bytes());
        BoundaryToken(hex(&h.finalize()))
    }

    /// Claude: the session ID for the main conversation, the subagent ID for a child.
    pub fn claude(session_or_subagent_id: &str) -> BoundaryToken {
        BoundaryToken(session_or_subagent_id.to_owned())
    }

    /// A token as received from a client.
    pub fn from_wire(text: impl Into<String>) -> BoundaryToken {
        BoundaryToken(text.into())
    }

    /// The token text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A Codex older-page cursor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CodexCursor {
    /// The thread whose history the cursor pages.
    pub thread_id: String,
    /// The sidecar's own cursor for `thread/items/list`; `None` at the start of history.
    pub sidecar_cursor: Option<String>,
    /// The generation of the history source.
    pub generation: u64,
    /// The boundary token of the source when the cursor was written.
    pub source_token: BoundaryToken,
    /// The seam: the leading block key of the window when the cursor was issued.
    #[serde(rename = "priorLeadingBlockKey")]
    pub seam: BlockKey,
    /// The window revision when the cursor was issued.
    pub window_revision: u64,
}

impl CodexCursor {
    /// The cursor text.
    pub fn encode(&self, key: &HostKey) -> String {
        // Serializing plain strings and numbers cannot fail.
        let json = serde_json::to_vec(self).unwrap_or_default();
        format!("{CODEX_CURSOR_PREFIX}{}", key.seal(CODEX_DOMAIN, &json))
    }

    /// Decodes a cursor for `thread_id` while the source is `current_source`: another
    /// thread fails with [`CursorError::OtherThread`], another source with
    /// [`CursorError::SourceChanged`] ("Timeline source changed").
    pub fn decode(
        text: &str,
        key: &HostKey,
        thread_id: &str,
        current_source: &BoundaryToken,
    ) -> Result<CodexCursor, CursorError> {
        let sealed = text
            .strip_prefix(CODEX_CURSOR_PREFIX)
            .ok_or(CursorError::Invalid)?;
        let json = key.open(CODEX_DOMAIN, sealed).ok_or(CursorError::Invalid)?;
        let cursor: CodexCursor =
            serde_json::from_slice(&json).map_err(|_| CursorError::Invalid)?;
        if cursor.thread_id != thread_id {
            return Err(CursorError::OtherThread);
        }
        if &cursor.source_token != current_source {
            return Err(CursorError::SourceChanged);
        }
        Ok(cursor)
    }
}

/// A Claude older-page cursor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ClaudeCursor {
    /// The Claude session ID, or the subagent ID for a child thread.
    pub session: String,
    /// The UUID of the oldest loaded message.
    pub before: String,
    /// The seam: the leading block key of the window.
    pub anchor: BlockKey,
    /// The window revision.
    pub revision: u64,
}

/// What follows the payload's members in a Claude cursor: `,"mac":"<64 hex>"}`.
const CLAUDE_MAC_OPEN: &str = ",\"mac\":\"";
const CLAUDE_MAC_CLOSE: &str = "\"}";
const CLAUDE_MAC_HEX_LEN: usize = 64;

impl ClaudeCursor {
    /// The cursor text (JSON).
    ///
    /// The text is the payload JSON `{"session":..,"before":..,"anchor":..,"revision":..}`
    /// with one more member, `"mac"`, spliced in before its closing brace. The MAC covers
    /// exactly those payload bytes, so [`ClaudeCursor::decode`] can check the bytes it
    /// received before it parses them.
    pub fn encode(&self, key: &HostKey) -> String {
        // Serializing plain strings and numbers cannot fail; an empty payload would give
        // a text that decode refuses, never a forged one.
        let payload = serde_json::to_string(self).unwrap_or_default();
        let mac = key.mac_hex(CLAUDE_DOMAIN, payload.as_bytes());
        let members = payload.strip_suffix('}').unwrap_or(&payload);
        format!("{members}{CLAUDE_MAC_OPEN}{mac}{CLAUDE_MAC_CLOSE}")
    }

    /// Decodes a cursor for the open conversation or subagent `session`. Longer than
    /// 4,096 characters fails before parsing; another session fails with
    /// [`CursorError::OtherSession`].
    ///
    /// The MAC is checked over the exact bytes received (the text without its
    /// `,"mac":"..."` member) before they are parsed, so a cursor whose whitespace, key
    /// order or escapes differ from what the host wrote is refused even when it means the
    /// same, and any one-byte change is refused.
    pub fn decode(text: &str, key: &HostKey, session: &str) -> Result<ClaudeCursor, CursorError> {
        if text.chars().count() > CLAUDE_CURSOR_MAX_CHARS {
            return Err(CursorError::TooLong {
                max: CLAUDE_CURSOR_MAX_CHARS,
            });
        }
        let payload = claude_signed_payload(text, key).ok_or(CursorError::Invalid)?;
        let cursor: ClaudeCursor =
            serde_json::from_str(&payload).map_err(|_| CursorError::Invalid)?;
        if cursor.session != session {
            return Err(CursorError::OtherSession);
        }
        Ok(cursor)
    }
}

/// The payload bytes of a Claude cursor text whose MAC verifies under `key`: the text
/// up to its fixed-length `,"mac":"<hex>"}` tail, closed with `}`. `None` when the tail
/// is not exactly that or the MAC does not cover those bytes.
fn claude_signed_payload(text: &str, key: &HostKey) -> Option<String> {
    let tail_len = CLAUDE_MAC_OPEN.len() + CLAUDE_MAC_HEX_LEN + CLAUDE_MAC_CLOSE.len();
    let split = text.len().checked_sub(tail_len)?;
    let members = text.get(..split)?;
    let tag = text
        .get(split..)?
        .strip_prefix(CLAUDE_MAC_OPEN)?
        .strip_suffix(CLAUDE_MAC_CLOSE)?;
    let mut payload = String::with_capacity(split + 1);
    payload.push_str(members);
    payload.push('}');
    key.verify_hex(CLAUDE_DOMAIN, payload.as_bytes(), tag)
        .then_some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::BlockType;

    fn key() -> HostKey {
        HostKey::from_bytes([3; 32])
    }

    fn codex() -> CodexCursor {
        CodexCursor {
            thread_id: "t1".into(),
            sidecar_cursor: None,
            generation: 0,
            source_token: BoundaryToken::codex_rollout("/r.jsonl"),
            seam: BlockKey::parse(BlockType::User, "u1").unwrap(),
            window_revision: 4,
        }
    }

    // TL-09
    #[test]
    fn codex_cursor_rejections_carry_the_seed_text() {
        let c = codex();
        let text = c.encode(&key());
        let src = c.source_token.clone();
        assert_eq!(
            CodexCursor::decode(&text, &key(), "t2", &src),
            Err(CursorError::OtherThread)
        );
        let err = CodexCursor::decode(&text, &key(), "t1", &BoundaryToken::codex_rollout("/x"))
            .unwrap_err();
        assert_eq!(err.to_string(), "Timeline source changed");
        assert!(err.reload_required());
        assert_eq!(
            CodexCursor::decode("thread-items-v4:abc", &key(), "t1", &src),
            Err(CursorError::Invalid)
        );
        let other_host = HostKey::from_bytes([4; 32]);
        assert_eq!(
            CodexCursor::decode(&text, &other_host, "t1", &src),
            Err(CursorError::Invalid)
        );
    }

    // TL-09
    #[test]
    fn claude_cursor_limit_is_4096_characters_not_bytes() {
        let mut c = ClaudeCursor {
            session: "s".into(),
            before: String::new(),
            anchor: BlockKey::parse(BlockType::User, "u").unwrap(),
            revision: 1,
        };
        let base = c.encode(&key()).chars().count();
        // Multi-byte characters: the limit counts characters.
        c.before = "é".repeat(CLAUDE_CURSOR_MAX_CHARS - base);
        let at_limit = c.encode(&key());
        assert_eq!(at_limit.chars().count(), CLAUDE_CURSOR_MAX_CHARS);
        assert!(at_limit.len() > CLAUDE_CURSOR_MAX_CHARS);
        assert_eq!(ClaudeCursor::decode(&at_limit, &key(), "s"), Ok(c.clone()));
        c.before.push('é');
        let past = c.encode(&key());
        assert_eq!(
            ClaudeCursor::decode(&past, &key(), "s"),
            Err(CursorError::TooLong { max: 4096 })
        );
        assert_eq!(
            ClaudeCursor::decode(&at_limit, &key(), "other"),
            Err(CursorError::OtherSession)
        );
    }

    // TL-09: the text is byte for byte what the host has always written (the payload
    // members, then the MAC over the payload's compact JSON), so cursors already handed
    // out keep decoding.
    #[test]
    fn claude_cursor_text_keeps_its_layout() {
        #[derive(Serialize)]
        struct Flattened<'a> {
            #[serde(flatten)]
            cursor: &'a ClaudeCursor,
            mac: String,
        }
        let c = ClaudeCursor {
            session: "s\"1".into(),
            before: "u/é".into(),
            anchor: BlockKey::parse(BlockType::User, "u").unwrap(),
            revision: 7,
        };
        let mac = key().mac_hex(CLAUDE_DOMAIN, &serde_json::to_vec(&c).unwrap());
        let expected = serde_json::to_string(&Flattened { cursor: &c, mac }).unwrap();
        assert_eq!(c.encode(&key()), expected);
        assert_eq!(ClaudeCursor::decode(&expected, &key(), "s\"1"), Ok(c));
    }

    // TL-10
    #[test]
    fn boundary_tokens_name_the_source() {
        // The FIPS 180-2 test vector for "abc".
        let a = BoundaryToken::codex_rollout("abc");
        assert_eq!(
            a.as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(
            BoundaryToken::codex_owned_thread_store("o1"),
            BoundaryToken::codex_rollout("owned-thread-storeo1")
        );
        assert_eq!(BoundaryToken::claude("sess-1").as_str(), "sess-1");
    }
}
