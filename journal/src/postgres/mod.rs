//! The journal on PostgreSQL: the same records, byte for byte, in a database that many dtask
//! processes on many machines share.
//!
//! [`PgBackend`] is a [`Backend`]: the journal's key spaces are tables whose primary keys keep
//! the keys' order (module `rows`), so every reader of the journal — streams, the commit order,
//! the live index, the outbox, the audit's bulk readers — works on it unchanged, and the
//! framing, the BLAKE3 chain and the CRC are the embedded journal's. What differs is who
//! decides: the database. Each batch of the group-commit writer is one transaction that
//! first locks the one row of `dtask_writer` ([`Backend::lock_for_write`]), reads the tail
//! marker the last writer of any process committed and the tasks written since this
//! writer's last batch (in the same round trip), checks every append's expected position
//! against the heads as committed, and writes the records, the indexes and the new tail —
//! then commits, which with `synchronous_commit` on returns once the database's write-ahead
//! log is flushed. The lock is held until that commit, so the global sequences are handed out
//! in commit order, without gaps: a reader of the commit order that has seen sequence `n`
//! has seen every record before it (see `docs/postgres.md`).
//!
//! Connections run on threads of their own (module `conn`); the schema is created and migrated by
//! the first open ([`schema`]).

pub mod admin;
mod conn;
mod listen;
pub(crate) mod rows;
pub mod schema;
pub(crate) mod write;

use crate::backend::{
    Backend, BatchOp, KeyValue, LastRecord, Range, RawIter, WriteLock, WRITTEN_SINCE_MAX,
};
use crate::error::{Error, Result};
use crate::keys::Space;
use crate::options::Durability;
use conn::{Conn, Target};
use rows::{Bound, Shape};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio_postgres::types::Type;
use write::{statements, write_and_commit};

pub use schema::SCHEMA_VERSION;

/// Reader connections per open journal.
const READERS: usize = 4;

/// Rows read per query of a scan: the first page is small (most scans read a stream or a
/// head), later ones grow to this.
const MAX_PAGE: i64 = 4096;
const FIRST_PAGE: i64 = 64;

/// A PostgreSQL location: the connection string and the schema the journal lives in.
#[derive(Debug, Clone)]
pub struct PgLocation {
    config: tokio_postgres::Config,
    schema: String,
    display: String,
}

impl PgLocation {
    /// Whether `location` names a PostgreSQL database (`postgres://…` or `postgresql://…`).
    #[must_use]
    pub fn is_postgres(location: &str) -> bool {
        location.starts_with("postgres://") || location.starts_with("postgresql://")
    }

    /// Parses a PostgreSQL URL. Besides libpq's parameters it takes `schema=NAME` (default
    /// `dtask`): the schema the journal's tables are in, so that several journals share a
    /// database.
    ///
    /// # Errors
    /// [`Error::InvalidLocation`] for a malformed URL.
    pub fn parse(url: &str) -> Result<Self> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut schema = "dtask".to_owned();
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("schema", name)) => name.clone_into(&mut schema),
                _ => kept.push(pair),
            }
        }
        if schema.is_empty() || schema.len() > 63 {
            return Err(Error::InvalidLocation(format!(
                "the schema name must be 1 to 63 bytes: {schema:?}"
            )));
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| Error::InvalidLocation(format!("not a PostgreSQL URL: {e}")))?;
        if config.get_application_name().is_none() {
            // Names the journal's connections in `pg_stat_activity`.
            let name: String = format!("dtask:{schema}").chars().take(63).collect();
            config.application_name(name);
        }
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
        let display = format!(
            "{}:{} (database {}, schema {schema})",
            if hosts.is_empty() {
                "localhost".to_owned()
            } else {
                hosts.join(",")
            },
            if ports.is_empty() {
                "5432".to_owned()
            } else {
                ports.join(",")
            },
            config.get_dbname().unwrap_or("postgres"),
        );
        Ok(Self {
            config,
            schema,
            display,
        })
    }

    /// Host, port, database and schema, without credentials.
    #[must_use]
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The schema the journal's tables are in.
    #[must_use]
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The URL of this location with schema `schema` (for tools that stage a journal
    /// beside another).
    #[must_use]
    pub fn url_with_schema(url: &str, schema: &str) -> String {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("schema="))
            .collect();
        let pair = format!("schema={schema}");
        kept.push(&pair);
        format!("{base}?{}", kept.join("&"))
    }
}

/// The PostgreSQL backend.
pub struct PgBackend {
    location: PgLocation,
    readers: Vec<Conn>,
    next_reader: AtomicUsize,
    /// The connection of the writer's locked batches (`None` read-only).
    writer: Option<Conn>,
    /// Whether the writer's connection holds the writer lock (a batch is open).
    locked: AtomicBool,
    read_only: bool,
    /// How connections are opened (for the listener, started on first use).
    target: Target,
    listener: std::sync::OnceLock<Option<listen::Listener>>,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("location", &self.location.display)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl PgBackend {
    /// Connects, creating or migrating the schema unless `read_only` (a new schema gets the
    /// `seed` rows of `dtask_meta` in the same transaction).
    ///
    /// # Errors
    /// [`Error::Storage`] naming the server and the cause when it cannot be reached;
    /// [`Error::UnsupportedSchema`] for a newer schema; [`Error::NotAJournal`] read-only on a
    /// database without a journal.
    pub(crate) fn open(
        location: PgLocation,
        read_only: bool,
        durability: Durability,
        seed: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Self> {
        let target = Target {
            config: location.config.clone(),
            schema: location.schema.clone(),
            display: location.display.clone(),
            synchronous: durability == Durability::Sync,
        };
        let first = Conn::open(target.clone(), "reader-0")?;
        schema::migrate(&first, &location.schema, read_only, seed)?;
        let mut readers = vec![first];
        for i in 1..READERS {
            readers.push(Conn::open(target.clone(), &format!("reader-{i}"))?);
        }
        let writer = if read_only {
            None
        } else {
            Some(Conn::open(target.clone(), "writer")?)
        };
        Ok(Self {
            location,
            readers,
            next_reader: AtomicUsize::new(0),
            writer,
            locked: AtomicBool::new(false),
            read_only,
            target,
            listener: std::sync::OnceLock::new(),
        })
    }

    /// Where the journal is.
    #[must_use]
    pub fn location(&self) -> &PgLocation {
        &self.location
    }

    fn reader(&self) -> &Conn {
        let i = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
        &self.readers[i]
    }

    /// One page of a space: rows within the bounds, in key order (or reverse).
    fn page(
        &self,
        space: Space,
        lower: Option<&Bound>,
        upper: Option<&Bound>,
        reverse: bool,
        limit: i64,
    ) -> Result<Vec<KeyValue>> {
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
        let rows = self.reader().call(move |client| {
            Box::pin(async move {
                let typed = write::typed(&params);
                client.query_typed(&sql, &typed).await
            })
        })?;
        rows.iter().map(|row| to_pair(space, row)).collect()
    }
}

impl PgBackend {
    /// The `NOTIFY` of a batch that moves the tail: other processes' listeners hear of it
    /// when it commits.
    fn notice(&self, ops: &[BatchOp]) -> Option<write::Statement> {
        let last_seq = ops.iter().find_map(|op| match op {
            BatchOp::Put {
                space: Space::Meta,
                key,
                value,
            } if key.as_slice() == crate::keys::META_TAIL => {
                crate::tail::Tail::decode(value).ok().map(|t| t.last_seq)
            }
            _ => None,
        })?;
        Some(write::Statement {
            sql: "SELECT pg_notify($1, $2)",
            params: vec![
                (Box::new(listen::CHANNEL.to_owned()), Type::TEXT),
                (
                    Box::new(listen::payload(&self.location.schema, last_seq)),
                    Type::TEXT,
                ),
            ],
            plan: write::Plan::Cached,
        })
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

/// A row read as the key-value pair of its space.
fn to_pair(space: Space, row: &tokio_postgres::Row) -> Result<KeyValue> {
    let get_err = |e: tokio_postgres::Error| conn::storage(&e);
    Ok(match space {
        Space::Events => {
            let task: String = row.try_get(0).map_err(get_err)?;
            let position: i64 = row.try_get(1).map_err(get_err)?;
            let record: Vec<u8> = row.try_get(2).map_err(get_err)?;
            (
                rows::event_key(&task, position).into_boxed_slice(),
                record.into_boxed_slice(),
            )
        }
        Space::Commits | Space::Outbox => {
            let seq: i64 = row.try_get(0).map_err(get_err)?;
            let task: String = row.try_get(1).map_err(get_err)?;
            let position: i64 = row.try_get(2).map_err(get_err)?;
            (
                rows::seq_key(seq).into_boxed_slice(),
                rows::event_key(&task, position).into_boxed_slice(),
            )
        }
        Space::Live => {
            let task: String = row.try_get(0).map_err(get_err)?;
            (task.into_bytes().into_boxed_slice(), Box::default())
        }
        Space::Meta => {
            let name: Vec<u8> = row.try_get(0).map_err(get_err)?;
            let value: Vec<u8> = row.try_get(1).map_err(get_err)?;
            (name.into_boxed_slice(), value.into_boxed_slice())
        }
    })
}

/// A scan: pages read as the iterator goes.
struct Scan<'a> {
    backend: &'a PgBackend,
    space: Space,
    lower: Option<Bound>,
    upper: Option<Bound>,
    reverse: bool,
    buffer: VecDeque<KeyValue>,
    limit: i64,
    done: bool,
}

impl Iterator for Scan<'_> {
    type Item = Result<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buffer.is_empty() && !self.done {
            let page = match self.backend.page(
                self.space,
                self.lower.as_ref(),
                self.upper.as_ref(),
                self.reverse,
                self.limit,
            ) {
                Ok(page) => page,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            };
            self.done = i64::try_from(page.len()).unwrap_or(i64::MAX) < self.limit;
            self.limit = (self.limit * 4).min(MAX_PAGE);
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
            self.buffer.extend(page);
        }
        self.buffer.pop_front().map(Ok)
    }
}

impl Backend for PgBackend {
    fn write(&self, ops: Vec<BatchOp>, durability: Durability) -> Result<()> {
        let _ = durability;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        // A write outside the writer's batches (the format stamp, a repair) takes the writer
        // lock too: no writer of another process runs beside it.
        let notice = self.notice(&ops);
        let mut statements = statements(ops)?;
        statements.extend(notice);
        self.reader().call(move |client| {
            Box::pin(async move {
                client
                    .batch_execute("BEGIN; SELECT id FROM dtask_writer WHERE id = 1 FOR UPDATE")
                    .await?;
                write_and_commit(&client, statements).await
            })
        })
    }

    fn write_expecting(&self, ops: Vec<BatchOp>, expected: &[u8]) -> Result<bool> {
        let writer = self.writer.as_ref().ok_or(Error::ReadOnly)?;
        let notice = self.notice(&ops);
        let mut statements = statements(ops)?;
        statements.extend(notice);
        let expected = expected.to_vec();
        writer.call(move |client| {
            Box::pin(async move { write::write_expecting(&client, expected, statements).await })
        })
    }

    fn write_locked(&self, ops: Vec<BatchOp>) -> Result<()> {
        let writer = self.writer.as_ref().ok_or(Error::ReadOnly)?;
        self.locked.store(false, Ordering::Release);
        let notice = self.notice(&ops);
        let mut statements = statements(ops)?;
        statements.extend(notice);
        writer.call(move |client| {
            Box::pin(async move { write_and_commit(&client, statements).await })
        })
    }

    fn sync(&self) -> Result<()> {
        // A commit returned once the database had flushed it.
        Ok(())
    }

    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let lower = rows::lower(space, key)?;
        let page = self.page(space, Some(&lower), None, false, 1)?;
        Ok(page
            .into_iter()
            .next()
            .filter(|(k, _)| **k == *key)
            .map(|(_, v)| v.into_vec()))
    }

    fn scan(&self, space: Space, range: Range) -> RawIter<'_> {
        let bounds = (|| -> Result<(Option<Bound>, Option<Bound>)> {
            let lower = if range.lower.is_empty() {
                None
            } else {
                Some(rows::lower(space, &range.lower)?)
            };
            let upper = match &range.upper {
                None => None,
                Some(upper) => Some(rows::upper(space, upper)?),
            };
            Ok((lower, upper))
        })();
        match bounds {
            Err(e) => Box::new(std::iter::once(Err(e))),
            Ok((lower, upper)) => Box::new(Scan {
                backend: self,
                space,
                lower,
                upper,
                reverse: range.reverse,
                buffer: VecDeque::new(),
                limit: FIRST_PAGE,
                done: false,
            }),
        }
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!("postgres {}", self.location.display)
    }

    fn lock_for_write(&self, since: u64) -> Result<Option<WriteLock>> {
        let writer = self.writer.as_ref().ok_or(Error::ReadOnly)?;
        let since = i64::try_from(since).unwrap_or(i64::MAX);
        // One more than listed, to tell a full list from a cut one.
        let most = i64::try_from(WRITTEN_SINCE_MAX + 1).unwrap_or(i64::MAX);
        let locked = writer.call(move |client| {
            Box::pin(async move {
                let run = async {
                    // Prepared first (once per connection), then sent together; the tail and
                    // the tasks written since `since` are read once the lock is held. The
                    // second read is planned each time (a range of a growing table).
                    let lock = client
                        .statement("SELECT id FROM dtask_writer WHERE id = 1 FOR UPDATE", &[])
                        .await?;
                    let read = client
                        .statement(
                            "SELECT value FROM dtask_meta WHERE name = $1",
                            &[Type::BYTEA],
                        )
                        .await?;
                    let (begun, locked, tail, written) = futures_util::future::join4(
                        client.batch_execute("BEGIN"),
                        client.query(&lock, &[]),
                        client.query(&read, &[&crate::keys::META_TAIL]),
                        client.query_typed(
                            "SELECT DISTINCT task FROM dtask_records WHERE seq > $1 LIMIT $2",
                            &[(&since, Type::INT8), (&most, Type::INT8)],
                        ),
                    )
                    .await;
                    begun?;
                    locked?;
                    let tail = tail?;
                    let written = written?;
                    let tasks = (written.len() <= WRITTEN_SINCE_MAX)
                        .then(|| {
                            written
                                .iter()
                                .map(|row| row.try_get::<_, String>(0))
                                .collect::<std::result::Result<Vec<_>, _>>()
                        })
                        .transpose()?;
                    Ok::<_, tokio_postgres::Error>(WriteLock {
                        tail: tail.first().map(|row| row.get::<_, Vec<u8>>(0)),
                        written_since: tasks,
                    })
                };
                match run.await {
                    Ok(locked) => Ok(locked),
                    Err(e) => {
                        let _ = client.batch_execute("ROLLBACK").await;
                        Err(e)
                    }
                }
            })
        })?;
        self.locked.store(true, Ordering::Release);
        Ok(Some(locked))
    }

    fn last_records(&self, tasks: &[String]) -> Option<Result<Vec<LastRecord>>> {
        let names = tasks.to_vec();
        let found = self.reader().call(move |client| {
            Box::pin(async move {
                // Planned each time: a plan cached while `dtask_live` was small would scan
                // it whole once it has grown.
                client
                    .query_typed(
                        "SELECT t.task, r.position, r.record, l.task IS NOT NULL \
                         FROM unnest($1::text[]) WITH ORDINALITY AS t(task, i) \
                         LEFT JOIN LATERAL (SELECT position, record FROM dtask_records \
                             WHERE task = t.task ORDER BY position DESC LIMIT 1) r ON true \
                         LEFT JOIN dtask_live l ON l.task = t.task \
                         ORDER BY t.i",
                        &[(&names, Type::TEXT_ARRAY)],
                    )
                    .await
            })
        });
        Some(found.and_then(|rows| {
            rows.iter()
                .map(|row| {
                    let err = |e: tokio_postgres::Error| conn::storage(&e);
                    let task: String = row.try_get(0).map_err(err)?;
                    let position: Option<i64> = row.try_get(1).map_err(err)?;
                    let record: Option<Vec<u8>> = row.try_get(2).map_err(err)?;
                    let live: bool = row.try_get(3).map_err(err)?;
                    Ok(position.zip(record).map(|(position, record)| {
                        (
                            (
                                rows::event_key(&task, position).into_boxed_slice(),
                                record.into_boxed_slice(),
                            ),
                            live,
                        )
                    }))
                })
                .collect()
        }))
    }

    fn watch_commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.listener
            .get_or_init(|| listen::start(self.target.clone()).ok())
            .as_ref()
            .map(|l| l.watermark.clone())
    }

    fn unlock_write(&self) {
        if self.locked.swap(false, Ordering::AcqRel) {
            if let Some(writer) = &self.writer {
                let _ = writer
                    .call(|client| Box::pin(async move { client.batch_execute("ROLLBACK").await }));
            }
        }
    }
}
