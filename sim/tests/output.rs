//! The `sim` program as a shell user runs it.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

// A reader that stops early (`sim --seed 48 --trace | head -3`) ends the program
// quietly, as a closed pipe ends a Unix tool: no panic, a zero exit.
#[test]
fn a_closed_output_pipe_ends_the_program_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(["--seed", "48", "--trace"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).unwrap();
    assert!(first.starts_with("seed 48"), "{first}");
    // The reader is gone now.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
}
