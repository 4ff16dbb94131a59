//! Prints a real agent's saved conversation as rows, through the same host a desktop
//! runs: a Codex rollout (`~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`, or
//! `.jsonl.zst`) or a Claude Code transcript (`~/.claude/projects/<slug>/<session>.jsonl`)
//! becomes the history source of a [`Host`]; a desktop `Timeline` loads its latest window
//! and pages back to the start.
//!
//! `cargo run -p host-core --example history -- <rollout or transcript file>`

// The example is the embedding: it reads its arguments and files.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::path::Path;

use host_core::{ClientRequest, Host, HostConfig, HostEffect, Reply, ReplyTo};
use outbox_core::{Capabilities, MemoryOutboxStore, SessionInfo};
use overlay_core::{HistorySource, MemoryOverlayStore};
use timeline_core::timeline::{LoadFailure, TimelineEffect};
use timeline_core::{ClientMode, HostKey, Millis, SessionId, TargetId, Timeline};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Pages of older rows read at most (a page is at most 100 rows).
const MAX_PAGES: usize = 10_000;

fn main() -> Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: history <rollout or transcript file>")?;
    let path = Path::new(&path);
    let (source, capabilities, agent) = open(path)?;
    let session = SessionId::new("history")?;
    let target = TargetId::main(&session);
    let config = HostConfig::new(HostKey::from_bytes([1; 32]), Box::new(String::new));
    let mut host = Host::new(MemoryOutboxStore::new(), MemoryOverlayStore::new(), config);
    host.add_session(&session, SessionInfo::new(capabilities), source);
    host.start(Millis(0))?;

    let mut desktop = Timeline::new(ClientMode::Desktop);
    let now = Millis(0);
    desktop.open_target(target.clone(), now);
    serve(&mut host, &mut desktop, &session, &target, now);
    for _ in 0..MAX_PAGES {
        if !desktop.load_older(now) {
            break;
        }
        serve(&mut host, &mut desktop, &session, &target, now);
    }
    println!(
        "{agent} conversation in {}: {} rows\n",
        path.display(),
        desktop.len()
    );
    for row in desktop.rows() {
        println!("{}", timeline_core::rows::plain_text(row.block));
    }
    Ok(())
}

/// The history source of the file: a Codex rollout or a Claude transcript.
fn open(path: &Path) -> Result<(Box<dyn HistorySource + Send>, Capabilities, &'static str)> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if name.starts_with("rollout-") || name.ends_with(".zst") {
        let source = agent_codex::RolloutSource::open(path, 1)?;
        return Ok((Box::new(source), Capabilities::codex(), "Codex"));
    }
    let stem = name.strip_suffix(".jsonl").unwrap_or(name).to_owned();
    let source = agent_claude::TranscriptFile::new(path, stem);
    Ok((Box::new(source), Capabilities::claude(), "Claude Code"))
}

/// Carries the desktop's load effects to the host and its answers back.
fn serve(
    host: &mut Host<MemoryOutboxStore, MemoryOverlayStore>,
    desktop: &mut Timeline,
    session: &SessionId,
    target: &TargetId,
    now: Millis,
) {
    while let Some(effect) = desktop.poll_effect() {
        let (request, tag) = match effect {
            TimelineEffect::LoadLatestWindow { tag, page_size, .. } => (
                ClientRequest::LatestWindow {
                    session: session.clone(),
                    target: target.clone(),
                    page_size,
                },
                tag,
            ),
            TimelineEffect::LoadOlderPage {
                tag,
                cursor,
                page_size,
                expected_boundary_token,
            } => (
                ClientRequest::OlderPage {
                    session: session.clone(),
                    target: target.clone(),
                    cursor,
                    page_size,
                    expected_boundary_token,
                },
                tag,
            ),
            _ => continue,
        };
        host.handle_client(ReplyTo(0), request, now);
        while let Some(effect) = host.poll_effect() {
            match effect {
                HostEffect::Reply {
                    reply: Reply::LatestWindow(w),
                    ..
                } => {
                    if let Err(e) = &w {
                        eprintln!("latest window: {e}");
                    }
                    desktop.handle_latest_window(
                        &tag,
                        w.map_err(|_| LoadFailure::Unavailable),
                        now,
                    );
                }
                HostEffect::Reply {
                    reply: Reply::OlderPage(p),
                    ..
                } => {
                    if let Err(e) = &p {
                        eprintln!("older page: {e}");
                    }
                    desktop.handle_older_page(&tag, p.map_err(|_| LoadFailure::Unavailable), now);
                }
                HostEffect::Notice(n) => eprintln!("notice ({:?}): {n}", n.severity()),
                _ => {}
            }
        }
    }
}
