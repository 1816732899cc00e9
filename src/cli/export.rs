//! `dtask export`: the journal (or some tasks) as JSON lines in global commit order, in the
//! versioned schema of `docs/export-format.md`.

use super::codec::{self, Bytes};
use super::{progress, require_task, CliError, Global, Result};
use dtask_journal::export::{ExportError, Header, RecordJson, Scope};
use dtask_journal::{Journal, Record};
use serde_json::json;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `dtask export`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Export only these tasks (repeatable); such an export cannot be imported.
    #[arg(long = "task", value_name = "ID")]
    tasks: Vec<String>,
    /// Replace payloads, checkpoints, data and context snapshots by their length; such an
    /// export cannot be imported.
    #[arg(long)]
    no_payload: bool,
    /// Write to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Appends the export line of one record (with its newline) to `out`.
fn write_record_line(out: &mut Vec<u8>, task: &str, record: &Record, bytes: Bytes) -> Result<()> {
    RecordJson::new(task, record, bytes)
        .write_line(out)
        .map_err(export_error)
}

fn export_error(e: ExportError) -> CliError {
    match e {
        ExportError::Write(e) => e.into(),
        other => CliError::Problems(other.to_string()),
    }
}

/// The most records a [`Merge`] reads of one stream in one turn.
const RUN: usize = 4096;

/// The most tasks an export merges stream by stream; more are taken from the journal's
/// commit order (one pass over the journal, whatever the number of tasks).
const MERGED_STREAMS: usize = 64;

/// Merges task streams by global sequence: a heap of each stream's next sequence; the stream
/// whose turn it is, is read from where it stands for as long as its records come before
/// every other stream's next (records committed together follow each other) and its reader
/// dropped. One reader is open at a time however many streams are merged — each holds the
/// storage's resources (a RocksDB iterator pins its tables, a PostgreSQL reader a page of
/// rows) — and each record costs a heap operation, not a look at every stream.
struct Merge<'a> {
    journal: &'a Journal,
    tasks: Vec<String>,
    /// Each stream's next record: its sequence, the stream's index, its position.
    next: BinaryHeap<Reverse<(u64, usize, u64)>>,
    /// Records read in the current turn, in order.
    ready: VecDeque<(String, Record)>,
    /// The error that ends the merge once `ready` is out.
    failed: Option<CliError>,
    started: bool,
}

impl<'a> Merge<'a> {
    fn new(journal: &'a Journal, tasks: Vec<String>) -> Self {
        Self {
            journal,
            tasks,
            next: BinaryHeap::new(),
            ready: VecDeque::new(),
            failed: None,
            started: false,
        }
    }

    /// Reads the next turn into `ready` (or notes the error that ends the merge).
    fn turn(&mut self) {
        if !self.started {
            self.started = true;
            for (i, task) in self.tasks.iter().enumerate() {
                match self.journal.read_stream(task, 0).next() {
                    Some(Ok(r)) => self.next.push(Reverse((r.seq, i, r.position))),
                    Some(Err(e)) => {
                        self.failed = Some(e.into());
                        return;
                    }
                    None => {}
                }
            }
        }
        let Some(Reverse((_, i, position))) = self.next.pop() else {
            return;
        };
        let before = self.next.peek().map_or(u64::MAX, |Reverse((seq, ..))| *seq);
        let task = &self.tasks[i];
        for item in self.journal.read_stream(task, position) {
            match item {
                Ok(r) if r.seq < before && self.ready.len() < RUN => {
                    self.ready.push_back((task.clone(), r));
                }
                Ok(r) => {
                    self.next.push(Reverse((r.seq, i, r.position)));
                    break;
                }
                Err(e) => {
                    self.failed = Some(e.into());
                    break;
                }
            }
        }
    }
}

impl Iterator for Merge<'_> {
    type Item = Result<(String, Record)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(Ok(item));
            }
            if let Some(e) = self.failed.take() {
                self.next.clear();
                return Some(Err(e));
            }
            if self.started && self.next.is_empty() {
                return None;
            }
            self.turn();
        }
    }
}

/// Records with their tasks, in global order.
type Items<'a> = Box<dyn Iterator<Item = Result<(String, Record)>> + 'a>;

/// Writes the export of `journal` to `w`; returns the number of records.
fn write_export(
    journal: &Journal,
    tasks: &[String],
    bytes: Bytes,
    w: &mut dyn Write,
) -> Result<u64> {
    if tasks.is_empty() {
        return write_journal_export(journal, bytes, w);
    }
    // A task named twice is exported once (named twice, its stream was merged with itself,
    // which never ended).
    let mut distinct = std::collections::HashSet::new();
    let tasks: Vec<String> = tasks
        .iter()
        .filter(|task| distinct.insert(task.as_str()))
        .cloned()
        .collect();
    let tasks = tasks.as_slice();
    let (scope, records, mut items): (Scope, u64, Items<'_>) = {
        let mut total = 0;
        for task in tasks {
            total += require_task(journal, task)?;
        }
        let items: Items<'_> = if tasks.len() <= MERGED_STREAMS {
            Box::new(Merge::new(journal, tasks.to_vec()))
        } else {
            // Many tasks (a purge's): the journal's commit order, read in batches, filtered —
            // where a merge would open a reader per turn, which on PostgreSQL is a query.
            let wanted: std::collections::HashSet<String> = tasks.iter().cloned().collect();
            Box::new(
                journal
                    .commits(1)
                    .filter(move |c| c.as_ref().map_or(true, |c| wanted.contains(&c.task)))
                    .map(|c| c.map(|c| (c.task, c.record)).map_err(CliError::from)),
            )
        };
        (Scope::Tasks(tasks.to_vec()), total, items)
    };
    write_header(w, journal, scope, records, bytes)?;
    let bar = progress(records, "exporting");
    let mut written = 0;
    let mut line = Vec::new();
    for item in &mut items {
        let (task, record) = item?;
        line.clear();
        write_record_line(&mut line, &task, &record, bytes)?;
        w.write_all(&line)
            .map_err(CliError::io("writing the export"))?;
        written += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();
    finish_export(w, records, written)
}

/// Writes the export of `tasks` (the whole journal when empty) to the file at `path`, made
/// durable before this returns; returns the number of records.
///
/// A file is written whole or not at all: into a temporary file beside `path`, synced, then
/// renamed over it (or, unless `replace`, renamed to it only if no file is there: a purge's
/// archive) and the directory synced — a failure or a crash midway leaves `path` as
/// it was, never a header and part of the lines. (Where `path` is not a regular file —
/// `/dev/null`, a pipe — it is written as it is.)
pub(super) fn export_to_file(
    journal: &Journal,
    tasks: &[String],
    bytes: Bytes,
    path: &std::path::Path,
    replace: bool,
) -> Result<u64> {
    let special = std::fs::metadata(path).is_ok_and(|m| !m.is_file());
    if special {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(CliError::io(format!("opening {}", path.display())))?;
        let mut w = std::io::BufWriter::new(file);
        return write_export(journal, tasks, bytes, &mut w);
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".dtask-export-");
    // A file as `File::create` makes it (the umask applies), not a private temporary one.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let staged = builder.tempfile_in(dir).map_err(CliError::io(format!(
        "creating a file in {}",
        dir.display()
    )))?;
    let mut w = std::io::BufWriter::new(staged);
    let n = write_export(journal, tasks, bytes, &mut w)?;
    let staged = w.into_inner().map_err(|e| CliError::Io {
        context: format!("writing {}", path.display()),
        source: e.into_error(),
    })?;
    staged
        .as_file()
        .sync_all()
        .map_err(CliError::io(format!("syncing {}", path.display())))?;
    let persisted = if replace {
        staged.persist(path)
    } else {
        staged.persist_noclobber(path)
    };
    persisted.map_err(|e| {
        if e.error.kind() == std::io::ErrorKind::AlreadyExists {
            CliError::Usage(format!(
                "{} exists: a purge's export never replaces a file",
                path.display()
            ))
        } else {
            CliError::Io {
                context: format!("renaming the export to {}", path.display()),
                source: e.error,
            }
        }
    })?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(CliError::io(format!("syncing {}", dir.display())))?;
    Ok(n)
}

fn write_header(
    w: &mut dyn Write,
    journal: &Journal,
    scope: Scope,
    records: u64,
    bytes: Bytes,
) -> Result<()> {
    let header = Header::new(journal.format_version().into(), scope, records, bytes)
        .with_record_format(journal.record_format());
    let mut line = Vec::new();
    header.write_line(&mut line).map_err(export_error)?;
    w.write_all(&line)
        .map_err(CliError::io("writing the export"))
}

fn finish_export(w: &mut dyn Write, records: u64, written: u64) -> Result<u64> {
    w.flush().map_err(CliError::io("writing the export"))?;
    if written != records {
        return Err(CliError::Problems(format!(
            "the journal announced {records} records but {written} were read: run `dtask verify`"
        )));
    }
    Ok(written)
}

/// Entries of the commit order read per batch.
const BATCH: usize = 2048;
/// Batches in flight at most (read, being formatted, or waiting to be written).
const IN_FLIGHT: usize = 8;

/// A formatted batch: its lines, how many, and the error that cut it short.
type Formatted = (Vec<u8>, u64, Option<CliError>);

/// The whole journal in global commit order. A reader thread walks the commit index in
/// batches; workers fetch each batch's records (in key order, with a forward cursor), check,
/// decode and format them; this thread writes the batches in order. At most
/// [`IN_FLIGHT`] batches exist at a time.
fn write_journal_export(journal: &Journal, bytes: Bytes, w: &mut dyn Write) -> Result<u64> {
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    // The records the commit index names: the last sequence, less those purges deleted.
    let last = journal.last_seq()?;
    let mut records = 0u64;
    journal.for_each_commit_entry(&mut |seq, _| {
        if seq.is_some_and(|seq| seq <= last) {
            records += 1;
        }
    })?;
    write_header(w, journal, Scope::Journal, records, bytes)?;
    let bar = progress(records, "exporting");
    let (token_tx, token_rx) = mpsc::sync_channel::<()>(IN_FLIGHT);
    for _ in 0..IN_FLIGHT {
        let _ = token_tx.send(());
    }
    let (batch_tx, batch_rx) = mpsc::sync_channel::<(usize, dtask_journal::RawCommits)>(IN_FLIGHT);
    let batch_rx = Arc::new(Mutex::new(batch_rx));
    let (done_tx, done_rx) = mpsc::channel::<(usize, Formatted)>();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 8));
    let written = std::thread::scope(|scope| {
        scope.spawn(move || {
            for (index, batch) in journal.commit_batches(1, BATCH).enumerate() {
                if token_rx.recv().is_err() || batch_tx.send((index, batch)).is_err() {
                    return;
                }
            }
        });
        for _ in 0..workers {
            let (batch_rx, done_tx) = (Arc::clone(&batch_rx), done_tx.clone());
            scope.spawn(move || {
                let mut fetcher = journal.record_fetcher();
                loop {
                    let next = match batch_rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let Ok((index, batch)) = next else { return };
                    if done_tx
                        .send((index, format_batch(&mut fetcher, batch, bytes)))
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        let written = write_in_order(&done_rx, &token_tx, w, &bar);
        // Unblocks the reader and the workers when the writing stopped early.
        drop((token_tx, done_rx));
        written
    })?;
    bar.finish_and_clear();
    finish_export(w, records, written)
}

fn format_batch(
    fetcher: &mut dtask_journal::RecordFetcher<'_>,
    batch: dtask_journal::RawCommits,
    bytes: Bytes,
) -> Formatted {
    let mut out = Vec::with_capacity(batch.len() * 256);
    let mut lines = 0;
    for item in batch.into_committed(fetcher) {
        match item {
            Ok(c) => {
                if let Err(e) = write_record_line(&mut out, &c.task, &c.record, bytes) {
                    return (out, lines, Some(e));
                }
                lines += 1;
            }
            Err(e) => return (out, lines, Some(e.into())),
        }
    }
    (out, lines, None)
}

/// Writes the formatted batches in batch order; returns the number of lines.
fn write_in_order(
    done: &std::sync::mpsc::Receiver<(usize, Formatted)>,
    tokens: &std::sync::mpsc::SyncSender<()>,
    w: &mut dyn Write,
    bar: &indicatif::ProgressBar,
) -> Result<u64> {
    let mut waiting = std::collections::BTreeMap::new();
    let mut next = 0;
    let mut written = 0;
    while let Ok((index, batch)) = done.recv() {
        waiting.insert(index, batch);
        while let Some((out, lines, error)) = waiting.remove(&next) {
            next += 1;
            w.write_all(&out)
                .map_err(CliError::io("writing the export"))?;
            written += lines;
            bar.inc(lines);
            if let Some(e) = error {
                return Err(e);
            }
            let _ = tokens.send(());
        }
    }
    Ok(written)
}

/// Runs `dtask export`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let opened = global.open()?;
    // The header's counts and the lines after it read the same moment: on PostgreSQL a
    // snapshot of the database, which other nodes may be writing (an embedded journal opened
    // read-only does not move).
    let frozen = opened.frozen()?;
    let journal = frozen.journal();
    let bytes = codec::bytes(args.no_payload);
    let written = if let Some(path) = &args.output {
        export_to_file(journal, &args.tasks, bytes, path, true)?
    } else {
        let mut w = std::io::BufWriter::new(std::io::stdout().lock());
        write_export(journal, &args.tasks, bytes, &mut w)?
    };
    if let Some(path) = &args.output {
        if global.json {
            let mut out = super::Out::new();
            out.json_line(&json!({ "records": written, "output": path.display().to_string() }))?;
            return out.flush();
        }
        eprintln!(
            "exported {} to {}",
            super::fmt::count(written, "record"),
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dtask_journal::export::RecordLine;
    use dtask_journal::{Digest, Event, Timestamp};

    #[test]
    fn the_line_is_json_with_every_field() {
        let record = Record {
            position: 3,
            seq: 1_234_567,
            event: Event::Completed {
                data: b"ok".to_vec(),
                at: Timestamp(5),
            },
            digest: Digest([0xa5; 32]),
            crc: 0x0012_abcd,
            size: 60,
        };
        for task in ["t", "task \"quoted\" \\ é\n"] {
            let line = codec::record_json(task, &record, Bytes::Base64).unwrap();
            assert_eq!(line["task"], task);
            assert_eq!(line["position"], 3);
            assert_eq!(line["seq"], 1_234_567);
            assert_eq!(line["crc"], "0012abcd");
            assert_eq!(line["digest"], "a5".repeat(32));
            assert_eq!(line["event"]["type"], "completed");
            assert_eq!(line["event"]["data"], "b2s=");
            let keys: Vec<_> = line.as_object().unwrap().keys().cloned().collect();
            assert_eq!(keys, ["crc", "digest", "event", "position", "seq", "task"]);
            // The streaming form writes the bytes of the value form.
            let mut out = Vec::new();
            write_record_line(&mut out, task, &record, Bytes::Base64).unwrap();
            assert_eq!(out, format!("{line}\n").into_bytes());
        }
    }

    /// An export of some tasks holds their records in the journal's order, the same lines
    /// as the whole journal's export, whether the streams are merged (a few tasks) or the
    /// commit order is filtered (many).
    #[test]
    fn an_export_of_tasks_holds_their_records_in_commit_order() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), dtask_journal::JournalOptions::default()).unwrap();
        let tasks: Vec<String> = (0..MERGED_STREAMS + 6)
            .map(|i| format!("t{i:03}"))
            .collect();
        // Interleaved: each round appends one record (two for some) to every task.
        for round in 0..3u64 {
            for (i, task) in tasks.iter().enumerate() {
                let n = if i % 5 == 0 { 2 } else { 1 };
                let events: Vec<Event> = (0..n)
                    .map(|k| Event::UpdateAppended {
                        attempt: 1,
                        event_id: format!("e{round}.{k}"),
                        kind: "progress".into(),
                        data: vec![1],
                        metadata: vec![],
                        at: Timestamp(round),
                    })
                    .collect();
                let position = round * n;
                journal.append(task, position, &events).unwrap();
            }
        }
        let lines = |text: Vec<u8>, keep: &dyn Fn(&str) -> bool| -> Vec<String> {
            String::from_utf8(text)
                .unwrap()
                .lines()
                .skip(1)
                .filter(|line| keep(line))
                .map(str::to_owned)
                .collect()
        };
        let mut whole = Vec::new();
        write_export(&journal, &[], Bytes::Base64, &mut whole).unwrap();
        for some in [&tasks[..3], &tasks[..]] {
            let mut out = Vec::new();
            write_export(&journal, some, Bytes::Base64, &mut out).unwrap();
            let named = |line: &str| {
                some.iter()
                    .any(|t| line.contains(&format!("\"task\":\"{t}\"")))
            };
            assert_eq!(
                lines(out, &|_| true),
                lines(whole.clone(), &named),
                "{} tasks",
                some.len()
            );
        }
    }

    /// Every line of the golden export reads back and writes again to the same bytes.
    #[test]
    fn the_golden_export_round_trips_byte_for_byte() {
        let dir = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from("."), PathBuf::from);
        let text = std::fs::read_to_string(dir.join("tests/golden/export.jsonl")).unwrap();
        let mut lines = text.lines();
        let header = Header::read(lines.next().unwrap()).unwrap();
        let mut out = Vec::new();
        header.write_line(&mut out).unwrap();
        let mut records = 0;
        for line in lines {
            let record = RecordLine::read(line).unwrap();
            RecordJson::of_line(&record).write_line(&mut out).unwrap();
            records += 1;
        }
        assert_eq!(header.records, records);
        assert_eq!(String::from_utf8(out).unwrap(), text);
    }
}
