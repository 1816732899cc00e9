//! One memtable insertion hint per task in the `events` space.
//!
//! RocksDB's memtable is a skip list, and an insert searches it from the top: a few dozen key
//! comparisons, most of them cache misses once the memtable holds tens of megabytes. A task's
//! records are appended in position order, so its next key sorts right after its last one.
//! With an *insertion hint prefix extractor*, RocksDB keeps, for every prefix, where it last
//! inserted a key with that prefix, and starts the next insert of the prefix there. The
//! `events` space names an extractor that maps an event key to its task's prefix (task id ‖
//! separator, [`crate::keys`]): every task has one hint.
//!
//! RocksDB's C API has no setter for this option and its built-in extractors take a fixed
//! number of leading bytes, which task ids of any length do not have. So the extractor is a
//! few lines of C++ (`cpp/key_prefix.cc`, compiled by the build script against the headers of
//! the RocksDB that is linked), registered by name in RocksDB's object library; the options
//! string names it. The key layout stays in [`crate::keys`], which passes its widths in.
//!
//! A hint changes where a search starts, never what is stored or read: a key outside the
//! extractor's domain is inserted without one, and a hint that does not bracket the key is
//! widened until it does. Each task's hint costs a splice in the memtable's arena (about
//! 250 bytes, counted in the memtable's size) and an entry of RocksDB's hint map on the heap
//! (not counted), for as long as that memtable lives: a memtable holding a record or two each
//! of many tasks fills a little sooner.

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

use crate::keys::{POSITION_BYTES, TASK_SEPARATOR};

#[allow(unsafe_code)]
extern "C" {
    /// Registers the extractor of keys that end in `separator` and `tail` more bytes (once per
    /// process) and returns its registered name, a static NUL-terminated ASCII string.
    fn dtask_register_task_prefix(tail: usize, separator: u8) -> *const c_char;
}

/// The RocksDB options string that gives the `events` space one insertion hint per task,
/// registering the extractor it names on first use.
pub(crate) fn events_memtable_options() -> &'static str {
    static OPTIONS: OnceLock<String> = OnceLock::new();
    OPTIONS.get_or_init(|| {
        #[allow(unsafe_code)]
        // SAFETY: the function takes two plain integers, registers under a `std::call_once`
        // (safe from any thread) and returns a pointer to a string literal of its own, valid
        // and unchanged for the life of the process.
        let name =
            unsafe { CStr::from_ptr(dtask_register_task_prefix(POSITION_BYTES, TASK_SEPARATOR)) };
        format!(
            "memtable_insert_with_hint_prefix_extractor={}",
            name.to_string_lossy()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{event_key, task_prefix, EVENT_KEY_SUFFIX, MAX_POSITION};
    use proptest::prelude::*;

    #[allow(unsafe_code)]
    extern "C" {
        fn dtask_task_prefix_of(key: *const c_char, len: usize, prefix_len: *mut usize) -> bool;
    }

    /// The registered extractor, looked up by name as RocksDB does: the prefix of `key`, or
    /// `None` outside its domain.
    fn prefix_of(key: &[u8]) -> Option<&[u8]> {
        let _ = events_memtable_options();
        let mut len = 0;
        #[allow(unsafe_code)]
        // SAFETY: the pointer and length describe `key`, which outlives the call; the
        // function writes only `len`.
        let found = unsafe { dtask_task_prefix_of(key.as_ptr().cast(), key.len(), &raw mut len) };
        found.then(|| &key[..len])
    }

    #[test]
    fn the_options_string_names_the_registered_extractor() {
        assert_eq!(
            events_memtable_options(),
            "memtable_insert_with_hint_prefix_extractor=dtask.TaskPrefix"
        );
    }

    proptest! {
        /// Any task id (UTF-8 without NUL, of any length) and any position.
        #[test]
        fn every_event_key_of_a_task_has_the_task_prefix(
            task in "[^\\x00]{0,40}",
            position in 0..=MAX_POSITION,
        ) {
            let key = event_key(&task, position);
            let prefix = task_prefix(&task);
            prop_assert_eq!(prefix_of(&key), Some(prefix.as_slice()));
        }

        #[test]
        fn keys_of_other_shapes_are_outside_the_domain_or_a_prefix(
            bytes in proptest::collection::vec(any::<u8>(), 0..30),
        ) {
            match prefix_of(&bytes) {
                None => prop_assert!(
                    bytes.len() < EVENT_KEY_SUFFIX
                        || bytes[bytes.len() - EVENT_KEY_SUFFIX] != TASK_SEPARATOR
                ),
                Some(prefix) => prop_assert_eq!(prefix.len(), bytes.len() - POSITION_BYTES),
            }
        }
    }
}
