//! What the checks find: the invariants a run must keep ([`Invariant`], each described
//! in [`crate::check`]), the known issues of other crates a run may meet ([`Known`]), and
//! one broken invariant ([`Violation`]). The world records violations and the checks
//! make them; both import these types, and neither imports the other for them.

use timeline_core::Millis;

/// Which invariant a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Invariant {
    /// An acknowledged message is gone.
    MessageLost,
    /// A message reached the agent twice.
    SentTwice,
    /// A ledger row moved to a weaker status.
    LedgerWeakened,
    /// A client's rows are duplicated or out of order.
    RowsOutOfOrder,
    /// A client holds live rows the host never saved at the version the client holds.
    LiveRowsUnsaved,
    /// A user's own message left the screen.
    EchoVanished,
    /// At quiescence a client shows something other than the host's history.
    ViewDiffers,
    /// A replay triggered a live side effect.
    ReplaySideEffect,
    /// An approval was decided twice.
    ApprovalTwice,
    /// At quiescence an approval card does not show the agent's outcome.
    ApprovalCardStale,
    /// A deadline is not finite, or does not move on.
    TimerInfinite,
    /// A request was answered twice, or a reply went to nobody.
    ReplyTwice,
    /// The host reported a defect of its own (or could not restart).
    HostDefect,
    /// At quiescence a message is neither delivered nor held with a reason.
    Stuck,
    /// The world never came to rest.
    NoQuiescence,
    /// A message of a turn a replace latest rolled back (or of a thread that is gone) is
    /// in the agent's history again, was sent to the agent again, or a row of that turn
    /// (or thread) still shows at quiescence.
    ReplacedReappears,
    /// A control the session's agent does not support (replace latest on Claude) was
    /// admitted, refused without its typed error, or reached the agent; or a supported
    /// one was refused (OB-04).
    UnsupportedControl,
    /// A replace latest asked the agent to roll back again after its rollback was done
    /// (OB-11): a second turn would be lost.
    RolledBackTwice,
}

impl Invariant {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::MessageLost => "message-lost",
            Invariant::SentTwice => "sent-twice",
            Invariant::LedgerWeakened => "ledger-weakened",
            Invariant::RowsOutOfOrder => "rows-out-of-order",
            Invariant::LiveRowsUnsaved => "live-rows-unsaved",
            Invariant::EchoVanished => "echo-vanished",
            Invariant::ViewDiffers => "view-differs",
            Invariant::ReplaySideEffect => "replay-side-effect",
            Invariant::ApprovalTwice => "approval-twice",
            Invariant::ApprovalCardStale => "approval-card-stale",
            Invariant::TimerInfinite => "timer-infinite",
            Invariant::ReplyTwice => "reply-twice",
            Invariant::HostDefect => "host-defect",
            Invariant::Stuck => "stuck",
            Invariant::NoQuiescence => "no-quiescence",
            Invariant::ReplacedReappears => "replaced-reappears",
            Invariant::UnsupportedControl => "unsupported-control",
            Invariant::RolledBackTwice => "rolled-back-twice",
        }
    }
}

/// A known issue of a crate outside the simulator: met, recorded and counted, but not
/// a failure of the run (each is described, with a seed, in `sim/README.md`). After one
/// is met, the world checks that the client it concerns heals when it reloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Known {
    /// overlay-core, the seed's rule: relay repair runs "every 5 seconds while a run is
    /// active", so a relay event lost after a run's last repair tick (or while no run is
    /// active) is never sent again; the phone shows the older overlay until the next
    /// write, a reconnect or a reload (checked: it heals on reload).
    RelayLossUnrepaired,
    /// outbox-core (a limit of confirming from history): a steer the turn accepted
    /// waits as the turn's pending input, which no history read sees. Custody waits for
    /// the run before it takes a "missing" as proof, but a host that restarted knows the
    /// old run only from the agent's next report: when its send reached the agent only
    /// after the host that sent it died, and the new host's start-up read said missing
    /// first, the user's "send now" sends it a second time.
    PendingInputMissing,
    /// host-core (OV-10, a limit): the write that takes a rolled-back turn's rows out of
    /// the overlay (or a gone thread's) was refused, the cleanup journal refused the row
    /// that would have made a restart do it again, and the host died before its retry in
    /// memory: nothing does it again, the saved overlay keeps those rows for good and
    /// every client shows them as live rows, through reloads. Met only in a session where
    /// the simulator saw both refusals ([`host_core::Notice::JournalFailed`] for
    /// [`host_core::REWRITE_JOURNAL_RUN`]) and then a restart; anywhere else it is
    /// [`Invariant::ReplacedReappears`].
    RolledBackRowsUnsettled,
    /// host-core (OV-10), the same lost retry: no epoch rose, so a client that loaded
    /// its window before the rollback keeps the rows that left history until it reloads
    /// (checked: it heals on reload). Met only where the simulator saw the refused
    /// write and then a restart.
    RollbackUnannounced,
}

impl Known {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Known::RelayLossUnrepaired => "relay-loss-unrepaired",
            Known::PendingInputMissing => "pending-input-missing",
            Known::RolledBackRowsUnsettled => "rolled-back-rows-unsettled",
            Known::RollbackUnannounced => "rollback-unannounced",
        }
    }

    /// Every known issue.
    pub const ALL: &'static [Known] = &[
        Known::RelayLossUnrepaired,
        Known::PendingInputMissing,
        Known::RolledBackRowsUnsettled,
        Known::RollbackUnannounced,
    ];
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which.
    pub invariant: Invariant,
    /// What was seen.
    pub detail: String,
    /// The step it was seen at (after the last step: at quiescence).
    pub step: usize,
    /// The simulated time.
    pub time: Millis,
}
