//! The tail marker: what the journal's end looks like, written with every batch.
//!
//! A journal's indexes are written in the same atomic batch as the records they describe, so
//! a crash cannot make them disagree — but damage can (a lost file, a deleted key), and an
//! engine that opened such a journal would build on it without a word: a live task whose
//! `live` entry is gone is never recovered, a live task whose last record is gone has that
//! position written again, a commit index that lost its tail gives its sequences out twice.
//! Finding any of these by reading the whole journal at every open would cost as much as an
//! audit.
//!
//! So the writer keeps, from format 3 on, one `meta` entry ([`crate::keys::META_TAIL`]) that
//! sums up the journal's end, rewritten in every batch (one small put per batch):
//!
//! - the **last global sequence** — a writable open compares it with the last entry of the
//!   `commits` index and with the record that entry names (one seek and one read);
//! - the **number of live tasks** and a **digest of their heads**: the order-independent sum
//!   ([`PairHash`]) of the (sequence, key) pair of every live task's last record. Recovery
//!   folds every live task anyway; it sums the heads it found and compares
//!   ([`crate::Journal::check_live`]). A deleted `live` entry, a live task's lost or added last
//!   record, or a stray `live` entry all change the sum.
//!
//! The marker is checksummed (CRC-32) and versioned like a record.

use crate::error::{CorruptionKind, Error, Result};
use crate::head::Head;
use crate::keys;

/// An order-independent digest of a set of (sequence, event key) pairs: the lane-wise
/// wrapping sums of two independent 64-bit hashes of each pair. Adding and removing pairs in
/// any order gives the same digest for the same set. It tells an intact set from a damaged one;
/// it is not meant to resist deliberate forgery (nothing in a journal's indexes is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PairHash {
    lanes: [u64; 2],
}

/// The lanes' seeds.
const SEEDS: [u64; 2] = [0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344];

/// The `SplitMix64` finalizer: a bijective mix of 64 bits.
const fn mix(mut h: u64) -> u64 {
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

impl PairHash {
    /// The two lanes' hashes of one (sequence, event key) pair. The lanes are independent
    /// chains of mixes, stepped together so that the CPU overlaps their multiplications (the
    /// writer computes this twice an append, for the head it replaces and the new one).
    fn of(seq: u64, key: &[u8]) -> [u64; 2] {
        let len = key.len() as u64;
        let step = |h: [u64; 2], word: u64| [mix(h[0] ^ word), mix(h[1] ^ word)];
        let mut h = step(SEEDS, seq);
        h = step(h, len);
        let mut words = key.chunks_exact(8);
        for word in &mut words {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            h = step(h, u64::from_le_bytes(w));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            h = step(h, u64::from_le_bytes(w));
        }
        h
    }

    /// Adds the pair (`seq`, `key`).
    pub fn add(&mut self, seq: u64, key: &[u8]) {
        for (lane, h) in self.lanes.iter_mut().zip(Self::of(seq, key)) {
            *lane = lane.wrapping_add(h);
        }
    }

    /// Removes the pair (`seq`, `key`), added before.
    pub fn remove(&mut self, seq: u64, key: &[u8]) {
        for (lane, h) in self.lanes.iter_mut().zip(Self::of(seq, key)) {
            *lane = lane.wrapping_sub(h);
        }
    }

    /// Adds one global sequence (a record's, its key unknown or gone): what a purge's
    /// tombstone sums the deleted records' sequences with ([`crate::Event::Purged`]) and an
    /// audit the sequences missing from the commit order with.
    pub fn add_sequence(&mut self, seq: u64) {
        self.add(seq, &[]);
    }

    /// The sum of `seqs` ([`PairHash::add_sequence`] each), as the two lanes a
    /// [`crate::Event::Purged`] records.
    #[must_use]
    pub fn of_sequences(seqs: impl IntoIterator<Item = u64>) -> [u64; 2] {
        let mut sum = Self::default();
        for seq in seqs {
            sum.add_sequence(seq);
        }
        sum.lanes
    }

    /// The two lanes.
    #[must_use]
    pub const fn lanes(&self) -> [u64; 2] {
        self.lanes
    }

    /// A sum from its two lanes ([`PairHash::lanes`]).
    #[must_use]
    pub const fn from_lanes(lanes: [u64; 2]) -> Self {
        Self { lanes }
    }

    /// Adds every pair of `other`.
    pub fn merge(&mut self, other: &Self) {
        for (lane, h) in self.lanes.iter_mut().zip(other.lanes) {
            *lane = lane.wrapping_add(h);
        }
    }

    /// Adds the head of a live task `task`: the pair of its last record. An empty head adds
    /// nothing.
    pub fn add_head(&mut self, task: &str, head: &Head) {
        with_last_key(task, head, |seq, key| self.add(seq, key));
    }

    /// Removes the head of a live task `task`; see [`PairHash::add_head`].
    pub fn remove_head(&mut self, task: &str, head: &Head) {
        with_last_key(task, head, |seq, key| self.remove(seq, key));
    }

    /// The digest as 16 bytes.
    #[must_use]
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0; 16];
        out[..8].copy_from_slice(&self.lanes[0].to_be_bytes());
        out[8..].copy_from_slice(&self.lanes[1].to_be_bytes());
        out
    }

    fn from_bytes(bytes: [u8; 16]) -> Self {
        let mut a = [0; 8];
        let mut b = [0; 8];
        a.copy_from_slice(&bytes[..8]);
        b.copy_from_slice(&bytes[8..]);
        Self {
            lanes: [u64::from_be_bytes(a), u64::from_be_bytes(b)],
        }
    }
}

/// The (sequence, event key) pairs of one task's records, added to a [`PairHash`] without
/// the caller building keys: the audit fingerprints every record this way and compares the
/// sum with the commit index's ([`crate::Journal::for_each_commit_entry`]).
#[derive(Debug, Clone)]
pub struct TaskPairs {
    key: Vec<u8>,
    prefix: usize,
}

impl TaskPairs {
    /// The pairs of task `task`; `None` when the id cannot be part of a key (empty, or with a
    /// NUL byte), so that its records' keys cannot be rebuilt.
    #[must_use]
    pub fn new(task: &str) -> Option<Self> {
        if !keys::is_valid_task_id(task) {
            return None;
        }
        let key = keys::task_prefix(task);
        let prefix = key.len();
        Some(Self { key, prefix })
    }

    /// Adds the pair of the record at `position` carrying sequence `seq` to `hash`.
    pub fn add(&mut self, hash: &mut PairHash, position: u64, seq: u64) {
        self.key.truncate(self.prefix);
        self.key.extend_from_slice(&position.to_be_bytes());
        hash.add(seq, &self.key);
    }
}

/// Calls `f` with the sequence and the `events` key of `head`'s last record (none for an empty
/// head). The key is made on the stack for the usual task ids: the writer does this twice per
/// append.
fn with_last_key(task: &str, head: &Head, f: impl FnOnce(u64, &[u8])) {
    const STACK: usize = 128;
    let Some(last) = head.next_position.checked_sub(1) else {
        return;
    };
    let len = task.len() + 9;
    if len > STACK {
        f(head.last_seq, &keys::event_key(task, last));
        return;
    }
    let mut key = [0u8; STACK];
    key[..task.len()].copy_from_slice(task.as_bytes());
    key[task.len()] = keys::TASK_SEPARATOR;
    key[task.len() + 1..len].copy_from_slice(&last.to_be_bytes());
    f(head.last_seq, &key[..len]);
}

impl std::fmt::Display for PairHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}{:016x}", self.lanes[0], self.lanes[1])
    }
}

/// The live tasks' heads summed up: how many, and the digest of their last records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveSummary {
    /// The number of live tasks.
    pub tasks: u64,
    /// The digest of their heads ([`PairHash::add_head`]).
    pub digest: PairHash,
}

impl LiveSummary {
    /// Adds a live task's head.
    pub fn add(&mut self, task: &str, head: &Head) {
        self.tasks += 1;
        self.digest.add_head(task, head);
    }

    /// The summary of `heads`.
    pub fn of<'a>(heads: impl IntoIterator<Item = (&'a str, &'a Head)>) -> Self {
        let mut summary = Self::default();
        for (task, head) in heads {
            summary.add(task, head);
        }
        summary
    }

    /// Moves a task's head from `before` (live or not, per `before.terminal` and an empty
    /// stream) to `after`.
    pub(crate) fn advance(&mut self, task: &str, before: &Head, after: &Head) {
        let was_live = before.next_position > 0 && !before.terminal;
        let is_live = after.next_position > 0 && !after.terminal;
        if was_live {
            self.digest.remove_head(task, before);
        }
        if is_live {
            self.digest.add_head(task, after);
        }
        match (was_live, is_live) {
            (false, true) => self.tasks += 1,
            (true, false) => self.tasks = self.tasks.saturating_sub(1),
            _ => {}
        }
    }
}

/// The tail marker of a format-3 journal (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tail {
    /// The global sequence of the last record (0 for an empty journal).
    pub last_seq: u64,
    /// The live tasks.
    pub live: LiveSummary,
}

/// The marker's own format version.
const TAIL_VERSION: u8 = 1;

/// The marker's length: version, last sequence, live tasks, digest, CRC-32.
pub(crate) const TAIL_LEN: usize = 1 + 8 + 8 + 16 + 4;

impl Tail {
    /// The stored form.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        self.encoded().to_vec()
    }

    /// [`Tail::encode`] on the stack: the writer puts one a batch, held in place in its
    /// [`crate::backend::OpBytes`].
    pub(crate) fn encoded(&self) -> [u8; TAIL_LEN] {
        let mut out = [0; TAIL_LEN];
        let (version, rest) = out.split_at_mut(1);
        version[0] = TAIL_VERSION;
        let (last_seq, rest) = rest.split_at_mut(8);
        last_seq.copy_from_slice(&self.last_seq.to_be_bytes());
        let (tasks, rest) = rest.split_at_mut(8);
        tasks.copy_from_slice(&self.live.tasks.to_be_bytes());
        rest[..16].copy_from_slice(&self.live.digest.to_bytes());
        let crc = crc32fast::hash(&out[..TAIL_LEN - 4]);
        out[TAIL_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses a stored marker.
    ///
    /// # Errors
    /// [`CorruptionKind`] when the bytes are not a marker (length, CRC, version) or the last
    /// sequence is out of range.
    pub fn decode(bytes: &[u8]) -> Result<Self, CorruptionKind> {
        let bytes: &[u8; TAIL_LEN] = bytes
            .try_into()
            .map_err(|_| CorruptionKind::Truncated { len: bytes.len() })?;
        let (body, crc) = bytes.split_at(TAIL_LEN - 4);
        let mut stored = [0; 4];
        stored.copy_from_slice(crc);
        let stored = u32::from_le_bytes(stored);
        let computed = crc32fast::hash(body);
        if stored != computed {
            return Err(CorruptionKind::Checksum { stored, computed });
        }
        if body[0] != TAIL_VERSION {
            return Err(CorruptionKind::UnknownVersion(body[0]));
        }
        let u64_at = |at: usize| {
            let mut b = [0; 8];
            b.copy_from_slice(&body[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let last_seq = u64_at(1);
        if last_seq != 0 {
            keys::checked_seq(last_seq)?;
        }
        let mut digest = [0; 16];
        digest.copy_from_slice(&body[17..33]);
        Ok(Self {
            last_seq,
            live: LiveSummary {
                tasks: u64_at(9),
                digest: PairHash::from_bytes(digest),
            },
        })
    }
}

/// How a journal's state disagrees with itself, found when it is opened for writing (see
/// [`Error::Inconsistent`]). `dtask verify` names every problem of the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Inconsistency {
    /// A format-3 journal without a (readable) tail marker.
    Marker(CorruptionKind),
    /// The `commits` index does not end where the tail marker says.
    CommitTail {
        /// The last sequence in the `commits` index (0 when it is empty or unreadable).
        index: u64,
        /// The last sequence the marker records.
        marker: u64,
    },
    /// The last `commits` entry names a record that does not carry its sequence.
    CommitTarget {
        /// The sequence of the entry.
        seq: u64,
        /// What was found instead.
        detail: String,
    },
    /// The live tasks recovered do not sum up to what the marker records: a `live` entry was
    /// lost or added, or a live task's last record was lost or added.
    LiveTasks {
        /// The live tasks the marker records.
        marker: u64,
        /// The live tasks found.
        found: u64,
        /// Whether the digests of their heads differ (with equal counts: a head moved).
        digest_differs: bool,
    },
}

impl std::fmt::Display for Inconsistency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Marker(kind) => write!(f, "the tail marker is unreadable: {kind}"),
            Self::CommitTail { index, marker } => write!(
                f,
                "the commit index ends at sequence {index}, the journal's tail marker at {marker}"
            ),
            Self::CommitTarget { seq, detail } => {
                write!(f, "the last commit entry (sequence {seq}) {detail}")
            }
            Self::LiveTasks {
                marker,
                found,
                digest_differs,
            } => {
                write!(
                    f,
                    "{found} live tasks recovered, the journal's tail marker records {marker}"
                )?;
                if *digest_differs && marker == found {
                    f.write_str(" with other heads (a live task's last record was lost or added)")?;
                }
                Ok(())
            }
        }
    }
}

impl Inconsistency {
    pub(crate) fn into_error(self) -> Error {
        Error::Inconsistent(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest is stored in every tail marker: its values are pinned, so that a change
    /// of the hash cannot pass unnoticed (it would make every stored marker disagree).
    #[test]
    fn the_pair_hash_is_stable() {
        let mut hash = PairHash::default();
        for (seq, key) in [
            (1, &b""[..]),
            (42, b"t\0\0\0\0\0\0\0\0\x06"),
            (u64::MAX, b"a task id longer than sixteen bytes"),
        ] {
            hash.add(seq, key);
        }
        assert_eq!(
            format!("{:032x}", u128::from_be_bytes(hash.to_bytes())),
            "036467442098825f11509daeeebd1954"
        );
    }

    /// The stack-built key of a head is the journal's event key, short ids and long.
    #[test]
    fn a_head_hashes_as_the_pair_of_its_last_record() {
        for task in ["t", "task-0000001", &"x".repeat(200)] {
            let head = Head {
                next_position: 7,
                last_seq: 42,
                ..Head::default()
            };
            let mut by_head = PairHash::default();
            by_head.add_head(task, &head);
            let mut by_pair = PairHash::default();
            by_pair.add(42, &keys::event_key(task, 6));
            assert_eq!(by_head, by_pair);
            by_head.remove_head(task, &head);
            assert_eq!(by_head, PairHash::default());
        }
    }
}
