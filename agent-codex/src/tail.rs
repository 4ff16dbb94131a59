//! Pages of a rollout read from the file's tail, sans-IO: the pagers ask for byte
//! ranges ([`PageBefore::want`]), take them ([`PageBefore::give`]) and build the page
//! from the lines they hold ([`PageBefore::finish`]). The IO edge
//! ([`crate::edge::RolloutSource`]) reads the ranges; a test hands them from memory.
//!
//! ```
//! use agent_codex::tail::PageBefore;
//!
//! let file = concat!(
//!     r#"{"timestamp":"2025-01-01T00:00:00Z","type":"event_msg","payload":{"type":"user_message","message":"hi","client_id":"op-1"}}"#, "\n",
//!     r#"{"timestamp":"2025-01-01T00:00:01Z","type":"event_msg","payload":{"type":"agent_message","message":"hello"}}"#, "\n",
//!     r#"{"timestamp":"2025-01-01T00:00:02Z","type":"event_m"#, // being written
//! ).as_bytes();
//! let mut pager = PageBefore::latest(file.len() as u64, 12);
//! while let Some(range) = pager.want() {
//!     let bytes = &file[range.start as usize..range.end as usize];
//!     pager.give(range.start, bytes).unwrap();
//! }
//! let page = pager.finish().unwrap();
//! assert_eq!(page.items.len(), 2);
//! assert!(page.torn_tail && !page.more);
//! // Newest first: the reply, then the user's message with its operation.
//! assert_eq!(page.items[1].blocks[0].operation_id.as_ref().unwrap().as_str(), "op-1");
//! ```
//!
//! # Paging
//!
//! - **Items.** An item is one row-producing line ([`crate::history::LineRole::Entry`]);
//!   other lines are read past. `limit` counts items, and one more is read to know
//!   whether older (or newer) items exist, so `more` is exact.
//! - **Positions.** An item's position ([`LinePosition`]) is its line's byte offset and
//!   length, an FNV-1a hash of the line, and the row's time. A read from a position
//!   checks that the line is still there, whole, at a line start, with that hash;
//!   otherwise the position is gone ([`TailError::PositionGone`]). Offsets are those of
//!   the plain file, so a rollout Codex compressed keeps its positions.
//! - **Latest page.** Read backwards from the end in blocks ([`BLOCK`], growing with a
//!   line longer than a block), never the whole file: what it reads is the newest
//!   `limit + 1` items and the lines between them. A last line without a newline is read
//!   when it is whole JSON, else left for the next read (`torn_tail`), as the writer is
//!   still writing it.
//! - **Older page.** The same, backwards from a position. A call's output is in a later
//!   line; the calls of the page whose output was not read are looked for forward from
//!   the position (at most [`LOOKAHEAD_MAX`] bytes, a scan that parses only lines naming
//!   a `call_id`).
//! - **Newer page.** Forwards from a position ([`PageAfter`]): the items after it, oldest
//!   first. A rollback further on may hide some of them; the caller finds where the
//!   rollbacks are ([`rollback_offsets`], a byte search) and has the pager read on
//!   through the last one ([`PageAfter::read_through`]).
//!
//! # Meaning of the lines
//!
//! - **Joins.** A call's row carries its output: the first output line after it that
//!   names its call ID (rolled back or not); without one it is in progress.
//! - **Rollbacks.** `thread_rolled_back {num_turns: n}` hides the `n` turns before it,
//!   a turn beginning with its user message: read backwards, everything back to and
//!   including the `n`-th user message before the rollback is skipped (rollbacks inside
//!   a skipped stretch add up); read forwards, the items of the last `n` turns are
//!   dropped. Both give the same conversation; an item of a page is never inside a
//!   skipped stretch, so a position needs no more state.
//! - **Time.** A row's time is its line's `timestamp`, or, when that is not a time, the
//!   nearest earlier line's; with none, 0. The pager reads back until it knows.
//! - **Counting.** Lines that are not JSON or that a known type cannot read are counted
//!   in [`PageBefore::diagnostics`] each time a page reads them, never fatal.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use serde_json::Value;
use timeline_core::block::Block;
use timeline_core::time::Millis;

use crate::diag::Diagnostics;
use crate::history::{self, CallOutput, Entry, LineRole};
use crate::rollout::{parse_line, RolloutReader};
use crate::time::parse_timestamp;

/// The bytes one read asks for (more when a line is longer).
pub const BLOCK: u64 = 64 * 1024;
/// How far an older page looks forward from its position for the outputs of its calls.
pub const LOOKAHEAD_MAX: u64 = 4 * 1024 * 1024;

/// FNV-1a of a line's bytes (without its newline): a position's check that the line at
/// its offset is still the line it named.
pub fn line_hash(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// Where an item sits in its rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinePosition {
    /// The byte offset of the line.
    pub offset: u64,
    /// Its length, without the newline.
    pub len: u64,
    /// [`line_hash`] of the line.
    pub hash: u32,
    /// The time of its row (see the module doc), where a newer page starts counting.
    pub at: Millis,
}

const POSITION_PREFIX: &str = "rollout:";

impl LinePosition {
    /// The position as text: `rollout:<offset>:<len>:<hash>:<at>`.
    pub fn encode(&self) -> String {
        format!(
            "{POSITION_PREFIX}{}:{}:{:08x}:{}",
            self.offset,
            self.len,
            self.hash,
            self.at.as_u64()
        )
    }

    /// Reads a position written by [`LinePosition::encode`].
    pub fn decode(text: &str) -> Option<LinePosition> {
        let mut parts = text.strip_prefix(POSITION_PREFIX)?.split(':');
        let position = LinePosition {
            offset: parts.next()?.parse().ok()?,
            len: parts.next()?.parse().ok()?,
            hash: u32::from_str_radix(parts.next()?, 16).ok()?,
            at: Millis(parts.next()?.parse().ok()?),
        };
        parts.next().is_none().then_some(position)
    }

    /// Where the line ends (its newline, or the end of the file).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// One item of a page.
#[derive(Clone, Debug, PartialEq)]
pub struct TailItem {
    /// Where it sits.
    pub position: LinePosition,
    /// Its rows.
    pub blocks: Vec<Block>,
}

/// One page.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TailPage {
    /// Newest first from [`PageBefore`], oldest first from [`PageAfter`].
    pub items: Vec<TailItem>,
    /// True when items go on past the last one in the direction read.
    pub more: bool,
    /// True when the file ends in a line still being written, left for the next read.
    pub torn_tail: bool,
}

/// Why a page was not built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TailError {
    /// The position's line is not where it was (the file changed, or the position was
    /// not written for this file).
    #[error("the rollout no longer holds that position")]
    PositionGone,
    /// Bytes were given for another range than the one asked for.
    #[error("bytes {given:?} were given where {wanted:?} was asked for")]
    WrongRange {
        /// What was given.
        given: Range<u64>,
        /// What was asked for.
        wanted: Option<Range<u64>>,
    },
    /// `finish` was called while the pager still wanted bytes.
    #[error("the page is not read yet: bytes {0:?} are wanted")]
    Unfinished(Range<u64>),
}

/// A row-producing line read, before its output and time are known.
#[derive(Clone, Debug)]
struct Pending {
    offset: u64,
    len: u64,
    hash: u32,
    at: Option<Millis>,
    entry: Entry,
    /// A call's output: the first output line after it that names its call ID.
    output: Option<CallOutput>,
    /// The turn it belongs to (forward reads only).
    turn: i64,
}

impl Pending {
    fn waits_for_output(&self) -> Option<&str> {
        self.entry.call_id().filter(|_| self.output.is_none())
    }
}

fn finish_items(items: &[Pending], limit: usize) -> Vec<TailItem> {
    items
        .iter()
        .take(limit)
        .map(|p| {
            let at = p.at.unwrap_or(Millis(0));
            let output = p.output.as_ref();
            TailItem {
                position: LinePosition {
                    offset: p.offset,
                    len: p.len,
                    hash: p.hash,
                    at,
                },
                blocks: history::blocks(&p.entry, p.offset, at, output),
            }
        })
        .collect()
}

fn is_whole_json(line: &[u8]) -> bool {
    let body = line.strip_suffix(b"\r").unwrap_or(line);
    serde_json::from_slice::<Value>(body).is_ok()
}

/// True when `hay` holds `needle`.
pub(crate) fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    while let Some(i) = hay.get(from..)?.iter().position(|&b| b == first) {
        let at = from + i;
        if hay.get(at + 1..at + 1 + rest.len()) == Some(rest) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// The offsets of the lines of `bytes` (which start at `base`, at a line start) that
/// name `thread_rolled_back`, and where the last whole line ends (the next scan starts
/// there). A byte search: no line is parsed.
pub fn rollback_offsets(base: u64, bytes: &[u8]) -> (Vec<u64>, u64) {
    const NEEDLE: &[u8] = b"thread_rolled_back";
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = bytes.get(from..whole).and_then(|h| find(h, NEEDLE)) {
        let at = from + i;
        let start = bytes
            .get(..at)
            .and_then(|b| b.iter().rposition(|&c| c == b'\n'))
            .map_or(0, |n| n + 1);
        found.push(base + start as u64);
        // Go on after this line.
        from = bytes
            .get(at..whole)
            .and_then(|b| b.iter().position(|&c| c == b'\n'))
            .map_or(whole, |n| at + n + 1);
    }
    (found, base + whole as u64)
}

// ----- splitting bytes into lines --------------------------------------------------------

/// Lines from bytes handed oldest block last: `carry` is the start of a line whose
/// beginning lies before `lo`.
#[derive(Debug)]
struct Backward {
    lo: u64,
    carry: Vec<u8>,
}

impl Backward {
    fn new(end: u64) -> Backward {
        Backward {
            lo: end,
            carry: Vec::new(),
        }
    }

    fn want(&self) -> Range<u64> {
        let size = BLOCK.max(self.carry.len() as u64);
        self.lo.saturating_sub(size)..self.lo
    }

    /// Takes bytes `[start, lo)` and calls `line(offset, bytes)` for every whole line,
    /// newest first, while it returns true.
    fn give(&mut self, start: u64, bytes: &[u8], mut line: impl FnMut(u64, &[u8]) -> bool) {
        let mut buf = Vec::with_capacity(bytes.len() + self.carry.len());
        buf.extend_from_slice(bytes);
        buf.extend_from_slice(&self.carry);
        let mut end = buf.len();
        let mut more = true;
        while more {
            let Some(nl) = buf
                .get(..end)
                .and_then(|b| b.iter().rposition(|&c| c == b'\n'))
            else {
                break;
            };
            if let Some(l) = buf.get(nl + 1..end).filter(|l| !l.is_empty()) {
                more = line(start + nl as u64 + 1, l);
            }
            end = nl;
        }
        if more && start == 0 {
            if let Some(l) = buf.get(..end).filter(|l| !l.is_empty()) {
                line(0, l);
            }
            end = 0;
        }
        buf.truncate(end);
        self.carry = buf;
        self.lo = start;
    }
}

/// Lines from bytes handed in file order: `carry` is a line begun before `hi`.
#[derive(Debug)]
struct Forward {
    hi: u64,
    carry: Vec<u8>,
}

impl Forward {
    fn new(start: u64) -> Forward {
        Forward {
            hi: start,
            carry: Vec::new(),
        }
    }

    fn want(&self, file_len: u64) -> Range<u64> {
        let size = BLOCK.max(self.carry.len() as u64);
        self.hi..self.hi.saturating_add(size).min(file_len)
    }

    /// Takes bytes `[hi, …)` and calls `line(offset, bytes)` for every line it ends, in
    /// order, while it returns true; at the end of the file a last line without newline
    /// is read when it is whole JSON. Returns whether the file ends in a torn line.
    fn give(
        &mut self,
        bytes: &[u8],
        file_len: u64,
        mut line: impl FnMut(u64, &[u8]) -> bool,
    ) -> (bool, bool) {
        let base = self.hi - self.carry.len() as u64;
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(bytes);
        self.hi += bytes.len() as u64;
        let mut start = 0;
        let mut more = true;
        while more {
            let Some(rel) = buf
                .get(start..)
                .and_then(|b| b.iter().position(|&c| c == b'\n'))
            else {
                break;
            };
            if let Some(l) = buf.get(start..start + rel).filter(|l| !l.is_empty()) {
                more = line(base + start as u64, l);
            }
            start += rel + 1;
        }
        let rest = buf.get(start..).unwrap_or_default();
        let mut torn = false;
        if more && self.hi >= file_len && !rest.is_empty() {
            if is_whole_json(rest) {
                more = line(base + start as u64, rest);
            } else {
                torn = true;
            }
        }
        self.carry = rest.to_vec();
        (more, torn)
    }
}

/// Checks the line a position names inside `bytes` (which start at `start`): whole,
/// at a line start, with its hash.
fn holds_position(p: &LinePosition, start: u64, bytes: &[u8], file_len: u64) -> bool {
    let Some(rel) = p
        .offset
        .checked_sub(start)
        .and_then(|r| usize::try_from(r).ok())
    else {
        return false;
    };
    let Ok(len) = usize::try_from(p.len) else {
        return false;
    };
    let at_line_start = rel == 0 && p.offset == 0 || rel > 0 && bytes.get(rel - 1) == Some(&b'\n');
    let ends = match bytes.get(rel + len) {
        Some(b) => *b == b'\n',
        None => p.end() == file_len,
    };
    let same = bytes
        .get(rel..rel + len)
        .is_some_and(|line| line_hash(line) == p.hash);
    at_line_start && ends && same && p.len > 0
}

// ----- older pages ---------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BeforeStage {
    /// The position's line is not checked yet.
    Check,
    /// Reading backwards.
    Older,
    /// Looking forward for outputs.
    Ahead,
    Done,
    Gone,
}

/// The latest page, or the page older than a position: see the module doc.
#[derive(Debug)]
pub struct PageBefore {
    limit: usize,
    file_len: u64,
    anchor: Option<LinePosition>,
    stage: BeforeStage,
    back: Backward,
    ahead: Forward,
    ahead_from: u64,
    ends_with_newline: bool,
    torn_tail: bool,
    reader: RolloutReader,
    items: Vec<Pending>,
    outputs: HashMap<String, CallOutput>,
    wanted: HashSet<String>,
    skip: u64,
    waiting: usize,
}

impl PageBefore {
    fn new(limit: usize, file_len: u64, anchor: Option<LinePosition>) -> PageBefore {
        let end = anchor.map_or(file_len, |a| a.offset);
        let gone = anchor.is_some_and(|a| a.end() > file_len || a.len == 0);
        PageBefore {
            limit,
            file_len,
            anchor,
            stage: match anchor {
                _ if gone => BeforeStage::Gone,
                Some(_) => BeforeStage::Check,
                None if file_len == 0 => BeforeStage::Done,
                None => BeforeStage::Older,
            },
            back: Backward::new(end),
            ahead: Forward::new(file_len),
            ahead_from: file_len,
            ends_with_newline: true,
            torn_tail: false,
            reader: RolloutReader::new(),
            items: Vec::new(),
            outputs: HashMap::new(),
            wanted: HashSet::new(),
            skip: 0,
            waiting: 0,
        }
    }

    /// The newest `limit` items of a file of `file_len` bytes.
    pub fn latest(file_len: u64, limit: usize) -> PageBefore {
        PageBefore::new(limit, file_len, None)
    }

    /// The `limit` items older than `position` in a file of `file_len` bytes.
    pub fn before(position: LinePosition, file_len: u64, limit: usize) -> PageBefore {
        PageBefore::new(limit, file_len, Some(position))
    }

    /// What the lines read so far held that this version skips or cannot read.
    pub fn diagnostics(&self) -> &Diagnostics {
        self.reader.diagnostics()
    }

    /// The bytes to read next, or `None` when the page is read.
    pub fn want(&self) -> Option<Range<u64>> {
        match self.stage {
            BeforeStage::Check => self.anchor.map(|a| {
                a.offset.saturating_sub(BLOCK)..a.end().saturating_add(1).min(self.file_len)
            }),
            BeforeStage::Older => Some(self.back.want()),
            BeforeStage::Ahead => Some(self.ahead.want(self.file_len)),
            BeforeStage::Done | BeforeStage::Gone => None,
        }
    }

    /// Takes the bytes of the range [`PageBefore::want`] asked for, starting at `start`.
    pub fn give(&mut self, start: u64, bytes: &[u8]) -> Result<(), TailError> {
        let given = start..start + bytes.len() as u64;
        let wanted = self.want();
        if wanted.as_ref() != Some(&given) {
            return Err(TailError::WrongRange { given, wanted });
        }
        match self.stage {
            BeforeStage::Check => {
                let Some(a) = self.anchor else {
                    return Ok(());
                };
                if !holds_position(&a, start, bytes, self.file_len) {
                    self.stage = BeforeStage::Gone;
                    return Ok(());
                }
                let rel = (a.offset - start) as usize;
                let after = a.end() + u64::from(a.end() < self.file_len);
                self.ahead = Forward::new(after);
                self.ahead_from = after;
                self.stage = BeforeStage::Older;
                self.back_block(start, bytes.get(..rel).unwrap_or_default());
            }
            BeforeStage::Older => {
                if self.anchor.is_none() && self.back.lo == self.file_len {
                    self.ends_with_newline = bytes.last() == Some(&b'\n');
                }
                self.back_block(start, bytes);
            }
            BeforeStage::Ahead => self.ahead_block(bytes),
            BeforeStage::Done | BeforeStage::Gone => {}
        }
        Ok(())
    }

    /// The page, once [`PageBefore::want`] says nothing more is needed.
    pub fn finish(self) -> Result<TailPage, TailError> {
        if self.stage == BeforeStage::Gone {
            return Err(TailError::PositionGone);
        }
        if let Some(range) = self.want() {
            return Err(TailError::Unfinished(range));
        }
        Ok(TailPage {
            items: finish_items(&self.items, self.limit),
            more: self.items.len() > self.limit,
            torn_tail: self.torn_tail,
        })
    }

    fn back_block(&mut self, start: u64, bytes: &[u8]) {
        let mut back = std::mem::replace(&mut self.back, Backward::new(0));
        back.give(start, bytes, |offset, line| self.back_line(offset, line));
        self.back = back;
        let enough = self.items.len() > self.limit && self.waiting == 0;
        if self.back.lo == 0 || enough {
            // Rows with no time before them read 0.
            for p in self.items.iter_mut().filter(|p| p.at.is_none()) {
                p.at = Some(Millis(0));
            }
            self.waiting = 0;
            self.wanted = self
                .items
                .iter()
                .take(self.limit)
                .filter_map(Pending::waits_for_output)
                .map(str::to_owned)
                .collect();
            // A latest page read every newer line: no output is further on.
            let look =
                self.anchor.is_some() && !self.wanted.is_empty() && self.ahead.hi < self.file_len;
            self.stage = if look {
                BeforeStage::Ahead
            } else {
                BeforeStage::Done
            };
        }
    }

    /// One line, read backwards; false once nothing older is needed.
    fn back_line(&mut self, offset: u64, raw: &[u8]) -> bool {
        let len = raw.len() as u64;
        if self.anchor.is_none() && !self.ends_with_newline && offset + len == self.file_len {
            // The last line, without its newline: read only when it is whole.
            if !is_whole_json(raw) {
                self.torn_tail = true;
                return true;
            }
        }
        let Some(line) = self.reader.line(raw) else {
            return true;
        };
        let at = line.timestamp.as_deref().and_then(parse_timestamp);
        match history::role(&line) {
            LineRole::RolledBack { turns } => self.skip = self.skip.saturating_add(turns),
            LineRole::Output { call_id, output } => {
                // Read backwards, the output kept is the oldest one after the lines to
                // come: the first one after a call read next.
                self.outputs.insert(call_id, output);
            }
            // Inside a rolled-back stretch: its user message ends the turn skipped.
            LineRole::Entry(entry) if self.skip > 0 && entry.begins_turn() => self.skip -= 1,
            LineRole::Entry(_) if self.skip > 0 => {}
            LineRole::Entry(entry) if self.items.len() <= self.limit => {
                let output = entry.call_id().and_then(|c| self.outputs.get(c)).cloned();
                self.items.push(Pending {
                    offset,
                    len,
                    hash: line_hash(raw),
                    at,
                    entry,
                    output,
                    turn: 0,
                });
                if at.is_none() {
                    self.waiting += 1;
                }
            }
            _ => {}
        }
        if let Some(t) = at {
            // The items waiting for a time are the newest ones read.
            for p in self
                .items
                .iter_mut()
                .rev()
                .take_while(|p| p.at.is_none() || p.offset == offset)
            {
                p.at.get_or_insert(t);
            }
            self.waiting = 0;
        }
        self.items.len() <= self.limit || self.waiting > 0
    }

    fn ahead_block(&mut self, bytes: &[u8]) {
        let mut ahead = std::mem::replace(&mut self.ahead, Forward::new(0));
        let file_len = self.file_len;
        ahead.give(bytes, file_len, |_, line| {
            if contains(line, b"call_id") {
                if let Ok(l) = parse_line(line.strip_suffix(b"\r").unwrap_or(line)) {
                    if let LineRole::Output { call_id, output } = history::role(&l) {
                        if self.wanted.remove(&call_id) {
                            for p in self.items.iter_mut().take(self.limit) {
                                if p.waits_for_output() == Some(call_id.as_str()) {
                                    p.output = Some(output.clone());
                                }
                            }
                        }
                    }
                }
            }
            !self.wanted.is_empty()
        });
        self.ahead = ahead;
        let far = self.ahead.hi.saturating_sub(self.ahead_from) >= LOOKAHEAD_MAX;
        if self.wanted.is_empty() || self.ahead.hi >= self.file_len || far {
            self.stage = BeforeStage::Done;
        }
    }
}

// ----- newer pages ---------------------------------------------------------------------

/// The page newer than a position, read forwards: see the module doc.
#[derive(Debug)]
pub struct PageAfter {
    limit: usize,
    file_len: u64,
    anchor: LinePosition,
    checked: bool,
    done: bool,
    gone: bool,
    torn_tail: bool,
    fwd: Forward,
    reader: RolloutReader,
    items: Vec<Pending>,
    last_at: Millis,
    turn: i64,
    read_through: u64,
    /// Where the `limit + 1`-th item was read, for the bound of the look for outputs.
    full_at: Option<u64>,
}

impl PageAfter {
    /// The `limit` items newer than `position` in a file of `file_len` bytes.
    pub fn new(position: LinePosition, file_len: u64, limit: usize) -> PageAfter {
        PageAfter {
            limit,
            file_len,
            anchor: position,
            checked: false,
            done: false,
            gone: position.end() > file_len || position.len == 0,
            torn_tail: false,
            fwd: Forward::new(position.offset.saturating_sub(1)),
            reader: RolloutReader::new(),
            items: Vec::new(),
            last_at: position.at,
            turn: 0,
            read_through: 0,
            full_at: None,
        }
    }

    /// Reads on at least through the line at `offset` (a rollback that may hide items of
    /// the page).
    pub fn read_through(mut self, offset: u64) -> PageAfter {
        self.read_through = offset.saturating_add(1);
        self
    }

    /// Where the lines read end (a line start): a rollback at or after this offset was
    /// not read.
    pub fn read_end(&self) -> u64 {
        self.fwd.hi - self.fwd.carry.len() as u64
    }

    /// What the lines read so far held that this version skips or cannot read.
    pub fn diagnostics(&self) -> &Diagnostics {
        self.reader.diagnostics()
    }

    /// The bytes to read next, or `None` when the page is read.
    pub fn want(&self) -> Option<Range<u64>> {
        if self.gone || self.done {
            return None;
        }
        if !self.checked {
            let start = self.anchor.offset.saturating_sub(1);
            return Some(start..self.anchor.end().saturating_add(1).min(self.file_len));
        }
        Some(self.fwd.want(self.file_len))
    }

    /// Takes the bytes of the range [`PageAfter::want`] asked for, starting at `start`.
    pub fn give(&mut self, start: u64, bytes: &[u8]) -> Result<(), TailError> {
        let given = start..start + bytes.len() as u64;
        let wanted = self.want();
        if wanted.as_ref() != Some(&given) {
            return Err(TailError::WrongRange { given, wanted });
        }
        if !self.checked {
            if !holds_position(&self.anchor, start, bytes, self.file_len) {
                self.gone = true;
                return Ok(());
            }
            self.checked = true;
            self.fwd = Forward::new(given.end);
            self.done = given.end >= self.file_len;
            return Ok(());
        }
        let mut fwd = std::mem::replace(&mut self.fwd, Forward::new(0));
        let (more, torn) = fwd.give(bytes, self.file_len, |offset, line| self.line(offset, line));
        self.fwd = fwd;
        self.torn_tail |= torn;
        self.done = !more || self.fwd.hi >= self.file_len;
        Ok(())
    }

    /// The page, once [`PageAfter::want`] says nothing more is needed.
    pub fn finish(self) -> Result<TailPage, TailError> {
        if self.gone {
            return Err(TailError::PositionGone);
        }
        if let Some(range) = self.want() {
            return Err(TailError::Unfinished(range));
        }
        Ok(TailPage {
            items: finish_items(&self.items, self.limit),
            more: self.items.len() > self.limit,
            torn_tail: self.torn_tail,
        })
    }

    fn line(&mut self, offset: u64, raw: &[u8]) -> bool {
        if let Some(line) = self.reader.line(raw) {
            if let Some(t) = line.timestamp.as_deref().and_then(parse_timestamp) {
                self.last_at = t;
            }
            match history::role(&line) {
                LineRole::Entry(entry) => {
                    if entry.begins_turn() {
                        self.turn += 1;
                    }
                    self.items.push(Pending {
                        offset,
                        len: raw.len() as u64,
                        hash: line_hash(raw),
                        at: Some(self.last_at),
                        entry,
                        output: None,
                        turn: self.turn,
                    });
                }
                LineRole::Output { call_id, output } => {
                    for p in &mut self.items {
                        if p.waits_for_output() == Some(call_id.as_str()) {
                            p.output = Some(output.clone());
                        }
                    }
                }
                LineRole::RolledBack { turns } => {
                    let keep = self
                        .turn
                        .saturating_sub(i64::try_from(turns).unwrap_or(i64::MAX));
                    self.items.retain(|p| p.turn <= keep);
                    self.turn = keep;
                }
                LineRole::Nothing => {}
            }
        }
        let end = offset + raw.len() as u64;
        if self.items.len() > self.limit {
            self.full_at.get_or_insert(end);
        } else {
            self.full_at = None;
        }
        let waiting_output = self
            .items
            .iter()
            .take(self.limit)
            .any(|p| p.waits_for_output().is_some());
        let looked_far = self
            .full_at
            .is_some_and(|at| end.saturating_sub(at) >= LOOKAHEAD_MAX);
        end < self.read_through || self.full_at.is_none() || waiting_output && !looked_far
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(ts: &str, payload: &str) -> String {
        format!(r#"{{"timestamp":"{ts}","type":"event_msg","payload":{payload}}}"#) + "\n"
    }

    fn user(i: u32, op: &str) -> String {
        line(
            &format!("2025-01-01T00:00:{i:02}Z"),
            &format!(r#"{{"type":"user_message","message":"u{i}","client_id":"{op}"}}"#),
        )
    }

    fn reply(i: u32) -> String {
        line(
            &format!("2025-01-01T00:00:{i:02}Z"),
            &format!(r#"{{"type":"agent_message","message":"r{i}"}}"#),
        )
    }

    fn run_before(file: &[u8], mut p: PageBefore) -> Result<TailPage, TailError> {
        while let Some(r) = p.want() {
            p.give(r.start, &file[r.start as usize..r.end as usize])?;
        }
        p.finish()
    }

    fn texts(page: &TailPage) -> Vec<String> {
        page.items
            .iter()
            .map(|i| {
                i.blocks[0].data["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn positions_round_trip() {
        let p = LinePosition {
            offset: 12,
            len: 40,
            hash: 0xdead_beef,
            at: Millis(7),
        };
        assert_eq!(LinePosition::decode(&p.encode()), Some(p));
        assert_eq!(LinePosition::decode("item-3"), None);
        assert_eq!(LinePosition::decode("rollout:1:2:3:4:5"), None);
    }

    #[test]
    fn a_rollback_hides_its_turns_both_ways() {
        let mut f = String::new();
        f += &user(1, "a");
        f += &reply(2);
        f += &user(3, "b");
        f += &reply(4);
        f += &line(
            "2025-01-01T00:00:05Z",
            r#"{"type":"thread_rolled_back","num_turns":1}"#,
        );
        f += &user(6, "c");
        let page = run_before(f.as_bytes(), PageBefore::latest(f.len() as u64, 10)).unwrap();
        assert_eq!(texts(&page), ["u6", "r2", "u1"]);
        // Forwards from the first item, the same conversation.
        let first = page.items[2].position;
        let mut after = PageAfter::new(first, f.len() as u64, 10);
        while let Some(r) = after.want() {
            after
                .give(r.start, &f.as_bytes()[r.start as usize..r.end as usize])
                .unwrap();
        }
        assert_eq!(texts(&after.finish().unwrap()), ["r2", "u6"]);
    }

    #[test]
    fn a_changed_line_makes_the_position_gone() {
        let f = user(1, "a") + &user(2, "b");
        let page = run_before(f.as_bytes(), PageBefore::latest(f.len() as u64, 1)).unwrap();
        assert!(page.more);
        let p = page.items[0].position;
        let changed = f.replace("u2", "u9");
        assert_eq!(
            run_before(
                changed.as_bytes(),
                PageBefore::before(p, changed.len() as u64, 5)
            ),
            Err(TailError::PositionGone)
        );
        let older = run_before(f.as_bytes(), PageBefore::before(p, f.len() as u64, 5)).unwrap();
        assert_eq!((texts(&older), older.more), (vec!["u1".to_owned()], false));
    }

    #[test]
    fn rollback_offsets_are_found_by_bytes() {
        let f = user(1, "a")
            + &line("t", r#"{"type":"thread_rolled_back","num_turns":1}"#)
            + &user(2, "b");
        let at = user(1, "a").len() as u64;
        let (found, end) = rollback_offsets(0, f.as_bytes());
        assert_eq!((found, end), (vec![at], f.len() as u64));
        // A torn last line is not scanned yet.
        let torn = &f.as_bytes()[..f.len() - 3];
        assert_eq!(
            rollback_offsets(0, torn).1,
            at + line("t", r#"{"type":"thread_rolled_back","num_turns":1}"#).len() as u64
        );
    }
}
