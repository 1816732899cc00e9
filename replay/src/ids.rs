//! [`IdIndex`]: event ids → stream positions, compact for the few ids most tasks have.

use std::collections::HashMap;

/// Ids held inline (in one buffer) before the index becomes a hash map.
const INLINE_MAX: u32 = 32;

/// How many ids of the first one's length an index makes room for at its first insert.
const FIRST_ROOM: usize = 4;

/// The words of an inline entry before its id's bytes: its position and the id's length.
const HEADER_WORDS: usize = 2;

/// A map from event ids (update, notification and outbox ids) to the position of the record
/// that recorded them.
///
/// Every live task holds three of these in memory, and most hold a handful of ids, or none:
/// up to 32 ids are kept in **one** buffer of words, entry after entry — the position, the
/// id's length, then the id's bytes in whole words — and looked up by a linear scan (one
/// allocation for the lot, no per-id string, and an empty index takes five words); beyond
/// that, a hash map. Equality is map equality (insertion order does not matter).
#[derive(Clone, Default)]
pub struct IdIndex {
    /// The inline entries, back to back: `[position, length, bytes…]`, the bytes in
    /// native byte order so that the words read back as the id ([`id_bytes`]).
    words: Vec<u64>,
    /// How many entries `words` holds.
    count: u32,
    /// The ids once there are more than [`INLINE_MAX`] (boxed: most tasks never need it,
    /// and an empty `Option<Box<_>>` takes one word where a map takes six).
    #[allow(clippy::box_collection, reason = "keeps the common, small index small")]
    map: Option<Box<HashMap<Box<str>, u64>>>,
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

impl IdIndex {
    /// An empty index.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            words: Vec::new(),
            count: 0,
            map: None,
        }
    }

    /// The number of ids.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map
            .as_ref()
            .map_or(self.count as usize, |map| map.len())
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
        match &self.map {
            Some(map) => Box::new(map.iter().map(|(id, position)| (&**id, *position))),
            None => Box::new(self.entries().map(|entry| {
                // Only whole `&str`s are stored.
                (
                    std::str::from_utf8(entry.id).unwrap_or_default(),
                    *entry.position,
                )
            })),
        }
    }

    /// The position recorded for `id`.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<&u64> {
        match &self.map {
            Some(map) => map.get(id),
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
        if let Some(map) = &mut self.map {
            map.insert(id.into(), position);
            return;
        }
        // A replaced id goes to the end, after the others.
        self.remove(id);
        self.insert_new(id, position);
    }

    /// Records `id`, which the caller knows is not recorded (the fold checks every id before
    /// it records it), at `position`: [`IdIndex::insert`] without the search for an earlier
    /// entry to replace.
    pub fn insert_new(&mut self, id: &str, position: u64) {
        debug_assert!(!self.contains_key(id), "{id:?} is already recorded");
        if let Some(map) = &mut self.map {
            map.insert(id.into(), position);
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

    /// Moves the inline ids, and `id`, to a hash map.
    fn spill(&mut self, id: &str, position: u64) {
        let mut map: HashMap<Box<str>, u64> = self
            .iter()
            .map(|(id, position)| (id.into(), position))
            .collect();
        map.insert(id.into(), position);
        self.map = Some(Box::new(map));
        self.words = Vec::new();
        self.count = 0;
    }

    /// Forgets `id`; returns its position.
    pub fn remove(&mut self, id: &str) -> Option<u64> {
        if let Some(map) = &mut self.map {
            return map.remove(id);
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

    proptest! {
        #[test]
        fn behaves_like_a_hash_map(ops in proptest::collection::vec((0u8..4, 0u8..80, any::<u64>()), 0..300)) {
            let mut index = IdIndex::new();
            let mut model: HashMap<String, u64> = HashMap::new();
            for (op, id, position) in ops {
                // Ids of every length around the 8-byte words they are stored in, with
                // multi-byte characters among them.
                let id = format!("{}{id}", "ab€".repeat(usize::from(id % 9)));
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
}
