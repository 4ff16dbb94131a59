//! Round trips of the cursor and anchor codecs (TL-09, TL-11), and that any change to a
//! sealed text is detected.
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

    // TL-09, TL-11: flipping any character of a sealed text never yields a valid cursor.
    #[test]
    fn a_changed_codex_cursor_is_rejected(thread in text(), seam in block_key(), pos in any::<prop::sample::Index>()) {
        let source = BoundaryToken::claude("s");
        let c = CodexCursor { thread_id: thread.clone(), sidecar_cursor: None, generation: 1,
            source_token: source.clone(), seam, window_revision: 2 };
        let s = c.encode(&key());
        let body_start = "thread-items-v5:".len();
        let i = body_start + pos.index(s.len() - body_start);
        let mut bytes = s.into_bytes();
        bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
        let changed = String::from_utf8(bytes).unwrap();
        let decoded = CodexCursor::decode(&changed, &key(), &thread, &source);
        prop_assert!(decoded.is_err() || decoded == Ok(c));
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
