//! `dtask import <file> --journal <new dir or postgres://…>`: rebuilds a fresh journal from a
//! full export by appending its records in global order, and checks that every rebuilt
//! record carries the exported digest and CRC (bit-exact) — whichever backend the export
//! came from.
//!
//! The import is all or nothing: the journal is built in a temporary directory beside the
//! target (or a staging schema of the target database) and renamed into place only once
//! every record, digest and the audit checked out; a failed import leaves the target as it
//! was (absent, or an empty directory or schema). So does an import stopped by SIGINT or
//! SIGTERM: it removes its staging copy, then exits with 130.

use super::interrupt::Interrupt;
use super::location::At;
use super::{CliError, Global, Out, Result};
use dtask_journal::export::{ExportError, Header, RecordLine, Scope};
use dtask_journal::postgres::{admin, PgLocation};
use dtask_journal::{
    Digest, Durability, Event, Journal, JournalOptions, PendingAppend, RecordFormat,
    JOURNAL_FORMAT_VERSION, OLDEST_JOURNAL_FORMAT_VERSION, OLDEST_RECORD_FORMAT_VERSION,
    RECORD_FORMAT_VERSION,
};
use serde_json::json;
use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

/// Arguments of `dtask import`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The export file (`-` for standard input). The target is `--journal <DIR>`, which must
    /// not exist or be empty.
    file: PathBuf,
}

/// One exported record, as expected after the import.
struct Expected {
    position: u64,
    seq: u64,
    digest: Digest,
    crc: u32,
}

/// Consecutive records of one task, appended together (their sequences stay consecutive).
struct Batch {
    task: String,
    events: Vec<Event>,
    expected: Vec<Expected>,
    /// The bytes of the export's lines the batch was read from (its size, roughly).
    bytes: usize,
}

/// The most records appended at once.
const MAX_BATCH: usize = 1024;

/// Records whose appends are in flight at once, before they are waited for and read back.
const WINDOW: usize = 4096;

/// The bytes of the export's lines a batch (and a window) holds at most beyond its first
/// record: records of megabytes each would otherwise make batches and windows of gigabytes
/// (read back whole on PostgreSQL).
const BATCH_BYTES: usize = 16 << 20;
const WINDOW_BYTES: usize = 64 << 20;

fn check_target(at: &At) -> Result<()> {
    if let At::Postgres(url) = at {
        // A schema holding another application's tables is no place for a journal (the
        // import would replace the schema): refused before any work, and again when the
        // import is put in place.
        if let Some(why) = admin::check_target(&PgLocation::parse(url)?)? {
            return Err(CliError::Usage(why));
        }
    }
    if at.is_new()? {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "{} is not empty: import only into a new journal",
        at.display()
    )))
}

/// What an export's header announces.
#[derive(Debug, Clone, Copy)]
struct Announced {
    /// How many record lines follow.
    records: u64,
    /// The framing of the records: the rebuilt journal is created with it, so that its
    /// digests and CRCs are the exported ones.
    format: RecordFormat,
}

/// Reads the header line and checks that this build can import the export; returns what it
/// announces.
fn check_header(line: &str, name: &str) -> Result<Announced> {
    let bad = |why: String| CliError::Usage(format!("not a dtask export: {why}"));
    let header = Header::read(line).map_err(|e| match e {
        ExportError::NotJson(e) => CliError::Usage(format!("{name}:1: not JSON: {e}")),
        e @ (ExportError::NoVersion | ExportError::Version { .. }) => bad(e.to_string()),
        e => bad(format!("the header: {e}")),
    })?;
    // The journal formats differ in their indexes only, which an import rebuilds: an export
    // of any journal format this build reads can be imported.
    let readable = u64::from(OLDEST_JOURNAL_FORMAT_VERSION)..=u64::from(JOURNAL_FORMAT_VERSION);
    let format = u8::try_from(header.record_format)
        .ok()
        .and_then(RecordFormat::from_version);
    let Some(format) = format.filter(|_| readable.contains(&header.journal_format)) else {
        return Err(bad(format!(
            "journal/record format ({}, {}); this build reads journal formats \
             {OLDEST_JOURNAL_FORMAT_VERSION}..={JOURNAL_FORMAT_VERSION}, record formats \
             {OLDEST_RECORD_FORMAT_VERSION}..={RECORD_FORMAT_VERSION}",
            header.journal_format, header.record_format
        )));
    };
    if header.redacted {
        return Err(CliError::Usage(
            "the export is redacted (--no-payload): payloads are missing, it cannot be imported"
                .into(),
        ));
    }
    if header.scope != Scope::Journal {
        return Err(CliError::Usage(
            "the export holds selected tasks only: their global sequences cannot be rebuilt \
             bit-exact, so only a whole-journal export can be imported"
                .into(),
        ));
    }
    Ok(Announced {
        records: header.records,
        format,
    })
}

/// Reads one record line.
fn parse_line(line: &str) -> Result<(String, Expected, Event), ExportError> {
    let RecordLine {
        task,
        position,
        seq,
        digest,
        crc,
        event,
    } = RecordLine::read(line)?;
    let expected = Expected {
        position,
        seq,
        digest,
        crc,
    };
    Ok((task, expected, event))
}

/// A submitted batch: its outcome to come, its task and its records as exported.
struct Submitted {
    pending: PendingAppend,
    task: String,
    expected: Vec<Expected>,
}

/// The appends of an import. Each batch is submitted without waiting for it, so that the
/// journal's writer takes many in one write (one round trip each on PostgreSQL); once a
/// window of [`WINDOW`] records is in flight, it is handed to the check (a thread of its
/// own: [`check_windows`]), which waits for it and reads it back while the next window's
/// lines are read and submitted. The writer takes appends in the order they come, so the
/// sequences are the exported ones.
struct Appender<'j> {
    journal: &'j Journal,
    /// The submitted batches not yet handed to the check.
    window: Vec<Submitted>,
    /// Records in `window`.
    records: usize,
    /// The export's bytes of `window`'s records.
    bytes: usize,
    /// Where full windows go; at most one waits there while the check works on another.
    to_check: std::sync::mpsc::SyncSender<Vec<Submitted>>,
}

impl<'j> Appender<'j> {
    fn new(journal: &'j Journal, to_check: std::sync::mpsc::SyncSender<Vec<Submitted>>) -> Self {
        Self {
            journal,
            window: Vec::new(),
            records: 0,
            bytes: 0,
            to_check,
        }
    }

    /// Submits `batch` (counted on `bar`); hands the window to the check once it is full.
    fn append(&mut self, batch: Option<Batch>, bar: &indicatif::ProgressBar) -> Result<()> {
        let Some(batch) = batch else {
            return Ok(());
        };
        let Some(first) = batch.expected.first() else {
            return Ok(());
        };
        bar.inc(batch.expected.len() as u64);
        // Off any runtime, a submission never writes on this thread and never waits.
        // At its exported sequence: those a purge deleted are left out.
        let pending =
            self.journal
                .submit_at_seq(&batch.task, first.position, &batch.events, first.seq)?;
        self.records += batch.expected.len();
        self.bytes += batch.bytes;
        self.window.push(Submitted {
            pending,
            task: batch.task,
            expected: batch.expected,
        });
        if self.records >= WINDOW || self.bytes >= WINDOW_BYTES {
            self.hand_over()?;
        }
        Ok(())
    }

    /// Hands the window to the check.
    fn hand_over(&mut self) -> Result<()> {
        self.records = 0;
        self.bytes = 0;
        let window = std::mem::take(&mut self.window);
        if window.is_empty() {
            return Ok(());
        }
        self.to_check
            .send(window)
            .map_err(|_| CliError::Problems(CHECK_STOPPED.into()))
    }
}

/// What a hand-over to a check that stopped says (the check's own error is reported instead).
const CHECK_STOPPED: &str = "the check of the rebuilt records stopped";

/// The check of an import, on a thread of its own: waits for each window's appends in order
/// (each batch's first sequence checked), then reads the window's records back in one pass
/// of the commit order (CRC, position and sequence checked; events not decoded: the audit
/// that ends the import decodes every record) and compares each with the export.
fn check_windows(
    journal: &Journal,
    windows: &std::sync::mpsc::Receiver<Vec<Submitted>>,
) -> Result<()> {
    for window in windows {
        check_window(journal, window)?;
    }
    Ok(())
}

/// Waits for one window's appends and compares its records, read back, with the export.
fn check_window(journal: &Journal, window: Vec<Submitted>) -> Result<()> {
    let mut records = 0;
    let mut batches = Vec::with_capacity(window.len());
    for Submitted {
        pending,
        task,
        expected,
    } in window
    {
        let appended = futures::executor::block_on(pending)?;
        if let Some(first) = expected.first() {
            if appended.first_seq != first.seq {
                return Err(CliError::Problems(format!(
                    "task {task:?} position {}: rebuilt at sequence {}, exported at {}",
                    first.position, appended.first_seq, first.seq
                )));
            }
        }
        records += expected.len();
        batches.push((task, expected));
    }
    let Some(first_seq) = batches
        .first()
        .and_then(|(_, expected)| expected.first())
        .map(|first| first.seq)
    else {
        return Ok(());
    };
    // A fetcher reads what was written before it was made: one a window.
    let mut fetcher = journal.record_fetcher();
    let mut rebuilt = journal
        .commit_batches(first_seq, records)
        .next()
        .into_iter()
        .flat_map(|batch| batch.into_sealed(&mut fetcher).collect::<Vec<_>>());
    for (task, expected) in &batches {
        for want in expected {
            let got = rebuilt.next().ok_or_else(|| {
                CliError::Problems(format!(
                    "task {task:?} position {}: the rebuilt record of sequence {} is missing",
                    want.position, want.seq
                ))
            })??;
            if got.task != *task
                || got.position != want.position
                || got.seq != want.seq
                || got.digest != want.digest
                || got.crc != want.crc
            {
                return Err(CliError::Problems(format!(
                    "the import is not bit-exact: task {task:?} position {} sequence {}: \
                     rebuilt digest {} crc {:08x}, exported digest {} crc {:08x}",
                    want.position, want.seq, got.digest, got.crc, want.digest, want.crc
                )));
            }
        }
    }
    Ok(())
}

/// Makes every file of `dir` (and the directory) durable.
fn sync_dir(dir: &Path) -> Result<()> {
    let io = |what: &Path| CliError::io(format!("syncing {}", what.display()));
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        if path.is_file() {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io(&path))?;
        }
    }
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io(dir))
}

/// What an interrupted import says it did.
const NOTHING_IMPORTED: &str = "nothing was imported (the staging copy is removed)";

/// Lines the reading thread hands over at once, and their bytes at most (beyond one line).
const LINES_AT_ONCE: usize = 1024;
const LINES_AT_ONCE_BYTES: usize = 4 << 20;

/// How often an import waiting for its input looks for a signal.
const SIGNAL_LOOK: Duration = Duration::from_millis(100);

/// The export's lines, read on a thread of their own: an import waiting for its input (a
/// pipe that says nothing) still answers a signal — the thread is left behind, blocked on
/// its read, when the import returns.
struct Lines {
    batches: Receiver<std::io::Result<Vec<String>>>,
    current: std::vec::IntoIter<String>,
    ended: bool,
    interrupt: Interrupt,
}

impl Lines {
    /// Starts reading `reader`'s lines ([`next_line`]).
    fn spawn(mut reader: Box<dyn BufRead + Send>, interrupt: Interrupt) -> Result<Self> {
        let (batches, received) = std::sync::mpsc::sync_channel(4);
        std::thread::Builder::new()
            .name("dtask-import-read".into())
            .spawn(move || read_batches(&mut *reader, &batches))
            .map_err(CliError::io("starting the import's reading"))?;
        Ok(Self {
            batches: received,
            current: Vec::new().into_iter(),
            ended: false,
            interrupt,
        })
    }

    /// The next line of the export `name`, `None` at its end; [`CliError::Interrupted`] once
    /// a signal came.
    fn next(&mut self, name: &str) -> Result<Option<String>> {
        loop {
            self.interrupt.check(NOTHING_IMPORTED)?;
            if let Some(line) = self.current.next() {
                return Ok(Some(line));
            }
            if self.ended {
                return Ok(None);
            }
            match self.batches.recv_timeout(SIGNAL_LOOK) {
                Ok(Ok(batch)) => self.current = batch.into_iter(),
                Ok(Err(e)) => return Err(CliError::io(format!("reading {name}"))(e)),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => self.ended = true,
            }
        }
    }
}

/// Reads `reader`'s lines ([`next_line`]) and sends them in batches: the header alone, at once
/// (the import checks it and sets up its staging copy before the records come — a pipe may
/// be slow to bring them), then up to [`LINES_AT_ONCE`] lines or [`LINES_AT_ONCE_BYTES`]; a
/// read error after the lines before it. Returns at the end of the input, or once the import
/// has gone.
fn read_batches(
    reader: &mut dyn BufRead,
    batches: &std::sync::mpsc::SyncSender<std::io::Result<Vec<String>>>,
) {
    let mut at_once = 1;
    loop {
        let (mut batch, mut bytes) = (Vec::new(), 0);
        let mut line = String::new();
        let end = loop {
            match next_line(reader, &mut line) {
                Ok(true) => {
                    bytes += line.len();
                    batch.push(std::mem::take(&mut line));
                    if batch.len() >= at_once || bytes >= LINES_AT_ONCE_BYTES {
                        break false;
                    }
                }
                Ok(false) => break true,
                Err(e) => {
                    if !batch.is_empty() {
                        let _ = batches.send(Ok(batch));
                    }
                    let _ = batches.send(Err(e));
                    return;
                }
            }
        };
        if !batch.is_empty() && batches.send(Ok(batch)).is_err() {
            return;
        }
        if end {
            return;
        }
        at_once = LINES_AT_ONCE;
    }
}

/// The longest line an export can hold: a record's largest payload (64 MiB, the import's
/// limit) in base64, escaped, with its fields — well under this.
const MAX_LINE_BYTES: u64 = 512 << 20;

/// Reads the next line of `reader` into `line` (its line ending left out); false at the end.
fn next_line(reader: &mut dyn BufRead, line: &mut String) -> std::io::Result<bool> {
    line.clear();
    let read = std::io::Read::take(reader, MAX_LINE_BYTES + 1).read_line(line)?;
    if read == 0 {
        return Ok(false);
    }
    if read as u64 > MAX_LINE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "a line of over {} MiB: no record of an export is that long",
                MAX_LINE_BYTES >> 20
            ),
        ));
    }
    if line.ends_with('\n') {
        line.pop();
        if line.ends_with('\r') {
            line.pop();
        }
    }
    Ok(true)
}

/// Appends every record line of the export to `journal`, the check of what was written
/// running beside it; returns the records and tasks.
fn rebuild(
    journal: &Journal,
    lines: &mut Lines,
    name: &str,
    bar: &indicatif::ProgressBar,
) -> Result<(u64, usize)> {
    std::thread::scope(|scope| {
        let (to_check, windows) = std::sync::mpsc::sync_channel(1);
        let check = std::thread::Builder::new()
            .name("dtask-import-check".into())
            .spawn_scoped(scope, move || check_windows(journal, &windows))
            .map_err(CliError::io("starting the import's check"))?;
        let appended = append_all(journal, lines, name, bar, to_check);
        let checked = check
            .join()
            .unwrap_or_else(|_| Err(CliError::Problems("the import's check failed".into())));
        // The check's error concerns records of lines before any the appends failed on.
        checked.and(appended)
    })
}

/// Reads the record lines and submits them in batches, handing each full window to the
/// check through `to_check`; returns the records and tasks.
fn append_all(
    journal: &Journal,
    lines: &mut Lines,
    name: &str,
    bar: &indicatif::ProgressBar,
    to_check: std::sync::mpsc::SyncSender<Vec<Submitted>>,
) -> Result<(u64, usize)> {
    let mut next_position: HashMap<String, u64> = HashMap::new();
    let mut appender = Appender::new(journal, to_check);
    let mut batch: Option<Batch> = None;
    let mut records = 0u64;
    let mut last_seq = 0u64;
    // The sequences missing so far, and the records the tombstones so far say they deleted:
    // a tombstone comes after the records it deleted, so it never claims more than the gaps
    // before it, and at the end the two are equal (as the audit checks, which walks each gap:
    // forged gaps of billions of sequences are refused here, before it).
    let (mut gaps, mut deleted) = (0u64, 0u64);
    let mut line_no = 1;
    while let Some(line) = lines.next(name)? {
        line_no += 1;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| CliError::Usage(format!("{name}:{line_no}: {why}"));
        let (task, expected, event) = parse_line(&line).map_err(|e| bad(e.to_string()))?;
        // Sequences may be missing — the records a purge deleted, which the rebuilt journal
        // leaves out too (and its audit matches against the tombstones) — but never repeat
        // or go back.
        if expected.seq <= last_seq {
            return Err(bad(format!(
                "sequence {} after sequence {last_seq}: the export is not in global order",
                expected.seq,
            )));
        }
        let contiguous = expected.seq == last_seq + 1;
        gaps = gaps.saturating_add(expected.seq - last_seq - 1);
        last_seq = expected.seq;
        if let Event::Purged { records: gone, .. } = &event {
            deleted = deleted.saturating_add(*gone);
            if deleted > gaps {
                return Err(bad(format!(
                    "the tombstones so far say {deleted} records were deleted, but only {gaps} \
                     sequences are missing before them"
                )));
            }
        }
        let at = next_position.get(task.as_str()).copied().unwrap_or(0);
        if expected.position != at {
            return Err(bad(format!(
                "task {task:?} position {} where {at} was expected",
                expected.position
            )));
        }
        match next_position.get_mut(task.as_str()) {
            Some(position) => *position += 1,
            None => {
                next_position.insert(task.clone(), 1);
            }
        }
        records += 1;
        let tombstone = matches!(event, Event::Purged { .. });
        let joins = contiguous
            && !tombstone
            && batch.as_ref().is_some_and(|b| {
                b.task == task
                    && b.events.len() < MAX_BATCH
                    && b.bytes < BATCH_BYTES
                    && !matches!(b.events.first(), Some(Event::Purged { .. }))
            });
        if !joins {
            appender.append(batch.take(), bar)?;
        }
        let b = batch.get_or_insert_with(|| Batch {
            task,
            events: Vec::new(),
            expected: Vec::new(),
            bytes: 0,
        });
        b.events.push(event);
        b.expected.push(expected);
        b.bytes += line.len();
    }
    if gaps != deleted {
        return Err(CliError::Usage(format!(
            "{name}: {gaps} sequences are missing, but the tombstones say {deleted} records \
             were deleted: records were left out of the export"
        )));
    }
    appender.append(batch, bar)?;
    appender.hand_over()?;
    Ok((records, next_position.len()))
}

/// Builds the journal in `dir` from the record lines, checks the record count, makes it
/// durable and audits it; returns the records and tasks.
fn build(at: &At, lines: &mut Lines, name: &str, announced: Announced) -> Result<(u64, usize)> {
    let mut options = JournalOptions::default()
        .with_record_format(announced.format)
        .with_durability(Durability::Buffered)
        .with_max_value_bytes(usize::MAX)
        .with_max_record_bytes(usize::MAX);
    options.max_task_id_bytes = usize::MAX;
    let journal = at.open_writer(options)?;
    let bar = super::progress(announced.records, "importing");
    let (records, tasks) = rebuild(&journal, lines, name, &bar)?;
    bar.finish_and_clear();
    drop(journal);
    // The audit that follows is not cut short by a signal: one that came during it is
    // answered once it ends.
    lines.interrupt.check(NOTHING_IMPORTED)?;
    if records != announced.records {
        return Err(CliError::Problems(format!(
            "the export announces {} but holds {records}: it is cut short; nothing was imported",
            super::fmt::count(announced.records, "record")
        )));
    }
    if let Some(dir) = at.dir() {
        sync_dir(dir)?;
    }
    let rebuilt = at.open_reader()?;
    let audit = dtask_replay::audit_journal(&rebuilt, &mut |_| {})?;
    if !audit.is_clean() {
        for p in &audit.problems {
            eprintln!("{p}");
        }
        return Err(CliError::Problems(format!(
            "the rebuilt journal has {}; nothing was imported",
            super::fmt::count(audit.problems.len() as u64, "problem")
        )));
    }
    Ok((records, tasks))
}

/// Builds the journal in a staging directory beside the target (same file system, so the
/// rename is atomic; removed on any failure) and moves it in place.
fn import_dir(
    target: &Path,
    lines: &mut Lines,
    name: &str,
    announced: Announced,
) -> Result<(u64, usize)> {
    let parent = match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let staging = tempfile::Builder::new()
        .prefix(".dtask-import-")
        .tempdir_in(&parent)
        .map_err(CliError::io(format!(
            "creating a temporary directory in {}",
            parent.display()
        )))?;
    let built = staging.path().join("journal");
    let counts = build(&At::Dir(built.clone()), lines, name, announced)?;
    lines.interrupt.check(NOTHING_IMPORTED)?;
    std::fs::rename(&built, target).map_err(CliError::io(format!(
        "moving the imported journal to {}",
        target.display()
    )))?;
    std::fs::File::open(&parent)
        .and_then(|f| f.sync_all())
        .map_err(CliError::io(format!("syncing {}", parent.display())))?;
    drop(staging);
    Ok(counts)
}

/// Builds the journal in a staging schema of the target database and, once complete and
/// audited, renames it to the target schema in one transaction (dropped on any failure).
fn import_postgres(
    url: &str,
    lines: &mut Lines,
    name: &str,
    announced: Announced,
) -> Result<(u64, usize)> {
    let location = PgLocation::parse(url)?;
    let staging = format!(
        "{}_import_{}",
        location.schema().chars().take(40).collect::<String>(),
        std::process::id()
    );
    let staged = At::Postgres(PgLocation::url_with_schema(url, &staging));
    let built = build(&staged, lines, name, announced)
        .and_then(|counts| lines.interrupt.check(NOTHING_IMPORTED).map(|()| counts))
        .and_then(|counts| Ok(admin::promote(&location, &staging).map(|()| counts)?));
    if built.is_err() {
        let _ = admin::drop_schema(&location, &staging);
    }
    built
}

/// Runs `dtask import`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let target = global.at()?;
    check_target(&target)?;
    let name = args.file.display().to_string();
    let reader: Box<dyn BufRead + Send> = if args.file.as_os_str() == "-" {
        Box::new(std::io::BufReader::with_capacity(1 << 16, std::io::stdin()))
    } else {
        let file =
            std::fs::File::open(&args.file).map_err(CliError::io(format!("opening {name}")))?;
        Box::new(std::io::BufReader::with_capacity(1 << 16, file))
    };
    let mut lines = Lines::spawn(reader, Interrupt::install()?)?;
    let Some(header_line) = lines.next(&name)? else {
        return Err(CliError::Usage(format!("{name} is empty")));
    };
    let announced = check_header(&header_line, &name)?;
    let (records, tasks) = match &target {
        At::Dir(dir) => import_dir(dir, &mut lines, &name, announced)?,
        At::Postgres(url) => import_postgres(url, &mut lines, &name, announced)?,
    };
    let mut out = Out::new();
    if global.json {
        out.json(&json!({
            "journal": target.display(),
            "records": records,
            "tasks": tasks,
            "bit_exact": true,
            "audit": "clean",
        }))?;
    } else {
        out.line(format!(
            "imported {} of {} into {}: every digest and CRC matches the export; audit clean",
            super::fmt::count(records, "record"),
            super::fmt::count(tasks as u64, "task"),
            target.display()
        ))?;
    }
    out.flush()
}
