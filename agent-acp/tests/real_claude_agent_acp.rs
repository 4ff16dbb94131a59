//! The ACP agent against the real `claude-agent-acp` (the pinned
//! `@zed-industries/claude-agent-acp`, Claude Code through its agent SDK), offline against the scripted model server on loopback: send and
//! stream, cancel, permission, load, and a message whose outcome is unknown.
//!
//! Needs the pinned agents (`.ci/run` installs them); without them each test fails
//! saying what to install.

#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

mod common;

use common::Which;

// AG-03 (each scenario's rules are named in tests/common).
#[test]
fn a_message_streams_its_reply_and_the_turn_goes_to_history() {
    common::a_message_streams_its_reply_and_the_turn_goes_to_history(Which::Claude);
}

#[test]
fn a_stop_cancels_the_turn() {
    common::a_stop_cancels_the_turn(Which::Claude);
}

#[test]
fn a_permission_request_is_a_card_and_its_decision_runs_the_command() {
    common::a_permission_request_is_a_card_and_its_decision_runs_the_command(Which::Claude);
}

#[test]
fn a_loaded_session_replays_into_history_not_live() {
    common::a_loaded_session_replays_into_history_not_live(Which::Claude);
}

#[test]
fn a_message_whose_agent_died_before_a_word_is_uncertain_and_unprovable() {
    common::a_message_whose_agent_died_before_a_word_is_uncertain_and_unprovable(Which::Claude);
}
