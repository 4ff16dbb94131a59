//! Edge cases of the transcript reader: torn and malformed lines, the end of a complete
//! file, and which branch of a forked transcript is the conversation (FORMATS.md §1.5).

mod common;

use agent_claude::proof::history_read;
use agent_claude::stream::MessageUuid;
use agent_claude::transcript::{ItemKind, PageError, Transcript};
use common::{data, TRANSCRIPT_FILES};
use outbox_core::adapter::HistoryRead;

fn user(uuid: &str, parent: Option<&str>, text: &str) -> String {
    serde_json::json!({
        "type": "user", "uuid": uuid, "parentUuid": parent,
        "timestamp": "2026-03-01T10:00:00.000Z",
        "message": {"role": "user", "content": text},
    })
    .to_string()
}

fn reply(uuid: &str, parent: &str, message: &str, text: &str) -> String {
    serde_json::json!({
        "type": "assistant", "uuid": uuid, "parentUuid": parent,
        "timestamp": "2026-03-01T10:00:01.000Z",
        "message": {"id": message, "content": [{"type": "text", "text": text}]},
    })
    .to_string()
}

fn file(lines: &[String]) -> Vec<u8> {
    let mut s = lines.join("\n");
    s.push('\n');
    s.into_bytes()
}

fn conversation(t: &Transcript) -> Vec<String> {
    t.visible_items().map(|(_, i)| i.position.clone()).collect()
}

// A torn last line that begins like an object is left for the next read, not counted;
// once its rest arrives it is read like any line.
#[test]
fn a_torn_last_line_waits_and_is_not_malformed() {
    let first = user("u1", None, "hello");
    let second = user("u2", Some("u1"), "again");
    let (head, tail) = second.split_at(18);
    assert!(head.starts_with('{'));
    let mut t = Transcript::new();
    let bytes = format!("{first}\n{head}");
    let used = t.feed(bytes.as_bytes());
    assert_eq!(&bytes[used..], head);
    assert_eq!((t.diagnostics().lines, t.diagnostics().malformed), (1, 0));
    assert_eq!(t.read_to(), used as u64);

    // The caller keeps the unused tail and feeds it again with what the writer added.
    let pending = format!("{}{tail}\n", &bytes[used..]);
    assert_eq!(t.feed(pending.as_bytes()), pending.len());
    assert_eq!(conversation(&t), ["u1", "u2"]);
    assert_eq!((t.diagnostics().lines, t.diagnostics().malformed), (2, 0));
}

// A complete malformed line in the middle is counted once and skipped; the lines around
// it are read.
#[test]
fn a_malformed_line_in_the_middle_is_counted_and_skipped() {
    let bytes = file(&[
        user("u1", None, "one"),
        r#"{"type":"user","uuid":"bad","message":{"content":[{"type":"text","text":5}]}}"#.into(),
        "not json at all".into(),
        user("u2", Some("u1"), "two"),
    ]);
    let mut t = Transcript::new();
    assert_eq!(t.feed(&bytes), bytes.len());
    let d = t.diagnostics();
    assert_eq!((d.lines, d.malformed), (4, 2));
    assert_eq!(d.accounted(), d.lines);
    assert!(d.first_malformed.is_some());
    assert_eq!(conversation(&t), ["u1", "u2"]);
}

// `finish`: the file is complete, so a trailing partial line is one malformed line; a
// trailing whole entry without its newline is read.
#[test]
fn finish_reads_the_last_line_of_a_complete_file() {
    let first = user("u1", None, "one");
    let mut t = Transcript::new();
    let bytes = format!("{first}\n{{\"type\":\"user\",\"mes");
    let used = t.feed(bytes.as_bytes());
    assert_eq!(t.finish(&bytes.as_bytes()[used..]), bytes.len() - used);
    assert_eq!((t.diagnostics().lines, t.diagnostics().malformed), (2, 1));
    assert_eq!(t.read_to(), bytes.len() as u64);

    let mut t = Transcript::new();
    let bytes = format!("{first}\n{}", user("u2", Some("u1"), "two"));
    let used = t.feed(bytes.as_bytes());
    assert_eq!(conversation(&t), ["u1"]);
    t.finish(&bytes.as_bytes()[used..]);
    assert_eq!(conversation(&t), ["u1", "u2"]);
    assert_eq!(t.diagnostics().malformed, 0);

    // Nothing left: finish changes nothing.
    let before = t.diagnostics().clone();
    assert_eq!(t.finish(b""), 0);
    assert_eq!(t.diagnostics(), &before);
}

// A user edited the second prompt and ran it again: the conversation is the branch of
// the newest item; the abandoned prompt and its reply are out of it, a page before them
// is gone, and the abandoned prompt still proves its delivery (OB-08).
#[test]
fn an_edited_prompt_leaves_the_old_branch_out() {
    let bytes = file(&[
        user("u1", None, "first"),
        reply("a1", "u1", "msg_1", "answer one"),
        user("u2", Some("a1"), "second, first try"),
        reply("a2", "u2", "msg_2", "answer to the first try"),
        user("u3", Some("a1"), "second, edited"),
        reply("a3", "u3", "msg_3", "answer to the edit"),
    ]);
    let mut t = Transcript::new();
    t.feed(&bytes);
    assert_eq!(t.items().len(), 6, "every branch is read");
    assert_eq!(conversation(&t), ["u1", "a1", "u3", "a3"]);
    assert_eq!(
        t.page_before(Some("a2"), 5),
        Err(PageError::PositionGone("a2".into()))
    );
    let page = t.page_before(Some("u3"), 5).expect("a page");
    let positions: Vec<&str> = page
        .items
        .iter()
        .map(|(_, i)| i.position.as_str())
        .collect();
    assert_eq!(positions, ["a1", "u1"]);
    assert!(t.has_user_message("u2"));
    let rows: Vec<String> = t
        .blocks()
        .iter()
        .map(|b| b.data["text"].to_string())
        .collect();
    assert!(!rows.iter().any(|r| r.contains("first try")), "{rows:?}");
}

// Rewinding back to an older branch point and going on: the newest item decides, even
// when the old branch is longer.
#[test]
fn the_newest_item_decides_between_branches() {
    let bytes = file(&[
        user("u1", None, "first"),
        reply("a1", "u1", "msg_1", "one"),
        user("u2", Some("a1"), "long branch"),
        reply("a2", "u2", "msg_2", "two"),
        user("u3", Some("a2"), "longer"),
        reply("a3", "u3", "msg_3", "three"),
        user("u4", Some("u1"), "rewound to the first prompt"),
    ]);
    let mut t = Transcript::new();
    t.feed(&bytes);
    assert_eq!(conversation(&t), ["u1", "u4"]);
}

// Parallel tool calls fork the line chain (each result hangs off its own call) without
// being a branch: every real transcript's conversation keeps all its items from the
// last compaction on, except the subagent lines Claude Code 1.0 wrote into the main
// file (5c0375b4). The synthetic fixture `agent-sessions/claude-small.jsonl` is left
// out: it gives most entries the same UUID ("[trimmed for fixture]"), so its chain
// says nothing.
#[test]
fn real_transcripts_keep_every_item_of_their_conversation() {
    // (file, items read, items in the conversation); counted with a parent walk over
    // the JSON lines, outside this crate.
    let expected: &[(&str, usize, usize)] = &[
        (TRANSCRIPT_FILES[0], 9, 9),
        (TRANSCRIPT_FILES[1], 24, 12),
        (TRANSCRIPT_FILES[2], 2, 2),
        (TRANSCRIPT_FILES[3], 15, 10),
        (TRANSCRIPT_FILES[4], 4, 4),
        (TRANSCRIPT_FILES[5], 2, 2),
        (TRANSCRIPT_FILES[6], 5, 5),
        (TRANSCRIPT_FILES[7], 13, 13),
    ];
    for (file, items, visible) in expected {
        let bytes = data(file);
        let mut t = Transcript::new();
        t.feed(&bytes);
        assert_eq!(t.items().len(), *items, "{file}");
        assert_eq!(t.visible_items().count(), *visible, "{file}");
        // No sidechain item is in a main file's conversation.
        if t.is_sidechain_file() == Some(false) {
            assert!(t.visible_items().all(|(_, i)| !i.sidechain), "{file}");
        }
    }
}

// A subagent file (its first entry a sidechain entry) is a conversation of sidechain
// items; Claude Code 1.0's subagent lines inside a main file are not.
#[test]
fn sidechain_lines_belong_to_subagent_files_only() {
    let side = |uuid: &str, parent: Option<&str>, text: &str| {
        let mut v: serde_json::Value = serde_json::from_str(&user(uuid, parent, text)).unwrap();
        v["isSidechain"] = true.into();
        v.to_string()
    };
    // A main file that ends with a subagent's lines (the Task still runs).
    let main = file(&[
        user("u1", None, "main"),
        side("s1", None, "subtask"),
        side("s2", Some("s1"), "more subtask"),
    ]);
    let mut t = Transcript::new();
    t.feed(&main);
    assert_eq!(t.is_sidechain_file(), Some(false));
    assert_eq!(conversation(&t), ["u1"]);

    let sub = file(&[side("s1", None, "subtask"), side("s2", Some("s1"), "more")]);
    let mut t = Transcript::new();
    t.feed(&sub);
    assert_eq!(t.is_sidechain_file(), Some(true));
    assert_eq!(conversation(&t), ["s1", "s2"]);
}

// The compaction is a root: the conversation starts there even though the boundary
// names the last line before it (`logicalParentUuid`, not followed); the summary after
// it is hidden, and a prompt before it is gone from paging but still a proof.
#[test]
fn a_compaction_starts_the_conversation() {
    let boundary = serde_json::json!({
        "type": "system", "subtype": "compact_boundary", "uuid": "c1", "parentUuid": null,
        "logicalParentUuid": "a1", "content": "Conversation compacted",
        "timestamp": "2026-03-01T10:05:00.000Z",
    })
    .to_string();
    let summary = serde_json::json!({
        "type": "user", "uuid": "s1", "parentUuid": "c1", "isCompactSummary": true,
        "timestamp": "2026-03-01T10:05:00.000Z",
        "message": {"role": "user", "content": "This session is being continued"},
    })
    .to_string();
    let bytes = file(&[
        user("11111111-1111-4111-8111-111111111111", None, "before"),
        reply("a1", "11111111-1111-4111-8111-111111111111", "msg_1", "old"),
        boundary,
        summary,
        user("u2", Some("s1"), "after"),
    ]);
    let mut t = Transcript::new();
    t.feed(&bytes);
    assert_eq!(conversation(&t), ["c1", "s1", "u2"]);
    assert!(matches!(
        t.visible_items().nth(1).map(|(_, i)| &i.kind),
        Some(ItemKind::Hidden { .. })
    ));
    assert!(t.page_before(Some("a1"), 5).is_err());
    let uuid = MessageUuid::parse("11111111-1111-4111-8111-111111111111").unwrap();
    assert_eq!(history_read(&t, &uuid), HistoryRead::Found);
}

// A parent written after its child is not followed (Claude writes parents first): the
// child starts a root of its own, the same whichever way the file is split.
#[test]
fn a_parent_written_later_is_not_followed() {
    let bytes = file(&[
        user("u2", Some("u1"), "child first"),
        user("u1", None, "parent later"),
        user("u3", Some("u2"), "grandchild"),
    ]);
    let mut t = Transcript::new();
    t.feed(&bytes);
    assert_eq!(conversation(&t), ["u2", "u3"]);
}
