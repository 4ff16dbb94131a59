//! Round trips of the cursor and anchor codecs (TL-09, TL-11), and that any change to a
//! sealed text is detected: a cursor is accepted only in the exact bytes the host wrote.
#![allow(clippy::unwrap_used)]

use fixtures::strategies::block_key;
use proptest::prelude::*;
use timeline_core::anchor::{AnchorError, AnchorToken, LinkPlace, NewerPlace};
use timeline_core::cursor::{BoundaryToken, ClaudeCursor, CodexCursor, CursorError};
use timeline_core::seal::HostKey;

fn key() -> HostKey {
    HostKey::from_bytes([11; 32])
}

fn text() -> impl Strategy<Value = String> {
    // Separators, quotes, NUL and multi-byte characters included.
    "[a-z0-9:.\"\\\\/\u{0}é漢🙂-]{0,24}"
}

/// One byte of a text changed, inserted or removed.
#[derive(Clone, Debug)]
enum OneByteEdit {
    Replace(prop::sample::Index, u8),
    Insert(prop::sample::Index, u8),
    Remove(prop::sample::Index),
}

impl OneByteEdit {
    /// The edited text, or `None` when the edit leaves no valid UTF-8 (such bytes cannot
    /// reach a decoder that takes text) or changes nothing.
    fn apply(&self, text: &str) -> Option<String> {
        let mut bytes = text.as_bytes().to_vec();
        match self {
            OneByteEdit::Replace(i, b) => {
                let i = i.index(bytes.len());
                bytes[i] = if bytes[i] == *b { b ^ 1 } else { *b };
            }
            OneByteEdit::Insert(i, b) => bytes.insert(i.index(bytes.len() + 1), *b),
            OneByteEdit::Remove(i) => {
                bytes.remove(i.index(bytes.len()));
            }
        }
        String::from_utf8(bytes)
            .ok()
            .filter(|changed| changed != text)
    }
}

fn one_byte_edit() -> impl Strategy<Value = OneByteEdit> {
    // Printable ASCII most of the time, so most edits stay valid UTF-8.
    let byte = prop_oneof![3 => 0x20u8..0x7f, 1 => any::<u8>()];
    prop_oneof![
        (any::<prop::sample::Index>(), byte.clone()).prop_map(|(i, b)| OneByteEdit::Replace(i, b)),
        (any::<prop::sample::Index>(), byte).prop_map(|(i, b)| OneByteEdit::Insert(i, b)),
        any::<prop::sample::Index>().prop_map(OneByteEdit::Remove),
    ]
}

/// Texts with the same JSON meaning as the cursor text `s` in other bytes: pretty
/// printed, members in reverse order, a space after a colon, a leading space, and a key
/// or a value character spelled with an escape.
fn respellings(s: &str) -> Vec<String> {
    let value: serde_json::Value = serde_json::from_str(s).unwrap();
    let members = value.as_object().unwrap();
    let reversed = ["mac", "revision", "anchor", "before", "session"]
        .iter()
        .map(|name| {
            format!(
                "{}:{}",
                serde_json::to_string(name).unwrap(),
                members[*name]
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    let mut others = vec![
        serde_json::to_string_pretty(&value).unwrap(),
        format!("{{{reversed}}}"),
        s.replacen("\"session\":", "\"session\": ", 1),
        s.replacen("\"session\":", "\"\\u0073ession\":", 1),
        format!(" {s}"),
    ];
    // Escapes JSON allows but the host does not write, inside a value.
    for (raw, escaped) in [("/", "\\/"), ("\u{e9}", "\\u00e9")] {
        if s.contains(raw) {
            others.push(s.replacen(raw, escaped, 1));
        }
    }
    others
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // TL-09
    #[test]
    fn codex_cursor_round_trips(thread in text(), sidecar in prop::option::of(text()),
        generation in any::<u64>(), path in text(), seam in block_key(), rev in any::<u64>()) {
        let source = BoundaryToken::codex_rollout(&path);
        let c = CodexCursor { thread_id: thread.clone(), sidecar_cursor: sidecar, generation,
            source_token: source.clone(), seam, window_revision: rev };
        let s = c.encode(&key());
        prop_assert!(s.starts_with("thread-items-v5:"));
        prop_assert_eq!(CodexCursor::decode(&s, &key(), &thread, &source), Ok(c));
    }

    // TL-09, TL-11: changing, inserting or removing any one byte of a sealed text never
    // yields a valid cursor.
    #[test]
    fn a_changed_codex_cursor_is_rejected(thread in text(), seam in block_key(),
        edit in one_byte_edit()) {
        let source = BoundaryToken::claude("s");
        let c = CodexCursor { thread_id: thread.clone(), sidecar_cursor: None, generation: 1,
            source_token: source.clone(), seam, window_revision: 2 };
        let s = c.encode(&key());
        if let Some(changed) = edit.apply(&s) {
            prop_assert!(CodexCursor::decode(&changed, &key(), &thread, &source).is_err(),
                "{} was accepted", changed);
        }
    }

    // TL-09: changing, inserting or removing any one byte of a Claude cursor is refused,
    // because the MAC is checked over the exact bytes received.
    #[test]
    fn a_changed_claude_cursor_is_rejected(session in text(), before in text(),
        anchor in block_key(), rev in any::<u64>(), edit in one_byte_edit()) {
        let c = ClaudeCursor { session: session.clone(), before, anchor, revision: rev };
        let s = c.encode(&key());
        if let Some(changed) = edit.apply(&s) {
            prop_assert!(ClaudeCursor::decode(&changed, &key(), &session).is_err(),
                "{} was accepted", changed);
        }
    }

    // TL-09: the same cursor spelled in other bytes (whitespace, member order, escapes)
    // means the same JSON but was not written by the host, so it is refused.
    #[test]
    fn a_claude_cursor_in_other_bytes_is_refused(session in text(), before in text(),
        anchor in block_key(), rev in any::<u64>()) {
        let c = ClaudeCursor { session: session.clone(), before, anchor, revision: rev };
        let s = c.encode(&key());
        prop_assert_eq!(ClaudeCursor::decode(&s, &key(), &session), Ok(c));
        let meaning: serde_json::Value = serde_json::from_str(&s).unwrap();
        for other in respellings(&s) {
            prop_assert_ne!(&other, &s);
            let same: serde_json::Value = serde_json::from_str(&other).unwrap();
            prop_assert_eq!(&same, &meaning, "{} does not mean the same", other);
            prop_assert_eq!(ClaudeCursor::decode(&other, &key(), &session),
                Err(CursorError::Invalid), "{} was accepted", other);
        }
    }

    // TL-09
    #[test]
    fn claude_cursor_round_trips(session in text(), before in text(), anchor in block_key(), rev in any::<u64>()) {
        let c = ClaudeCursor { session: session.clone(), before, anchor, revision: rev };
        let s = c.encode(&key());
        prop_assert_eq!(ClaudeCursor::decode(&s, &key(), &session), Ok(c));
        prop_assert_eq!(ClaudeCursor::decode(&s, &HostKey::from_bytes([1; 32]), &session), Err(CursorError::Invalid));
    }

    // TL-11
    #[test]
    fn anchor_tokens_round_trip_and_keep_their_kind(session in prop::option::of(text()), thread in prop::option::of(text()),
        row in block_key(), target in text(), pos in prop::option::of(text())) {
        let link = LinkPlace { app_session_id: session, thread_id: thread, row: row.clone() };
        let t = AnchorToken::Link(link.clone()).encode(&key());
        prop_assert!(t.starts_with("ta1."));
        prop_assert_eq!(AnchorToken::decode_link(&t, &key()), Ok(link));
        prop_assert_eq!(AnchorToken::decode_newer(&t, &key()), Err(AnchorError::Invalid));
        let newer = NewerPlace { target, source_token: BoundaryToken::claude("x"), after: row, position: pos };
        let t = AnchorToken::Newer(newer.clone()).encode(&key());
        prop_assert_eq!(AnchorToken::decode_newer(&t, &key()), Ok(newer));
        prop_assert_eq!(AnchorToken::decode_link(&t, &key()), Err(AnchorError::Invalid));
    }
}

/// Every text one byte away from `text` (each byte replaced by every other value, every
/// byte value inserted at every place, each byte removed) that is still UTF-8.
fn all_one_byte_edits(text: &str) -> impl Iterator<Item = String> + '_ {
    let bytes = text.as_bytes();
    let replaced = (0..bytes.len()).flat_map(move |i| {
        (0..=u8::MAX).filter(move |b| *b != bytes[i]).map(move |b| {
            let mut edited = bytes.to_vec();
            edited[i] = b;
            edited
        })
    });
    let inserted = (0..=bytes.len()).flat_map(move |i| {
        (0..=u8::MAX).map(move |b| {
            let mut edited = bytes.to_vec();
            edited.insert(i, b);
            edited
        })
    });
    let removed = (0..bytes.len()).map(move |i| {
        let mut edited = bytes.to_vec();
        edited.remove(i);
        edited
    });
    replaced
        .chain(inserted)
        .chain(removed)
        .filter_map(|edited| String::from_utf8(edited).ok())
        .filter(move |edited| edited != text)
}

// TL-09: exhaustively, no text one byte away from a Claude cursor is accepted; a space
// between two members, which means the same JSON, included.
#[test]
fn every_one_byte_change_of_a_claude_cursor_is_refused() {
    let c = ClaudeCursor {
        session: "s \"1\"/é".into(),
        before: "u\\2\u{0}".into(),
        anchor: timeline_core::key::BlockKey::parse(timeline_core::key::BlockType::User, "u")
            .unwrap(),
        revision: 9,
    };
    let s = c.encode(&key());
    assert_eq!(ClaudeCursor::decode(&s, &key(), &c.session), Ok(c.clone()));
    let mut tried = 0;
    for edited in all_one_byte_edits(&s) {
        tried += 1;
        assert!(
            ClaudeCursor::decode(&edited, &key(), &c.session).is_err(),
            "{edited} was accepted"
        );
    }
    assert!(tried > s.len() * 100, "{tried} edits tried");
}

// TL-09: the same for a Codex cursor.
#[test]
fn every_one_byte_change_of_a_codex_cursor_is_refused() {
    let source = BoundaryToken::codex_rollout("/r.jsonl");
    let c = CodexCursor {
        thread_id: "t1".into(),
        sidecar_cursor: Some("c-1".into()),
        generation: 2,
        source_token: source.clone(),
        seam: timeline_core::key::BlockKey::parse(timeline_core::key::BlockType::User, "u")
            .unwrap(),
        window_revision: 3,
    };
    let s = c.encode(&key());
    assert_eq!(CodexCursor::decode(&s, &key(), "t1", &source), Ok(c));
    for edited in all_one_byte_edits(&s) {
        assert!(
            CodexCursor::decode(&edited, &key(), "t1", &source).is_err(),
            "{edited} was accepted"
        );
    }
}
