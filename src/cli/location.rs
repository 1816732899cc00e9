//! Where a journal is: a directory (the embedded RocksDB journal) or a PostgreSQL database
//! (`postgres://…`, many processes sharing it). Every command takes either as `--journal`.

use super::{CliError, Result};
use dtask_journal::postgres::PgLocation;
use dtask_journal::{Error as JournalError, Journal, JournalOptions};
use std::path::{Path, PathBuf};

/// A journal's location.
#[derive(Debug, Clone)]
pub enum At {
    /// A directory.
    Dir(PathBuf),
    /// A PostgreSQL URL (with `?schema=NAME` for a schema other than `dtask`).
    Postgres(String),
}

impl At {
    /// `path` as given: a PostgreSQL URL or a directory.
    pub fn of(path: &Path) -> Self {
        match path.to_str() {
            Some(url) if PgLocation::is_postgres(url) => Self::Postgres(url.to_owned()),
            _ => Self::Dir(path.to_owned()),
        }
    }

    /// For messages: the directory, or host, port, database and schema (no credentials).
    pub fn display(&self) -> String {
        match self {
            Self::Dir(dir) => dir.display().to_string(),
            Self::Postgres(url) => PgLocation::parse(url).map_or_else(
                |_| "a PostgreSQL database".to_owned(),
                |l| format!("PostgreSQL {}", l.display()),
            ),
        }
    }

    /// The directory, when it is one.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Self::Dir(dir) => Some(dir),
            Self::Postgres(_) => None,
        }
    }

    /// Checks that a journal is there to read (a directory must exist).
    fn existing(&self) -> Result<()> {
        if let Self::Dir(dir) = self {
            if !dir.exists() {
                return Err(CliError::Usage(format!("no journal at {}", dir.display())));
            }
            if !dir.is_dir() {
                return Err(CliError::Usage(format!(
                    "no journal at {}: it is a file, a journal is a directory",
                    dir.display()
                )));
            }
        }
        Ok(())
    }

    /// Opens for writing a journal that must be there already — for the commands that change
    /// one (`purge`, `trim`, `hold`): a mistyped path is refused (exit 2, `no journal at …`),
    /// not made into a new journal.
    pub fn open_existing_writer(&self, options: JournalOptions) -> Result<Journal> {
        self.existing()?;
        let missing = || CliError::Usage(format!("no journal at {}", self.display()));
        // A read-only open tells a journal from anything else (another program's RocksDB
        // directory has no journal format), and writes nothing.
        let reader = match self {
            Self::Dir(dir) => Journal::open_read_only(dir),
            Self::Postgres(url) => Journal::open_postgres_read_only(url),
        };
        match reader {
            Err(JournalError::NotAJournal(_)) => return Err(missing()),
            Err(e) => return Err(e.into()),
            Ok(reader) => drop(reader),
        }
        self.open_writer(options)
    }

    /// Opens the journal for writing (creating it if missing).
    pub fn open_writer(&self, options: JournalOptions) -> Result<Journal> {
        Ok(match self {
            Self::Dir(dir) => Journal::open(dir, options)?,
            Self::Postgres(url) => Journal::open_postgres(url, options)?,
        })
    }

    /// Opens the journal read-only (no lock: works while another process writes it).
    pub fn open_reader(&self) -> Result<Journal> {
        self.existing()?;
        Ok(match self {
            Self::Dir(dir) => Journal::open_read_only(dir)?,
            Self::Postgres(url) => Journal::open_postgres_read_only(url)?,
        })
    }

    /// Opens a reader that sees what a live writer commits after the open: a RocksDB follower
    /// (with its info log in `scratch`, caught up on demand), or a database reader (every
    /// read sees the latest commits).
    pub fn open_follower(&self, scratch: &Path) -> Result<Journal> {
        self.existing()?;
        Ok(match self {
            Self::Dir(dir) => Journal::open_follower(dir, scratch)?,
            Self::Postgres(url) => Journal::open_postgres_read_only(url)?,
        })
    }

    /// Whether nothing is there yet: a missing or empty directory, or a database without a
    /// journal (or with a journal of no task).
    pub fn is_new(&self) -> Result<bool> {
        match self {
            Self::Dir(dir) => {
                if !dir.exists() {
                    return Ok(true);
                }
                let mut entries = std::fs::read_dir(dir)
                    .map_err(CliError::io(format!("reading {}", dir.display())))?;
                Ok(entries.next().is_none())
            }
            Self::Postgres(url) => match Journal::open_postgres_read_only(url) {
                Err(JournalError::NotAJournal(_)) => Ok(true),
                Err(e) => Err(e.into()),
                Ok(journal) => Ok(journal.task_ids().next().is_none()),
            },
        }
    }
}
