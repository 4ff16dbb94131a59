//! The rollout as an `overlay-core` history source ([`RolloutSource`]): the library's
//! own window builders over real and growing rollout files.

#![allow(clippy::disallowed_methods)] // writes and reads rollout files

use std::io::Write;
use std::path::{Path, PathBuf};

use agent_codex::diag::Skip;
use agent_codex::edge::RolloutSource;
use overlay_core::overlay::Change;
use overlay_core::source::{HistorySource, SourceKind, SourcePosition};
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::store::write;
use overlay_core::store::{RowClass, StoredBlock};
use overlay_core::window::{latest_window, older_page, OlderPageRequest, Target};
use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{BlockKey, BlockType, OperationId, RunId, SessionId, TargetId};
use timeline_core::order::SourceOrder;
use timeline_core::seal::HostKey;
use timeline_core::time::Millis;

fn key() -> HostKey {
    HostKey::from_bytes([3; 32])
}

fn session() -> SessionId {
    SessionId::new("session-1").expect("a session ID")
}

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

const REAL: &str =
    "codex-session-view/rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl";

fn event(sec: u32, payload: &str) -> String {
    format!(
        r#"{{"timestamp":"2026-01-01T00:00:{sec:02}.000Z","type":"event_msg","payload":{payload}}}"#
    ) + "\n"
}

fn meta() -> String {
    r#"{"timestamp":"2026-01-01T00:00:00.000Z","type":"session_meta","payload":{"id":"thread-1","cli_version":"0.147.0","originator":"codex_cli_rs"}}"#.to_owned() + "\n"
}

fn user(sec: u32, op: &str, text: &str) -> String {
    event(
        sec,
        &format!(r#"{{"type":"user_message","message":"{text}","client_id":"{op}"}}"#),
    )
}

fn reply(sec: u32, text: &str) -> String {
    event(
        sec,
        &format!(r#"{{"type":"agent_message","message":"{text}"}}"#),
    )
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the rollout");
    f.write_all(text.as_bytes()).expect("append to the rollout");
}

fn texts(blocks: &[Block]) -> Vec<String> {
    blocks
        .iter()
        .map(|b| b.data["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

// OV-05, TL-03: the latest window read from the rollout's tail holds the user row of
// the operation, so the live row with that key leaves the overlay in the same answer;
// a live reply (Codex does not persist live item IDs) stays.
#[test]
fn the_latest_window_of_a_rollout_settles_the_live_user_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir
        .path()
        .join("rollout-2026-01-01T00-00-00-thread-1.jsonl");
    append(
        &path,
        &(meta() + &user(1, "op-1", "hello") + &reply(2, "hi there")),
    );
    let op = OperationId::new("op-1").unwrap();
    let run = RunId::new("run-1").unwrap();
    let live_user = StoredBlock {
        block: Block::new(BlockKey::user_message(&op), Millis(5))
            .with_source_order(SourceOrder::live(1))
            .with_operation(op.clone())
            .with_data(serde_json::json!({"text": "hello"})),
        class: RowClass::Ordinary,
        run_id: Some(run.clone()),
    };
    let live_reply = StoredBlock {
        block: Block::new(
            BlockKey::parse(BlockType::AgentReply, "msg_live").unwrap(),
            Millis(6),
        )
        .with_source_order(SourceOrder::live(2)),
        class: RowClass::Ordinary,
        run_id: Some(run),
    };
    let (s, t) = (session(), TargetId::main(&session()));
    let mut store = MemoryOverlayStore::new();
    write(
        &mut store,
        &s,
        &t,
        &Change::Publish(vec![live_user, live_reply]),
    )
    .unwrap();
    let mut source = RolloutSource::open(&path, 1).unwrap();
    assert_eq!(
        source.kind(),
        SourceKind::Codex {
            thread_id: "thread-1".into(),
            generation: 1
        }
    );
    let target = Target {
        session: &s,
        target: &t,
        current_run: None,
    };
    let built = latest_window(&mut store, &mut source, &key(), target, 12).unwrap();
    assert_eq!(texts(&built.window.blocks), ["hello", "hi there"]);
    assert_eq!(built.window.blocks[0].operation_id.as_ref(), Some(&op));
    let overlay = built.window.live_overlay.unwrap();
    let left: Vec<&str> = overlay.blocks.iter().map(|b| b.id.as_str()).collect();
    assert_eq!(left, ["msg_live"]);
    assert_eq!(
        overlay.settlement_epoch, 1,
        "an ordinary row left: epoch + 1"
    );
    assert_eq!(built.window.oldest_cursor, None, "the history fits");
    assert_eq!(
        source.boundary_token(),
        BoundaryToken::codex_rollout(&path.to_string_lossy())
    );
}

// TL-08, TL-09: a real rollout paged by the library's builders, the latest window then
// older pages by cursor, reaches its start with every row once, in the file's order.
#[test]
fn older_pages_of_a_real_rollout_reach_its_start() {
    let path = data(REAL);
    let mut source = RolloutSource::open(&path, 4).unwrap();
    let (s, t) = (session(), TargetId::main(&session()));
    let target = Target {
        session: &s,
        target: &t,
        current_run: None,
    };
    let mut store = MemoryOverlayStore::new();
    let built = latest_window(&mut store, &mut source, &key(), target, 12).unwrap();
    let mut rows = built.window.blocks.clone();
    assert_eq!(rows.len(), 12);
    let token = source.boundary_token();
    let mut cursor = built.window.oldest_cursor.clone();
    let mut revision = built.window.window_revision;
    let mut pages = 0;
    while let Some(c) = cursor {
        let page = older_page(
            &mut source,
            &key(),
            OlderPageRequest {
                cursor: &c,
                page_size: 20,
                expected_boundary_token: Some(&token),
            },
        )
        .unwrap();
        assert!(!page.reload_required);
        assert_eq!(page.window_revision, revision + 1);
        revision = page.window_revision;
        let mut older = page.blocks.clone();
        older.extend(rows);
        rows = older;
        cursor = page.oldest_cursor;
        pages += 1;
    }
    assert!(pages >= 3, "{pages} older pages");
    // Every row once, in canonical order, as one read of the whole file gives them.
    let mut whole = Vec::new();
    let mut before: Option<SourcePosition> = None;
    loop {
        let page = source.read(before.as_ref(), 1000).unwrap();
        whole.extend(page.items.iter().flat_map(|i| i.blocks.clone()));
        before = match (page.more, page.items.last()) {
            (true, Some(l)) => Some(l.position.clone()),
            _ => break,
        };
    }
    whole.sort_by_cached_key(Block::order_key);
    let keys = |b: &[Block]| b.iter().map(Block::key).collect::<Vec<_>>();
    assert_eq!(keys(&rows), keys(&whole));
    assert_eq!(
        source.diagnostics().agent_version.as_deref(),
        Some("0.58.0")
    );
}

// The file being written: a torn last line is left until it is whole; a position read
// before the file grew still pages; a newer page reads forward, and a rollback written
// later hides the turn it rolls back.
#[test]
fn a_growing_rollout_is_read_as_it_grows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rollout.jsonl");
    append(&path, &(meta() + &user(1, "op-1", "one") + &reply(2, "r1")));
    let next = user(3, "op-2", "two");
    let (head, rest) = next.split_at(20);
    append(&path, head);
    let mut source = RolloutSource::open(&path, 1).unwrap();
    let page = source.read(None, 10).unwrap();
    assert_eq!(
        texts(
            &page
                .items
                .iter()
                .flat_map(|i| i.blocks.clone())
                .collect::<Vec<_>>()
        ),
        ["r1", "one"]
    );
    let first = page.items[1].position.clone();
    append(&path, &(rest.to_owned() + &reply(4, "r2")));
    let page = source.read(None, 10).unwrap();
    assert_eq!(page.items.len(), 4, "the finished line and the next one");
    // Forward from the first item: the rest of the conversation, oldest first.
    let newer = source.read_newer(&first, 10).unwrap();
    let got: Vec<Block> = newer.items.iter().flat_map(|i| i.blocks.clone()).collect();
    assert_eq!(texts(&got), ["r1", "two", "r2"]);
    assert!(!newer.more);
    // Codex rolls the last turn back and takes another message.
    append(
        &path,
        &(event(5, r#"{"type":"thread_rolled_back","num_turns":1}"#) + &user(6, "op-3", "three")),
    );
    let newer = source.read_newer(&first, 10).unwrap();
    let got: Vec<Block> = newer.items.iter().flat_map(|i| i.blocks.clone()).collect();
    assert_eq!(texts(&got), ["r1", "three"]);
    let latest = source.read(None, 10).unwrap();
    let got: Vec<Block> = latest.items.iter().flat_map(|i| i.blocks.clone()).collect();
    assert_eq!(texts(&got), ["three", "r1", "one"]);
    // The older page from a position read before any of this still holds.
    let older = source.read(Some(&latest.items[1].position), 10).unwrap();
    assert_eq!(older.items.len(), 1);
}

// TL-10: a rewritten file: the position is gone, the older page asks for a reload.
#[test]
fn a_rewritten_rollout_asks_for_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rollout.jsonl");
    let mut text = meta();
    for i in 0..30 {
        text += &user(i % 60, &format!("op-{i}"), &format!("m{i}"));
    }
    append(&path, &text);
    let mut source = RolloutSource::open(&path, 1).unwrap();
    let (s, t) = (session(), TargetId::main(&session()));
    let target = Target {
        session: &s,
        target: &t,
        current_run: None,
    };
    let mut store = MemoryOverlayStore::new();
    let built = latest_window(&mut store, &mut source, &key(), target, 12).unwrap();
    let cursor = built.window.oldest_cursor.unwrap();
    std::fs::write(&path, text.replace("\"m1", "\"x1")).unwrap();
    let mut source = RolloutSource::open(&path, 1).unwrap();
    let page = older_page(
        &mut source,
        &key(),
        OlderPageRequest {
            cursor: &cursor,
            page_size: 12,
            expected_boundary_token: None,
        },
    )
    .unwrap();
    assert!(page.reload_required);
    assert!(page.blocks.is_empty());
    assert!(source
        .read(Some(&SourcePosition("item-3".into())), 5)
        .is_err());
}

// Lines a version does not know, and lines that are not JSON, are counted and skipped;
// the thread comes from the file name when the first line is not `session_meta`.
#[test]
fn unknown_lines_are_counted_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let name = "rollout-2026-01-01T00-00-00-019a93b9-f380-7600-98ff-940e6b99603c.jsonl";
    let path = dir.path().join(name);
    append(
        &path,
        &(user(1, "op-1", "one")
            + "not json\n"
            + r#"{"timestamp":"2026-01-01T00:00:02.000Z","type":"future_line","payload":{}}"#
            + "\n"
            + &event(3, r#"{"type":"brand_new_event"}"#)
            + &reply(4, "r1")),
    );
    let mut source = RolloutSource::open(&path, 1).unwrap();
    let page = source.read(None, 10).unwrap();
    assert_eq!(page.items.len(), 2);
    let d = source.diagnostics();
    assert_eq!(d.get(Skip::Malformed, "line:not-json"), 1);
    assert_eq!(d.get(Skip::Unknown, "line:future_line"), 1);
    assert_eq!(d.get(Skip::Unknown, "line:event_msg/brand_new_event"), 1);
    assert_eq!(source.thread_id(), "019a93b9-f380-7600-98ff-940e6b99603c");
    // A compressed rollout is the same source as its plain file.
    let zst = dir.path().join(format!("{name}.zst"));
    let plain = std::fs::read(&path).unwrap();
    std::fs::write(&zst, zstd::stream::encode_all(plain.as_slice(), 3).unwrap()).unwrap();
    let mut packed = RolloutSource::open(&zst, 1).unwrap();
    assert_eq!(packed.boundary_token(), source.boundary_token());
    assert_eq!(
        packed.read(None, 10).unwrap(),
        source.read(None, 10).unwrap()
    );
}

// A compressed rollout decompresses to at most the limit: exactly the limit is read,
// one byte more is refused with a typed error before more is taken.
#[test]
fn a_compressed_rollout_decompresses_up_to_its_limit_and_no_further() {
    use agent_codex::edge::{EdgeError, RolloutBytes, DECOMPRESSED_LIMIT};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rollout.jsonl.zst");
    let text = meta() + &user(1, "op-1", "hello");
    std::fs::write(&path, zstd::stream::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
    let size = text.len() as u64;
    let at = RolloutBytes::open_limited(&path, size).unwrap();
    assert_eq!(at.len().unwrap(), size);
    match RolloutBytes::open_limited(&path, size - 1) {
        Err(EdgeError::TooLarge { limit, .. }) => assert_eq!(limit, size - 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(DECOMPRESSED_LIMIT, 256 * 1024 * 1024);
    assert_eq!(RolloutBytes::open(&path).unwrap().len().unwrap(), size);
}
