//! `dtask migrate`: brings a journal's format — and, on PostgreSQL, its database schema — up
//! to this build's, as a deliberate step of an upgrade rather than at the first open of a node
//! of the new version; `--check` only says whether anything is pending.
//!
//! On PostgreSQL a migration may fence off the nodes of the earlier version still running
//! (schema version 3 does: docs/postgres.md, "Upgrading a cluster of nodes"), so an operator
//! runs it when the cluster is ready for it.

use super::{CliError, Global, Out, Result};
use dtask_journal::{Journal, JournalOptions, JOURNAL_FORMAT_VERSION};
use serde_json::json;

/// Arguments of `dtask migrate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only say what is pending; exit 1 when something is, 0 when the journal is up to date.
    #[arg(long)]
    check: bool,
}

/// A journal's versions: its format, and its database schema's (PostgreSQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Versions {
    format: u32,
    schema: Option<u32>,
}

impl Versions {
    fn of(journal: &Journal) -> Self {
        Self {
            format: journal.format_version(),
            schema: journal.schema_version(),
        }
    }

    /// This build's, for a journal whose schema (if any) is `self`'s.
    fn current(self) -> Self {
        Self {
            format: JOURNAL_FORMAT_VERSION,
            schema: self.schema.map(|_| dtask_journal::postgres::SCHEMA_VERSION),
        }
    }

    fn describe(self) -> String {
        match self.schema {
            Some(schema) => format!(
                "journal format {}, PostgreSQL schema version {schema}",
                self.format
            ),
            None => format!("journal format {}", self.format),
        }
    }
}

/// Runs `dtask migrate`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let at = global.at()?;
    let before = Versions::of(&at.open_reader()?);
    let target = before.current();
    let pending = before != target;
    let after = if pending && !args.check {
        Versions::of(&at.open_writer(JournalOptions::default())?)
    } else {
        before
    };
    let mut out = Out::new();
    if global.json {
        out.json(&json!({
            "journal_format": { "before": before.format, "after": after.format },
            "postgres_schema": before.schema.map(|b| json!({ "before": b, "after": after.schema })),
            "this_build": {
                "journal_format": target.format,
                "postgres_schema": target.schema,
            },
            "pending": after != target,
            "migrated": after != before,
        }))?;
    } else if !pending {
        out.line(format!(
            "{}: up to date ({})",
            at.display(),
            before.describe()
        ))?;
    } else if args.check {
        out.line(format!(
            "{}: {}; this build writes {}: `dtask migrate` brings it there",
            at.display(),
            before.describe(),
            target.describe()
        ))?;
    } else {
        out.line(format!(
            "{}: migrated from {} to {}",
            at.display(),
            before.describe(),
            after.describe()
        ))?;
    }
    out.flush()?;
    if after == target {
        Ok(())
    } else {
        // Already said above; exit 1.
        Err(CliError::Problems(String::new()))
    }
}
