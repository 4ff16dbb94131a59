//! Each invariant can fail: a deliberate defect switched on in the world (a test-only
//! switch, `Config::defect`) is caught by the check it breaks, within a few seeds.

use sim::{Config, Defect, Invariant};

/// Runs seeds with `defect` until one fails; returns the invariant it broke.
fn caught(defect: Defect) -> Invariant {
    for seed in 0..400 {
        let mut cfg = Config::new(seed);
        cfg.defect = Some(defect);
        let outcome = sim::run(cfg);
        if let Some(v) = outcome.violation {
            return v.invariant;
        }
    }
    panic!("{defect:?} was never caught in 400 seeds");
}

// OB-08, OB-09: a message reaches the agent twice.
#[test]
fn a_message_sent_twice_is_caught() {
    assert_eq!(caught(Defect::DuplicateSend), Invariant::SentTwice);
}

// OB-03, OB-05: an acknowledged message disappears from the store.
#[test]
fn a_lost_message_is_caught() {
    assert_eq!(caught(Defect::ForgetEntry), Invariant::MessageLost);
}

// OB-07: a sent ledger row is written back as sending.
#[test]
fn a_weakened_ledger_is_caught() {
    assert_eq!(caught(Defect::WeakenLedger), Invariant::LedgerWeakened);
}

// TL-02, TL-04: a client's rows out of canonical order.
#[test]
fn rows_out_of_order_are_caught() {
    assert_eq!(caught(Defect::ShuffleRows), Invariant::RowsOutOfOrder);
}

// TL-03: a user's own message leaves the screen.
#[test]
fn a_vanished_echo_is_caught() {
    assert_eq!(caught(Defect::DropEcho), Invariant::EchoVanished);
}

// OV-07, TL-06: a client that does not converge on the host's history.
#[test]
fn a_view_that_differs_at_quiescence_is_caught() {
    assert_eq!(caught(Defect::WindowIgnoresUpdates), Invariant::ViewDiffers);
}

// RB-04: a replay that triggers live-only side effects.
#[test]
fn a_replay_with_live_effects_is_caught() {
    assert_eq!(caught(Defect::ReplayAsLive), Invariant::ReplaySideEffect);
}

// RW-06: an approval decided twice.
#[test]
fn an_approval_decided_twice_is_caught() {
    assert_eq!(caught(Defect::DuplicateDecision), Invariant::ApprovalTwice);
}

// RW-06: a card that does not show the decision the agent took.
#[test]
fn a_card_left_pending_is_caught() {
    assert_eq!(
        caught(Defect::SilentResolution),
        Invariant::ApprovalCardStale
    );
}

// The loop contract: every deadline is finite.
#[test]
fn an_endless_timer_is_caught() {
    assert_eq!(caught(Defect::EndlessTimer), Invariant::TimerInfinite);
}

// Reproduction: the shrinker keeps the failure and never grows the run.
#[test]
fn the_shrinker_finds_a_smaller_run_that_fails_the_same_way() {
    let failing = (0..200)
        .map(|seed| {
            let mut cfg = Config::new(seed);
            cfg.defect = Some(Defect::DropEcho);
            sim::run(cfg)
        })
        .find(|o| o.violation.is_some())
        .expect("a failing seed");
    let small = sim::shrink(&failing);
    assert!(small.steps <= failing.config.steps);
    assert!(
        small.steps
            <= failing
                .violation
                .as_ref()
                .map_or(usize::MAX, |v| v.step.max(1))
    );
    let again = sim::run(small.clone());
    assert_eq!(
        again.violation.map(|v| v.invariant),
        Some(Invariant::EchoVanished),
        "{}",
        sim::command(&small)
    );
    assert!(sim::command(&small).contains(&format!("--seed {}", small.seed)));
}

// OV-07, TL-06: a client that applies a live patch on the wrong base shows rows the
// host never published; the next snapshot would heal it, so only the check of every
// step against what the host saved at that version catches it.
#[test]
fn a_patch_applied_on_the_wrong_base_is_caught() {
    assert_eq!(caught(Defect::PatchOnAnyBase), Invariant::LiveRowsUnsaved);
}

// OB-04, OB-11: a replace latest whose rollback leaves the replaced turn in the agent's
// history: the replaced message shows again.
#[test]
fn a_rolled_back_turn_kept_in_history_is_caught() {
    assert_eq!(
        caught(Defect::KeepRolledBackTurn),
        Invariant::ReplacedReappears
    );
}
