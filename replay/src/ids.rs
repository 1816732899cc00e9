//! [`IdIndex`]: event ids → stream positions, compact for the few ids most tasks have and for
//! the many a long-running tool's updates give one task.

use hashbrown::HashTable;
use std::hash::{BuildHasher, RandomState};

/// Ids held inline (looked up by a scan) before the index moves them to a [`Table`].
const INLINE_MAX: u32 = 32;

/// How many ids of the first one's length an index makes room for at its first insert.
const FIRST_ROOM: usize = 4;

/// The words of an entry before its id's bytes: its position and the id's length.
const HEADER_WORDS: usize = 2;

/// A map from event ids (update, notification and outbox ids) to the position of the record
/// that recorded them.
///
/// Every live task holds three of these in memory, and most hold a handful of ids, or none;
/// a long-running tool's task may hold hundreds of thousands (one per progress update,
/// kept for the deduplication for as long as the task can run). Up to 32 ids are kept in
/// **one** buffer of words, entry after entry — the position, the id's length, then the id's
/// bytes in whole words — and looked up by a linear scan (one allocation for the lot, and an
/// empty index takes five words). Beyond that, in a table: the ids' bytes back to back in
/// one buffer, each after its length, and a hash table of (offset, position) slots — still no
/// allocation per id. Equality is map equality (insertion order does not matter).
#[derive(Clone, Default)]
pub struct IdIndex {
    /// The inline entries, back to back: `[position, length, bytes…]`, the bytes in
    /// native byte order so that the words read back as the id ([`id_bytes`]). Empty once
    /// the ids are in a table.
    words: Vec<u64>,
    /// How many ids the index holds.
    count: u32,
    /// The ids once there are more than [`INLINE_MAX`] (boxed: most tasks never need it,
    /// and an empty `Option<Box<_>>` takes one word).
    table: Option<Box<Table>>,
}

/// The ids of an index that holds many: their bytes in one buffer, found through a hash
/// table of where each starts and its position.
#[derive(Clone)]
struct Table {
    /// Each id's length (LEB128), then its bytes, back to back; a removed id's bytes stay
    /// until they make half the buffer.
    bytes: Vec<u8>,
    /// (Where the id starts in `bytes`, its position), hashed by the id.
    slots: HashTable<(usize, u64)>,
    /// The hash of ids (randomly keyed: ids come from tools).
    hasher: RandomState,
    /// Bytes of removed ids not yet dropped from `bytes`.
    dead: usize,
}

/// One inline entry, as [`IdIndex::entries`] finds it.
struct Entry<'a> {
    /// Where the entry starts in the index's words.
    start: usize,
    /// Where it ends (the next one starts).
    end: usize,
    /// Its id's bytes.
    id: &'a [u8],
    /// Its position.
    position: &'a u64,
}

impl<'a> Entry<'a> {
    /// The entry's id and position (only whole `&str`s are stored).
    fn pair(self) -> (&'a str, u64) {
        (
            std::str::from_utf8(self.id).unwrap_or_default(),
            *self.position,
        )
    }
}

/// How many words hold `len` bytes.
const fn words_for(len: usize) -> usize {
    len.div_ceil(8)
}

/// The first `len` bytes of `words`: an id stored by [`IdIndex::insert_new`].
fn id_bytes(words: &[u64], len: usize) -> &[u8] {
    bytemuck::cast_slice::<u64, u8>(words)
        .get(..len)
        .unwrap_or_default()
}

impl Table {
    /// An empty table with room for `ids` ids of about `len` bytes.
    fn with_room(ids: usize, len: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(ids * (len + 1)),
            slots: HashTable::with_capacity(ids),
            hasher: RandomState::new(),
            dead: 0,
        }
    }

    /// The id whose length starts at `at` in `bytes`, and where it ends.
    #[inline]
    fn id_at(bytes: &[u8], at: usize) -> (&[u8], usize) {
        // Most ids are shorter than 128 bytes: one byte of length.
        if let Some(&len) = bytes.get(at).filter(|&&len| len < 0x80) {
            let end = (at + 1 + usize::from(len)).min(bytes.len());
            return (&bytes[(at + 1).min(end)..end], end);
        }
        let (mut len, mut shift, mut i) = (0usize, 0u32, at);
        while let Some(&byte) = bytes.get(i) {
            i += 1;
            len |= usize::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        let end = (i + len).min(bytes.len());
        (&bytes[i.min(end)..end], end)
    }

    /// The slot of `id`.
    fn find(&self, id: &[u8]) -> Option<&(usize, u64)> {
        let hash = self.hasher.hash_one(id);
        self.slots
            .find(hash, |&(at, _)| same_id(Self::id_at(&self.bytes, at).0, id))
    }

    /// Records `id`, which the table does not hold, at `position`.
    fn add(&mut self, id: &[u8], position: u64) {
        let at = self.bytes.len();
        let mut len = id.len();
        loop {
            let low = u8::try_from(len & 0x7f).unwrap_or_default();
            len >>= 7;
            if len == 0 {
                self.bytes.push(low);
                break;
            }
            self.bytes.push(low | 0x80);
        }
        self.bytes.extend_from_slice(id);
        let (hasher, bytes) = (&self.hasher, &self.bytes);
        self.slots
            .insert_unique(hasher.hash_one(id), (at, position), |&(at, _)| {
                hasher.hash_one(Self::id_at(bytes, at).0)
            });
    }

    /// Forgets `id`; returns its position.
    fn remove(&mut self, id: &[u8]) -> Option<u64> {
        let hash = self.hasher.hash_one(id);
        let bytes = &self.bytes;
        let slot = self
            .slots
            .find_entry(hash, |&(at, _)| same_id(Self::id_at(bytes, at).0, id))
            .ok()?;
        let ((at, position), _) = slot.remove();
        self.dead += Self::id_at(&self.bytes, at).1 - at;
        if self.dead * 2 > self.bytes.len() {
            self.compact();
        }
        Some(position)
    }

    /// Every id with its position.
    fn iter(&self) -> impl Iterator<Item = (&[u8], u64)> {
        self.slots
            .iter()
            .map(|&(at, position)| (Self::id_at(&self.bytes, at).0, position))
    }

    /// Drops the bytes of removed ids: the live ones recorded again, in the order they were
    /// recorded.
    fn compact(&mut self) {
        let mut live: Vec<(usize, u64)> = self.slots.iter().copied().collect();
        live.sort_unstable();
        let mut table = Self::with_room(live.len(), 0);
        table.hasher = self.hasher.clone();
        for (at, position) in live {
            table.add(Self::id_at(&self.bytes, at).0, position);
        }
        *self = table;
    }
}

impl IdIndex {
    /// An empty index.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            words: Vec::new(),
            count: 0,
            table: None,
        }
    }

    /// The number of ids.
    #[must_use]
    pub fn len(&self) -> usize {
        self.table
            .as_ref()
            .map_or(self.count as usize, |table| table.slots.len())
    }

    /// Whether the index is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The inline entries, in insertion order.
    fn entries(&self) -> impl Iterator<Item = Entry<'_>> {
        let mut start = 0;
        std::iter::from_fn(move || {
            let (position, rest) = self.words.get(start..)?.split_first()?;
            let (len, rest) = rest.split_first()?;
            let len = usize::try_from(*len).ok()?;
            let end = start + HEADER_WORDS + words_for(len);
            let id = id_bytes(rest, len);
            let entry = Entry {
                start,
                end,
                id,
                position,
            };
            start = end;
            Some(entry)
        })
    }

    /// The inline entry of `id`.
    fn find(&self, id: &str) -> Option<Entry<'_>> {
        self.entries()
            .find(|entry| same_id(entry.id, id.as_bytes()))
    }

    /// Every id with its position (inline ids in insertion order, then in no order).
    pub fn iter(&self) -> Box<dyn Iterator<Item = (&str, u64)> + '_> {
        match &self.table {
            // Only whole `&str`s are stored.
            Some(table) => Box::new(
                table
                    .iter()
                    .map(|(id, position)| (std::str::from_utf8(id).unwrap_or_default(), position)),
            ),
            None => Box::new(self.entries().map(Entry::pair)),
        }
    }

    /// The position recorded for `id`.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<&u64> {
        match &self.table {
            Some(table) => table.find(id.as_bytes()).map(|(_, position)| position),
            None => self.find(id).map(|entry| entry.position),
        }
    }

    /// Whether `id` is recorded.
    #[must_use]
    pub fn contains_key(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// Records `id` at `position` (replacing an earlier position of the same id).
    pub fn insert(&mut self, id: &str, position: u64) {
        // A replaced id goes to the end, after the others.
        self.remove(id);
        self.insert_new(id, position);
    }

    /// Records `id`, which the caller knows is not recorded (the fold checks every id before
    /// it records it), at `position`: [`IdIndex::insert`] without the search for an earlier
    /// entry to replace.
    pub fn insert_new(&mut self, id: &str, position: u64) {
        debug_assert!(!self.contains_key(id), "{id:?} is already recorded");
        if let Some(table) = &mut self.table {
            table.add(id.as_bytes(), position);
            return;
        }
        if self.count >= INLINE_MAX {
            self.spill(id, position);
            return;
        }
        let size = HEADER_WORDS + words_for(id.len());
        if self.words.is_empty() {
            // Room for the first ids at once: growing from one entry took a reallocation
            // at each of the second, third and fifth.
            self.words.reserve(FIRST_ROOM * size);
        }
        self.words.push(position);
        self.words.push(id.len() as u64);
        for chunk in id.as_bytes().chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.words.push(u64::from_ne_bytes(word));
        }
        self.count += 1;
    }

    /// Moves the inline ids, and `id`, to a table.
    fn spill(&mut self, id: &str, position: u64) {
        let mut table = Table::with_room(2 * INLINE_MAX as usize, id.len());
        for entry in self.entries() {
            table.add(entry.id, *entry.position);
        }
        table.add(id.as_bytes(), position);
        self.table = Some(Box::new(table));
        self.words = Vec::new();
        self.count = 0;
    }

    /// Forgets `id`; returns its position.
    pub fn remove(&mut self, id: &str) -> Option<u64> {
        if let Some(table) = &mut self.table {
            return table.remove(id.as_bytes());
        }
        let (start, end, position) = self
            .find(id)
            .map(|entry| (entry.start, entry.end, *entry.position))?;
        self.words.drain(start..end);
        self.count -= 1;
        Some(position)
    }
}

impl<'a> IntoIterator for &'a IdIndex {
    type Item = (&'a str, u64);
    type IntoIter = Box<dyn Iterator<Item = (&'a str, u64)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl std::fmt::Debug for IdIndex {
    /// The ids and their positions, as a map.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl PartialEq for IdIndex {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|(id, p)| other.get(id) == Some(&p))
    }
}

impl Eq for IdIndex {}

/// Whether two ids are equal, looking at their last bytes before the rest: ids of one task
/// tend to share a prefix and differ at the end (`step-1`, `step-2`, …), and a lookup among
/// up to [`INLINE_MAX`] of them compares with each in turn.
#[inline]
fn same_id(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.last() == b.last() && a == b
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn behaves_like_a_hash_map(ops in proptest::collection::vec((0u8..4, 0u8..80, any::<u64>()), 0..300)) {
            let mut index = IdIndex::new();
            let mut model: HashMap<String, u64> = HashMap::new();
            for (op, id, position) in ops {
                // Ids of every length around the 8-byte words they are stored in, with
                // multi-byte characters among them, and some of more than 127 bytes (two
                // bytes of length in a table).
                let repeat = match id % 9 {
                    8 => 30 + usize::from(id % 5),
                    n => usize::from(n),
                };
                let id = format!("{}{id}", "ab€".repeat(repeat));
                match op {
                    0 | 1 => {
                        index.insert(&id, position);
                        model.insert(id, position);
                    }
                    // `insert_new` is for ids not recorded yet.
                    3 if !model.contains_key(&id) => {
                        index.insert_new(&id, position);
                        model.insert(id, position);
                    }
                    _ => prop_assert_eq!(index.remove(&id), model.remove(&id)),
                }
                prop_assert_eq!(index.len(), model.len());
            }
            for (id, position) in &model {
                prop_assert_eq!(index.get(id), Some(position));
            }
            prop_assert_eq!(index.iter().count(), model.len());
            prop_assert!(!index.contains_key("absent"));
        }
    }

    #[test]
    fn ids_of_any_length_come_back_whole() {
        let ids = [
            "",
            "a",
            "abcdefg",
            "abcdefgh",
            "abcdefghi",
            "€€€",
            "step-16",
            "step-17",
        ];
        let mut index = IdIndex::new();
        for (position, id) in (10..).zip(ids) {
            index.insert_new(id, position);
        }
        assert_eq!(index.len(), ids.len());
        let listed: Vec<_> = index.iter().collect();
        let expected: Vec<_> = ids.iter().copied().zip(10..).collect();
        assert_eq!(listed, expected);
        assert!(format!("{index:?}").starts_with(r#"{"": 10, "a": 11, "abcdefg": 12"#));
        // Removing from the middle keeps the entries after it whole.
        assert_eq!(index.remove("abcdefgh"), Some(13));
        assert_eq!(index.get("abcdefghi"), Some(&14));
        assert_eq!(index.get("step-17"), Some(&17));
        assert!(!index.contains_key("abcdefgh"));
        assert!(!index.contains_key("step-1"));
        assert_eq!(index.len(), ids.len() - 1);
    }

    #[test]
    fn many_ids_removed_and_recorded_again_stay_whole_through_compactions() {
        let mut index = IdIndex::new();
        let mut model: HashMap<String, u64> = HashMap::new();
        for n in 0..10_000u64 {
            let id = format!("line-{n}");
            index.insert_new(&id, n);
            model.insert(id, n);
        }
        // Remove three in four (the words compact as holes pass half of them), then record
        // some of them again at new positions.
        for n in (0..10_000u64).filter(|n| n % 4 != 0) {
            let id = format!("line-{n}");
            assert_eq!(index.remove(&id), model.remove(&id));
        }
        assert!(
            index.words.len() < 10_000 * 4,
            "compacted: {}",
            index.words.len()
        );
        for n in (0..10_000u64).filter(|n| n % 8 == 1) {
            let id = format!("line-{n}");
            index.insert(&id, n + 100_000);
            model.insert(id, n + 100_000);
        }
        assert_eq!(index.len(), model.len());
        for (id, position) in &model {
            assert_eq!(index.get(id), Some(position), "{id}");
        }
        assert!(!index.contains_key("line-3"));
        let listed: HashMap<String, u64> = index.iter().map(|(id, p)| (id.to_owned(), p)).collect();
        assert_eq!(listed, model);
        assert_eq!(index.clone(), index);
    }
}
