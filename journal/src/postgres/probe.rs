//! What a synced append promises on a PostgreSQL journal: the server's settings that decide
//! it, and what a commit that waits for the server's flush costs (the PostgreSQL side of
//! [`crate::probe`]; `dtask probe` prints both).
//!
//! The journal's commits wait for the server's write-ahead log flush (its sessions set
//! `synchronous_commit` themselves, whatever the server's default), so what remains is the
//! server's own: `fsync` (off, nothing is flushed) and `full_page_writes` (off, a crash in the
//! middle of a page write can tear it) — and the disk under its data directory, which is not
//! seen from a client: probe that directory on the server's machine.

use super::conn::{Conn, Target};
use super::PgLocation;
use crate::error::{Error, Result};
use crate::probe::{SyncPromise, SyncTimes, Verdict};
use serde::Serialize;
use std::time::{Duration, Instant};

/// The server settings that decide what a commit survives, as the server reports them for
/// a new session (`pg_settings.reset_val`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerSettings {
    /// The server's version (`server_version`).
    pub version: String,
    /// Whether the server flushes its log at all (`fsync`).
    pub fsync: bool,
    /// Whether a page's first change after a checkpoint is logged whole (`full_page_writes`).
    pub full_page_writes: bool,
    /// The server's default for sessions that do not set it (`synchronous_commit`); the
    /// journal's sessions set their own.
    pub synchronous_commit: String,
    /// How the server flushes its log (`wal_sync_method`).
    pub wal_sync_method: String,
    /// Whether the data pages carry checksums (`data_checksums`).
    pub data_checksums: Option<bool>,
    /// The server's data directory, when this role may see it (`data_directory`).
    pub data_directory: Option<String>,
}

/// The settings read, by name.
const SETTINGS: [&str; 7] = [
    "server_version",
    "fsync",
    "full_page_writes",
    "synchronous_commit",
    "wal_sync_method",
    "data_checksums",
    "data_directory",
];

/// Reads the settings of the server at `location`.
///
/// # Errors
/// [`Error::Storage`] naming the server when it cannot be reached or the read fails.
pub fn settings(location: &PgLocation) -> Result<ServerSettings> {
    let conn = Conn::open(Target::admin(location), "probe")?;
    let rows: Vec<(String, String)> = conn.call(|client| {
        Box::pin(async move {
            let rows = client
                .query(
                    "SELECT name, reset_val FROM pg_settings WHERE name = ANY($1)",
                    &[&SETTINGS.as_slice()],
                )
                .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    })?;
    let get = |name: &str| rows.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let on = |name: &str| get(name).map(|v| v == "on");
    Ok(ServerSettings {
        version: get("server_version").unwrap_or_default(),
        // Both are shown to every role; a server that hid them is taken at its default (on).
        fsync: on("fsync").unwrap_or(true),
        full_page_writes: on("full_page_writes").unwrap_or(true),
        synchronous_commit: get("synchronous_commit").unwrap_or_default(),
        wal_sync_method: get("wal_sync_method").unwrap_or_default(),
        data_checksums: on("data_checksums"),
        data_directory: get("data_directory"),
    })
}

/// Times `count` commits that each write a commit record and wait for the server's flush of
/// it (a transaction id taken and committed: no table is written), over one connection.
///
/// # Errors
/// [`Error::InvalidLocation`] when `count` is 0; [`Error::Storage`] when the server cannot be
/// reached or a commit fails.
pub fn time_commits(location: &PgLocation, count: u32) -> Result<SyncTimes> {
    if count == 0 {
        return Err(Error::InvalidLocation(
            "a commit probe needs at least one commit".to_owned(),
        ));
    }
    let conn = Conn::open(Target::admin(location), "probe")?;
    let times: Vec<Duration> = conn.call(move |client| {
        Box::pin(async move {
            let mut times = Vec::with_capacity((count as usize).min(1024));
            for _ in 0..count {
                let start = Instant::now();
                // Taking a transaction id makes the commit write a record, and the session's
                // `synchronous_commit = on` makes it wait for the flush of it.
                client.batch_execute("SELECT txid_current()").await?;
                times.push(start.elapsed());
            }
            Ok(times)
        })
    })?;
    SyncTimes::of(times, 0).ok_or_else(|| Error::InvalidLocation("no commit was timed".to_owned()))
}

/// Logs a warning when the server at `location` does not flush its log (`fsync = off`): what
/// a writer's open of a journal there that is to sync does. Says nothing when the settings
/// cannot be read (the open goes on; `dtask probe` reads them).
pub(crate) fn warn_if_lost(location: &PgLocation) {
    if let Ok(settings) = settings(location) {
        let verdict = settings.verdict();
        if verdict.promise == SyncPromise::Lost {
            tracing::warn!(
                server = %location.display(),
                "the journal's synced appends will not survive a crash of the database's machine: {}",
                verdict.why
            );
        }
    }
}

impl ServerSettings {
    /// What a synced record survives on this server.
    #[must_use]
    pub fn verdict(&self) -> Verdict {
        if !self.fsync {
            return Verdict {
                promise: SyncPromise::Lost,
                why: "the server runs with fsync = off: it never flushes its log, so a crash of \
                      its machine can lose acknowledged records (and damage the database)"
                    .to_owned(),
                notes: Vec::new(),
            };
        }
        let mut notes = Vec::new();
        if !self.full_page_writes {
            notes.push(
                "full_page_writes = off: a crash in the middle of a page write can tear the \
                 page, unless the server's file system writes pages atomically (ZFS)"
                    .to_owned(),
            );
        }
        notes.push(match &self.data_directory {
            Some(dir) => format!(
                "the server's disk is not seen from here: run `dtask probe --journal {dir}` on \
                 its machine"
            ),
            None => "the server's disk is not seen from here: run `dtask probe --journal DIR` \
                     on its machine, DIR its data directory"
                .to_owned(),
        });
        Verdict {
            promise: SyncPromise::Flushed,
            why: "the server flushes its log at each commit (fsync = on) and the journal's \
                  commits wait for that flush: a synced record survives as the server's disk \
                  keeps its flushes"
                .to_owned(),
            notes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(fsync: bool, full_page_writes: bool) -> ServerSettings {
        ServerSettings {
            version: "16.4".to_owned(),
            fsync,
            full_page_writes,
            synchronous_commit: "on".to_owned(),
            wal_sync_method: "fdatasync".to_owned(),
            data_checksums: Some(false),
            data_directory: None,
        }
    }

    #[test]
    fn fsync_off_loses_synced_records_and_torn_pages_are_noted() {
        let off = settings(false, true).verdict();
        assert_eq!(off.promise, SyncPromise::Lost);
        assert!(off.why.contains("fsync = off"), "{off:?}");
        let on = settings(true, true).verdict();
        assert_eq!(on.promise, SyncPromise::Flushed);
        assert_eq!(on.notes.len(), 1, "{on:?}");
        let torn = settings(true, false).verdict();
        assert_eq!(torn.promise, SyncPromise::Flushed);
        assert!(torn.notes[0].contains("full_page_writes"), "{torn:?}");
        let located = ServerSettings {
            data_directory: Some("/var/lib/postgresql/16/main".to_owned()),
            ..settings(true, true)
        };
        assert!(located.verdict().notes[0].contains("--journal /var/lib/postgresql/16/main"));
    }
}
