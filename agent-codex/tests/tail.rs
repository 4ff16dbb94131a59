//! The tail pagers pinned to the naive truth: one forward pass over the whole file
//! (every line parsed, rollbacks applied as they come, outputs joined, times carried
//! forward) gives the conversation; paging it from the tail, back to the start, and
//! forwards again from any item, gives exactly that conversation, on the real rollouts
//! and on random files (torn last lines, lines that are not JSON, lines longer than a
//! read block, rollbacks, lines without a time).

#![allow(clippy::disallowed_methods)] // a test of real files reads them

use std::collections::HashMap;
use std::path::PathBuf;

use agent_codex::history::{self, CallOutput, LineRole};
use agent_codex::rollout::RolloutReader;
use agent_codex::tail::{
    line_hash, rollback_offsets, LinePosition, PageAfter, PageBefore, TailError, TailItem,
};
use agent_codex::time::parse_timestamp;
use proptest::prelude::*;
use timeline_core::time::Millis;

/// The conversation of `file`, oldest first, by one forward pass.
fn naive(file: &[u8]) -> Vec<TailItem> {
    struct P {
        pos: LinePosition,
        entry: history::Entry,
        output: Option<CallOutput>,
        turn: i64,
    }
    let mut reader = RolloutReader::new();
    let mut items: Vec<usize> = Vec::new();
    // Every call read so far (rolled back or not) still waiting for its output.
    let mut waiting: HashMap<String, Vec<usize>> = HashMap::new();
    let mut all: Vec<P> = Vec::new();
    let mut last = Millis(0);
    let mut turn = 0i64;
    let mut offset = 0usize;
    let pieces: Vec<&[u8]> = file.split(|&b| b == b'\n').collect();
    let n = pieces.len();
    for (i, raw) in pieces.into_iter().enumerate() {
        let at = offset as u64;
        offset += raw.len() + 1;
        let is_last = i + 1 == n;
        if is_last {
            // After the last newline: read only when whole JSON.
            let body = raw.strip_suffix(b"\r").unwrap_or(raw);
            if serde_json::from_slice::<serde_json::Value>(body).is_err() {
                continue;
            }
        }
        let Some(line) = reader.line(raw) else {
            continue;
        };
        if let Some(t) = line.timestamp.as_deref().and_then(parse_timestamp) {
            last = t;
        }
        match history::role(&line) {
            LineRole::Entry(entry) => {
                if entry.begins_turn() {
                    turn += 1;
                }
                if let Some(c) = entry.call_id() {
                    waiting.entry(c.to_owned()).or_default().push(all.len());
                }
                all.push(P {
                    pos: LinePosition {
                        offset: at,
                        len: raw.len() as u64,
                        hash: line_hash(raw),
                        at: last,
                    },
                    entry,
                    output: None,
                    turn,
                });
                items.push(all.len() - 1);
            }
            LineRole::Output { call_id, output } => {
                for i in waiting.remove(&call_id).unwrap_or_default() {
                    all[i].output = Some(output.clone());
                }
            }
            LineRole::RolledBack { turns } => {
                turn -= turns as i64;
                items.retain(|&i| all[i].turn <= turn);
            }
            _ => {}
        }
    }
    items
        .iter()
        .map(|&i| &all[i])
        .map(|p| TailItem {
            position: p.pos,
            blocks: history::blocks(&p.entry, p.pos.offset, p.pos.at, p.output.as_ref()),
        })
        .collect()
}

fn slice(file: &[u8], r: std::ops::Range<u64>) -> &[u8] {
    &file[r.start as usize..r.end as usize]
}

fn before(
    file: &[u8],
    p: Option<LinePosition>,
    limit: usize,
) -> Result<agent_codex::tail::TailPage, TailError> {
    let mut pager = match p {
        None => PageBefore::latest(file.len() as u64, limit),
        Some(p) => PageBefore::before(p, file.len() as u64, limit),
    };
    while let Some(r) = pager.want() {
        pager.give(r.start, slice(file, r))?;
    }
    pager.finish()
}

fn after(
    file: &[u8],
    p: LinePosition,
    limit: usize,
) -> Result<agent_codex::tail::TailPage, TailError> {
    let mut pager = PageAfter::new(p, file.len() as u64, limit);
    let (rollbacks, _) = rollback_offsets(0, file);
    if let Some(last) = rollbacks.into_iter().filter(|&o| o >= p.end()).max() {
        pager = pager.read_through(last);
    }
    while let Some(r) = pager.want() {
        pager.give(r.start, slice(file, r))?;
    }
    pager.finish()
}

/// Pages `file` from the tail to the start, then forwards from every `stride`-th item,
/// comparing each page with the naive conversation.
fn check_paging(file: &[u8], limit: usize, stride: usize) {
    let truth = naive(file);
    let mut read: Vec<TailItem> = Vec::new();
    let mut position = None;
    loop {
        let page = before(file, position, limit).expect("a page");
        assert!(page.items.len() <= limit);
        let more = page.more;
        read.extend(page.items);
        match (more, read.last()) {
            (true, Some(last)) => position = Some(last.position),
            _ => break,
        }
    }
    read.reverse();
    assert_eq!(read.len(), truth.len(), "every item, once");
    for (a, b) in read.iter().zip(&truth) {
        assert_eq!(a, b);
    }
    for (i, item) in truth.iter().enumerate().step_by(stride.max(1)) {
        let page = after(file, item.position, limit).expect("a newer page");
        let expected: Vec<&TailItem> = truth.iter().skip(i + 1).take(limit).collect();
        assert_eq!(
            page.items.iter().collect::<Vec<_>>(),
            expected,
            "newer than item {i}"
        );
        assert_eq!(
            page.more,
            truth.len() > i + 1 + limit,
            "more after item {i}"
        );
    }
}

fn data(rel: &str) -> Vec<u8> {
    let copy = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel);
    std::fs::read(copy).expect("read a real rollout")
}

const ROLLOUTS: [&str; 2] = [
    "codex-session-view/rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl",
    "agent-sessions/codex-small.jsonl",
];

// TL-08, OV-05: pages of a real rollout read from its tail are the file's conversation.
#[test]
fn real_rollouts_page_like_one_forward_read() {
    for rel in ROLLOUTS {
        let file = data(rel);
        for limit in [1, 5, 12, 100] {
            check_paging(&file, limit, 7);
        }
    }
}

#[test]
fn the_latest_page_of_a_real_rollout_reads_its_tail_only() {
    let mut file = Vec::new();
    let one = data(ROLLOUTS[0]);
    while file.len() < 8 << 20 {
        file.extend_from_slice(&one);
    }
    let mut pager = PageBefore::latest(file.len() as u64, 12);
    let mut read = 0u64;
    while let Some(r) = pager.want() {
        read += r.end - r.start;
        pager.give(r.start, slice(&file, r)).unwrap();
    }
    let page = pager.finish().unwrap();
    assert_eq!(page.items.len(), 12);
    assert!(
        read <= 4 * agent_codex::tail::BLOCK,
        "read {read} bytes of {}",
        file.len()
    );
}

#[test]
fn a_position_from_another_file_or_a_torn_line_is_gone() {
    let file = data(ROLLOUTS[1]);
    let page = before(&file, None, 3).unwrap();
    let p = page.items[2].position;
    let shifted: Vec<u8> = [b"\n".as_slice(), &file].concat();
    assert_eq!(before(&shifted, Some(p), 3), Err(TailError::PositionGone));
    assert_eq!(after(&shifted, p, 3), Err(TailError::PositionGone));
    let short = &file[..p.offset as usize + 3];
    assert_eq!(before(short, Some(p), 3), Err(TailError::PositionGone));
    let forged = LinePosition {
        offset: p.offset + 1,
        ..p
    };
    assert_eq!(before(&file, Some(forged), 3), Err(TailError::PositionGone));
}

// ----- random files ----------------------------------------------------------------------

fn ts(i: usize) -> String {
    format!("2025-01-01T00:{:02}:{:02}.000Z", (i / 60) % 60, i % 60)
}

fn event(t: &str, payload: String) -> String {
    format!(r#"{{"timestamp":"{t}","type":"event_msg","payload":{payload}}}"#)
}

fn item(t: &str, payload: String) -> String {
    format!(r#"{{"timestamp":"{t}","type":"response_item","payload":{payload}}}"#)
}

/// One random line (without its newline); `i` numbers it.
fn render(kind: u8, i: usize, arg: usize) -> String {
    let t = ts(i);
    match kind % 12 {
        0 => event(
            &t,
            format!(r#"{{"type":"user_message","message":"u{i}","client_id":"op-{i}"}}"#),
        ),
        1 => event(
            &t,
            format!(r#"{{"type":"agent_message","message":"r{i}"}}"#),
        ),
        2 => event(&t, format!(r#"{{"type":"agent_reasoning","text":"t{i}"}}"#)),
        3 => item(
            &t,
            format!(
                r#"{{"type":"function_call","name":"shell","arguments":"{{\"command\":[\"bash\",\"-lc\",\"echo {i}\"]}}","call_id":"call-{}"}}"#,
                arg % 6
            ),
        ),
        4 => item(
            &t,
            format!(
                r#"{{"type":"function_call_output","call_id":"call-{}","output":"{{\"output\":\"o{i}\",\"metadata\":{{\"exit_code\":{}}}}}"}}"#,
                arg % 6,
                arg % 2
            ),
        ),
        5 => event(
            &t,
            format!(r#"{{"type":"thread_rolled_back","num_turns":{}}}"#, arg % 3),
        ),
        6 => event(&t, r#"{"type":"token_count","info":null}"#.to_owned()),
        7 => "this line is not JSON".to_owned(),
        8 => event(
            "[trimmed]",
            format!(r#"{{"type":"agent_message","message":"no time {i}"}}"#),
        ),
        9 => event(
            &t,
            format!(
                r#"{{"type":"agent_message","message":"{}"}}"#,
                "x".repeat(70_000 + arg)
            ),
        ),
        10 => r#"{"type":"compacted","payload":{"message":""}}"#.to_owned(),
        _ => event(&t, format!(r#"{{"type":"brand_new_event","n":{i}}}"#)),
    }
}

fn file_of(lines: &[(u8, usize)], torn: Option<usize>, crlf: bool) -> Vec<u8> {
    let mut out = String::new();
    for (i, (kind, arg)) in lines.iter().enumerate() {
        out += &render(*kind, i, *arg);
        out += if crlf && i % 3 == 0 { "\r\n" } else { "\n" };
    }
    let mut bytes = out.into_bytes();
    if let Some(cut) = torn {
        // A last line still being written.
        let next = render(1, lines.len(), 0);
        bytes.extend_from_slice(&next.as_bytes()[..cut.min(next.len() - 1)]);
    }
    bytes
}

fn kinds() -> impl Strategy<Value = Vec<(u8, usize)>> {
    // Long lines (kind 9) are rare: a few per file at most.
    let kind = prop_oneof![
        20 => (0u8..9, 0usize..12),
        1 => (9u8..10, 0usize..12),
        3 => (10u8..12, 0usize..12),
    ];
    proptest::collection::vec(kind, 0..60)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(96)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    // TL-08: the pagers are the forward read, whatever the file holds.
    #[test]
    fn random_rollouts_page_like_one_forward_read(
        lines in kinds(),
        torn in proptest::option::of(0usize..40),
        crlf in any::<bool>(),
        limit in 1usize..6,
    ) {
        let file = file_of(&lines, torn, crlf);
        check_paging(&file, limit, 1);
    }

    // A file being written: the page of the file read so far, and after the writer
    // finished the line, the page of the whole file, both as the forward read says.
    #[test]
    fn a_torn_last_line_is_read_once_it_is_whole(lines in kinds(), cut in 1usize..60) {
        let whole = file_of(&lines, None, false);
        let next = render(0, lines.len(), 0) + "\n";
        let mut growing = whole.clone();
        growing.extend_from_slice(&next.as_bytes()[..cut.min(next.len() - 2)]);
        let page = before(&growing, None, 4).unwrap();
        prop_assert!(page.torn_tail);
        let truth = naive(&whole);
        let newest: Vec<&TailItem> = truth.iter().rev().take(4).collect();
        prop_assert_eq!(page.items.iter().collect::<Vec<_>>(), newest);
        growing.truncate(whole.len());
        growing.extend_from_slice(next.as_bytes());
        let page = before(&growing, None, 1).unwrap();
        prop_assert!(!page.torn_tail);
        let newest = format!("u{}", lines.len());
        prop_assert_eq!(page.items[0].blocks[0].data["text"].as_str(), Some(newest.as_str()));
    }
}
