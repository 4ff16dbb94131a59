//! The rows of every recording in `tests/data`, in the row wording, one line per row
//! (RW-01, RW-07): title, context line, signal and status of each activity row, the
//! first line of each text row. A transcript shows its conversation, then the items
//! off it (abandoned branches, a subagent's lines in a main file, what came before the
//! last compaction); a stream shows the rows its live projection left and how many
//! deltas went down the packed-history path. Lines Claude split per content block come
//! out as one reply per `message.id`.
//!
//! Snapshots live in `tests/snapshots`, one named file per recording; CI runs with
//! `INSTA_UPDATE=no`, so a change of wording fails until the snapshot is reviewed.

mod common;

use std::collections::BTreeMap;

use agent_claude::project::{Output, Projector};
use agent_claude::stream::StreamDecoder;
use agent_claude::transcript::Transcript;
use common::{data, STREAM_FILES, TRANSCRIPT_FILES};
use timeline_core::block::Block;
use timeline_core::key::{BlockKey, BlockType};
use timeline_core::rows::{validate, ActivityRow, RowStatus};
use timeline_core::time::Millis;

const CUT: usize = 96;

/// `s` on one line, at most [`CUT`] characters, with the number of further lines.
fn one_line(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let first = lines.first().copied().unwrap_or("");
    let mut out: String = first.chars().take(CUT).collect();
    if first.chars().count() > CUT {
        out.push('…');
    }
    if lines.len() > 1 {
        out.push_str(&format!(" (+{} lines)", lines.len() - 1));
    }
    out
}

fn status(s: RowStatus) -> &'static str {
    match s {
        RowStatus::InProgress => "in-progress",
        RowStatus::Completed => "completed",
        RowStatus::Failed => "failed",
        RowStatus::Declined => "declined",
    }
}

/// One row in the wording a client shows.
fn render(b: &Block) -> String {
    match b.block_type {
        BlockType::Activity => {
            let row: ActivityRow = serde_json::from_value(b.data.clone()).expect("an activity row");
            let broken = validate(&row);
            assert!(broken.is_empty(), "{}: {broken:?}", row.title);
            let mut line = format!("activity   {} | {:?}", one_line(&row.title), row.kind);
            if let Some(sub) = &row.subtitle {
                line.push_str(&format!(" | context: {}", one_line(sub)));
            }
            if let Some(signal) = &row.display.signal {
                line.push_str(&format!(" | signal: {signal}"));
            }
            line.push_str(&format!(" | {}", status(row.status)));
            line
        }
        other => {
            let text = b.data["text"].as_str().unwrap_or_default();
            let op = if b.operation_id.is_some() {
                " (operation)"
            } else {
                ""
            };
            format!(
                "{:<10} {}{op}",
                format!("{other:?}").to_lowercase(),
                one_line(text)
            )
        }
    }
}

fn snapshot_name(file: &str) -> String {
    let stem = file.trim_end_matches(".jsonl");
    let stem = stem.rsplit('/').take(2).collect::<Vec<_>>();
    let (name, dir) = (
        stem.first().copied().unwrap_or(""),
        stem.get(1).copied().unwrap_or(""),
    );
    format!("{dir}__{name}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn transcript_rows(file: &str) -> String {
    let bytes = data(file);
    let mut t = Transcript::new();
    t.feed(&bytes);
    let mut out = format!("# {file}\n\n## conversation\n");
    let on: std::collections::HashSet<u64> = t.visible_items().map(|(o, _)| o).collect();
    for (_, item) in t.visible_items() {
        for b in item.rows() {
            out.push_str(&render(&b));
            out.push('\n');
        }
    }
    let off: Vec<_> = t
        .items()
        .iter()
        .filter(|i| !on.contains(&i.offset))
        .collect();
    if !off.is_empty() {
        out.push_str("\n## not in the conversation\n");
        for item in off {
            for b in item.rows() {
                out.push_str(&render(&b));
                out.push('\n');
            }
        }
    }
    out
}

fn stream_rows(file: &str) -> String {
    let bytes = data(file);
    let mut dec = StreamDecoder::new();
    let mut p = Projector::new("session", 0);
    for (i, line) in bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        if let Some(l) = dec.decode(line) {
            p.handle_line(&l, Millis(i as u64));
        }
    }
    // The last version of each row, in the order rows first appeared.
    let mut order: Vec<BlockKey> = Vec::new();
    let mut rows: BTreeMap<String, Block> = BTreeMap::new();
    let mut deltas: BTreeMap<String, usize> = BTreeMap::new();
    let mut ends = Vec::new();
    while let Some(o) = p.poll_effect() {
        match o {
            Output::Row(b) => {
                if !rows.contains_key(&b.key().encoded()) {
                    order.push(b.key());
                }
                rows.insert(b.key().encoded(), b);
            }
            Output::Event(e) => {
                if let Some((kind, block, _)) = e.as_delta() {
                    *deltas.entry(format!("{kind:?} {block}")).or_insert(0) += 1;
                }
            }
            Output::TurnEnded(r) => ends.push(format!(
                "turn ended: {} | {}",
                r.subtype,
                one_line(r.result.as_deref().unwrap_or(""))
            )),
            _ => {}
        }
    }
    let mut out = format!("# {file}\n\n## rows\n");
    for k in order {
        out.push_str(&render(&rows[&k.encoded()]));
        out.push('\n');
    }
    out.push_str("\n## deltas\n");
    for (k, n) in deltas {
        out.push_str(&format!("{k}: {n}\n"));
    }
    for e in ends {
        out.push_str(&format!("\n{e}\n"));
    }
    out
}

// RW-07: every transcript recording, conversation and the rest.
#[test]
fn transcript_rows_snapshot() {
    for file in TRANSCRIPT_FILES {
        insta::assert_snapshot!(
            format!("transcript__{}", snapshot_name(file)),
            transcript_rows(file)
        );
    }
}

// RW-07: every stream-json recording, its live rows and deltas.
#[test]
fn stream_rows_snapshot() {
    for file in STREAM_FILES {
        insta::assert_snapshot!(
            format!("stream__{}", snapshot_name(file)),
            stream_rows(file)
        );
    }
}

// Lines split per content block come out as one reply per `message.id`: no reply or
// thinking row key appears twice in any snapshot's rows.
#[test]
fn one_reply_row_per_message_id() {
    for file in TRANSCRIPT_FILES {
        let bytes = data(file);
        let mut t = Transcript::new();
        t.feed(&bytes);
        let mut seen = std::collections::HashSet::new();
        for item in t.items() {
            for b in item.rows() {
                if matches!(b.block_type, BlockType::AgentReply | BlockType::Thinking) {
                    assert!(seen.insert(b.key()), "{file}: {} twice", b.key());
                }
            }
        }
    }
}
