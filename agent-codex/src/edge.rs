//! The IO edge for rollout files: reading bytes from disk and handing them to the
//! sans-IO readers ([`crate::rollout::RolloutReader`], the pagers of [`crate::tail`]).
//!
//! - [`RolloutBytes`]: a rollout's bytes by range. A plain `.jsonl` is read with
//!   positioned reads of the ranges asked for, and its length is read again at every
//!   page (Codex appends while a client pages). A `.jsonl.zst` (a rollout Codex
//!   compressed after 7 idle days) is decompressed once into memory: a zstd frame cannot
//!   be read from its end, and a compressed rollout does not grow.
//! - [`RolloutSource`]: the rollout as an [`overlay_core::source::HistorySource`].
//! - [`read_rollout_file`]: every line of a rollout at once (tests, tools).
//! - [`rollout_holds`]: the history proof of an operation (OB-08), one pass over the
//!   file that parses only the lines naming the operation.

#![allow(clippy::disallowed_methods)] // the module that reads files

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

use overlay_core::source::{
    HistorySource, SourceError, SourceItem, SourceKind, SourcePage, SourcePosition,
};
use timeline_core::cursor::BoundaryToken;

use crate::diag::Diagnostics;
use crate::rollout::{EventMsg, ReadBatch, RolloutReader, RolloutRecord, TurnItem};
use crate::tail::{self, LinePosition, PageAfter, PageBefore, TailError, TailPage};

/// Why a rollout was not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EdgeError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A compressed rollout decompresses to more than the limit
    /// ([`DECOMPRESSED_LIMIT`] unless [`RolloutBytes::open_limited`] said otherwise).
    #[error("{path} decompresses to more than {limit} bytes")]
    TooLarge {
        /// The path.
        path: String,
        /// The limit, in bytes.
        limit: u64,
    },
    /// A position that the file no longer holds.
    #[error("{0} no longer holds that position")]
    PositionGone(String),
    /// The pager was handed bytes it did not ask for (a defect of this module).
    #[error("reading {path}: {source}")]
    Tail {
        /// The path.
        path: String,
        /// What went wrong.
        source: TailError,
    },
}

/// True when `path` names a compressed rollout (`.zst`).
pub fn is_compressed(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "zst")
}

/// A rollout's bytes, read by range.
#[derive(Debug)]
pub enum RolloutBytes {
    /// A plain rollout, read where asked.
    File(File),
    /// A compressed rollout, decompressed.
    Memory(Vec<u8>),
}

/// The most a compressed rollout may decompress to (256 MiB): a larger one, or a
/// damaged frame that claims to be, is refused ([`EdgeError::TooLarge`]) before it can
/// take the memory.
pub const DECOMPRESSED_LIMIT: u64 = 256 * 1024 * 1024;

impl RolloutBytes {
    /// Opens `path`; a `.zst` file is decompressed whole, up to [`DECOMPRESSED_LIMIT`].
    pub fn open(path: &Path) -> Result<RolloutBytes, EdgeError> {
        Self::open_limited(path, DECOMPRESSED_LIMIT)
    }

    /// Opens `path`; a `.zst` file is decompressed whole, up to `limit` bytes (at most
    /// `limit + 1` are ever decompressed).
    pub fn open_limited(path: &Path, limit: u64) -> Result<RolloutBytes, EdgeError> {
        let io = |source| EdgeError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        if is_compressed(path) {
            let decoder = zstd::stream::read::Decoder::new(file).map_err(io)?;
            let mut bytes = Vec::new();
            decoder
                .take(limit.saturating_add(1))
                .read_to_end(&mut bytes)
                .map_err(io)?;
            if bytes.len() as u64 > limit {
                return Err(EdgeError::TooLarge {
                    path: path.display().to_string(),
                    limit,
                });
            }
            return Ok(RolloutBytes::Memory(bytes));
        }
        Ok(RolloutBytes::File(file))
    }

    /// The length now (a plain file may have grown).
    pub fn len(&self) -> std::io::Result<u64> {
        match self {
            RolloutBytes::File(f) => f.metadata().map(|m| m.len()),
            RolloutBytes::Memory(b) => Ok(b.len() as u64),
        }
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> std::io::Result<bool> {
        self.len().map(|n| n == 0)
    }

    /// The bytes of `range` (fewer when the file is shorter).
    pub fn read_range(&mut self, range: Range<u64>) -> std::io::Result<Vec<u8>> {
        let want = usize::try_from(range.end.saturating_sub(range.start)).unwrap_or(usize::MAX);
        match self {
            RolloutBytes::File(f) => {
                f.seek(SeekFrom::Start(range.start))?;
                let mut buf = Vec::with_capacity(want);
                f.take(want as u64).read_to_end(&mut buf)?;
                Ok(buf)
            }
            RolloutBytes::Memory(b) => {
                let start = usize::try_from(range.start)
                    .unwrap_or(usize::MAX)
                    .min(b.len());
                let end = start.saturating_add(want).min(b.len());
                Ok(b.get(start..end).unwrap_or_default().to_vec())
            }
        }
    }
}

/// Reads a whole rollout file (plain or `.zst`): its lines, and the reader with its
/// diagnostics. A last line that is not whole JSON (Codex is writing it) is left out;
/// `consumed` in the batch says where the next read should start.
pub fn read_rollout_file(path: &Path) -> Result<(ReadBatch, RolloutReader), EdgeError> {
    let bytes = match RolloutBytes::open(path)? {
        RolloutBytes::Memory(b) => b,
        RolloutBytes::File(_) => std::fs::read(path).map_err(|source| EdgeError::Io {
            path: path.display().to_string(),
            source,
        })?,
    };
    let mut reader = RolloutReader::new();
    let batch = reader.read_to_end(&bytes);
    Ok((batch, reader))
}

/// Bytes read per step by the scans that pass over a whole file.
const SCAN_BLOCK: u64 = 1024 * 1024;

/// True when the rollout at `path` records a user message whose client ID is
/// `operation_id` (legacy `user_message.client_id` or paginated `item_completed`
/// `UserMessage.client_id`), in any turn (OB-08). One pass; only lines that contain the
/// ID's text are parsed.
pub fn rollout_holds(path: &Path, operation_id: &str) -> Result<bool, EdgeError> {
    let mut bytes = RolloutBytes::open(path)?;
    let io = |source| EdgeError::Io {
        path: path.display().to_string(),
        source,
    };
    let len = bytes.len().map_err(io)?;
    let needle = operation_id.as_bytes();
    let mut reader = RolloutReader::new();
    let mut at = 0u64;
    let mut carry: Vec<u8> = Vec::new();
    while at < len {
        let block = bytes
            .read_range(at..at.saturating_add(SCAN_BLOCK).min(len))
            .map_err(io)?;
        if block.is_empty() {
            break;
        }
        at += block.len() as u64;
        carry.extend_from_slice(&block);
        let whole = carry.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let last = at >= len;
        let upto = if last { carry.len() } else { whole };
        let found = carry
            .get(..upto)
            .unwrap_or_default()
            .split(|&b| b == b'\n')
            .filter(|l| !needle.is_empty() && tail::contains(l, needle))
            .filter_map(|l| reader.line(l))
            .any(|l| match l.record {
                RolloutRecord::EventMsg(EventMsg::UserMessage {
                    client_id: Some(c), ..
                })
                | RolloutRecord::EventMsg(EventMsg::ItemCompleted {
                    item:
                        TurnItem::UserMessage {
                            client_id: Some(c), ..
                        },
                    ..
                }) => c == operation_id,
                _ => false,
            });
        if found {
            return Ok(true);
        }
        carry.drain(..upto);
    }
    Ok(false)
}

/// Where the rollbacks of a file are, as far as it was scanned: `[from, to)`.
#[derive(Debug, Default)]
struct RollbackIndex {
    span: Option<(u64, u64)>,
    offsets: BTreeSet<u64>,
}

/// The thread ID a rollout's name carries (`rollout-<time>-<thread id>.jsonl[.zst]`).
fn thread_id_of_name(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name
        .strip_suffix(".zst")
        .unwrap_or(&name)
        .strip_suffix(".jsonl")
        .unwrap_or(&name)
        .to_owned();
    // A UUID is the last 36 characters.
    let tail: String = stem
        .chars()
        .rev()
        .take(36)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let is_uuid = tail.len() == 36 && tail.chars().filter(|c| *c == '-').count() == 4;
    if is_uuid {
        tail
    } else {
        stem
    }
}

/// A rollout file as the history source of its thread's timeline: pages read from the
/// file's tail (see [`crate::tail`]), positions `rollout:<offset>:…`, the boundary token
/// the SHA-256 of the rollout's path (TL-10; a compressed rollout is named by its plain
/// path, so compression does not change its source).
///
/// ```no_run
/// use agent_codex::edge::RolloutSource;
/// use overlay_core::source::HistorySource;
///
/// let mut source = RolloutSource::open("rollout.jsonl".as_ref(), 0)?;
/// let page = source.read(None, 12)?; // the newest 12 items, newest first
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RolloutSource {
    path: PathBuf,
    bytes: RolloutBytes,
    thread_id: String,
    generation: u64,
    token: BoundaryToken,
    diagnostics: Diagnostics,
    rollbacks: RollbackIndex,
    bytes_read: u64,
}

impl RolloutSource {
    /// Opens the rollout at `path` for history `generation`. The thread ID and the Codex
    /// version come from the first line (`session_meta`), the thread ID else from the
    /// file name.
    pub fn open(path: &Path, generation: u64) -> Result<RolloutSource, EdgeError> {
        let bytes = RolloutBytes::open(path)?;
        let plain = if is_compressed(path) {
            path.with_extension("")
        } else {
            path.to_path_buf()
        };
        let mut source = RolloutSource {
            path: path.to_path_buf(),
            bytes,
            thread_id: thread_id_of_name(path),
            generation,
            token: BoundaryToken::codex_rollout(&plain.to_string_lossy()),
            diagnostics: Diagnostics::new(),
            rollbacks: RollbackIndex::default(),
            bytes_read: 0,
        };
        source.read_head()?;
        Ok(source)
    }

    /// The thread the rollout records.
    pub fn thread_id(&self) -> &str {
        &self.thread_id
    }

    /// The path read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the lines read so far held that this version skips or cannot read (counted
    /// each time a page reads them), and the Codex version the file states.
    pub fn diagnostics(&self) -> &Diagnostics {
        &self.diagnostics
    }

    /// How many bytes the reads of this source read from the file so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    fn io(&self, source: std::io::Error) -> EdgeError {
        EdgeError::Io {
            path: self.path.display().to_string(),
            source,
        }
    }

    fn range(&mut self, range: Range<u64>) -> Result<Vec<u8>, EdgeError> {
        let bytes = self.bytes.read_range(range).map_err(|e| self.io(e))?;
        self.bytes_read = self.bytes_read.saturating_add(bytes.len() as u64);
        Ok(bytes)
    }

    fn len(&self) -> Result<u64, EdgeError> {
        self.bytes.len().map_err(|e| self.io(e))
    }

    fn tail_error(&self, e: TailError) -> EdgeError {
        match e {
            TailError::PositionGone => EdgeError::PositionGone(self.path.display().to_string()),
            other => EdgeError::Tail {
                path: self.path.display().to_string(),
                source: other,
            },
        }
    }

    /// Reads the first line for the thread ID and the version (a first line longer
    /// than [`tail::LOOKAHEAD_MAX`] is not read).
    fn read_head(&mut self) -> Result<(), EdgeError> {
        let len = self.len()?;
        let mut head = Vec::new();
        let mut whole = false;
        while !whole && (head.len() as u64) < len.min(tail::LOOKAHEAD_MAX) {
            let at = head.len() as u64;
            let block = self.range(at..at.saturating_add(tail::BLOCK).min(len))?;
            if block.is_empty() {
                break;
            }
            head.extend_from_slice(&block);
            if let Some(nl) = head.iter().position(|&b| b == b'\n') {
                head.truncate(nl);
                whole = true;
            }
        }
        whole |= head.len() as u64 == len;
        let mut reader = RolloutReader::new();
        let line = if whole { reader.line(&head) } else { None };
        if let Some(RolloutRecord::SessionMeta(meta)) = line.map(|l| l.record) {
            if !meta.id.trim().is_empty() {
                self.thread_id = meta.id;
            }
        }
        self.diagnostics.absorb(reader.diagnostics());
        Ok(())
    }

    /// The newest `limit` items, newest first.
    pub fn latest(&mut self, limit: usize) -> Result<TailPage, EdgeError> {
        let len = self.len()?;
        let mut pager = PageBefore::latest(len, limit);
        while let Some(r) = pager.want() {
            let bytes = self.range(r.clone())?;
            pager
                .give(r.start, &bytes)
                .map_err(|e| self.tail_error(e))?;
        }
        self.diagnostics.absorb(pager.diagnostics());
        pager.finish().map_err(|e| self.tail_error(e))
    }

    /// The `limit` items older than `position`, newest first.
    pub fn before(&mut self, position: LinePosition, limit: usize) -> Result<TailPage, EdgeError> {
        let len = self.len()?;
        let mut pager = PageBefore::before(position, len, limit);
        while let Some(r) = pager.want() {
            let bytes = self.range(r.clone())?;
            pager
                .give(r.start, &bytes)
                .map_err(|e| self.tail_error(e))?;
        }
        self.diagnostics.absorb(pager.diagnostics());
        pager.finish().map_err(|e| self.tail_error(e))
    }

    /// The `limit` items newer than `position`, oldest first. A rollback further on may
    /// hide some of them: the rest of the file is searched for rollbacks first (once;
    /// later reads search only what was appended, [`tail::rollback_offsets`]), and the
    /// page reads on through the last one.
    pub fn after(&mut self, position: LinePosition, limit: usize) -> Result<TailPage, EdgeError> {
        let len = self.len()?;
        self.scan_rollbacks(position.end(), len)?;
        let mut pager = PageAfter::new(position, len, limit);
        if let Some(last) = self.rollbacks.offsets.range(position.end()..).next_back() {
            pager = pager.read_through(*last);
        }
        while let Some(r) = pager.want() {
            let bytes = self.range(r.clone())?;
            pager
                .give(r.start, &bytes)
                .map_err(|e| self.tail_error(e))?;
        }
        self.diagnostics.absorb(pager.diagnostics());
        pager.finish().map_err(|e| self.tail_error(e))
    }

    /// Makes the rollback index cover `[start, len)` (`start` a line start).
    fn scan_rollbacks(&mut self, start: u64, len: u64) -> Result<(), EdgeError> {
        let (from, to) = self.rollbacks.span.unwrap_or((start, start));
        let from = if start < from {
            self.scan_span(start, from)?;
            start
        } else {
            from
        };
        let to = self.scan_span(to, len)?;
        self.rollbacks.span = Some((from, to));
        Ok(())
    }

    /// Scans `[at, end)` for rollbacks; returns where its whole lines end.
    fn scan_span(&mut self, mut at: u64, end: u64) -> Result<u64, EdgeError> {
        let mut size = SCAN_BLOCK;
        while at < end {
            let stop = at.saturating_add(size).min(end);
            let bytes = self.range(at..stop)?;
            let (found, whole) = tail::rollback_offsets(at, &bytes);
            self.rollbacks.offsets.extend(found);
            if whole > at {
                at = whole;
                size = SCAN_BLOCK;
            } else if stop < end {
                // A line longer than the block: read more of it.
                size = size.saturating_mul(2);
            } else {
                // A last line still being written: the next scan reads it.
                break;
            }
        }
        Ok(at)
    }
}

fn source_page(page: TailPage) -> SourcePage {
    SourcePage {
        items: page
            .items
            .into_iter()
            .map(|i| SourceItem {
                position: SourcePosition(i.position.encode()),
                blocks: i.blocks,
            })
            .collect(),
        more: page.more,
    }
}

fn source_error(e: EdgeError) -> SourceError {
    match e {
        EdgeError::PositionGone(_) => SourceError::PositionGone,
        other => SourceError::Unavailable(other.to_string()),
    }
}

fn position(p: &SourcePosition) -> Result<LinePosition, SourceError> {
    LinePosition::decode(&p.0).ok_or(SourceError::PositionGone)
}

impl HistorySource for RolloutSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Codex {
            thread_id: self.thread_id.clone(),
            generation: self.generation,
        }
    }

    fn boundary_token(&self) -> BoundaryToken {
        self.token.clone()
    }

    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        let page = match before {
            None => self.latest(limit),
            Some(p) => {
                let p = position(p)?;
                self.before(p, limit)
            }
        };
        page.map(source_page).map_err(source_error)
    }

    fn read_newer(
        &mut self,
        after: &SourcePosition,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        let p = position(after)?;
        self.after(p, limit).map(source_page).map_err(source_error)
    }
}
