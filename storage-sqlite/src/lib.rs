//! # storage-sqlite
//!
//! The durable backend: every storage trait of the core crates on one SQLite file,
//! through rusqlite with the bundled SQLite.
