//! The file edge of the transcript reader: where Claude keeps a session's transcript,
//! reading it whole, and reading its pages from the end ([`crate::tail`]) as an
//! `overlay-core` history source. Everything else in the crate is sans-IO; this module
//! only moves bytes between a file and the pure readers.
//!
//! A transcript that does not exist reads as an empty conversation (the seed: "A
//! transcript that does not exist loads as an empty conversation."); a page `before` a
//! message it does not hold is [`PageError::PositionGone`].

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the module that reads files

use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use overlay_core::source::{
    HistorySource, SourceError, SourceItem, SourceKind, SourcePage, SourcePosition,
};
use timeline_core::cursor::BoundaryToken;

use crate::stream::MessageUuid;
use crate::tail::{TailPage, TailRead, TailStep};
use crate::transcript::{PageError, Transcript};

/// Why a transcript file was not read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The file exists but could not be read: retry later.
    #[error("reading the Claude transcript {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The conversation does not hold the position: answer with an empty page and
    /// `reloadRequired`.
    #[error(transparent)]
    Page(#[from] PageError),
}

/// The project folder name Claude derives from a working directory: every character
/// other than an ASCII letter or digit becomes `-` (lossy: read `cwd` from the entries
/// when the way back matters).
pub fn project_slug(cwd: &str) -> String {
    cwd.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// `<projects>/<slug of cwd>/<session>.jsonl`, where `projects` is
/// `~/.claude/projects`.
pub fn transcript_path(projects: &Path, cwd: &str, session: &str) -> PathBuf {
    projects
        .join(project_slug(cwd))
        .join(format!("{session}.jsonl"))
}

fn io_error(path: &Path, source: std::io::Error) -> FileError {
    FileError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Reads a whole transcript file. A missing file is an empty transcript; a last line
/// without its newline (Claude is writing it) is left out, and [`Transcript::read_to`]
/// says where the next read starts.
pub fn read_transcript(path: &Path) -> Result<Transcript, FileError> {
    let mut t = Transcript::new();
    match std::fs::read(path) {
        Ok(bytes) => {
            t.feed(&bytes);
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(path, e)),
    }
    Ok(t)
}

/// True when the transcript at `path` proves the message `uuid` delivered, on any
/// branch (the Claude delivery proof, OB-08): a user entry with it, a merged entry
/// listing it in `mergedSendUuids`, or the message absorbed into a running turn
/// ([`crate::proof::proves_delivery`]). The file is read line by line and only lines
/// that contain the UUID's text are parsed, so the memory is that of one line. A
/// missing file holds nothing.
pub fn has_user_entry(path: &Path, uuid: &MessageUuid) -> Result<bool, FileError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_error(path, e)),
    };
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let needle = uuid.as_str().as_bytes();
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| io_error(path, e))?;
        if n == 0 {
            return Ok(false);
        }
        if contains_ignore_case(&line, needle) && crate::proof::proves_delivery(&line, uuid) {
            return Ok(true);
        }
    }
}

/// True when `hay` contains `needle` (ASCII letters compared without case).
fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    let Some(&first) = needle.first() else {
        return true;
    };
    hay.windows(needle.len()).any(|w| {
        w.first().is_some_and(|b| b.eq_ignore_ascii_case(&first)) && w.eq_ignore_ascii_case(needle)
    })
}

/// Drives a [`TailRead`] on the file at `path`; a missing file answers as an empty one.
pub fn run_tail(path: &Path, make: impl FnOnce(u64) -> TailRead) -> Result<TailPage, FileError> {
    let mut file = match File::open(path) {
        Ok(f) => Some(f),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(io_error(path, e)),
    };
    let len = match &file {
        Some(f) => f.metadata().map_err(|e| io_error(path, e))?.len(),
        None => 0,
    };
    let mut read = make(len);
    let mut buf = Vec::new();
    loop {
        match read.poll() {
            TailStep::Done(answer) => return Ok(answer?),
            TailStep::Read { start, end } => {
                let n = usize::try_from(end.saturating_sub(start)).map_err(|_| {
                    io_error(
                        path,
                        std::io::Error::new(ErrorKind::OutOfMemory, "block too large"),
                    )
                })?;
                buf.clear();
                buf.resize(n, 0);
                if let Some(f) = file.as_mut() {
                    f.seek(SeekFrom::Start(start))
                        .and_then(|_| f.read_exact(&mut buf))
                        .map_err(|e| io_error(path, e))?;
                }
                read.handle_read(start, &buf);
            }
        }
    }
}

/// The newest `limit` items of the conversation in the file at `path`, read from its
/// end.
pub fn read_latest(path: &Path, limit: usize) -> Result<TailPage, FileError> {
    run_tail(path, |len| TailRead::latest(len, limit))
}

/// A transcript file as the history source of one timeline target (TL-09, TL-10): the
/// latest window and the pages before or after a UUID, each read from the file's end.
#[derive(Clone, Debug)]
pub struct TranscriptFile {
    /// The file.
    pub path: PathBuf,
    /// The Claude session ID for the main conversation, the subagent ID for a child.
    pub target: String,
}

impl TranscriptFile {
    /// The source of `target` in the file at `path`.
    pub fn new(path: impl Into<PathBuf>, target: impl Into<String>) -> TranscriptFile {
        TranscriptFile {
            path: path.into(),
            target: target.into(),
        }
    }
}

fn source_page(p: TailPage) -> SourcePage {
    SourcePage {
        items: p
            .items
            .into_iter()
            .map(|item| SourceItem {
                position: SourcePosition(item.position.clone()),
                blocks: item.rows(),
            })
            .collect(),
        more: p.more,
    }
}

fn source_error(e: FileError) -> SourceError {
    match e {
        FileError::Page(PageError::PositionGone(_)) => SourceError::PositionGone,
        FileError::Io { .. } => SourceError::Unavailable(e.to_string()),
    }
}

impl HistorySource for TranscriptFile {
    fn kind(&self) -> SourceKind {
        SourceKind::Claude {
            session: self.target.clone(),
        }
    }

    fn boundary_token(&self) -> BoundaryToken {
        BoundaryToken::claude(&self.target)
    }

    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        run_tail(&self.path, |len| match before {
            None => TailRead::latest(len, limit),
            Some(p) => TailRead::before(len, &p.0, limit),
        })
        .map(source_page)
        .map_err(source_error)
    }

    fn read_newer(
        &mut self,
        after: &SourcePosition,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        run_tail(&self.path, |len| TailRead::after(len, &after.0, limit))
            .map(source_page)
            .map_err(source_error)
    }
}
