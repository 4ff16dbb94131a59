//! Target `tokens`: Codex and Claude cursors, boundary tokens and `ta1.` anchor tokens
//! (TL-09, TL-10, TL-11), plus the small text codecs beside them (encoded block keys,
//! hex).
//!
//! Checks: decoding arbitrary text never panics; whenever a decode succeeds, the value
//! belongs to the thread, session or kind it was decoded for, and re-encoding it decodes
//! to the same value. Values read from arbitrary JSON payloads (the part a host key seals)
//! survive encode then decode, and are refused under another key, another thread or
//! session, another source, or as the other anchor kind.
//!
//! Script: one mode byte, then the mode's fields (see [`Mode`]).

use timeline_core::anchor::{Anchor, AnchorError, AnchorToken};
use timeline_core::cursor::{BoundaryToken, ClaudeCursor, CodexCursor, CursorError};
use timeline_core::key::BlockKey;
use timeline_core::policy::CLAUDE_CURSOR_MAX_CHARS;
use timeline_core::seal::{hex, unhex, HostKey};

use crate::script::Script;

/// The host key every target and the corpus generator seal with.
pub const HOST_KEY: [u8; 32] = [0x5a; 32];
/// A second key: a token written under it must be refused.
const OTHER_KEY: [u8; 32] = [0xa5; 32];

/// The modes of this target, in the order of the mode byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Thread text, source text, then the rest as a Codex cursor text.
    CodexText = 0,
    /// Session text, then the rest as a Claude cursor text.
    ClaudeText = 1,
    /// The rest as an anchor token text.
    AnchorText = 2,
    /// The rest as the JSON payload of a Codex cursor.
    CodexPayload = 3,
    /// The rest as the JSON of a Claude cursor (without its MAC).
    ClaudePayload = 4,
    /// The rest as the JSON payload of an anchor token.
    AnchorPayload = 5,
    /// The rest as the JSON of a wire anchor (`{kind, token | row}`).
    WireAnchor = 6,
    /// The rest as an encoded block key, a hex text and a boundary-token source.
    KeysAndHex = 7,
}

impl Mode {
    const ALL: [Mode; 8] = [
        Mode::CodexText,
        Mode::ClaudeText,
        Mode::AnchorText,
        Mode::CodexPayload,
        Mode::ClaudePayload,
        Mode::AnchorPayload,
        Mode::WireAnchor,
        Mode::KeysAndHex,
    ];

    fn read(s: &mut Script<'_>) -> Mode {
        let i = usize::from(s.pick(Mode::ALL.len() as u8));
        Mode::ALL.get(i).copied().unwrap_or(Mode::KeysAndHex)
    }
}

fn key() -> HostKey {
    HostKey::from_bytes(HOST_KEY)
}

fn other_key() -> HostKey {
    HostKey::from_bytes(OTHER_KEY)
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut s = Script::new(data);
    match Mode::read(&mut s) {
        Mode::CodexText => {
            let thread = s.text().into_owned();
            let source = BoundaryToken::from_wire(s.text().into_owned());
            if let Ok(text) = std::str::from_utf8(s.rest()) {
                codex_text(text, &thread, &source);
            }
        }
        Mode::ClaudeText => {
            let session = s.text().into_owned();
            if let Ok(text) = std::str::from_utf8(s.rest()) {
                claude_text(text, &session);
            }
        }
        Mode::AnchorText => {
            if let Ok(text) = std::str::from_utf8(s.rest()) {
                anchor_text(text);
            }
        }
        Mode::CodexPayload => {
            if let Ok(c) = serde_json::from_slice::<CodexCursor>(s.rest()) {
                codex_round_trip(&c);
            }
        }
        Mode::ClaudePayload => {
            if let Ok(c) = serde_json::from_slice::<ClaudeCursor>(s.rest()) {
                claude_round_trip(&c);
            }
        }
        Mode::AnchorPayload => {
            if let Ok(t) = serde_json::from_slice::<AnchorToken>(s.rest()) {
                anchor_round_trip(&t);
            }
        }
        Mode::WireAnchor => {
            if let Ok(a) = serde_json::from_slice::<Anchor>(s.rest()) {
                wire_anchor(&a);
            }
        }
        Mode::KeysAndHex => {
            if let Ok(text) = std::str::from_utf8(s.rest()) {
                keys_and_hex(text);
            }
        }
    }
}

// TL-09
fn codex_text(text: &str, thread: &str, source: &BoundaryToken) {
    let Ok(c) = CodexCursor::decode(text, &key(), thread, source) else {
        return;
    };
    assert_eq!(c.thread_id, thread, "a cursor of another thread decoded");
    assert_eq!(
        &c.source_token, source,
        "a cursor of another source decoded"
    );
    codex_round_trip(&c);
}

// TL-09
fn codex_round_trip(c: &CodexCursor) {
    let text = c.encode(&key());
    assert!(text.starts_with(timeline_core::cursor::CODEX_CURSOR_PREFIX));
    assert_eq!(
        CodexCursor::decode(&text, &key(), &c.thread_id, &c.source_token).as_ref(),
        Ok(c),
        "re-encoded Codex cursor does not decode to itself"
    );
    assert_eq!(
        CodexCursor::decode(&text, &other_key(), &c.thread_id, &c.source_token),
        Err(CursorError::Invalid),
        "a Codex cursor decoded under another key"
    );
    let other_thread = format!("{}-other", c.thread_id);
    assert_eq!(
        CodexCursor::decode(&text, &key(), &other_thread, &c.source_token),
        Err(CursorError::OtherThread)
    );
    let other_source = BoundaryToken::from_wire(format!("{}-other", c.source_token.as_str()));
    let moved = CodexCursor::decode(&text, &key(), &c.thread_id, &other_source);
    assert_eq!(moved, Err(CursorError::SourceChanged));
    assert!(moved.is_err_and(|e| e.reload_required()));
}

// TL-09
fn claude_text(text: &str, session: &str) {
    let decoded = ClaudeCursor::decode(text, &key(), session);
    if text.chars().count() > CLAUDE_CURSOR_MAX_CHARS {
        assert_eq!(
            decoded,
            Err(CursorError::TooLong {
                max: CLAUDE_CURSOR_MAX_CHARS
            })
        );
        return;
    }
    let Ok(c) = decoded else {
        return;
    };
    assert_eq!(c.session, session, "a cursor of another session decoded");
    claude_round_trip(&c);
}

// TL-09
fn claude_round_trip(c: &ClaudeCursor) {
    let text = c.encode(&key());
    let decoded = ClaudeCursor::decode(&text, &key(), &c.session);
    if text.chars().count() > CLAUDE_CURSOR_MAX_CHARS {
        assert_eq!(
            decoded,
            Err(CursorError::TooLong {
                max: CLAUDE_CURSOR_MAX_CHARS
            })
        );
        return;
    }
    assert_eq!(
        decoded.as_ref(),
        Ok(c),
        "re-encoded Claude cursor does not decode to itself"
    );
    assert_eq!(
        ClaudeCursor::decode(&text, &other_key(), &c.session),
        Err(CursorError::Invalid),
        "a Claude cursor decoded under another key"
    );
    let other = format!("{}-other", c.session);
    assert_eq!(
        ClaudeCursor::decode(&text, &key(), &other),
        Err(CursorError::OtherSession)
    );
}

// TL-11
fn anchor_text(text: &str) {
    let link = AnchorToken::decode_link(text, &key());
    let newer = AnchorToken::decode_newer(text, &key());
    if text.trim().is_empty() {
        assert!(matches!(link, Err(AnchorError::InvalidParams(_))));
        assert!(matches!(newer, Err(AnchorError::InvalidParams(_))));
        return;
    }
    assert!(
        link.is_err() || newer.is_err(),
        "one token decoded as both kinds"
    );
    if let Ok(place) = link {
        anchor_round_trip(&AnchorToken::Link(place));
    }
    if let Ok(place) = newer {
        anchor_round_trip(&AnchorToken::Newer(place));
    }
}

// TL-11
fn anchor_round_trip(t: &AnchorToken) {
    let text = t.encode(&key());
    assert!(text.starts_with(timeline_core::anchor::ANCHOR_TOKEN_PREFIX));
    match t {
        AnchorToken::Link(place) => {
            assert_eq!(AnchorToken::decode_link(&text, &key()).as_ref(), Ok(place));
            assert_eq!(
                AnchorToken::decode_newer(&text, &key()),
                Err(AnchorError::Invalid)
            );
            assert_eq!(
                AnchorToken::decode_link(&text, &other_key()),
                Err(AnchorError::Invalid)
            );
        }
        AnchorToken::Newer(place) => {
            assert_eq!(AnchorToken::decode_newer(&text, &key()).as_ref(), Ok(place));
            assert_eq!(
                AnchorToken::decode_link(&text, &key()),
                Err(AnchorError::Invalid)
            );
            assert_eq!(
                AnchorToken::decode_newer(&text, &other_key()),
                Err(AnchorError::Invalid)
            );
        }
    }
}

// TL-11
fn wire_anchor(a: &Anchor) {
    let checked = a.check_params();
    let key = a.row_key();
    if let Anchor::Row { .. } = a {
        assert_eq!(checked.is_ok(), key.is_ok(), "row anchor checks disagree");
    }
    if let Ok(k) = &key {
        assert_eq!(Anchor::row(k).row_key().as_ref(), Ok(k));
    }
    let json = serde_json::to_string(a).unwrap_or_default();
    let back: Result<Anchor, _> = serde_json::from_str(&json);
    assert_eq!(back.ok().as_ref(), Some(a), "wire anchor JSON round trip");
}

// TL-01, TL-10
fn keys_and_hex(text: &str) {
    if let Ok(k) = BlockKey::decode(text) {
        assert_eq!(k.encoded(), text, "an encoded key decodes to another text");
        assert_eq!(BlockKey::decode(&k.encoded()).as_ref(), Ok(&k));
    }
    if let Some(bytes) = unhex(text) {
        assert_eq!(hex(&bytes), text, "unhex accepted text hex does not write");
    }
    for token in [
        BoundaryToken::codex_rollout(text),
        BoundaryToken::codex_owned_thread_store(text),
    ] {
        let t = token.as_str();
        assert_eq!(t.len(), 64);
        assert_eq!(unhex(t).map(|b| b.len()), Some(32));
    }
    let claude = BoundaryToken::claude(text);
    assert_eq!(claude.as_str(), text);
    let json = serde_json::to_string(&claude).unwrap_or_default();
    assert_eq!(
        serde_json::from_str::<BoundaryToken>(&json).ok(),
        Some(claude)
    );
}
