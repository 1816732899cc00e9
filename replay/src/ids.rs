//! [`IdIndex`]: event ids → stream positions, compact for the few ids most tasks have.

use std::collections::HashMap;

/// Ids held inline (back to back in one buffer) before the index becomes a hash map.
const INLINE_MAX: usize = 32;

/// How many ids of the first one's length an index makes room for at its first insert.
const FIRST_ROOM: usize = 4;

/// A map from event ids (update, notification and outbox ids) to the position of the record
/// that recorded them.
///
/// Every live task holds three of these in memory, and most hold a handful of ids: up to
/// 32 ids are kept in one byte buffer with a small table of (end, position) —
/// two allocations, no per-id string — and looked up by a linear scan; beyond that, a hash
/// map. Equality is map equality (insertion order does not matter).
#[derive(Debug, Clone, Default)]
pub struct IdIndex {
    /// The inline ids, back to back.
    bytes: Vec<u8>,
    /// Per inline id: where it ends in `bytes`, and its position.
    entries: Vec<(u32, u64)>,
    /// The ids once there are more than [`INLINE_MAX`] (boxed: most tasks never need it,
    /// and an empty `Option<Box<_>>` takes one word where a map takes six).
    #[allow(clippy::box_collection, reason = "keeps the common, small index small")]
    map: Option<Box<HashMap<Box<str>, u64>>>,
}

impl IdIndex {
    /// An empty index.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            bytes: Vec::new(),
            entries: Vec::new(),
            map: None,
        }
    }

    /// The number of ids.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map
            .as_ref()
            .map_or(self.entries.len(), |map| map.len())
    }

    /// Whether the index is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The inline ids with their positions, in insertion order.
    fn inline(&self) -> impl Iterator<Item = (&str, &u64)> {
        self.inline_bytes().map(|(id, position)| {
            // Only whole `&str`s are stored, and cut at their ends.
            (std::str::from_utf8(id).unwrap_or_default(), position)
        })
    }

    /// [`IdIndex::inline`] as bytes: what a lookup compares, without checking each
    /// candidate's UTF-8 again.
    fn inline_bytes(&self) -> impl Iterator<Item = (&[u8], &u64)> {
        let mut start = 0;
        self.entries.iter().map(move |(end, position)| {
            let end = *end as usize;
            let id = self.bytes.get(start..end).unwrap_or_default();
            start = end;
            (id, position)
        })
    }

    /// Every id with its position (inline ids in insertion order, then in no order).
    pub fn iter(&self) -> Box<dyn Iterator<Item = (&str, u64)> + '_> {
        match &self.map {
            Some(map) => Box::new(map.iter().map(|(id, position)| (&**id, *position))),
            None => Box::new(self.inline().map(|(id, position)| (id, *position))),
        }
    }

    /// The position recorded for `id`.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<&u64> {
        match &self.map {
            Some(map) => map.get(id),
            None => self
                .inline_bytes()
                .find(|(candidate, _)| same_id(candidate, id.as_bytes()))
                .map(|(_, position)| position),
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
        match u32::try_from(self.bytes.len() + id.len()) {
            Ok(end) if self.entries.len() < INLINE_MAX => {
                if self.entries.is_empty() {
                    // Room for the first ids at once: growing from one id's bytes took a
                    // reallocation at each of the second, third and fifth.
                    self.bytes.reserve(FIRST_ROOM * id.len());
                    self.entries.reserve(FIRST_ROOM);
                }
                self.bytes.extend_from_slice(id.as_bytes());
                self.entries.push((end, position));
            }
            _ => self.spill(id, position),
        }
    }

    /// Moves the inline ids, and `id`, to a hash map.
    fn spill(&mut self, id: &str, position: u64) {
        let mut map: HashMap<Box<str>, u64> = self
            .inline()
            .map(|(id, position)| (id.into(), *position))
            .collect();
        map.insert(id.into(), position);
        self.map = Some(Box::new(map));
        self.bytes = Vec::new();
        self.entries = Vec::new();
    }

    /// Forgets `id`; returns its position.
    pub fn remove(&mut self, id: &str) -> Option<u64> {
        if let Some(map) = &mut self.map {
            return map.remove(id);
        }
        let mut start = 0usize;
        let mut found = None;
        for (i, (candidate, position)) in self.inline_bytes().enumerate() {
            if same_id(candidate, id.as_bytes()) {
                found = Some((i, start, start + candidate.len(), *position));
                break;
            }
            start += candidate.len();
        }
        let (i, start, end, position) = found?;
        self.bytes.drain(start..end);
        self.entries.remove(i);
        let removed = u32::try_from(end - start).unwrap_or(u32::MAX);
        for entry in &mut self.entries[i..] {
            entry.0 -= removed;
        }
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
                let id = format!("id-{id}");
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
}
