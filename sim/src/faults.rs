//! Faults: what can go wrong, how likely it is in one run, and how often it happened.
//!
//! Each run draws its own probability for every [`FaultKind`] from the seed (and leaves
//! about a quarter of the kinds off entirely), so one seed is a calm world and the next
//! a storm of one kind: a fault that needs quiet around it to matter gets runs where it
//! is alone. A kind can also be masked off from outside (`--without`), which the
//! shrinker uses; a masked kind still draws its numbers, so the rest of the run stays
//! aligned.

use crate::rng::Rng;

macro_rules! fault_kinds {
    ($($kind:ident = $name:literal, $lo:literal..$hi:literal, $doc:literal;)*) => {
        /// One kind of fault the world injects.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[non_exhaustive]
        pub enum FaultKind {
            $(#[doc = $doc] $kind,)*
        }

        impl FaultKind {
            /// Every kind, in a fixed order.
            pub const ALL: &'static [FaultKind] = &[$(FaultKind::$kind,)*];

            /// The name used on the command line and in summaries.
            pub fn name(self) -> &'static str {
                match self { $(FaultKind::$kind => $name,)* }
            }

            /// The range the per-run probability is drawn from.
            fn range(self) -> (f64, f64) {
                match self { $(FaultKind::$kind => ($lo, $hi),)* }
            }
        }
    };
}

fault_kinds! {
    RelayDrop = "relay-drop", 0.02..0.3, "A relay event to a phone is dropped.";
    RelayDuplicate = "relay-duplicate", 0.02..0.2, "A relay event reaches a phone twice.";
    RelayDelay = "relay-delay", 0.05..0.5, "A relay event is held back (and so overtaken).";
    RequestLost = "request-lost", 0.02..0.2, "A client request never reaches the host.";
    ReplyLost = "reply-lost", 0.02..0.2, "The host's answer never reaches the client.";
    RequestLate = "request-late", 0.05..0.4, "A request or its answer takes seconds to minutes.";
    AgentReplyLost = "agent-reply-lost", 0.02..0.2, "An answer or proof from the agent is lost.";
    AgentReplyLate = "agent-reply-late", 0.02..0.3, "An agent answer comes past the host's deadline.";
    AgentReplyDuplicated = "agent-reply-duplicated", 0.02..0.2, "An agent answer arrives twice.";
    AgentOldAttempt = "agent-old-attempt", 0.02..0.2, "An answer for an old attempt arrives again.";
    AgentUncertain = "agent-uncertain", 0.05..0.4, "The agent's send result is lost on its side: admission uncertain.";
    AgentRefuses = "agent-refuses", 0.02..0.3, "The agent refuses a send, a stop or a decision.";
    HistoryUnreadable = "history-unreadable", 0.01..0.1, "The agent's history cannot be read for a while.";
    RunInterrupted = "run-interrupted", 0.01..0.1, "A run ends, fails or is aborted at a random point.";
    HostCrash = "host-crash", 0.002..0.03, "The host process dies; a new one starts from the store.";
    OutboxStoreFail = "outbox-store-fail", 0.005..0.08, "Outbox store calls fail (or commit, then report failure).";
    OverlayStoreFail = "overlay-store-fail", 0.005..0.08, "Overlay store and journal calls fail.";
    ClientReconnect = "client-reconnect", 0.005..0.05, "A phone loses its connection: it leaves, joins again (replay) and reloads.";
    ClientReload = "client-reload", 0.005..0.05, "A client reloads its window.";
}

impl FaultKind {
    /// The kind named `name` on the command line.
    pub fn parse(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.iter().copied().find(|k| k.name() == name)
    }

    fn index(self) -> usize {
        FaultKind::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }
}

/// The fault probabilities of one run.
#[derive(Clone, Debug)]
pub struct Faults {
    p: Vec<f64>,
    masked: Vec<bool>,
    /// False once the world is brought to quiescence: no fault strikes any more.
    pub on: bool,
}

impl Faults {
    /// Draws the probabilities of a run; kinds in `without` never strike.
    pub fn draw(rng: &mut Rng, without: &[FaultKind]) -> Faults {
        let p = FaultKind::ALL
            .iter()
            .map(|k| {
                let enabled = rng.chance(0.75);
                let (lo, hi) = k.range();
                let p = lo + (hi - lo) * rng.unit();
                if enabled {
                    p
                } else {
                    0.0
                }
            })
            .collect();
        let masked = FaultKind::ALL.iter().map(|k| without.contains(k)).collect();
        Faults {
            p,
            masked,
            on: true,
        }
    }

    /// A world where nothing goes wrong.
    pub fn none() -> Faults {
        Faults {
            p: vec![0.0; FaultKind::ALL.len()],
            masked: vec![true; FaultKind::ALL.len()],
            on: false,
        }
    }

    /// The probability of `kind` in this run (0 when masked).
    pub fn p(&self, kind: FaultKind) -> f64 {
        if self.masked[kind.index()] {
            0.0
        } else {
            self.p[kind.index()]
        }
    }

    /// Whether `kind` strikes now. Always draws one number.
    pub fn strikes(&self, rng: &mut Rng, kind: FaultKind) -> bool {
        let i = kind.index();
        rng.chance_if(self.on && !self.masked[i], self.p[i])
    }

    /// The kinds that can strike in this run.
    pub fn active(&self) -> Vec<FaultKind> {
        FaultKind::ALL
            .iter()
            .copied()
            .filter(|k| self.p(*k) > 0.0)
            .collect()
    }
}

/// How many faults of each kind were injected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    counts: Vec<u64>,
}

impl FaultCounts {
    /// Counts one fault of `kind`.
    pub fn add(&mut self, kind: FaultKind) {
        if self.counts.is_empty() {
            self.counts = vec![0; FaultKind::ALL.len()];
        }
        self.counts[kind.index()] += 1;
    }

    /// Faults of `kind` injected.
    pub fn get(&self, kind: FaultKind) -> u64 {
        self.counts.get(kind.index()).copied().unwrap_or(0)
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &FaultCounts) {
        if self.counts.is_empty() {
            self.counts = vec![0; FaultKind::ALL.len()];
        }
        for (i, n) in other.counts.iter().enumerate() {
            self.counts[i] += n;
        }
    }

    /// Every kind injected at least once, with its count.
    pub fn injected(&self) -> Vec<(FaultKind, u64)> {
        FaultKind::ALL
            .iter()
            .map(|k| (*k, self.get(*k)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// The total.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}
