//! Codex history through `thread/items/list` (AG-05), as the seed reads owned Codex
//! history: an `overlay-core` history source ([`ItemsSource`]) over a `codex app-server`
//! of its own ([`ItemsReader`]).
//!
//! - **Pages.** Codex is asked for [`ITEMS_PAGE`] items a page (its most), newest first
//!   (`sortDirection: desc`), and each later page with the `nextCursor` of the one
//!   before. The window builders read up to four such pages per request until one
//!   yields a visible row; the exact scans and windows read through the same source.
//! - **Positions.** An item's position is its ID and, as a hint, the raw sidecar cursor
//!   of the page it came in (`<id>\u{1f}<cursor>`). The window cursor
//!   (`thread-items-v5:`) carries it, with the generation, the source token, the seam
//!   key and the window revision. A read before an item asks for that page again and
//!   goes on after the item; when the page no longer holds it (the newest page moved),
//!   the read looks for it from the present, and a position not found there is gone.
//! - **Rows.** Each item shows the row the live stream showed for it: the same key (the
//!   item ID; a user message by its `clientId`), data and operation
//!   ([`crate::project::history_block`]), timed by its `startedAtMs` (else
//!   `completedAtMs`). An `unsupportedItem`, and an item type this crate does not
//!   project, is a diagnostic row that still advances the position
//!   ([`crate::project::unsupported_block`]); an entry with neither or both of `item`
//!   and `unsupportedItem` fails the whole page ([`SourceError::Malformed`]).
//! - **The thread** is the session's, as the agent learns it ([`ThreadLink`], from
//!   [`crate::CodexAgent::thread_link`]): until Codex named one, the history is empty.
//!   So is the history of a thread whose first turn Codex has not saved yet: Codex
//!   0.168 and 0.169 answer `-32601` `thread/items/list is not supported yet` for it.
//!
//! The reader blocks its caller while Codex answers, at most the reply deadline of its
//! [`DriverConfig`] (the seed's 30 s). The host thread of `host-runtime` calls history
//! sources as it calls its stores, so a read there waits like a store write does. The
//! rollout reader ([`crate::edge::RolloutSource`]) stays for files on disk and for a
//! Codex without `thread/items/list`.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // drives a process, waits on the clock

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use overlay_core::source::{
    HistorySource, SourceError, SourceItem, SourceKind, SourcePage, SourcePosition,
};
use serde_json::Value;
use timeline_core::cursor::BoundaryToken;
use timeline_core::time::Millis;

use crate::adapter::AdapterError;
use crate::codec::{Codec, Incoming, ListedItem, Response};
use crate::driver::{Driver, DriverConfig, ReadLine};
use crate::project::{history_block, unsupported_block};
use crate::protocol::{ClientRequest, ThreadItem};

/// Items asked for per `thread/items/list` page (Codex 0.169's most).
pub const ITEMS_PAGE: u32 = 100;

/// Pages a read goes through at most to find its item from the present (the page it
/// came in moved), and again after it while pages hold nothing (100 such pages with no
/// item at all fail the read).
pub const FIND_PAGES: usize = 100;

/// The JSON-RPC code Codex answers a thread it has no listable history of with.
const METHOD_NOT_FOUND: i64 = -32601;

/// The words of that answer (`thread/items/list is not supported yet`).
const NOTHING_SAVED: &str = "not supported yet";

/// The separator of an item's ID and its page's cursor in a position.
const SEP: char = '\u{1f}';

/// The thread of one session, as the agent learns it: empty until Codex named it.
/// Clones share it.
#[derive(Clone, Debug, Default)]
pub struct ThreadLink(Arc<Mutex<Option<String>>>);

impl ThreadLink {
    /// A link to `thread` (a thread the embedder already knows).
    pub fn to(thread: impl Into<String>) -> ThreadLink {
        ThreadLink(Arc::new(Mutex::new(Some(thread.into()))))
    }

    /// The thread, once known.
    pub fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set(&self, thread: Option<String>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = thread;
    }
}

/// One page as Codex answered it.
#[derive(Clone, Debug, PartialEq)]
pub struct ItemsPage {
    /// The entries, newest first.
    pub items: Vec<ListedItem>,
    /// The next (older) page's cursor; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// What answers `thread/items/list` pages: [`ItemsReader`], or a stand-in in tests.
pub trait ItemPages: Send {
    /// One page of `thread`, newest first, from `cursor` (`None`: the newest).
    ///
    /// # Errors
    ///
    /// [`AdapterError`]: the page could not be had, or cannot be read.
    fn page(&mut self, thread: &str, cursor: Option<&str>) -> Result<ItemsPage, AdapterError>;
}

/// A `codex app-server` that answers history reads, one at a time, blocking. A process
/// that ended is started again at the next read, once: a read that cannot start it fails.
#[derive(Debug)]
pub struct ItemsReader {
    config: DriverConfig,
    client: (String, String),
    driver: Driver,
    codec: Codec,
}

impl ItemsReader {
    /// Starts the process and initializes the connection as client `name` `version`.
    ///
    /// # Errors
    ///
    /// [`AdapterError`] when the process does not start or does not answer `initialize`.
    pub fn start(config: DriverConfig, name: &str, version: &str) -> Result<Self, AdapterError> {
        let (driver, codec) = ItemsReader::connect(&config, name, version)?;
        Ok(ItemsReader {
            config,
            client: (name.to_owned(), version.to_owned()),
            driver,
            codec,
        })
    }

    /// A started, initialized process.
    fn connect(
        config: &DriverConfig,
        name: &str,
        version: &str,
    ) -> Result<(Driver, Codec), AdapterError> {
        let mut driver = Driver::spawn(config)?;
        let mut codec = Codec::new();
        let initialize = ClientRequest::Initialize {
            name: name.to_owned(),
            version: version.to_owned(),
        };
        exchange(&mut driver, &mut codec, config, &initialize, "initialize")?;
        let initialized = codec.initialized();
        driver.write_line(&initialized)?;
        Ok((driver, codec))
    }

    /// One page of `thread`, newest first, from `cursor` (`None`: the newest).
    ///
    /// # Errors
    ///
    /// [`AdapterError`]: Codex refused, did not answer within the deadline, ended, or
    /// answered a page that cannot be read (a malformed entry fails it whole).
    pub fn read_page(
        &mut self,
        thread: &str,
        cursor: Option<&str>,
    ) -> Result<ItemsPage, AdapterError> {
        let request = ClientRequest::ThreadItemsList {
            thread_id: thread.to_owned(),
            cursor: cursor.map(str::to_owned),
            limit: ITEMS_PAGE,
            newest_first: true,
        };
        match self.call(&request, "thread/items/list")? {
            Response::ThreadItemsList { items, next_cursor } => {
                Ok(ItemsPage { items, next_cursor })
            }
            other => Err(AdapterError::UnexpectedAnswer {
                method: "thread/items/list",
                answer: format!("{other:?}"),
            }),
        }
    }

    fn call(
        &mut self,
        request: &ClientRequest,
        what: &'static str,
    ) -> Result<Response, AdapterError> {
        if !self.driver.is_running() {
            // The process ended since the last read: start it again (once; a start
            // that fails fails this read, and the next read tries again).
            let (name, version) = &self.client;
            let (driver, codec) = ItemsReader::connect(&self.config, name, version)?;
            self.driver = driver;
            self.codec = codec;
        }
        exchange(
            &mut self.driver,
            &mut self.codec,
            &self.config,
            request,
            what,
        )
    }
}

/// Writes `request` and waits for its answer, at most the reply deadline.
fn exchange(
    driver: &mut Driver,
    codec: &mut Codec,
    config: &DriverConfig,
    request: &ClientRequest,
    what: &'static str,
) -> Result<Response, AdapterError> {
    let (id, line) = codec.request(request);
    driver.write_line(&line)?;
    let deadline = Instant::now() + config.reply_timeout;
    loop {
        match driver.read_line(deadline) {
            ReadLine::Line(line) => match codec.handle_line(&line) {
                Ok(Incoming::Response { id: got, response }) if got == id => return Ok(response),
                Ok(Incoming::Error {
                    id: Some(got),
                    error,
                    ..
                }) if got == id => {
                    return Err(AdapterError::Rpc {
                        code: error.code,
                        message: error.message,
                    })
                }
                // A reader answers no request: Codex sends it none that needs one (it
                // starts no turn); notifications are not its business.
                Ok(_) => {}
                Err(error) if !codec.pending().any(|(p, _)| p == id) => {
                    return Err(AdapterError::Unreadable {
                        method: what,
                        error,
                    })
                }
                Err(_) => {}
            },
            ReadLine::Timeout => return Err(AdapterError::Timeout(what)),
            ReadLine::Exited { reason } => return Err(AdapterError::Exited(reason)),
        }
    }
}

impl ItemPages for ItemsReader {
    fn page(&mut self, thread: &str, cursor: Option<&str>) -> Result<ItemsPage, AdapterError> {
        self.read_page(thread, cursor)
    }
}

/// Where an [`ItemsSource`] gets its pages; one may serve every session of a host.
pub type SharedPages = Arc<Mutex<dyn ItemPages>>;

/// The history of one Codex session read through `thread/items/list`. See the module
/// docs.
pub struct ItemsSource {
    reader: SharedPages,
    link: ThreadLink,
    generation: u64,
}

impl ItemsSource {
    /// The history of the thread `link` names, read through `reader` (one reader may
    /// serve every session of a host), at history generation `generation`.
    pub fn new(reader: SharedPages, link: ThreadLink, generation: u64) -> Self {
        ItemsSource {
            reader,
            link,
            generation,
        }
    }

    /// One page; `None` when Codex holds no saved history of the thread yet.
    fn page(&self, thread: &str, cursor: Option<&str>) -> Result<Option<ItemsPage>, SourceError> {
        self.fetch(thread, cursor).map_err(source_error)
    }

    fn fetch(&self, thread: &str, cursor: Option<&str>) -> Result<Option<ItemsPage>, AdapterError> {
        let mut reader = self.reader.lock().unwrap_or_else(PoisonError::into_inner);
        match reader.page(thread, cursor) {
            Ok(page) => Ok(Some(page)),
            // Codex 0.168 and 0.169 answer so for a thread whose first turn is not
            // saved yet (and for a thread they do not know).
            Err(AdapterError::Rpc { code, message })
                if code == METHOD_NOT_FOUND && message.contains(NOTHING_SAVED) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The pages of `thread` from the present, newest first, at most [`FIND_PAGES`];
    /// `f` says when to stop. A cursor Codex gives twice fails the walk (it would never
    /// end).
    fn walk<T>(
        &self,
        thread: &str,
        mut f: impl FnMut(&ItemsPage, Option<&str>) -> Option<T>,
    ) -> Result<Option<T>, SourceError> {
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..FIND_PAGES {
            let Some(page) = self.page(thread, cursor.as_deref())? else {
                return Ok(None);
            };
            if let Some(found) = f(&page, cursor.as_deref()) {
                return Ok(Some(found));
            }
            match page.next_cursor {
                Some(next) if !seen.insert(next.clone()) => {
                    return Err(SourceError::Malformed(format!(
                        "thread/items/list gave the cursor {next:?} twice"
                    )))
                }
                Some(next) => cursor = Some(next),
                None => return Ok(None),
            }
        }
        Ok(None)
    }

    /// Where the items older than `before` start: the page and the index after it.
    fn find(
        &self,
        thread: &str,
        before: &SourcePosition,
    ) -> Result<(ItemsPage, Option<String>, usize), SourceError> {
        let (id, hint) = split(&before.0).ok_or(SourceError::PositionGone)?;
        let hint = (!hint.is_empty()).then(|| hint.to_owned());
        match self.fetch(thread, hint.as_deref()) {
            Ok(Some(page)) => {
                if let Some(at) = index_of(&page, id) {
                    return Ok((page, hint, at + 1));
                }
            }
            Ok(None) => return Err(SourceError::PositionGone),
            // A cursor Codex no longer takes (a restarted Codex, a compacted thread):
            // the item is looked for from the present.
            Err(AdapterError::Rpc { .. }) if hint.is_some() => {}
            Err(e) => return Err(source_error(e)),
        }
        // The page moved (the newest page grew): look for the item from the present.
        self.walk(thread, |page, cursor| {
            let at = index_of(page, id)?;
            Some((page.clone(), cursor.map(str::to_owned), at + 1))
        })?
        .ok_or(SourceError::PositionGone)
    }
}

/// `(id, cursor)` of a position.
fn split(position: &str) -> Option<(&str, &str)> {
    position.split_once(SEP)
}

/// The names positions give a page's entries, in its order: an item's ID, else a hash
/// of the entry (its item, turn and times) and which of the page's identical entries
/// before it this is, so an entry without an ID keeps its name when the newest page
/// grows, and two identical ones are two names.
fn entry_ids(page: &ItemsPage) -> Vec<String> {
    let mut seen: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    page.items
        .iter()
        .map(|item| match item.item.get("id").and_then(Value::as_str) {
            Some(id) if !id.is_empty() && !id.contains(SEP) => id.to_owned(),
            _ => {
                let entry = format!(
                    "{}|{:?}|{:?}|{:?}",
                    item.item, item.turn_id, item.started_at_ms, item.completed_at_ms
                );
                let hash = entry.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
                let n = seen.entry(hash).or_default();
                *n += 1;
                format!("entry-{hash:016x}-{n}")
            }
        })
        .collect()
}

fn index_of(page: &ItemsPage, id: &str) -> Option<usize> {
    entry_ids(page).iter().position(|e| e == id)
}

fn source_error(e: AdapterError) -> SourceError {
    match e {
        AdapterError::Unreadable { error, .. } => SourceError::Malformed(error.to_string()),
        other => SourceError::Unavailable(other.to_string()),
    }
}

fn source_item(item: &ListedItem, id: &str, cursor: Option<&str>) -> SourceItem {
    let at = Millis(item.started_at_ms.or(item.completed_at_ms).unwrap_or(0));
    let shown = if item.unsupported {
        None
    } else {
        match ThreadItem::from_value(&item.item) {
            Ok(ThreadItem::Unknown { .. }) | Err(_) => None,
            Ok(known) => Some(history_block(&known, at)),
        }
    };
    let blocks = match shown {
        // A known item that shows no row (reasoning without words) is no diagnostic.
        Some(block) => block.into_iter().collect(),
        None => unsupported_block(&item.item, id, at).into_iter().collect(),
    };
    SourceItem {
        position: SourcePosition(format!("{id}{SEP}{}", cursor.unwrap_or_default())),
        blocks,
    }
}

impl std::fmt::Debug for ItemsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ItemsSource")
            .field("thread", &self.link.get())
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl HistorySource for ItemsSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Codex {
            thread_id: self.link.get().unwrap_or_default(),
            generation: self.generation,
        }
    }

    fn boundary_token(&self) -> BoundaryToken {
        BoundaryToken::codex_owned_thread_store(&self.link.get().unwrap_or_default())
    }

    fn read(
        &mut self,
        before: Option<&SourcePosition>,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        let Some(thread) = self.link.get() else {
            return Ok(SourcePage::default());
        };
        let (mut page, mut cursor, mut at) = match before {
            None => match self.page(&thread, None)? {
                Some(page) => (page, None, 0),
                None => return Ok(SourcePage::default()),
            },
            Some(p) => self.find(&thread, p)?,
        };
        let mut items = Vec::new();
        let mut pages = 1;
        let mut cursors: std::collections::HashSet<String> = cursor.iter().cloned().collect();
        loop {
            let ids = entry_ids(&page);
            while items.len() < limit {
                let (Some(item), Some(id)) = (page.items.get(at), ids.get(at)) else {
                    break;
                };
                items.push(source_item(item, id, cursor.as_deref()));
                at += 1;
            }
            let rest = at < page.items.len();
            match page.next_cursor.clone() {
                Some(next) if !rest && items.len() < limit => {
                    if !cursors.insert(next.clone()) {
                        return Err(SourceError::Malformed(format!(
                            "thread/items/list gave the cursor {next:?} twice"
                        )));
                    }
                    if pages >= FIND_PAGES {
                        // Pages of nothing, each naming another: what was read is
                        // answered; were it nothing, the history would seem to end.
                        if items.is_empty() {
                            return Err(SourceError::Unavailable(format!(
                                "thread/items/list gave {FIND_PAGES} pages with no item"
                            )));
                        }
                        return Ok(SourcePage { items, more: true });
                    }
                    page = self
                        .page(&thread, Some(&next))?
                        .ok_or(SourceError::PositionGone)?;
                    cursor = Some(next);
                    at = 0;
                    pages += 1;
                }
                next => {
                    let more = rest || next.is_some();
                    return Ok(SourcePage { items, more });
                }
            }
        }
    }

    fn read_newer(
        &mut self,
        after: &SourcePosition,
        limit: usize,
    ) -> Result<SourcePage, SourceError> {
        // Positions name items by ID; the hint in them may differ between two reads of
        // one item, so the item is looked for by its ID from the present, page by page
        // (at most FIND_PAGES). The items met before it are the newer ones: the
        // `limit + 1` nearest to it are kept.
        let Some(thread) = self.link.get() else {
            return Err(SourceError::PositionGone);
        };
        let (id, _) = split(&after.0).ok_or(SourceError::PositionGone)?;
        let mut newer: VecDeque<SourceItem> = VecDeque::new();
        let mut dropped = false;
        let found = self.walk(&thread, |page, cursor| {
            for (item, name) in page.items.iter().zip(entry_ids(page)) {
                if name == id {
                    return Some(());
                }
                newer.push_back(source_item(item, &name, cursor));
                if newer.len() > limit.saturating_add(1) {
                    newer.pop_front();
                    dropped = true;
                }
            }
            None
        })?;
        if found.is_none() {
            return Err(SourceError::PositionGone);
        }
        let more = dropped || newer.len() > limit;
        let items = newer.into_iter().rev().take(limit).collect();
        Ok(SourcePage { items, more })
    }
}
