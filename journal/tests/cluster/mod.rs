//! A private PostgreSQL cluster for the tests that need a server of their own (to crash it,
//! to give it settings or certificates): the distribution's `initdb` and `pg_ctl`, from
//! `DTASK_TEST_PG_BIN` (which `./dev test` sets), in a temporary directory, on a free
//! loopback port.
#![allow(
    dead_code,
    reason = "each test file uses a part of the cluster's helpers"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A private PostgreSQL cluster in a temporary directory, stopped when dropped.
#[derive(Debug)]
pub struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    /// The user the server runs as: `postgres` when the tests run as root (the server
    /// refuses root), else the tests' own.
    user: String,
    as_postgres: bool,
    /// Settings given to the server at each start (`-c name=value …`).
    settings: String,
    /// The server's port on 127.0.0.1.
    pub port: u16,
}

impl Cluster {
    /// A cluster, started; `None` (and a loud line) when `DTASK_TEST_PG_BIN` is not set.
    pub fn new(test: &str) -> Option<Self> {
        Self::with_settings(test, "")
    }

    /// A cluster whose server starts with `settings` besides the usual ones, started.
    pub fn with_settings(test: &str, settings: &str) -> Option<Self> {
        let cluster = Self::init(test, settings)?;
        cluster.start();
        Some(cluster)
    }

    /// A cluster made and not started: files can be put in place (see [`Cluster::give`])
    /// and its access rules changed before [`Cluster::start`].
    pub fn init(test: &str, settings: &str) -> Option<Self> {
        let Ok(bin) = std::env::var("DTASK_TEST_PG_BIN") else {
            eprintln!("SKIPPED {test}: DTASK_TEST_PG_BIN is not set (./dev test sets it)");
            return None;
        };
        let uid = Command::new("id").arg("-u").output().unwrap();
        let as_postgres = String::from_utf8_lossy(&uid.stdout).trim() == "0";
        let user = if as_postgres {
            "postgres".to_owned()
        } else {
            let name = Command::new("id").arg("-un").output().unwrap();
            String::from_utf8_lossy(&name.stdout).trim().to_owned()
        };
        let dir = tempfile::tempdir().unwrap();
        if as_postgres {
            let owned = Command::new("chown")
                .arg("postgres")
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(owned.success());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cluster = Self {
            bin: PathBuf::from(bin),
            dir,
            port,
            user,
            as_postgres,
            settings: settings.to_owned(),
        };
        let data = cluster.data();
        cluster.pg(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                &cluster.user,
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        Some(cluster)
    }

    /// The server's data directory.
    pub fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// Runs one of the cluster's programs, as the server's user; panics with its output if it
    /// fails.
    pub fn pg(&self, program: &str, args: &[&str]) {
        let program = self.bin.join(program).display().to_string();
        let output = if self.as_postgres {
            let quoted: Vec<String> = std::iter::once(program.as_str())
                .chain(args.iter().copied())
                .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
                .collect();
            Command::new("su")
                .args(["postgres", "-s", "/bin/sh", "-c", &quoted.join(" ")])
                .output()
                .unwrap()
        } else {
            Command::new(&program).args(args).output().unwrap()
        };
        assert!(
            output.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Starts the server (and waits until it accepts connections).
    pub fn start(&self) {
        let data = self.data();
        let log = self.dir.path().join("server.log").display().to_string();
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on {}",
            self.port,
            self.dir.path().display(),
            self.settings
        );
        self.pg(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-w", "-o", &options, "start"],
        );
    }

    /// Stops the server at once: no checkpoint, no flush of what it holds in memory.
    pub fn crash(&self) {
        let data = self.data();
        self.pg("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
    }

    /// Stops the server as an operator's restart does (`fast`): transactions in progress
    /// are rolled back, and the whole write-ahead log is flushed — every commit the server
    /// acknowledged is kept.
    pub fn stop_fast(&self) {
        let data = self.data();
        self.pg("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]);
    }

    /// The URL of a journal in schema `schema`, as the server's superuser.
    pub fn url(&self, schema: &str) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/postgres?schema={schema}",
            self.user, self.port
        )
    }

    /// The server's superuser.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Writes `contents` to `name` in the cluster's directory, readable by the server's user
    /// alone (as the server wants its private key); returns its path.
    pub fn give(&self, name: &str, contents: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        if self.as_postgres {
            let owned = Command::new("chown")
                .arg("postgres")
                .arg(&path)
                .status()
                .unwrap();
            assert!(owned.success());
        }
        path
    }

    /// Replaces the server's access rules (`pg_hba.conf`) with `rules`.
    pub fn set_access_rules(&self, rules: &str) {
        let path = Path::new(&self.data()).join("pg_hba.conf");
        std::fs::write(path, rules).unwrap();
    }

    /// The directory of the cluster's files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data();
        let program = self.bin.join("pg_ctl").display().to_string();
        let args = ["-D", data.as_str(), "-m", "immediate", "stop"];
        let _ = if self.as_postgres {
            let line = format!("'{program}' '{}'", args.join("' '"));
            Command::new("su")
                .args(["postgres", "-s", "/bin/sh", "-c", &line])
                .output()
        } else {
            Command::new(&program).args(args).output()
        };
    }
}
