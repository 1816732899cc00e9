//! What a synced append promises where a journal lies: the file system and block device under
//! a directory, their write cache, and what a synced write costs there.
//!
//! An acknowledged append is durable only as far as the storage under the journal keeps its
//! promise: a sync on a file system held in memory (`tmpfs`) survives no reboot, one on a
//! file system mounted without write barriers (`nobarrier`) never asks the device to empty
//! its volatile cache, and a device (or a hypervisor) that acknowledges flushes it has not
//! made loses what it acknowledged in a power failure. [`Placement::examine`] reads what the
//! system tells of a directory (Linux: `/proc/self/mountinfo` and `/sys/dev/block`; writes
//! nothing), [`time_syncs`] measures synced appends of 4 KiB there, and
//! [`Placement::verdict`] says what a synced record survives. `dtask probe` prints both; a
//! writer's open of a journal logs a warning when its directory cannot keep a synced record
//! ([`SyncPromise::Lost`]). On PostgreSQL the server's settings decide instead
//! ([`crate::postgres::probe`]).
//!
//! ```
//! use dtask_journal::probe::{time_syncs, Placement, SyncPromise};
//! # fn main() -> Result<(), dtask_journal::Error> {
//! let dir = tempfile::tempdir().expect("tempdir");
//! let placement = Placement::examine(dir.path())?;
//! let syncs = time_syncs(dir.path(), 5)?;
//! assert_eq!(syncs.count, 5);
//! let verdict = placement.verdict(Some(&syncs));
//! // On Linux the file system is always known; the device's cache may not be (a network or
//! // FUSE file system has none to tell).
//! # #[cfg(target_os = "linux")]
//! assert!(placement.filesystem.is_some());
//! println!("{:?}: {}", verdict.promise, verdict.why);
//! # let _ = SyncPromise::Stable;
//! # Ok(()) }
//! ```

use crate::error::{Error, Result, StorageError};
use serde::Serialize;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Synced writes faster than this on a device that reports a volatile write cache are
/// reported as suspect ([`Verdict::notes`]): a flush of a volatile cache that reaches stable
/// media takes longer on every device class we know of, so a hypervisor or the device may be
/// acknowledging flushes it has not made. A hint, not a proof either way.
pub const SUSPECT_SYNC: Duration = Duration::from_micros(40);

/// The bytes of each synced write [`time_syncs`] makes (one page, as a journal's log grows).
pub const PROBE_WRITE_BYTES: usize = 4096;

/// The file [`time_syncs`] writes in the directory it measures, then removes (the process id
/// follows the name, so probes of one directory at once do not meet).
pub const SYNC_PROBE_FILE: &str = "DTASK_SYNC_PROBE";

/// File systems that keep their files in memory: nothing on them survives a reboot.
const IN_MEMORY: [&str; 2] = ["tmpfs", "ramfs"];

/// File systems whose durability is another machine's or another layer's: the device under
/// them is not seen from here.
const NOT_LOCAL: [&str; 12] = [
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "9p",
    "virtiofs",
    "fuse",
    "fuseblk",
    "overlay",
    "ceph",
    "glusterfs",
    "lustre",
];

/// What a synced record survives where it is written, from the best promise to the worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SyncPromise {
    /// The device reports no volatile write cache (`write through`): a sync returns once the
    /// data is on stable media (or in a cache the device protects from power loss).
    Stable,
    /// The device has a volatile write cache (`write back`) and the file system sends a flush
    /// with each sync: a synced record survives a power failure if the device honours its
    /// flushes — every sane device does; a hypervisor configured to drop them does not.
    Flushed,
    /// A synced record does not survive a reboot or a power failure (a file system held in
    /// memory, write barriers turned off, PostgreSQL with `fsync = off`).
    Lost,
    /// The storage under the journal is not seen from here (a network, FUSE or overlay file
    /// system, or a system other than Linux).
    Unknown,
}

impl SyncPromise {
    /// The promise's name as `dtask probe --json` prints it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Stable => "stable",
            Self::Flushed => "flushed",
            Self::Lost => "lost",
            Self::Unknown => "unknown",
        }
    }
}

/// What a synced record survives, why, and what else is worth knowing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The promise.
    pub promise: SyncPromise,
    /// Why, in a sentence.
    pub why: String,
    /// Cautions that do not change the promise (suspiciously fast syncs, a setting to check).
    pub notes: Vec<String>,
}

/// A device's write cache, as the kernel reports it (`queue/write_cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WriteCache {
    /// A volatile cache: the kernel sends a flush (or a forced unit access) to make data
    /// durable.
    WriteBack,
    /// No volatile cache (or one the device keeps through a power loss).
    WriteThrough,
}

/// The block device under a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockDevice {
    /// The kernel's name of the whole device (`nvme0n1`, `sda`, `vda`, `dm-0`).
    pub name: String,
    /// Its write cache, if the kernel says.
    pub write_cache: Option<WriteCache>,
    /// Whether the kernel takes it for a rotating disk (virtual disks often claim to be).
    pub rotational: Option<bool>,
    /// Whether it takes forced-unit-access writes (a durable write without a full flush).
    pub fua: Option<bool>,
    /// The model it reports, if any.
    pub model: Option<String>,
}

/// Where a directory lies: its file system, mount and block device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The directory examined: the one asked for, or (when it does not exist yet) the
    /// nearest one above it that does, where it would be created.
    pub dir: PathBuf,
    /// The file system's type (`ext4`, `xfs`, `tmpfs`, …); `None` where the system does not
    /// say (not Linux).
    pub filesystem: Option<String>,
    /// Where that file system is mounted.
    pub mount_point: Option<PathBuf>,
    /// What is mounted there (a device's path, or the file system's own name).
    pub source: Option<String>,
    /// The mount's options, then the file system's own, as the kernel lists them (each once).
    pub options: Vec<String>,
    /// The block device under it, when there is one to see.
    pub device: Option<BlockDevice>,
}

/// Synced writes timed by [`time_syncs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SyncTimes {
    /// How many were timed.
    pub count: u32,
    /// The bytes of each write (0 for PostgreSQL's commits, which write no table).
    pub bytes: u32,
    /// The median.
    #[serde(serialize_with = "micros", rename = "p50_us")]
    pub p50: Duration,
    /// The 99th percentile.
    #[serde(serialize_with = "micros", rename = "p99_us")]
    pub p99: Duration,
    /// The slowest.
    #[serde(serialize_with = "micros", rename = "max_us")]
    pub max: Duration,
    /// The mean.
    #[serde(serialize_with = "micros", rename = "mean_us")]
    pub mean: Duration,
}

/// A duration as whole microseconds, as the JSON of `dtask probe` prints it.
fn micros<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl SyncTimes {
    /// The summary of `times` (in the order taken); `None` for none.
    #[must_use]
    pub fn of(mut times: Vec<Duration>, bytes: usize) -> Option<Self> {
        let count = u32::try_from(times.len()).ok()?;
        if count == 0 {
            return None;
        }
        let total: Duration = times.iter().sum();
        times.sort_unstable();
        let at = |q: usize| times[(times.len() * q / 100).min(times.len() - 1)];
        Some(Self {
            count,
            bytes: u32::try_from(bytes).unwrap_or(u32::MAX),
            p50: at(50),
            p99: at(99),
            max: times[times.len() - 1],
            mean: total / count,
        })
    }
}

/// An I/O failure of the probe, with what it was doing.
fn io_error(what: &str, path: &Path, e: &std::io::Error) -> Error {
    Error::Storage(StorageError::caused_by(std::io::Error::new(
        e.kind(),
        format!("{what} {}: {e}", path.display()),
    )))
}

/// `dir`, or the nearest directory above it that exists.
fn existing(dir: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(dir).map_err(|e| io_error("resolving", dir, &e))?;
    let mut at = absolute.as_path();
    loop {
        match std::fs::metadata(at) {
            Ok(meta) if meta.is_dir() => {
                return at.canonicalize().map_err(|e| io_error("resolving", at, &e));
            }
            Ok(_) => {
                return Err(Error::InvalidLocation(format!(
                    "{} is a file, not a directory",
                    at.display()
                )))
            }
            // Not there, or under a file (which the next step up finds).
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                match at.parent() {
                    Some(parent) => at = parent,
                    None => return Err(io_error("finding", dir, &e)),
                }
            }
            Err(e) => return Err(io_error("examining", at, &e)),
        }
    }
}

impl Placement {
    /// Examines where `dir` lies (or, if it does not exist yet, the nearest directory above
    /// it). Reads only what the system tells; writes nothing.
    ///
    /// # Errors
    /// [`Error::InvalidLocation`] when `dir` (or what stands in its place) is a file;
    /// [`Error::Storage`] when it cannot be examined.
    pub fn examine(dir: &Path) -> Result<Self> {
        let dir = existing(dir)?;
        #[cfg(target_os = "linux")]
        {
            linux::examine(dir)
        }
        #[cfg(not(target_os = "linux"))]
        {
            Ok(Self {
                dir,
                filesystem: None,
                mount_point: None,
                source: None,
                options: Vec::new(),
                device: None,
            })
        }
    }

    /// What a synced record survives here; `syncs`, when measured, adds a note on synced
    /// writes that are suspiciously fast ([`SUSPECT_SYNC`]).
    #[must_use]
    pub fn verdict(&self, syncs: Option<&SyncTimes>) -> Verdict {
        let mut notes = Vec::new();
        let Some(fs) = self.filesystem.as_deref() else {
            return Verdict {
                promise: SyncPromise::Unknown,
                why: "the system does not say where the directory lies (only Linux is examined)"
                    .to_owned(),
                notes,
            };
        };
        if IN_MEMORY.contains(&fs) {
            return Verdict {
                promise: SyncPromise::Lost,
                why: format!(
                    "{fs} keeps its files in memory: a synced record is gone after a reboot or \
                     a power failure"
                ),
                notes,
            };
        }
        if let Some(option) = self
            .options
            .iter()
            .find(|o| *o == "nobarrier" || *o == "barrier=0")
        {
            return Verdict {
                promise: SyncPromise::Lost,
                why: format!(
                    "the file system is mounted with {option}: a sync does not ask the device \
                     to flush its write cache, so a power failure can lose synced records"
                ),
                notes,
            };
        }
        if NOT_LOCAL.contains(&fs) {
            if fs == "overlay" {
                notes.push(
                    "an overlay's writes go to its upper directory: probe that directory's \
                     file system"
                        .to_owned(),
                );
            }
            return Verdict {
                promise: SyncPromise::Unknown,
                why: format!(
                    "{fs}: the storage under it is not seen from here; its server or lower \
                     layer decides what a sync keeps"
                ),
                notes,
            };
        }
        let Some(device) = &self.device else {
            return Verdict {
                promise: SyncPromise::Unknown,
                why: format!("{fs} on no block device the kernel describes"),
                notes,
            };
        };
        match device.write_cache {
            Some(WriteCache::WriteThrough) => Verdict {
                promise: SyncPromise::Stable,
                why: format!(
                    "{} reports no volatile write cache: a sync returns once the data is on \
                     stable media",
                    device.name
                ),
                notes,
            },
            Some(WriteCache::WriteBack) => {
                if let Some(times) = syncs.filter(|t| t.p50 < SUSPECT_SYNC) {
                    notes.push(format!(
                        "synced writes take {} µs (median): faster than a volatile cache's flush \
                         usually is — if a hypervisor or the device acknowledges flushes it has \
                         not made, a power failure can lose synced records",
                        times.p50.as_micros()
                    ));
                }
                Verdict {
                    promise: SyncPromise::Flushed,
                    why: format!(
                        "{} has a volatile write cache and each sync flushes it: a synced \
                         record survives a power failure if the device honours its flushes",
                        device.name
                    ),
                    notes,
                }
            }
            None => Verdict {
                promise: SyncPromise::Unknown,
                why: format!(
                    "the kernel does not say whether {} caches writes",
                    device.name
                ),
                notes,
            },
        }
    }
}

/// Times `count` synced appends of [`PROBE_WRITE_BYTES`] to a new file in `dir` (or the
/// nearest directory above it that exists), each written and then `fdatasync`ed as a
/// journal's log is; the file is removed after, whatever happened.
///
/// # Errors
/// [`Error::InvalidLocation`] when `count` is 0 or `dir` is a file; [`Error::Storage`] when
/// the file cannot be written or synced (a read-only or full file system).
pub fn time_syncs(dir: &Path, count: u32) -> Result<SyncTimes> {
    if count == 0 {
        return Err(Error::InvalidLocation(
            "a sync probe needs at least one sync".to_owned(),
        ));
    }
    let dir = existing(dir)?;
    let path = dir.join(format!("{SYNC_PROBE_FILE}.{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| io_error("creating", &path, &e))?;
    let block = [0x5a_u8; PROBE_WRITE_BYTES];
    let mut times = Vec::with_capacity((count as usize).min(1024));
    let written = (|| {
        for _ in 0..count {
            let start = Instant::now();
            file.write_all(&block)?;
            file.sync_data()?;
            times.push(start.elapsed());
        }
        Ok::<_, std::io::Error>(())
    })();
    drop(file);
    let removed = std::fs::remove_file(&path);
    written.map_err(|e| io_error("writing", &path, &e))?;
    removed.map_err(|e| io_error("removing", &path, &e))?;
    SyncTimes::of(times, PROBE_WRITE_BYTES)
        .ok_or_else(|| Error::InvalidLocation("no sync was timed".to_owned()))
}

/// Logs a warning when the journal about to be written at `dir` cannot keep a synced record
/// ([`SyncPromise::Lost`]); says nothing when it can, or when `dir` cannot be examined.
pub(crate) fn warn_if_lost(dir: &Path) {
    if let Ok(placement) = Placement::examine(dir) {
        let verdict = placement.verdict(None);
        if verdict.promise == SyncPromise::Lost {
            tracing::warn!(
                dir = %placement.dir.display(),
                "the journal's synced appends will not survive a power failure: {}",
                verdict.why
            );
        }
    }
}

/// The mount table and sysfs, as Linux shows them.
#[cfg(target_os = "linux")]
mod linux {
    use super::{io_error, BlockDevice, Placement, WriteCache};
    use crate::error::Result;
    use std::os::unix::fs::MetadataExt as _;
    use std::path::{Path, PathBuf};

    /// One line of `/proc/self/mountinfo`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(super) struct Mount {
        /// The device's major and minor numbers.
        pub dev: (u32, u32),
        /// Where it is mounted.
        pub point: PathBuf,
        /// The mount's options, then the file system's own.
        pub options: Vec<String>,
        /// The file system's type.
        pub filesystem: String,
        /// What is mounted.
        pub source: String,
    }

    /// Undoes the octal escapes of the mount table (`\040` for a space).
    fn unescape(field: &str) -> String {
        let bytes = field.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let octal = bytes
                .get(i + 1..i + 4)
                .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
            if let Some(d) = octal {
                let value = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Parses the mount table (malformed lines are skipped).
    pub(super) fn parse_mountinfo(text: &str) -> Vec<Mount> {
        text.lines()
            .filter_map(|line| {
                let (mount, fs) = line.split_once(" - ")?;
                let mut m = mount.split(' ');
                let (_id, _parent, dev, _root, point, options) = (
                    m.next()?,
                    m.next()?,
                    m.next()?,
                    m.next()?,
                    m.next()?,
                    m.next()?,
                );
                let (major, minor) = dev.split_once(':')?;
                let mut f = fs.split(' ');
                let (filesystem, source, fs_options) = (f.next()?, f.next()?, f.next()?);
                Some(Mount {
                    dev: (major.parse().ok()?, minor.parse().ok()?),
                    point: PathBuf::from(unescape(point)),
                    options: options.split(',').chain(fs_options.split(',')).fold(
                        Vec::new(),
                        |mut all, o| {
                            let o = unescape(o);
                            if !o.is_empty() && !all.contains(&o) {
                                all.push(o);
                            }
                            all
                        },
                    ),
                    filesystem: filesystem.to_owned(),
                    source: unescape(source),
                })
            })
            .collect()
    }

    /// The mount `dir` (canonical) lies on: of those of its device, the one whose mount
    /// point is the longest prefix of `dir` (the last mounted when two are the same); of any
    /// device when none is its (a file system whose files carry other device numbers).
    pub(super) fn mount_of<'a>(
        mounts: &'a [Mount],
        dir: &Path,
        dev: (u32, u32),
    ) -> Option<&'a Mount> {
        let best = |same_device: bool| {
            mounts
                .iter()
                .filter(|m| dir.starts_with(&m.point) && (!same_device || m.dev == dev))
                .max_by_key(|m| m.point.components().count())
        };
        // `max_by_key` keeps the last of equals: the mount stacked last is the one seen.
        best(true).or_else(|| best(false))
    }

    /// The device numbers of `st_dev`.
    fn split(dev: u64) -> (u32, u32) {
        (libc::major(dev), libc::minor(dev))
    }

    /// The whole block device of the device numbers `dev`, if sysfs knows it.
    fn block_device(dev: (u32, u32)) -> Option<BlockDevice> {
        let link = PathBuf::from(format!("/sys/dev/block/{}:{}", dev.0, dev.1));
        let mut at = link.canonicalize().ok()?;
        // A partition's queue is its disk's.
        if at.join("partition").exists() {
            at = at.parent()?.to_path_buf();
        }
        let read = |file: &str| {
            std::fs::read_to_string(at.join(file))
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        };
        let flag = |file: &str| read(file).map(|s| s == "1");
        Some(BlockDevice {
            name: at.file_name()?.to_string_lossy().into_owned(),
            write_cache: read("queue/write_cache").and_then(|s| match s.as_str() {
                "write back" => Some(WriteCache::WriteBack),
                "write through" => Some(WriteCache::WriteThrough),
                _ => None,
            }),
            rotational: flag("queue/rotational"),
            fua: flag("queue/fua"),
            model: read("device/model"),
        })
    }

    /// [`Placement::examine`] on Linux, of an existing, canonical `dir`.
    pub(super) fn examine(dir: PathBuf) -> Result<Placement> {
        let meta = std::fs::metadata(&dir).map_err(|e| io_error("examining", &dir, &e))?;
        let dev = split(meta.dev());
        let table = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| io_error("reading", Path::new("/proc/self/mountinfo"), &e))?;
        let mounts = parse_mountinfo(&table);
        let mount = mount_of(&mounts, &dir, dev);
        // The directory's own device numbers name its block device, except on file systems
        // that give their files numbers of their own (btrfs): then the mounted device's.
        let device = block_device(dev).or_else(|| {
            let source = mount?.source.as_str();
            let rdev = std::fs::metadata(source).ok()?.rdev();
            (rdev != 0).then(|| block_device(split(rdev))).flatten()
        });
        Ok(Placement {
            filesystem: mount.map(|m| m.filesystem.clone()),
            mount_point: mount.map(|m| m.point.clone()),
            source: mount.map(|m| m.source.clone()),
            options: mount.map(|m| m.options.clone()).unwrap_or_default(),
            device,
            dir,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(fs: &str, options: &[&str], cache: Option<WriteCache>) -> Placement {
        Placement {
            dir: PathBuf::from("/srv/journal"),
            filesystem: Some(fs.to_owned()),
            mount_point: Some(PathBuf::from("/srv")),
            source: Some("/dev/nvme0n1p2".to_owned()),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
            device: cache.map(|c| BlockDevice {
                name: "nvme0n1".to_owned(),
                write_cache: Some(c),
                rotational: Some(false),
                fua: Some(true),
                model: None,
            }),
        }
    }

    fn times(p50_us: u64) -> SyncTimes {
        SyncTimes::of(vec![Duration::from_micros(p50_us); 3], PROBE_WRITE_BYTES).expect("times")
    }

    #[test]
    fn each_kind_of_storage_gets_its_promise() {
        let cases = [
            (
                placement("ext4", &["rw"], Some(WriteCache::WriteThrough)),
                SyncPromise::Stable,
            ),
            (
                placement("xfs", &["rw"], Some(WriteCache::WriteBack)),
                SyncPromise::Flushed,
            ),
            (placement("tmpfs", &["rw"], None), SyncPromise::Lost),
            (placement("ramfs", &["rw"], None), SyncPromise::Lost),
            (
                placement("ext4", &["rw", "nobarrier"], Some(WriteCache::WriteBack)),
                SyncPromise::Lost,
            ),
            (
                placement("ext3", &["barrier=0"], Some(WriteCache::WriteBack)),
                SyncPromise::Lost,
            ),
            (placement("nfs4", &["rw"], None), SyncPromise::Unknown),
            (placement("overlay", &["rw"], None), SyncPromise::Unknown),
            (placement("ext4", &["rw"], None), SyncPromise::Unknown),
        ];
        for (placement, promise) in cases {
            let verdict = placement.verdict(None);
            assert_eq!(verdict.promise, promise, "{placement:?}: {}", verdict.why);
            assert!(!verdict.why.is_empty());
        }
        let unseen = Placement {
            filesystem: None,
            ..placement("ext4", &[], None)
        };
        assert_eq!(unseen.verdict(None).promise, SyncPromise::Unknown);
    }

    #[test]
    fn fast_syncs_on_a_volatile_cache_are_noted_and_change_no_promise() {
        let volatile = placement("ext4", &["rw"], Some(WriteCache::WriteBack));
        let fast = volatile.verdict(Some(&times(10)));
        assert_eq!(fast.promise, SyncPromise::Flushed);
        assert_eq!(fast.notes.len(), 1, "{fast:?}");
        assert!(fast.notes[0].contains("10 µs"), "{fast:?}");
        assert!(volatile.verdict(Some(&times(400))).notes.is_empty());
        assert!(volatile.verdict(None).notes.is_empty());
        // Fast syncs are what a device without a volatile cache should make.
        let stable = placement("ext4", &["rw"], Some(WriteCache::WriteThrough));
        assert!(stable.verdict(Some(&times(10))).notes.is_empty());
    }

    #[test]
    fn sync_times_summarise_in_order() {
        let taken: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let t = SyncTimes::of(taken, 4096).expect("times");
        assert_eq!(t.count, 100);
        assert_eq!(t.p50, Duration::from_micros(51));
        assert_eq!(t.p99, Duration::from_micros(100));
        assert_eq!(t.max, Duration::from_micros(100));
        assert_eq!(t.mean, Duration::from_nanos(50_500));
        assert_eq!(SyncTimes::of(Vec::new(), 4096), None);
        let json = serde_json::to_value(t).expect("json");
        assert_eq!(json["p50_us"], 51);
        assert_eq!(json["mean_us"], 50);
    }

    #[test]
    fn timed_syncs_leave_no_file_behind_and_refuse_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = time_syncs(dir.path(), 3).expect("timed");
        assert_eq!((t.count, t.bytes), (3, 4096));
        assert!(t.p50 <= t.max && t.p99 <= t.max);
        assert_eq!(std::fs::read_dir(dir.path()).expect("listed").count(), 0);
        assert!(matches!(
            time_syncs(dir.path(), 0),
            Err(Error::InvalidLocation(_))
        ));
        // A directory that does not exist yet is measured where it would be created, and is
        // not created.
        let later = dir.path().join("not/yet");
        assert_eq!(time_syncs(&later, 1).expect("timed").count, 1);
        assert!(!dir.path().join("not").exists());
    }

    #[test]
    fn a_file_is_no_place_for_a_journal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").expect("written");
        assert!(matches!(
            Placement::examine(&file),
            Err(Error::InvalidLocation(_))
        ));
        assert!(matches!(
            Placement::examine(&file.join("below")),
            Err(Error::InvalidLocation(_))
        ));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_mount_table_is_read_with_its_escapes_and_stacked_mounts() {
        let table = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=100k
30 25 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=200k
31 27 8:1 / /mnt/my\\040disk rw master:1 - xfs /dev/sda1 rw,nobarrier
garbage line
";
        let mounts = linux::parse_mountinfo(table);
        assert_eq!(mounts.len(), 5);
        assert_eq!(mounts[4].point, PathBuf::from("/mnt/my disk"));
        assert_eq!(mounts[4].options, ["rw", "nobarrier"]);
        assert_eq!(mounts[4].dev, (8, 1));
        let on = |dir: &str, dev| {
            linux::mount_of(&mounts, Path::new(dir), dev).map(|m| (m.filesystem.as_str(), m.dev))
        };
        assert_eq!(on("/srv/journal", (254, 0)), Some(("ext4", (254, 0))));
        assert_eq!(on("/mnt/my disk/j", (8, 1)), Some(("xfs", (8, 1))));
        // Two mounts on one point: the directory's device numbers pick the one it is on.
        assert_eq!(on("/dev/shm/j", (0, 27)), Some(("tmpfs", (0, 27))));
        assert_eq!(on("/dev/shm/j", (0, 23)), Some(("tmpfs", (0, 23))));
        // Numbers of no mount (btrfs subvolumes): the longest mount point.
        assert_eq!(on("/mnt/my disk/j", (0, 99)), Some(("xfs", (8, 1))));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_directory_in_memory_is_found_to_lose_synced_records() {
        // /dev/shm is a tmpfs wherever it is mounted (the C library's shared memory).
        let shm = Path::new("/dev/shm");
        let Ok(dir) = tempfile::tempdir_in(shm) else {
            // No /dev/shm to write to on this system: nothing to examine.
            return;
        };
        let placement = Placement::examine(dir.path()).expect("examined");
        assert_eq!(placement.filesystem.as_deref(), Some("tmpfs"));
        assert_eq!(placement.verdict(None).promise, SyncPromise::Lost);
    }

    /// Collects the messages of the warnings logged while it is the default subscriber.
    struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl tracing::Subscriber for Warnings {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(
                    &mut self,
                    field: &tracing::field::Field,
                    value: &dyn std::fmt::Debug,
                ) {
                    if field.name() == "message" {
                        self.0 = format!("{value:?}");
                    }
                }
            }
            if *event.metadata().level() == tracing::Level::WARN {
                let mut message = Message(String::new());
                event.record(&mut message);
                self.0.lock().expect("not poisoned").push(message.0);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// The warnings `work` logs.
    fn warnings(work: impl FnOnce()) -> Vec<String> {
        let seen = std::sync::Arc::default();
        tracing::subscriber::with_default(Warnings(std::sync::Arc::clone(&seen)), work);
        let seen = seen.lock().expect("not poisoned");
        seen.clone()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_writers_open_warns_of_a_journal_whose_synced_records_would_be_lost() {
        use crate::{Durability, Journal, JournalOptions};
        let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
            // No /dev/shm to write to on this system: nothing to open there.
            return;
        };
        let dir = shm.path().join("journal");
        let warned = warnings(|| {
            drop(Journal::open(&dir, JournalOptions::default()).expect("opened"));
        });
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(
            warned[0].contains("will not survive a power failure"),
            "{warned:?}"
        );
        assert!(warned[0].contains("tmpfs"), "{warned:?}");
        // A journal asked not to sync made no such promise.
        let buffered = JournalOptions::default().with_durability(Durability::Buffered);
        let warned = warnings(|| drop(Journal::open(&dir, buffered).expect("opened")));
        assert!(warned.is_empty(), "{warned:?}");
        // Where synced records are kept, nothing is said.
        let kept = tempfile::tempdir().expect("tempdir");
        let lost = Placement::examine(kept.path())
            .expect("examined")
            .verdict(None)
            .promise
            == SyncPromise::Lost;
        let warned = warnings(|| warn_if_lost(kept.path()));
        assert_eq!(warned.is_empty(), !lost, "{warned:?}");
    }

    #[test]
    fn a_writers_open_warns_of_a_postgres_server_that_does_not_flush() {
        use crate::{Durability, Journal, JournalOptions};
        let Some(cluster) =
            crate::test_cluster::Cluster::with_settings("postgres_fsync_off", "-c fsync=off")
        else {
            return;
        };
        let url = cluster.url("dtask");
        let location = crate::postgres::PgLocation::parse(&url).expect("a URL");
        let settings = crate::postgres::probe::settings(&location).expect("settings read");
        assert!(!settings.fsync, "{settings:?}");
        assert_eq!(settings.verdict().promise, SyncPromise::Lost);
        let warned = warnings(|| {
            drop(Journal::open_postgres(&url, JournalOptions::default()).expect("opened"));
        });
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].contains("fsync = off"), "{warned:?}");
        // A journal asked not to sync made no such promise.
        let buffered = JournalOptions::default().with_durability(Durability::Buffered);
        let warned = warnings(|| drop(Journal::open_postgres(&url, buffered).expect("opened")));
        assert!(warned.is_empty(), "{warned:?}");
    }
}
