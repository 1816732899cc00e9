//! The memory and speed of a task's event-id index (`dtask::replay::IdIndex`) with many ids —
//! a long-running tool's progress updates, one id each, kept for the deduplication for as
//! long as the task can run — against a hash map of boxed ids (the index's representation of
//! many ids before it kept them in one buffer), in alternating rounds: heap bytes per id
//! (counted by this bench's allocator as the system allocator holds them: usable sizes and
//! chunk headers), inserts and lookups per second.
//!
//! Run: `cargo bench --bench ids` (`-- --ids 100000` for another count, `--rounds 5`).
#![allow(
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_wrap,
    unsafe_code,
    missing_docs
)]

mod common;

use clap::Parser;
use dtask::replay::IdIndex;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

/// The system allocator, counting the bytes it holds for the allocations not yet freed as
/// it hands them out: each one's usable size (the request rounded up to the allocator's
/// chunk) and the chunk's header word — what a map with one small allocation an id pays
/// beyond the sizes it asks for.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The bytes the allocator holds for the allocation at `ptr` (none for a null pointer).
fn held(ptr: *mut u8) -> isize {
    if ptr.is_null() {
        return 0;
    }
    // SAFETY: `ptr` is a live allocation of the system allocator (glibc's malloc).
    let usable = unsafe { libc::malloc_usable_size(ptr.cast()) };
    usable as isize + 8
}

// SAFETY: every call is the system allocator's, with the caller's own arguments; the count
// is a side table.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        let ptr = unsafe { System.alloc(layout) };
        LIVE.fetch_add(held(ptr), Ordering::Relaxed);
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(held(ptr), Ordering::Relaxed);
        // SAFETY: a pointer this allocator gave out, with its layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let before = held(ptr);
        // SAFETY: as for `realloc`'s caller.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            LIVE.fetch_add(held(moved) - before, Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The index's memory and speed with many ids.
#[derive(Debug, Parser)]
struct Args {
    /// Ids in each index.
    #[arg(long, default_value_t = 1_000_000)]
    ids: u64,
    /// Alternating rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[command(flatten)]
    _cargo: common::CargoBench,
}

/// What one build of an index cost: heap bytes per id, inserts/s, lookups/s.
#[derive(Debug, Clone, Copy)]
struct Cost {
    bytes: f64,
    inserts: f64,
    lookups: f64,
}

/// The ids a tool's updates typically carry.
fn id(n: u64) -> String {
    format!("line-{n}")
}

fn measure<M>(
    ids: u64,
    new: impl Fn() -> M,
    insert: impl Fn(&mut M, &str, u64),
    get: impl Fn(&M, &str) -> Option<u64>,
) -> Cost {
    let names: Vec<String> = (0..ids).map(id).collect();
    let before = LIVE.load(Ordering::Relaxed);
    let start = Instant::now();
    let mut index = new();
    for (n, name) in (0..).zip(&names) {
        insert(&mut index, name, n);
    }
    let inserts = ids as f64 / start.elapsed().as_secs_f64();
    let bytes = (LIVE.load(Ordering::Relaxed) - before) as f64 / ids as f64;
    let start = Instant::now();
    let mut found = 0u64;
    for name in &names {
        found += u64::from(get(&index, name).is_some());
    }
    let lookups = ids as f64 / start.elapsed().as_secs_f64();
    assert_eq!(found, ids);
    drop(index);
    Cost {
        bytes,
        inserts,
        lookups,
    }
}

fn main() {
    let args = Args::parse();
    println!(
        "event-id index with {} ids (`line-N`; {} rounds, the two alternating: medians, and \
         the range of the per-round ratios)",
        args.ids, args.rounds
    );
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        for column in 0..2 {
            if (column + round) % 2 == 0 {
                ours.push(measure(
                    args.ids,
                    IdIndex::new,
                    IdIndex::insert_new,
                    |index, name| index.get(name).copied(),
                ));
            } else {
                base.push(measure(
                    args.ids,
                    HashMap::<Box<str>, u64>::new,
                    |map, name, n| {
                        map.insert(name.into(), n);
                    },
                    |map, name| map.get(name).copied(),
                ));
            }
        }
    }
    let row = |what: &str, of: fn(&Cost) -> f64, unit: &str| {
        let (o, b): (Vec<f64>, Vec<f64>) =
            (ours.iter().map(of).collect(), base.iter().map(of).collect());
        println!(
            "{what:>8}: IdIndex {:>12.1} {unit}, boxed-id map {:>12.1} {unit}, ratio {}",
            common::Spread::of(&o).median,
            common::Spread::of(&b).median,
            common::Spread::of_ratios(&o, &b).ratio()
        );
    };
    row("memory", |c| c.bytes, "B/id");
    row("inserts", |c| c.inserts, "/s");
    row("lookups", |c| c.lookups, "/s");
}
