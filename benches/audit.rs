//! `dtask verify`, `dtask export` and `dtask import` on a journal of 1M events (100k tasks of 10
//! events, half of them terminal): events per second, wall clock of the real binary; then
//! `dtask trim` of every finished task's progress to its last 2 updates, `verify` after it,
//! and the same trim again (nothing left to trim).
//!
//! Run: `cargo bench --bench audit` (`-- --events 200000` for a smaller journal).
#![allow(clippy::unwrap_used, clippy::cast_precision_loss, missing_docs)]

mod common;

use clap::Parser;
use std::process::Command;
use std::time::Instant;

/// `dtask verify`, `dtask export` and `dtask import` on a journal of 1M events.
#[derive(Debug, Parser)]
struct Args {
    /// Events in the journal (10 per task).
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    #[command(flatten)]
    _cargo: common::CargoBench,
}

fn timed(events: usize, what: &str, args: &[&str]) {
    let start = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_dtask"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{what:>8}: {secs:.2} s, {:.0} events/s (exit {})",
        events as f64 / secs,
        status.code().unwrap_or(-1)
    );
}

fn main() {
    let args = Args::parse();
    let tasks = args.events / 10;
    let dir = tempfile::tempdir().unwrap();
    // DTASK_BENCH_KEEP=<dir> builds the journal there and keeps it (for profiling).
    let journal = std::env::var_os("DTASK_BENCH_KEEP")
        .map_or_else(|| dir.path().join("journal"), std::path::PathBuf::from);
    if !journal.join("CURRENT").exists() {
        common::build_journal(&journal, tasks, 10, common::Finished::Interleaved);
    }
    println!("journal of {} events over {tasks} tasks", tasks * 10);
    let j = journal.to_str().unwrap();
    timed(tasks * 10, "verify", &["--journal", j, "verify"]);
    timed(
        tasks * 10,
        "export",
        &["--journal", j, "export", "-o", "/dev/null"],
    );
    // The import of the journal's export into a new journal (the export written first,
    // untimed): its appends, the read-back of every record and the closing audit.
    let exported = dir.path().join("export.jsonl");
    let exported = exported.to_str().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_dtask"))
        .args(["--journal", j, "export", "-o", exported])
        .status()
        .unwrap();
    assert!(status.success(), "the export for the import failed");
    let imported = dir.path().join("imported");
    let imported = imported.to_str().unwrap();
    timed(
        tasks * 10,
        "import",
        &["--journal", imported, "import", exported],
    );
    // Last, as it changes the journal: the trim of every finished task's progress (the fold
    // of the whole journal to choose them, then one atomic write a task), and the audit of
    // the trimmed journal.
    trim(tasks, j, "trim");
    timed(tasks * 10, "verify", &["--journal", j, "verify"]);
    // The same sweep again: every task trimmed before, nothing left to do.
    trim(tasks, j, "again");
}

/// `dtask trim --finished-before 2100-01-01 --keep 2` of the journal at `j`, timed.
fn trim(tasks: usize, j: &str, what: &str) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_dtask"))
        .args([
            "--journal",
            j,
            "--json",
            "trim",
            "--finished-before",
            "2100-01-01",
        ])
        .args(["--keep", "2"])
        .output()
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let trimmed = &report["trimmed"];
    println!(
        "{what:>8}: {secs:.2} s, {:.0} events/s; {} updates of {} tasks trimmed, {:.1} MiB saved (exit {})",
        (tasks * 10) as f64 / secs,
        trimmed["records"],
        trimmed["tasks"],
        trimmed["bytes"].as_f64().unwrap_or(0.0) / (1024.0 * 1024.0),
        out.status.code().unwrap_or(-1)
    );
}
