//! Codex history through `thread/items/list` ([`ItemsSource`]): pages of 100 newest
//! first, positions that survive a growing newest page, the rows the live stream
//! showed, unsupported items as diagnostic rows, malformed entries failing the page.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use agent_codex::items::{ItemPages, ItemsPage, ItemsSource, ThreadLink, ITEMS_PAGE};
use agent_codex::protocol::{Notification, ServerNotification};
use agent_codex::{AdapterError, ListedItem, Projected, Projector};
use overlay_core::source::{HistorySource, SourceError, SourcePosition};
use serde_json::{json, Value};
use timeline_core::time::Millis;

/// A thread's entries, oldest first, paged as Codex pages them: `e<epoch>c<n>` starts
/// `n` items back from the newest.
#[derive(Default)]
struct Thread {
    entries: Vec<Value>,
    calls: Vec<Option<String>>,
    /// Cursors carry it; one of an earlier epoch is refused (a restarted Codex that no
    /// longer knows the cursors it gave before).
    epoch: u32,
    /// Answer every page empty, naming these cursors in turn (a Codex that loops, or
    /// one whose pages hold nothing).
    looping: Vec<String>,
}

impl ItemPages for Thread {
    fn page(&mut self, thread: &str, cursor: Option<&str>) -> Result<ItemsPage, AdapterError> {
        assert_eq!(thread, "th-1");
        self.calls.push(cursor.map(str::to_owned));
        if !self.looping.is_empty() {
            let n = self.calls.len() - 1;
            return Ok(ItemsPage {
                items: Vec::new(),
                next_cursor: Some(self.looping[n % self.looping.len()].clone()),
            });
        }
        if cursor.is_some_and(|c| !c.starts_with(&format!("e{}c", self.epoch))) {
            return Err(AdapterError::Rpc {
                code: -32600,
                message: "invalid cursor".into(),
            });
        }
        let skip: usize = match cursor {
            None => 0,
            Some(c) => c.split_once('c').unwrap().1.parse().unwrap(),
        };
        let newest_first: Vec<&Value> = self.entries.iter().rev().skip(skip).collect();
        let page = ITEMS_PAGE as usize;
        let mut items = Vec::new();
        for e in newest_first.iter().take(page) {
            items.push(
                ListedItem::from_entry(e).map_err(|error| AdapterError::Unreadable {
                    method: "thread/items/list",
                    error: agent_codex::codec::LineError::Shape {
                        what: "thread/items/list".into(),
                        shape: error,
                    },
                })?,
            );
        }
        let next_cursor =
            (newest_first.len() > page).then(|| format!("e{}c{}", self.epoch, skip + page));
        Ok(ItemsPage { items, next_cursor })
    }
}

fn reply(n: usize) -> Value {
    json!({"turnId": format!("turn-{}", n / 2), "startedAtMs": 1_000 + n as u64,
           "completedAtMs": 1_500 + n as u64,
           "item": {"type": "agentMessage", "id": format!("msg-{n}"), "text": format!("reply {n}"),
                    "phase": "final_answer"}})
}

fn source(entries: Vec<Value>) -> (ItemsSource, Arc<Mutex<Thread>>) {
    let thread = Arc::new(Mutex::new(Thread {
        entries,
        ..Thread::default()
    }));
    let pages: agent_codex::items::SharedPages = thread.clone();
    (ItemsSource::new(pages, ThreadLink::to("th-1"), 1), thread)
}

fn texts(page: &overlay_core::source::SourcePage) -> Vec<String> {
    page.items
        .iter()
        .flat_map(|i| i.blocks.iter())
        .map(|b| b.data["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

// AG-05, OV-05, TL-08: pages of 100 newest first; every item is read once, in order, across
// reads that cross the sidecar's pages; `more` says whether older items remain.
#[test]
fn reads_cross_sidecar_pages_newest_first_and_read_each_item_once() {
    let (mut source, thread) = source((0..250).map(reply).collect());
    let mut seen = Vec::new();
    let mut before: Option<SourcePosition> = None;
    loop {
        let page = source.read(before.as_ref(), 40).unwrap();
        seen.extend(texts(&page));
        before = page.items.last().map(|i| i.position.clone());
        if !page.more {
            break;
        }
    }
    let want: Vec<String> = (0..250).rev().map(|n| format!("reply {n}")).collect();
    assert_eq!(seen, want);
    // Each read asks again for the page its position came in, and no more.
    let calls = thread.lock().unwrap().calls.len();
    assert!(calls <= 2 * 7, "{calls} pages for 7 reads");
}

// AG-05: a position survives the newest page growing: the read goes on right after its item.
#[test]
fn a_position_in_the_newest_page_survives_new_items() {
    let (mut source, thread) = source((0..10).map(reply).collect());
    let first = source.read(None, 3).unwrap();
    assert_eq!(texts(&first), ["reply 9", "reply 8", "reply 7"]);
    thread.lock().unwrap().entries.extend((10..14).map(reply));
    let next = source.read(Some(&first.items[2].position), 3).unwrap();
    assert_eq!(texts(&next), ["reply 6", "reply 5", "reply 4"]);
    // Newer than the first page's last item: the items above it, oldest first.
    let newer = source.read_newer(&first.items[2].position, 4).unwrap();
    assert_eq!(
        texts(&newer),
        ["reply 8", "reply 9", "reply 10", "reply 11"]
    );
    assert!(newer.more);
}

// AG-05: a position whose item left the thread is gone; a thread not yet known reads empty.
#[test]
fn a_position_no_longer_held_is_gone_and_an_unknown_thread_is_empty() {
    let (mut source, thread) = source((0..5).map(reply).collect());
    let page = source.read(None, 5).unwrap();
    thread.lock().unwrap().entries.remove(2);
    let gone = source.read(Some(&page.items[2].position), 5);
    assert_eq!(gone, Err(SourceError::PositionGone));
    let pages: agent_codex::items::SharedPages = thread;
    let mut unknown = ItemsSource::new(pages, ThreadLink::default(), 1);
    assert_eq!(unknown.read(None, 5).unwrap().items.len(), 0);
}

// AG-05, TL-03: each saved item shows the row the live stream showed for it: the same key,
// data and operation, so history settles the live row in place.
#[test]
fn saved_items_show_the_rows_the_live_stream_showed() {
    let items = vec![
        json!({"type": "userMessage", "id": "u-1", "clientId": "op-1",
               "content": [{"type": "text", "text": "Run it", "text_elements": []}]}),
        json!({"type": "agentMessage", "id": "msg-1", "text": "Done.", "phase": "final_answer"}),
        json!({"type": "commandExecution", "id": "cmd-1", "command": "ls", "cwd": "/w",
               "status": "completed", "aggregatedOutput": "a\n", "exitCode": 0,
               "commandActions": []}),
        json!({"type": "reasoning", "id": "r-1", "summary": ["Thinking it over"], "content": []}),
    ];
    let mut live = Projector::new("s-1", None, 1);
    let mut live_rows = Vec::new();
    for item in &items {
        let n = Notification {
            emitted_at_ms: Some(5),
            body: ServerNotification::from_parts(
                "item/completed",
                &json!({"threadId": "th-1", "turnId": "turn-1", "item": item, "completedAtMs": 5}),
            )
            .unwrap(),
        };
        for p in live.handle(&n, Millis(5)) {
            if let Projected::Row(r) = p {
                live_rows.push(r.block);
            }
        }
    }
    let entries = items
        .iter()
        .map(|item| json!({"turnId": "turn-1", "startedAtMs": 5, "item": item}))
        .collect();
    let (mut source, _) = source(entries);
    let page = source.read(None, 10).unwrap();
    let mut history: Vec<_> = page.items.iter().flat_map(|i| i.blocks.clone()).collect();
    history.reverse();
    assert_eq!(history.len(), live_rows.len());
    for (h, l) in history.iter().zip(&live_rows) {
        assert_eq!(
            (h.key(), &h.data, &h.operation_id),
            (l.key(), &l.data, &l.operation_id)
        );
        assert_eq!(h.timestamp, Millis(5));
    }
}

// AG-05, the seed: "an unsupported public item appears as a diagnostic row that still advances
// the cursor, and an entry with neither or both of item and unsupportedItem fails the
// whole page".
#[test]
fn unsupported_items_are_diagnostic_rows_and_malformed_entries_fail_the_page() {
    let entries = vec![
        reply(0),
        json!({"turnId": "turn-1", "unsupportedItem": {"type": "futureThing", "id": "f-1"}}),
        json!({"turnId": "turn-1", "item": {"type": "hologram", "id": "h-1"}}),
        reply(1),
    ];
    let (mut source, thread) = source(entries);
    let page = source.read(None, 10).unwrap();
    let rows: Vec<_> = page.items.iter().flat_map(|i| i.blocks.clone()).collect();
    assert_eq!(rows.len(), 4, "every entry advances and shows a row");
    assert_eq!(rows[1].data["diagnostic"]["unsupportedItem"], "hologram");
    assert_eq!(rows[2].data["diagnostic"]["unsupportedItem"], "futureThing");
    assert_eq!(
        rows[2].key().block_type,
        timeline_core::key::BlockType::System
    );
    for bad in [
        json!({"turnId": "turn-1"}),
        json!({"turnId": "turn-1", "item": {"type": "agentMessage", "id": "x", "text": ""},
               "unsupportedItem": {"type": "y"}}),
        json!({"turnId": "turn-1", "item": "not an object"}),
    ] {
        thread.lock().unwrap().entries.push(bad);
        assert!(
            matches!(source.read(None, 10), Err(SourceError::Malformed(_))),
            "a malformed entry fails the page"
        );
        thread.lock().unwrap().entries.pop();
    }
}

// AG-05: a page cursor Codex no longer takes sends the read to look for its item from
// the present; a Codex that gives one cursor twice fails the read instead of looping;
// an entry without an ID keeps its position when the newest page grows.
#[test]
fn refused_cursors_looping_pages_and_entries_without_ids() {
    let (mut refusing, thread) = source((0..150).map(reply).collect());
    let first = refusing.read(None, 120).unwrap();
    let last = first.items.last().unwrap().position.clone();
    assert!(last.0.ends_with("e0c100"), "{last:?}");
    thread.lock().unwrap().epoch = 1;
    let next = refusing.read(Some(&last), 5).unwrap();
    assert_eq!(
        texts(&next),
        ["reply 29", "reply 28", "reply 27", "reply 26", "reply 25"]
    );

    // A cycle of two cursors, A then B then A again, fails the read.
    let (mut looping, thread) = source(Vec::new());
    thread.lock().unwrap().looping = vec!["e0cA".into(), "e0cB".into()];
    assert!(matches!(
        looping.read(None, 5),
        Err(SourceError::Malformed(_))
    ));
    // Pages of nothing, each naming a new cursor: after 100 the read fails, rather
    // than answer an end of history that is not one.
    let (mut empty, thread) = source(Vec::new());
    thread.lock().unwrap().looping = (0..1_000).map(|n| format!("e0c{n}")).collect();
    assert!(matches!(
        empty.read(None, 5),
        Err(SourceError::Unavailable(_))
    ));
    assert_eq!(thread.lock().unwrap().calls.len(), 100);

    let unnamed = json!({"turnId": "turn-0", "item": {"type": "hologram"}});
    let (mut unnamed_source, thread) = source(vec![reply(0), unnamed, reply(1)]);
    let page = unnamed_source.read(None, 2).unwrap();
    assert_eq!(
        page.items[1].blocks[0].data["diagnostic"]["unsupportedItem"],
        "hologram"
    );
    thread.lock().unwrap().entries.extend((2..5).map(reply));
    let next = unnamed_source
        .read(Some(&page.items[1].position), 5)
        .unwrap();
    assert_eq!(texts(&next), ["reply 0"]);
    assert!(!next.more);
}

// AG-05: two identical entries without an ID are two positions: a read before the
// second goes on after it, and reads each entry once.
#[test]
fn identical_entries_without_ids_are_read_once_each() {
    let unnamed = json!({"turnId": "turn-0", "item": {"type": "hologram"}});
    let (mut source, _) = source(vec![reply(0), unnamed.clone(), unnamed, reply(1)]);
    let first = source.read(None, 2).unwrap();
    assert_ne!(first.items[0].position, first.items[1].position);
    let second = source.read(Some(&first.items[1].position), 5).unwrap();
    assert_eq!(second.items.len(), 2, "the other hologram, then reply 0");
    assert_ne!(second.items[0].position, first.items[1].position);
    assert_eq!(texts(&second)[1], "reply 0");
}
