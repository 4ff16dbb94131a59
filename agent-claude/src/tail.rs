//! Pages of a transcript read from the file's end (sans-IO): the latest window of a
//! 500 MB transcript costs the bytes of its page, not the file.
//!
//! [`TailRead`] is a small machine the edge drives ([`crate::file`] with a real file,
//! the tests with a byte slice): it asks for byte ranges ([`TailStep::Read`]), takes
//! them ([`TailRead::handle_read`]) and answers with a page ([`TailStep::Done`]).
//!
//! 1. It reads the first entry of the file (a few bytes from its start): a file whose
//!    first entry is a sidechain entry is a subagent file, which changes which item is
//!    the newest of the conversation ([`crate::transcript`]).
//! 2. It reads blocks backwards from the end, each twice the size of the one before,
//!    and reads the lines of the window `[cut, end)` with the transcript reader placed
//!    at `cut` (the first partial line dropped). It walks the conversation from its
//!    newest item; when the walk reaches a parent before the window, a tool result
//!    whose call may be before it, or finds no main item, the window is too short and
//!    the next block is read. A compaction is a root, so the walk of a compacted
//!    transcript stops there without reading further back.
//!
//! Invariant (the twin of the whole read, `tests/tail_twin.rs`): for a file whose UUIDs
//! are unique and whose entries carry timestamps, a page read from the tail equals the
//! page [`crate::transcript::Transcript::page_before`] / `page_after` gives after
//! reading the whole file, item for item, `more` included. Older and newer pages are
//! found by UUID the same way; they cost the bytes from their place to the end. A last
//! line still being written is not read.
//!
//! ```
//! use agent_claude::tail::{TailRead, TailStep};
//!
//! let file = concat!(
//!     r#"{"type":"user","uuid":"u1","message":{"role":"user","content":"one"}}"#, "\n",
//!     r#"{"type":"user","uuid":"u2","parentUuid":"u1","message":{"role":"user","content":"two"}}"#, "\n",
//! ).as_bytes();
//! let mut read = TailRead::latest(file.len() as u64, 1).with_block(16);
//! let page = loop {
//!     match read.poll() {
//!         TailStep::Read { start, end } => {
//!             read.handle_read(start, &file[start as usize..end as usize]);
//!         }
//!         TailStep::Done(page) => break page.unwrap(),
//!     }
//! };
//! assert_eq!(page.items[0].position, "u2");
//! assert!(page.more);
//! ```

use serde::Deserialize;

use crate::transcript::{Anchor, Item, PageError, Transcript, Walk};

/// The first block read from the end (doubled at every further read).
pub const FIRST_BLOCK: u64 = 64 * 1024;

/// A page read from the tail.
#[derive(Clone, Debug, PartialEq)]
pub struct TailPage {
    /// The items: newest first for the latest and older pages, oldest first for a page
    /// after a position.
    pub items: Vec<Item>,
    /// True when the conversation goes on past the last item in the direction read.
    pub more: bool,
    /// How many bytes of the file were read to build the page.
    pub bytes_read: u64,
}

/// What the driver of a [`TailRead`] does next.
#[derive(Clone, Debug, PartialEq)]
pub enum TailStep {
    /// Read the bytes `[start, end)` of the file and hand them to
    /// [`TailRead::handle_read`].
    Read {
        /// The first byte.
        start: u64,
        /// One past the last byte.
        end: u64,
    },
    /// The answer: a page, or a position the conversation does not hold.
    Done(Result<TailPage, PageError>),
}

/// Which page is read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Want {
    Latest,
    Before(String),
    After(String),
}

/// Where the machine stands.
#[derive(Clone, Debug)]
enum State {
    /// Reading the file's start for its first entry; `scanned` bytes are read, `partial`
    /// is the unfinished last line.
    Head { scanned: u64, partial: Vec<u8> },
    /// Reading back from the end: `window` holds `[cut, end)`.
    Tail {
        sidechain_file: bool,
        cut: u64,
        window: Vec<u8>,
        grow: u64,
    },
    /// The read is answered: the page is complete.
    Done,
}

/// A page read from the end of a transcript file; see the module doc for the drive
/// loop.
#[derive(Clone, Debug)]
pub struct TailRead {
    end: u64,
    want: Want,
    limit: usize,
    block: u64,
    state: State,
    answer: Option<Result<TailPage, PageError>>,
    bytes_read: u64,
}

/// The fields of an entry that say whether it is one and a sidechain one.
#[derive(Deserialize)]
struct FirstEntry {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default, rename = "isSidechain")]
    is_sidechain: Option<bool>,
}

/// `Some(sidechain)` when `line` is a user, assistant or system entry with a UUID (the
/// lines the transcript reader takes as entries).
fn entry_sidechain(line: &[u8]) -> Option<bool> {
    let e: FirstEntry = serde_json::from_slice(line).ok()?;
    let is_entry = matches!(e.kind.as_deref(), Some("user" | "assistant" | "system"))
        && e.uuid.is_some_and(|u| !u.trim().is_empty());
    is_entry.then_some(e.is_sidechain == Some(true))
}

impl TailRead {
    /// The newest `limit` items of the conversation of a file of `len` bytes.
    pub fn latest(len: u64, limit: usize) -> TailRead {
        TailRead::new(len, Want::Latest, limit)
    }

    /// Up to `limit` items older than the item holding `before`, newest first.
    pub fn before(len: u64, before: &str, limit: usize) -> TailRead {
        TailRead::new(len, Want::Before(before.to_owned()), limit)
    }

    /// Up to `limit` items newer than the item holding `after`, oldest first.
    pub fn after(len: u64, after: &str, limit: usize) -> TailRead {
        TailRead::new(len, Want::After(after.to_owned()), limit)
    }

    fn new(end: u64, want: Want, limit: usize) -> TailRead {
        TailRead {
            end,
            want,
            limit,
            block: FIRST_BLOCK,
            state: State::Head {
                scanned: 0,
                partial: Vec::new(),
            },
            answer: None,
            bytes_read: 0,
        }
    }

    /// Sets the size of the first block (at least 1 byte).
    #[must_use]
    pub fn with_block(mut self, bytes: u64) -> TailRead {
        self.block = bytes.max(1);
        self
    }

    /// What to do next.
    #[must_use]
    pub fn poll(&mut self) -> TailStep {
        if let Some(answer) = self.answer.take() {
            self.state = State::Done;
            return TailStep::Done(answer);
        }
        match &self.state {
            State::Head { scanned, .. } => TailStep::Read {
                start: *scanned,
                end: scanned.saturating_add(self.block).min(self.end),
            },
            State::Tail { cut, grow, .. } => TailStep::Read {
                start: cut.saturating_sub(*grow),
                end: *cut,
            },
            // Asked again after the answer: the page is read again from the start.
            State::Done => {
                self.state = State::Head {
                    scanned: 0,
                    partial: Vec::new(),
                };
                self.bytes_read = 0;
                self.poll()
            }
        }
    }

    /// Takes the bytes `[start, end)` the last [`TailStep::Read`] asked for. Bytes for
    /// another range (or fewer than asked) are ignored, and the same read is asked
    /// again: the driver reports a file it cannot read as its own error.
    pub fn handle_read(&mut self, start: u64, bytes: &[u8]) {
        let TailStep::Read {
            start: want_start,
            end: want_end,
        } = self.next_read()
        else {
            return;
        };
        if start != want_start || bytes.len() as u64 != want_end.saturating_sub(want_start) {
            return;
        }
        self.bytes_read = self.bytes_read.saturating_add(bytes.len() as u64);
        match std::mem::replace(&mut self.state, State::Done) {
            State::Head {
                scanned,
                mut partial,
            } => {
                let next = scanned.saturating_add(bytes.len() as u64);
                partial.extend_from_slice(bytes);
                let mut found = None;
                let mut used = 0usize;
                while let Some(nl) = partial
                    .get(used..)
                    .and_then(|r| r.iter().position(|&b| b == b'\n'))
                {
                    let line = partial.get(used..used + nl).unwrap_or_default();
                    used += nl + 1;
                    if let Some(side) = entry_sidechain(line) {
                        found = Some(side);
                        break;
                    }
                }
                partial.drain(..used);
                match found {
                    Some(sidechain_file) => self.start_tail(sidechain_file),
                    // No entry in the whole file: the tail reads an empty conversation.
                    None if next >= self.end => self.start_tail(false),
                    None => {
                        self.state = State::Head {
                            scanned: next,
                            partial,
                        };
                    }
                }
            }
            State::Tail {
                sidechain_file,
                window,
                grow,
                ..
            } => {
                let mut joined = Vec::with_capacity(bytes.len().saturating_add(window.len()));
                joined.extend_from_slice(bytes);
                joined.extend_from_slice(&window);
                drop(window);
                let cut = start;
                match self.try_window(sidechain_file, cut, &joined) {
                    Some(answer) => self.answer = Some(answer),
                    None => {
                        self.state = State::Tail {
                            sidechain_file,
                            cut,
                            window: joined,
                            grow: grow.saturating_mul(2),
                        }
                    }
                }
            }
            State::Done => {}
        }
    }

    /// The read the machine waits for, without changing it.
    fn next_read(&self) -> TailStep {
        match &self.state {
            State::Head { scanned, .. } => TailStep::Read {
                start: *scanned,
                end: scanned.saturating_add(self.block).min(self.end),
            },
            State::Tail { cut, grow, .. } => TailStep::Read {
                start: cut.saturating_sub(*grow),
                end: *cut,
            },
            State::Done => TailStep::Done(Err(PageError::PositionGone(String::new()))),
        }
    }

    fn start_tail(&mut self, sidechain_file: bool) {
        self.state = State::Tail {
            sidechain_file,
            cut: self.end,
            window: Vec::new(),
            grow: self.block,
        };
        if self.end == 0 {
            // An empty file: the window is the whole file already.
            self.answer = self.try_window(sidechain_file, 0, &[]);
        }
    }

    /// The answer of the window `[cut, end)`, or `None` when it needs more bytes.
    fn try_window(
        &self,
        sidechain_file: bool,
        cut: u64,
        window: &[u8],
    ) -> Option<Result<TailPage, PageError>> {
        // The first line of a window that does not start the file may be cut.
        let skip = if cut == 0 {
            0
        } else {
            window.iter().position(|&b| b == b'\n')?.saturating_add(1)
        };
        let lines = window.get(skip..).unwrap_or_default();
        let mut t = Transcript::window(cut.saturating_add(skip as u64), sidechain_file);
        t.feed(lines);
        let anchor = match &self.want {
            Want::Latest => Anchor::Latest,
            Want::Before(u) => Anchor::Before(u),
            Want::After(u) => Anchor::After(u),
        };
        match t.walk(anchor, self.limit) {
            Walk::Page(order, more) => {
                let mut items: Vec<Option<Item>> = t.into_items().into_iter().map(Some).collect();
                let items = order
                    .into_iter()
                    .filter_map(|i| items.get_mut(i).and_then(Option::take))
                    .collect();
                Some(Ok(TailPage {
                    items,
                    more,
                    bytes_read: self.bytes_read,
                }))
            }
            Walk::Gone => Some(Err(PageError::PositionGone(match &self.want {
                Want::Latest => String::new(),
                Want::Before(u) | Want::After(u) => u.clone(),
            }))),
            Walk::NeedMore if cut > 0 => None,
            // A window that starts the file never needs more; were it to, the answer
            // is "gone" (reload) rather than a read that never ends.
            Walk::NeedMore => Some(Err(PageError::PositionGone(String::new()))),
        }
    }
}
