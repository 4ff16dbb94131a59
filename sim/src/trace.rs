//! The trace of a run: every step and message in readable form, the last lines kept for
//! a failure report, all of them folded into a digest (FNV-1a, 64 bits) that the
//! determinism test compares between two runs of one seed.

use std::collections::VecDeque;

/// Lines kept for a failure report.
pub const KEPT_LINES: usize = 400;

/// The trace of one run.
#[derive(Clone, Debug)]
pub struct Trace {
    lines: VecDeque<String>,
    digest: u64,
    count: u64,
    /// When set, every line is also printed as it is written.
    pub echo: bool,
}

impl Default for Trace {
    fn default() -> Self {
        Trace {
            lines: VecDeque::new(),
            digest: 0xcbf2_9ce4_8422_2325,
            count: 0,
            echo: false,
        }
    }
}

impl Trace {
    /// Writes one line.
    pub fn log(&mut self, line: String) {
        for b in line.as_bytes().iter().chain(b"\n") {
            self.digest ^= u64::from(*b);
            self.digest = self.digest.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.count += 1;
        if self.echo {
            say(format_args!("{line}"));
        }
        if self.lines.len() == KEPT_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    /// The digest of every line written.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Lines written.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The last `n` lines.
    pub fn last(&self, n: usize) -> Vec<&str> {
        let skip = self.lines.len().saturating_sub(n);
        self.lines.iter().skip(skip).map(String::as_str).collect()
    }
}

/// Prints one line on standard output. A reader that went away (`sim ... | head`) ends
/// the program quietly, as a closed pipe ends a Unix tool, instead of a panic.
pub fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("sim: cannot write the output: {e}");
        std::process::exit(1);
    }
}

/// [`say`] with `format!` syntax.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::trace::say(format_args!($($arg)*))
    };
}

/// `s` cut to at most `n` bytes (at a character boundary), with `…` when cut.
pub(crate) fn clip(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_owned();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
