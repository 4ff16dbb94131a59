//! Helpers shared by the timeline test files.
#![allow(dead_code, clippy::unwrap_used)]

use fixtures::sim_host::SimHost;
use timeline_core::block::Block;
use timeline_core::cursor::BoundaryToken;
use timeline_core::key::{BlockKey, BlockType, OperationId, TargetId};
use timeline_core::order::SourceOrder;
use timeline_core::time::Millis;
use timeline_core::timeline::{ClientMode, Origin, RequestTag, Timeline, TimelineEffect};
use timeline_core::wire::{LiveOverlay, TimelineWindow};

pub fn key(t: BlockType, id: &str) -> BlockKey {
    BlockKey::parse(t, id).unwrap()
}

pub fn reply(id: &str) -> BlockKey {
    key(BlockType::AgentReply, id)
}

pub fn op(id: &str) -> OperationId {
    OperationId::new(id).unwrap()
}

pub fn target(id: &str) -> TargetId {
    TargetId::new(id).unwrap()
}

pub fn hist(id: &str, t: u64) -> Block {
    Block::new(reply(id), Millis(t)).with_source_order(SourceOrder::history(t, 0))
}

pub fn live(id: &str, t: u64, seq: u64) -> Block {
    Block::new(reply(id), Millis(t)).with_source_order(SourceOrder::live(seq))
}

pub fn overlay(epoch: u64, revision: u64, blocks: Vec<Block>) -> LiveOverlay {
    LiveOverlay {
        settlement_epoch: epoch,
        revision,
        blocks,
    }
}

pub fn window(blocks: Vec<Block>, o: LiveOverlay) -> TimelineWindow {
    TimelineWindow {
        blocks,
        oldest_cursor: None,
        boundary_token: BoundaryToken::claude("s"),
        window_revision: 1,
        live_overlay: Some(o),
        anchor_row: None,
        anchor_notice: None,
        newer_cursor: None,
    }
}

/// The rows as `(origin, id)` pairs.
pub fn ids(t: &Timeline) -> Vec<(Origin, String)> {
    t.rows()
        .map(|r| (r.origin, r.block.id.as_str().to_owned()))
        .collect()
}

/// Drains effects and returns them.
pub fn effects(t: &mut Timeline) -> Vec<TimelineEffect> {
    std::iter::from_fn(|| t.poll_effect()).collect()
}

/// The tag of the newest latest-window request among `effects`.
pub fn latest_tag(effects: &[TimelineEffect]) -> RequestTag {
    effects
        .iter()
        .rev()
        .find_map(|e| match e {
            TimelineEffect::LoadLatestWindow { tag, .. } => Some(tag.clone()),
            _ => None,
        })
        .expect("a latest-window request")
}

/// A timeline opened on target `s` with one window applied.
pub fn opened(mode: ClientMode, w: TimelineWindow) -> Timeline {
    let mut t = Timeline::new(mode);
    t.open_target(target("s"), Millis(0));
    let tag = latest_tag(&effects(&mut t));
    t.handle_latest_window(&tag, Ok(w), Millis(1));
    t
}

/// A client that loads the host's latest window now.
pub fn load_latest(t: &mut Timeline, host: &mut SimHost, now: Millis) {
    t.reload(now);
    let tag = latest_tag(&effects(t));
    let (w, _) = host.latest_window();
    t.handle_latest_window(&tag, Ok(w), now);
}
