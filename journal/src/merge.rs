//! Two sorted sources of one key space read as one.
//!
//! A RocksDB journal keeps its `events` space in two column families from format 4 on: the
//! streams without a terminal record in `events`, the finished ones in
//! [`FINISHED_EVENTS`](crate::keys::FINISHED_EVENTS). Every read of the space sees the two
//! as one ordered space through these. A record moves only from `events` to `finished`, so a
//! reader that makes its `events` iterator first and its `finished` one second misses no
//! record moved in between: it sees it in the first (before the move), in the second (after
//! it), or in both, and then it comes once — the first's copy, so that a key put in `events`
//! over a moved record (only damage does that) is what reads see.

use crate::backend::{Cursor, KeyValue, RawIter, Source};
use crate::error::Result;
use std::cmp::Ordering;
use std::iter::Peekable;

/// Two [`RawIter`]s over the same range, in the same direction, as one.
pub(crate) struct Merged<'a> {
    first: Peekable<RawIter<'a>>,
    second: Peekable<RawIter<'a>>,
    reverse: bool,
    /// A storage error came: nothing follows it.
    failed: bool,
}

impl<'a> Merged<'a> {
    /// `first` and `second` merged; `reverse` when both run backwards.
    pub(crate) fn new(first: RawIter<'a>, second: RawIter<'a>, reverse: bool) -> Self {
        Self {
            first: first.peekable(),
            second: second.peekable(),
            reverse,
            failed: false,
        }
    }
}

impl Iterator for Merged<'_> {
    type Item = Result<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let order = match (self.first.peek(), self.second.peek()) {
            (None, None) => return None,
            // An error comes at once.
            (Some(Err(_)), _) | (Some(Ok(_)), None) => Ordering::Less,
            (_, Some(Err(_))) | (None, Some(Ok(_))) => Ordering::Greater,
            (Some(Ok((a, _))), Some(Ok((b, _)))) => {
                let order = a.cmp(b);
                if self.reverse {
                    order.reverse()
                } else {
                    order
                }
            }
        };
        let item = match order {
            Ordering::Less => self.first.next(),
            Ordering::Greater => self.second.next(),
            Ordering::Equal => {
                self.second.next();
                self.first.next()
            }
        };
        self.failed = matches!(item, Some(Err(_)));
        item
    }
}

/// Two forward [`Cursor`]s over the same space as one.
pub(crate) struct MergedCursor<'a> {
    first: Box<dyn Cursor + 'a>,
    second: Box<dyn Cursor + 'a>,
    /// The current entry is the first cursor's (also when both stand at the same key).
    on_first: bool,
}

impl<'a> MergedCursor<'a> {
    /// `first` and `second` merged; neither positioned yet.
    pub(crate) fn new(first: Box<dyn Cursor + 'a>, second: Box<dyn Cursor + 'a>) -> Self {
        Self {
            first,
            second,
            on_first: true,
        }
    }

    fn settle(&mut self) {
        self.on_first = match (self.first.key(), self.second.key()) {
            (Some(a), Some(b)) => a <= b,
            (Some(_) | None, None) => true,
            (None, Some(_)) => false,
        };
    }
}

impl Cursor for MergedCursor<'_> {
    fn seek(&mut self, key: &[u8]) {
        self.first.seek(key);
        self.second.seek(key);
        self.settle();
    }

    fn next(&mut self) {
        let same = matches!((self.first.key(), self.second.key()), (Some(a), Some(b)) if a == b);
        if same {
            self.first.next();
            self.second.next();
        } else if self.on_first {
            self.first.next();
        } else {
            self.second.next();
        }
        self.settle();
    }

    fn key(&self) -> Option<&[u8]> {
        if self.on_first {
            self.first.key()
        } else {
            self.second.key()
        }
    }

    fn value(&self) -> Option<&[u8]> {
        if self.on_first {
            self.first.value()
        } else {
            self.second.value()
        }
    }

    fn status(&self) -> Result<()> {
        self.first.status().and(self.second.status())
    }

    fn source(&self) -> Source {
        match (self.first.key(), self.second.key()) {
            (Some(a), Some(b)) if a == b => Source::Both,
            _ if self.on_first => Source::First,
            _ => Source::Second,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// What a column family holds.
    type Map = BTreeMap<Vec<u8>, Vec<u8>>;

    /// A cursor over a sorted map (what a column family holds).
    struct MapCursor {
        entries: Vec<(Vec<u8>, Vec<u8>)>,
        at: Option<usize>,
    }

    impl MapCursor {
        fn new(map: &Map) -> Self {
            Self {
                entries: map.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                at: None,
            }
        }
    }

    impl Cursor for MapCursor {
        fn seek(&mut self, key: &[u8]) {
            self.at = Some(self.entries.partition_point(|(k, _)| k.as_slice() < key));
        }
        fn next(&mut self) {
            if let Some(at) = &mut self.at {
                *at = (*at + 1).min(self.entries.len());
            }
        }
        fn key(&self) -> Option<&[u8]> {
            self.entries.get(self.at?).map(|(k, _)| k.as_slice())
        }
        fn value(&self) -> Option<&[u8]> {
            self.entries.get(self.at?).map(|(_, v)| v.as_slice())
        }
        fn status(&self) -> Result<()> {
            Ok(())
        }
    }

    fn iter(map: &Map, reverse: bool) -> RawIter<'static> {
        let mut items: Vec<Result<KeyValue>> = map
            .iter()
            .map(|(k, v)| Ok((k.clone().into_boxed_slice(), v.clone().into_boxed_slice())))
            .collect();
        if reverse {
            items.reverse();
        }
        Box::new(items.into_iter())
    }

    /// Two maps that share some keys (a record seen before and after its move).
    fn halves() -> impl Strategy<Value = (Map, Map)> {
        let key = proptest::collection::vec(0u8..4, 0..4);
        proptest::collection::vec((key, any::<u8>(), 0u8..3), 0..24).prop_map(|entries| {
            let (mut first, mut second) = (BTreeMap::new(), BTreeMap::new());
            for (key, value, side) in entries {
                // 0: first only, 1: second only, 2: both (the first's copy marked).
                if side != 1 {
                    first.insert(key.clone(), vec![value, 1]);
                }
                if side != 0 {
                    second.insert(key, vec![value, 2]);
                }
            }
            (first, second)
        })
    }

    /// The union of the two, the first's copy of a key in both.
    fn union(first: &Map, second: &Map) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut all = second.clone();
        all.extend(first.iter().map(|(k, v)| (k.clone(), v.clone())));
        all.into_iter().collect()
    }

    proptest! {
        #[test]
        fn merged_scans_are_the_union_in_both_directions((first, second) in halves()) {
            let expected = union(&first, &second);
            let forward: Vec<_> = Merged::new(iter(&first, false), iter(&second, false), false)
                .map(|item| item.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
                .collect();
            prop_assert_eq!(&forward, &expected);
            let mut backward: Vec<_> = Merged::new(iter(&first, true), iter(&second, true), true)
                .map(|item| item.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
                .collect();
            backward.reverse();
            prop_assert_eq!(&backward, &expected);
        }

        #[test]
        fn a_merged_cursor_reads_the_union_from_any_key(
            (first, second) in halves(),
            from in proptest::collection::vec(0u8..4, 0..4),
        ) {
            let expected: Vec<_> = union(&first, &second)
                .into_iter()
                .filter(|(k, _)| *k >= from)
                .collect();
            let mut cursor = MergedCursor::new(
                Box::new(MapCursor::new(&first)),
                Box::new(MapCursor::new(&second)),
            );
            cursor.seek(&from);
            let mut read = Vec::new();
            while let (Some(k), Some(v)) = (cursor.key(), cursor.value()) {
                read.push((k.to_vec(), v.to_vec()));
                cursor.next();
            }
            prop_assert_eq!(read, expected);
            prop_assert!(cursor.status().is_ok());
        }
    }

    #[test]
    fn an_error_ends_a_merged_scan() {
        let failing: RawIter<'static> = Box::new(
            vec![
                Ok((b"a".to_vec().into_boxed_slice(), Box::default())),
                Err(crate::Error::storage("disk")),
                Ok((b"c".to_vec().into_boxed_slice(), Box::default())),
            ]
            .into_iter(),
        );
        let other: RawIter<'static> =
            Box::new(vec![Ok((b"b".to_vec().into_boxed_slice(), Box::default()))].into_iter());
        let items: Vec<_> = Merged::new(failing, other, false).collect();
        assert_eq!(
            items.len(),
            2,
            "the first key, then the error, then nothing"
        );
        assert!(items[1].is_err());
    }
}
