//! # outbox-core
//!
//! Custody of a message from composer to agent: the outbox, the operation ledger, send
//! results, drain lanes, the run registry, stop, and messages between sessions. Pure
//! state machines over storage traits and an agent-adapter trait.
