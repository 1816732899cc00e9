//! The reading side of [`PgBackend`]: pages of a space asked for on the readers'
//! connections (the next one while the caller works through the last), turned back into the
//! key spaces' pairs, and a read-only open's check that what it read is durable.

use super::conn::{self, Conn};
use super::rows::{self, Bound, Shape};
use super::{durable, write, PgBackend};
use crate::backend::KeyValue;
use crate::error::Result;
use crate::keys::Space;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use tokio_postgres::types::Type;

/// Rows read by a scan's first query: most scans read a stream or a head.
pub(super) const FIRST_PAGE: i64 = 64;

/// Rows read per query of a scan once its pages have grown.
const MAX_PAGE: i64 = 4096;

/// The records of a range of sequences, in sequence order
/// ([`Backend::records_by_seq`](crate::backend::Backend::records_by_seq)).
const RECORDS_BY_SEQ: &str =
    "SELECT task, position, record FROM dtask_records WHERE seq BETWEEN $1 AND $2 ORDER BY seq";

/// The last sequence committed (on a reader's session, whose search path is the journal's).
pub(super) const LAST_SEQ: &str = "SELECT coalesce(max(seq), 0) FROM dtask_records";

impl PgBackend {
    /// The next reader connection, in turn.
    pub(super) fn reader(&self) -> &Conn {
        let i = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
        &self.readers[i]
    }

    /// Asks for one page of a space — rows within the bounds, in key order (or reverse) —
    /// and returns at once: the query sent to a reader, its rows to take with
    /// [`PgBackend::take_page`].
    pub(super) fn ask_page(
        &self,
        space: Space,
        lower: Option<&Bound>,
        upper: Option<&Bound>,
        reverse: bool,
        limit: i64,
    ) -> Result<conn::Answer<Vec<tokio_postgres::Row>>> {
        let shape = rows::shape(space);
        let mut params: write::Params = Vec::new();
        let mut conditions = Vec::new();
        if let Some(bound) = lower {
            let n = params.len() + 1;
            conditions.push(rows::compare(&shape, bound, true, n, &mut params));
        }
        if let Some(bound) = upper {
            let n = params.len() + 1;
            conditions.push(rows::compare(&shape, bound, false, n, &mut params));
        }
        let order = order_by(&shape, reverse);
        let sql = format!(
            "SELECT {} FROM {}{}{} ORDER BY {order} LIMIT {limit}",
            shape.select,
            shape.table,
            if conditions.is_empty() { "" } else { " WHERE " },
            conditions.join(" AND "),
        );
        // Prepared once per connection and text (a few dozen shapes at most: the space, which
        // bounds, the order, the page's size): a page after the first is not parsed again,
        // and is planned for its parameters (the readers' sessions force custom plans).
        self.reader().submit(move |client| {
            Box::pin(async move {
                let statement = client.statement(&sql, &write::types(&params)).await?;
                client.query(&statement, &write::values(&params)).await
            })
        })
    }

    /// The page [`PgBackend::ask_page`] asked for, once its rows come. The rows become pairs
    /// on the calling thread: a frozen view's one connection serves several readers at once
    /// (the audit's), each converting its own pages.
    pub(super) fn take_page(
        &self,
        space: Space,
        asked: conn::Answer<Vec<tokio_postgres::Row>>,
    ) -> Result<Vec<KeyValue>> {
        let pairs = to_pairs(space, &asked.wait()?)?;
        if self.read_only && !self.known_durable(Self::seqs(space, &pairs)) {
            self.make_reads_durable()?;
        }
        Ok(pairs)
    }

    /// The records of sequences `first..=last` in sequence order, in one query: see
    /// [`Backend::records_by_seq`](crate::backend::Backend::records_by_seq).
    pub(super) fn records_in_seq_range(&self, first: u64, last: u64) -> Result<Vec<KeyValue>> {
        let first = i64::try_from(first).unwrap_or(i64::MAX);
        let last = i64::try_from(last).unwrap_or(i64::MAX);
        let rows = self.reader().call(move |client| {
            Box::pin(async move {
                let statement = client
                    .statement(RECORDS_BY_SEQ, &[Type::INT8, Type::INT8])
                    .await?;
                client.query(&statement, &[&first, &last]).await
            })
        })?;
        let pairs = to_pairs(Space::Events, &rows)?;
        if self.read_only && !self.known_durable(Self::seqs(Space::Events, &pairs)) {
            self.make_reads_durable()?;
        }
        Ok(pairs)
    }

    /// The sequences of `pairs`, a page of `space`; `None` for a space without them, whose
    /// pages a read-only open never takes as known durable (an absent row there may be a
    /// deletion not yet flushed). An absent record or commit only ends a stream or the commit
    /// order early.
    pub(super) fn seqs(
        space: Space,
        pairs: &[KeyValue],
    ) -> Option<impl Iterator<Item = Option<u64>> + '_> {
        let of_record = matches!(space, Space::Events);
        match space {
            Space::Events | Space::Commits => Some(pairs.iter().map(move |(key, value)| {
                if of_record {
                    crate::record::seq_of(value)
                } else {
                    crate::keys::parse_seq_key(key).ok()
                }
            })),
            Space::Outbox | Space::Live | Space::Meta => None,
        }
    }

    /// Whether every one of `seqs` is at or below the last sequence this reader knows durable
    /// (module `durable`).
    pub(super) fn known_durable(&self, seqs: Option<impl Iterator<Item = Option<u64>>>) -> bool {
        let known = self.durable_seq.load(Ordering::Acquire);
        seqs.is_some_and(|mut seqs| seqs.all(|seq| seq.is_some_and(|seq| seq <= known)))
    }

    /// Makes durable every commit a read made before this call saw, and learns the last
    /// sequence committed, now durable (module `durable`).
    pub(super) fn make_reads_durable(&self) -> Result<()> {
        if self.frozen {
            // Made durable when its snapshot was taken ([`PgBackend::frozen`]).
            return Ok(());
        }
        let seq = self
            .reader()
            .call(|client| Box::pin(async move { durable::last_seq(&client, LAST_SEQ).await }))?;
        self.durable_seq.fetch_max(seq, Ordering::AcqRel);
        Ok(())
    }
}

fn order_by(shape: &Shape, reverse: bool) -> String {
    let direction = if reverse { " DESC" } else { "" };
    shape
        .key
        .trim_matches(|c| c == '(' || c == ')')
        .split(", ")
        .map(|column| format!("{column}{direction}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rows of `space` read as its key-value pairs ([`to_pair`]).
pub(super) fn to_pairs(space: Space, rows: &[tokio_postgres::Row]) -> Result<Vec<KeyValue>> {
    rows.iter().map(|row| to_pair(space, row)).collect()
}

/// A row read as the key-value pair of its space. The columns are read in place from the
/// row's bytes: each pair is two allocations, its key and its value (exactly sized).
fn to_pair(space: Space, row: &tokio_postgres::Row) -> Result<KeyValue> {
    let get_err = |e: tokio_postgres::Error| conn::storage(&e);
    Ok(match space {
        Space::Events => {
            let task: &str = row.try_get(0).map_err(get_err)?;
            let position: i64 = row.try_get(1).map_err(get_err)?;
            let record: &[u8] = row.try_get(2).map_err(get_err)?;
            (
                rows::event_key(task, position).into_boxed_slice(),
                Box::from(record),
            )
        }
        Space::Commits | Space::Outbox => {
            let seq: i64 = row.try_get(0).map_err(get_err)?;
            let task: &str = row.try_get(1).map_err(get_err)?;
            let position: i64 = row.try_get(2).map_err(get_err)?;
            (
                rows::seq_key(seq).into_boxed_slice(),
                rows::event_key(task, position).into_boxed_slice(),
            )
        }
        Space::Live => {
            let task: &str = row.try_get(0).map_err(get_err)?;
            (Box::from(task.as_bytes()), Box::default())
        }
        Space::Meta => {
            let name: &[u8] = row.try_get(0).map_err(get_err)?;
            let value: &[u8] = row.try_get(1).map_err(get_err)?;
            (Box::from(name), Box::from(value))
        }
    })
}

/// A scan: pages read as the iterator goes. Once its pages are full-sized (a long scan),
/// each next page is asked for as soon as the one before comes, and read by the server
/// while the caller works through that one.
pub(super) struct Scan<'a> {
    backend: &'a PgBackend,
    space: Space,
    lower: Option<Bound>,
    upper: Option<Bound>,
    reverse: bool,
    buffer: VecDeque<KeyValue>,
    limit: i64,
    done: bool,
    /// The next page, asked for already, and the limit it was asked with.
    ahead: Option<(conn::Answer<Vec<tokio_postgres::Row>>, i64)>,
}

impl<'a> Scan<'a> {
    /// A scan of `space` within the bounds, in key order or `reverse`.
    pub(super) fn new(
        backend: &'a PgBackend,
        space: Space,
        lower: Option<Bound>,
        upper: Option<Bound>,
        reverse: bool,
    ) -> Self {
        Self {
            backend,
            space,
            lower,
            upper,
            reverse,
            buffer: VecDeque::new(),
            limit: FIRST_PAGE,
            done: false,
            ahead: None,
        }
    }

    /// The next page: the one asked for ahead, or asked for now.
    fn next_page(&mut self) -> Result<(Vec<KeyValue>, i64)> {
        let (asked, limit) = match self.ahead.take() {
            Some(ahead) => ahead,
            None => (
                self.backend.ask_page(
                    self.space,
                    self.lower.as_ref(),
                    self.upper.as_ref(),
                    self.reverse,
                    self.limit,
                )?,
                self.limit,
            ),
        };
        Ok((self.backend.take_page(self.space, asked)?, limit))
    }

    /// Asks for the page after the one just taken, if the scan goes on with full pages. A
    /// failure to ask is left to the next page's own asking, which reports it.
    fn ask_ahead(&mut self) {
        if self.done || self.limit < MAX_PAGE {
            return;
        }
        #[cfg(test)]
        super::tests::ASKED_AHEAD.fetch_add(1, Ordering::Relaxed);
        self.ahead = self
            .backend
            .ask_page(
                self.space,
                self.lower.as_ref(),
                self.upper.as_ref(),
                self.reverse,
                self.limit,
            )
            .ok()
            .map(|asked| (asked, self.limit));
    }
}

impl Iterator for Scan<'_> {
    type Item = Result<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buffer.is_empty() && !self.done {
            let (page, limit) = match self.next_page() {
                Ok(page) => page,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            };
            self.done = i64::try_from(page.len()).unwrap_or(i64::MAX) < limit;
            self.limit = (limit * 4).min(MAX_PAGE);
            if let Some((last, _)) = page.last() {
                let next = if self.reverse {
                    rows::upper(self.space, last).map(|b| self.upper = Some(b))
                } else {
                    rows::after(self.space, last).map(|b| self.lower = Some(b))
                };
                if let Err(e) = next {
                    self.done = true;
                    return Some(Err(e));
                }
            }
            self.ask_ahead();
            self.buffer.extend(page);
        }
        self.buffer.pop_front().map(Ok)
    }
}
