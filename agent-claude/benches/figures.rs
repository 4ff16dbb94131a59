//! Figures that criterion does not give (recorded in `agent-claude/BENCHES.md`):
//!
//! - peak memory and time of a latest window read from the tail of a 100 MB and a
//!   500 MB transcript, against a read of the whole file;
//! - stream-json deltas decoded and projected per second of CPU time (the "per core"
//!   figure, which a busy machine does not lower as it lowers wall-clock time).
//!
//! Each measurement runs in a child process of its own (this program started again
//! with `--child`), which reports the growth of its peak resident set (`VmHWM` in
//! `/proc/self/status`) and its CPU time (`/proc/self/schedstat`), Linux only.
//!
//! `cargo bench -p agent-claude --bench figures`

#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    clippy::unwrap_used
)] // a bench: files, processes, the clock

mod support;

use std::time::Instant;

use agent_claude::file::{read_latest, read_transcript};
use agent_claude::project::{Output, Projector};
use agent_claude::stream::StreamDecoder;
use timeline_core::time::Millis;

const PAGE: usize = 50;

/// The peak resident set in KiB, when the system says it.
fn peak_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Nanoseconds this (single-threaded) process ran on a CPU.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Decodes and projects `rounds` turns of 10,000 deltas; prints deltas per CPU second
/// and per wall-clock second.
fn deltas_child(rounds: usize) {
    const N: usize = 10_000;
    let lines = support::delta_stream(N);
    let cpu0 = cpu_ns();
    let start = Instant::now();
    let mut events = 0usize;
    for _ in 0..rounds {
        let mut dec = StreamDecoder::new();
        let mut p = Projector::new("session-1", 0);
        for line in &lines {
            if let Some(l) = dec.decode(line) {
                p.handle_line(&l, Millis(1));
            }
            while let Some(o) = p.poll_effect() {
                events += usize::from(matches!(o, Output::Event(_)));
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    assert_eq!(events, N * rounds);
    let per_cpu = match (cpu0, cpu_ns()) {
        (Some(a), Some(b)) if b > a => format!("{:.0}", events as f64 / ((b - a) as f64 / 1e9)),
        _ => "n/a".to_owned(),
    };
    println!("{events} {per_cpu} {:.0}", events as f64 / wall);
}

fn child(mode: &str, path: &str) {
    if mode == "deltas" {
        deltas_child(path.parse().unwrap());
        return;
    }
    let before = peak_kib();
    let start = Instant::now();
    let (items, read) = match mode {
        "tail" => {
            let page = read_latest(path.as_ref(), PAGE).unwrap();
            (page.items.len(), page.bytes_read)
        }
        _ => {
            let t = read_transcript(path.as_ref()).unwrap();
            let n = t.page_before(None, PAGE).unwrap().items.len();
            (n, t.read_to())
        }
    };
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    let after = peak_kib();
    let grew = match (before, after) {
        (Some(b), Some(a)) => format!("{}", a.saturating_sub(b)),
        _ => "n/a".to_owned(),
    };
    println!("{mode} {items} {read} {ms:.2} {grew}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(&args[2], &args[3]);
        return;
    }
    let exe = std::env::current_exe().unwrap();
    println!("| file | read | items | bytes read | time (ms) | peak RSS growth (KiB) |");
    println!("|---|---|---|---|---|---|");
    for mb in [100u64, 500] {
        let path = support::big_transcript(mb << 20);
        let len = std::fs::metadata(&path).unwrap().len();
        for mode in ["tail", "whole"] {
            // The best of three runs, each in a fresh process.
            let mut best: Option<(f64, String)> = None;
            for _ in 0..3 {
                let out = std::process::Command::new(&exe)
                    .args(["--child", mode, path.to_str().unwrap()])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let line = String::from_utf8(out.stdout).unwrap();
                let f: Vec<&str> = line.split_whitespace().collect();
                let ms: f64 = f[3].parse().unwrap();
                if best.as_ref().is_none_or(|(b, _)| ms < *b) {
                    best = Some((
                        ms,
                        format!(
                            "| {} MB ({len} B) | {mode} | {} | {} | {:.2} | {} |",
                            mb, f[1], f[2], ms, f[4]
                        ),
                    ));
                }
            }
            println!("{}", best.unwrap().1);
        }
    }
    println!();
    println!("| deltas | per CPU second | per wall-clock second |");
    println!("|---|---|---|");
    for _ in 0..3 {
        let out = std::process::Command::new(&exe)
            .args(["--child", "deltas", "300"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8(out.stdout).unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        println!("| {} | {} | {} |", f[0], f[1], f[2]);
    }
}
