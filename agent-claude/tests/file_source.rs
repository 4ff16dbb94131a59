//! A transcript file as the history source of `overlay-core` (TL-09, TL-10, OV-05): the
//! latest window and the older pages by Claude cursor, read from the file's end, give
//! the rows a read of the whole file gives; a missing file is an empty conversation.

#![allow(clippy::disallowed_methods)] // writes and reads transcript files

mod common;

use agent_claude::file::{
    project_slug, read_latest, read_transcript, transcript_path, TranscriptFile,
};
use agent_claude::source::TranscriptSource;
use common::{data, TRANSCRIPT_FILES};
use overlay_core::source::{HistorySource, SourceError, SourcePosition};
use overlay_core::store::memory::MemoryOverlayStore;
use overlay_core::window::{latest_window, older_page, OlderPageRequest, Target};
use timeline_core::cursor::ClaudeCursor;
use timeline_core::key::{SessionId, TargetId};
use timeline_core::seal::HostKey;

const SESSION: &str = "ae4a77f8-aedd-4bc1-888f-c94edc91af04";

fn placed(dir: &tempfile::TempDir, rel: &str) -> std::path::PathBuf {
    let path = transcript_path(&dir.path().join("projects"), "/Users/me/my.proj", SESSION);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(&path, data(rel)).expect("write");
    path
}

// Where Claude keeps a transcript: `<projects>/<slug of cwd>/<session>.jsonl`.
#[test]
fn transcripts_live_under_the_project_slug() {
    assert_eq!(project_slug("/Users/me/my.proj"), "-Users-me-my-proj");
    assert_eq!(project_slug("C:\\work\\a b"), "C--work-a-b");
    let p = transcript_path(std::path::Path::new("/h/.claude/projects"), "/w", "s1");
    assert_eq!(p, std::path::Path::new("/h/.claude/projects/-w/s1.jsonl"));
}

// TL-09: the file source answers every read as the in-memory source over the whole
// file does: the latest page, pages before each position, pages after each.
#[test]
fn the_file_source_reads_like_the_whole_transcript() {
    let dir = tempfile::tempdir().expect("tempdir");
    for rel in &TRANSCRIPT_FILES[..8] {
        let path = placed(&dir, rel);
        let whole = read_transcript(&path).expect("read");
        let mut memory = TranscriptSource {
            target: SESSION.into(),
            transcript: &whole,
        };
        let mut file = TranscriptFile::new(&path, SESSION);
        assert_eq!(file.kind(), memory.kind());
        assert_eq!(file.boundary_token(), memory.boundary_token());
        let mut before: Option<SourcePosition> = None;
        loop {
            let a = file.read(before.as_ref(), 4);
            let b = memory.read(before.as_ref(), 4);
            assert_eq!(a, b, "{rel} before {before:?}");
            let page = a.expect("a page");
            if let Some(oldest) = page.items.last() {
                assert_eq!(
                    file.read_newer(&oldest.position, 3),
                    memory.read_newer(&oldest.position, 3),
                    "{rel}"
                );
            }
            match page.items.last() {
                Some(item) if page.more => before = Some(item.position.clone()),
                _ => break,
            }
        }
    }
}

// "A transcript that does not exist loads as an empty conversation."; a position in it
// is gone.
#[test]
fn a_missing_transcript_is_an_empty_conversation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nope.jsonl");
    let page = read_latest(&path, 10).expect("a page");
    assert!(page.items.is_empty() && !page.more);
    assert!(read_transcript(&path).expect("read").items().is_empty());
    let mut file = TranscriptFile::new(&path, "s");
    assert_eq!(
        file.read(Some(&SourcePosition("u1".into())), 5),
        Err(SourceError::PositionGone)
    );
}

// OV-05, TL-09: overlay-core builds the latest window from the file and an older page
// from the Claude cursor it wrote (`{session, before, anchor, revision, mac}`); the rows
// of both are the whole conversation's rows, in order, without overlap.
#[test]
fn windows_and_older_pages_by_claude_cursor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rel = "spotter/tool_heavy.jsonl";
    let path = placed(&dir, rel);
    let key = HostKey::from_bytes([7; 32]);
    let session = SessionId::new("app-session").expect("id");
    let target = TargetId::main(&session);
    let mut store = MemoryOverlayStore::new();
    let mut file = TranscriptFile::new(&path, SESSION);
    let t = Target {
        session: &session,
        target: &target,
        current_run: None,
    };
    let built = latest_window(&mut store, &mut file, &key, t, 4).expect("a window");
    let mut rows: Vec<String> = Vec::new();
    let mut page_rows: Vec<String> = built
        .window
        .blocks
        .iter()
        .map(|b| b.key().encoded())
        .collect();
    let mut cursor = built.window.oldest_cursor.clone();
    let mut pages = 0;
    while let Some(c) = cursor {
        let decoded = ClaudeCursor::decode(&c, &key, SESSION).expect("a Claude cursor");
        assert_eq!(decoded.session, SESSION);
        pages += 1;
        let older = older_page(
            &mut file,
            &key,
            OlderPageRequest {
                cursor: &c,
                page_size: 4,
                expected_boundary_token: Some(&built.window.boundary_token),
            },
        )
        .expect("an older page");
        assert!(!older.reload_required);
        let mut newer = std::mem::take(&mut page_rows);
        page_rows = older.blocks.iter().map(|b| b.key().encoded()).collect();
        newer.extend(rows);
        rows = newer;
        cursor = older.oldest_cursor;
    }
    page_rows.extend(rows);
    let rows = page_rows;
    assert!(pages >= 2, "{pages} older pages");
    let whole = read_transcript(&path).expect("read");
    let expected: Vec<String> = whole.blocks().iter().map(|b| b.key().encoded()).collect();
    assert_eq!(rows, expected);
}
