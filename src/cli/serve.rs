//! `dtask serve`: the HTTP API, the web page and the metrics of `dtask::server` over a
//! journal. By default the server owns the journal (opens the engine's task store, serves the
//! control endpoints); with `--read-only` it follows a journal another process writes.
//! SIGINT and SIGTERM stop it gracefully.

use super::{CliError, Global, Result};
use dtask::server::{Server, ServerConfig};
use dtask_engine::{StoreConfig, SystemClock, TaskStore};
use dtask_journal::probe::{Placement, SyncPromise};
use dtask_journal::JournalOptions;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// Arguments of `dtask serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The address to listen on. Off loopback, `--token` is required.
    #[arg(long, default_value = "127.0.0.1:7700", value_name = "ADDR")]
    listen: SocketAddr,
    /// Follow a journal another process writes: inspection endpoints only, no lock taken.
    #[arg(long)]
    read_only: bool,
    /// A bearer token every request must carry (at least 16 characters); required off
    /// loopback.
    #[arg(
        long,
        env = "DTASK_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
    /// With --read-only: how often to look for new commits, in milliseconds (an owner is told
    /// of each commit).
    #[arg(long, default_value_t = 100, value_name = "MS")]
    poll: u64,
    /// The largest request body, in bytes.
    #[arg(long, default_value_t = 2 << 20, value_name = "BYTES")]
    body_limit: usize,
    /// How long past a lease's deadline this node waits before it writes the lease down as
    /// expired, in milliseconds: a margin for the skew between the clocks of the nodes that
    /// share a PostgreSQL journal. Default: 1000 on a PostgreSQL journal, 0 on an embedded one.
    #[arg(long, value_name = "MS", conflicts_with = "read_only")]
    expiry_grace: Option<u64>,
    /// Purge the root tasks that ended longer ago than this (with their nested tasks): a
    /// number with a unit, `s`, `m`, `h` or `d` (`30d`). Swept every `--retain-every`.
    #[arg(long, value_name = "AGE", value_parser = parse_age, conflicts_with = "read_only")]
    retain: Option<Duration>,
    /// How often the retention sweeps run (with --retain or --trim-after).
    #[arg(long, value_name = "AGE", value_parser = parse_age, default_value = "1h")]
    retain_every: Duration,
    /// Trim the progress of the tasks that ended longer ago than this to their last
    /// `--trim-keep` updates (the bytes of the others dropped, every record kept): a number
    /// with a unit (`7d`). Swept every `--retain-every`.
    #[arg(long, value_name = "AGE", value_parser = parse_age, conflicts_with = "read_only")]
    trim_after: Option<Duration>,
    /// The latest progress updates a trim keeps whole (with --trim-after).
    #[arg(long, value_name = "N", default_value_t = 20, requires = "trim_after")]
    trim_keep: u64,
}

/// An age: a whole number and a unit, `s`, `m`, `h` or `d`.
fn parse_age(text: &str) -> std::result::Result<Duration, String> {
    let bad = || format!("bad age {text:?}: a whole number and s, m, h or d (`30d`, `12h`)");
    let unit = text.chars().last().ok_or_else(bad)?;
    let seconds = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(bad()),
    };
    let n: u64 = text[..text.len() - 1].parse().map_err(|_| bad())?;
    n.checked_mul(seconds)
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

/// The expiry grace of a node that does not say (`--expiry-grace`): a second where other
/// nodes' clocks decide expiries too, none where this process's clock is the only one.
const SHARED_EXPIRY_GRACE: Duration = Duration::from_secs(1);

/// Runs `dtask serve`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    Server::check_listen(args.listen, args.token.as_deref())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(CliError::io("starting the runtime"))?;
    runtime.block_on(serve(global, args))
}

async fn serve(global: &Global, args: &Args) -> Result<()> {
    // The handlers come first: from then on SIGINT and SIGTERM stop the server instead of
    // the process, and the follower's scratch directory is always removed.
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(CliError::io("installing a signal handler"))?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(CliError::io("installing a signal handler"))?;
    let mut config = ServerConfig::default()
        .with_poll_interval(Duration::from_millis(args.poll.max(10)))
        .with_body_limit(args.body_limit);
    if let Some(token) = &args.token {
        config = config.with_token(token.clone());
    }
    let mut scratch = None;
    let mut sweeper = None;
    let mut retention = None;
    let mut trimming = None;
    let mut follower = None;
    let at = global.at()?;
    let (server, mode) = if args.read_only {
        let tmp = tempfile::Builder::new()
            .prefix("dtask-serve-")
            .tempdir()
            .map_err(CliError::io("creating a scratch directory"))?;
        let journal = at.open_follower(tmp.path())?;
        scratch = Some(tmp);
        (Server::follower(journal, config), "read-only")
    } else {
        let journal = at.open_writer(JournalOptions::default())?;
        let grace = match args.expiry_grace {
            Some(ms) => Duration::from_millis(ms),
            None if journal.is_shared() => SHARED_EXPIRY_GRACE,
            None => Duration::ZERO,
        };
        let store = TaskStore::open(
            journal,
            SystemClock,
            StoreConfig::default().with_expiry_grace(grace),
        )?;
        if let Some(repair) = store.repaired_live_index() {
            eprintln!(
                "dtask serve: warning: the live index was damaged and re-derived: {repair:?}"
            );
        }
        sweeper = Some(store.spawn_sweeper(Duration::from_secs(1)));
        if let Some(retain) = args.retain {
            retention = Some(store.spawn_retention(retain, args.retain_every));
        }
        if let Some(after) = args.trim_after {
            trimming = Some(store.spawn_trimming(after, args.trim_keep, args.retain_every));
        }
        if store.journal().is_shared() {
            // Other processes write this journal too: follow their commits.
            follower = Some(store.spawn_follower());
        }
        (Server::owner(store, None, config), "owner")
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(CliError::io(format!("listening on {}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(CliError::io("reading the listen address"))?;
    eprintln!(
        "dtask serve: http://{addr}/ ({mode}, journal {}); stop with Ctrl-C",
        at.display()
    );
    if let (false, Some(dir)) = (args.read_only, at.dir()) {
        let lost = Placement::examine(dir)
            .map(|p| p.verdict(None))
            .ok()
            .filter(|v| v.promise == SyncPromise::Lost);
        if let Some(verdict) = lost {
            eprintln!(
                "dtask serve: warning: the journal's synced appends will not survive a power \
                 failure: {} (see `dtask probe`)",
                verdict.why
            );
        }
    }
    let outcome = server
        .serve(listener, async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        })
        .await;
    for task in [sweeper, follower, retention, trimming]
        .into_iter()
        .flatten()
    {
        task.abort();
    }
    eprintln!("dtask serve: stopped");
    if let Some(scratch) = scratch {
        scratch
            .close()
            .map_err(CliError::io("removing the scratch directory"))?;
    }
    Ok(outcome?)
}
