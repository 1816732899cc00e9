//! One ordered worker pool, shared by recovery's fold ([`crate::load_tasks_each`]) and the
//! audit: inputs are handed to worker threads, each with its own state (a journal reader),
//! and their outputs come back to the calling thread **in input order**, while later inputs
//! are still being worked on. At most `in_flight` inputs are out at a time, so memory is
//! bounded by that, not by the journal.

use std::collections::BTreeMap;
use std::sync::{mpsc, Mutex};

/// A worker thread panicked: its input's output never came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Panicked;

/// Threads to use for `inputs` inputs of work when each thread should get at least `min`:
/// at most the machine's cores (and 8), at least 1.
pub(crate) fn threads_for(inputs: usize, min: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .clamp(1, 8)
        .min(inputs / min.max(1))
        .max(1)
}

/// Runs `work` over `inputs` on `threads` threads (on the calling thread alone when 1) and
/// hands each output to `consume` on the calling thread, in input order. `work` gets the
/// thread's state (made by `state` once per thread) and the input's number. When `consume`
/// returns `false`, no more inputs are handed out and the outputs still outstanding are
/// dropped.
///
/// # Errors
/// [`Panicked`] when `work` panicked on a worker thread: nothing more is handed out or over,
/// and the other threads end once the inputs handed out are done.
pub(crate) fn ordered<I, O, S>(
    threads: usize,
    in_flight: usize,
    inputs: impl Iterator<Item = I>,
    state: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, usize, I) -> O + Sync,
    mut consume: impl FnMut(O) -> bool,
) -> Result<(), Panicked>
where
    I: Send,
    O: Send,
{
    if threads <= 1 {
        let mut state = state();
        for (i, input) in inputs.enumerate() {
            if !consume(work(&mut state, i, input)) {
                break;
            }
        }
        return Ok(());
    }
    let in_flight = in_flight.max(threads);
    let (give, queue) = mpsc::channel::<(usize, I)>();
    let queue = Mutex::new(queue);
    let (done, outputs) = mpsc::channel::<(usize, Result<O, Panicked>)>();
    std::thread::scope(|scope| {
        let mut workers = Vec::with_capacity(threads);
        for _ in 0..threads {
            let done = done.clone();
            let (queue, state, work) = (&queue, &state, &work);
            workers.push(scope.spawn(move || {
                let mut state = state();
                loop {
                    let next = match queue.lock() {
                        Ok(queue) => queue.recv(),
                        Err(_) => break,
                    };
                    let Ok((i, input)) = next else { break };
                    // A panic is caught and reported as this input's output, so that the
                    // caller stops waiting for it (the panic message is printed as usual).
                    let output = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        work(&mut state, i, input)
                    }))
                    .map_err(|_| Panicked);
                    let failed = output.is_err();
                    if done.send((i, output)).is_err() || failed {
                        break;
                    }
                }
            }));
        }
        drop(done);
        let mut inputs = inputs.enumerate();
        let mut given = 0;
        let mut next = 0;
        let mut waiting = BTreeMap::new();
        // Whether inputs may still be handed out: until they run out or `consume` stops.
        let mut feeding = true;
        let mut panicked = false;
        loop {
            while feeding && given - next < in_flight {
                match inputs.next().map(|input| give.send(input)) {
                    Some(Ok(())) => given += 1,
                    _ => feeding = false,
                }
            }
            if next == given {
                break;
            }
            // Every output comes, a panic as `Err`.
            let Ok((i, Ok(output))) = outputs.recv() else {
                panicked = true;
                break;
            };
            waiting.insert(i, output);
            while let Some(output) = waiting.remove(&next) {
                next += 1;
                if !consume(output) {
                    // Stopped: nothing more is handed out, nor handed over.
                    feeding = false;
                    next = given;
                    waiting.clear();
                    break;
                }
            }
        }
        // The workers end once the inputs handed out are done.
        drop(give);
        for worker in workers {
            panicked |= worker.join().is_err();
        }
        if panicked {
            Err(Panicked)
        } else {
            Ok(())
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn outputs_come_in_input_order_on_any_number_of_threads() {
        for threads in [1, 2, 4] {
            let mut seen = Vec::new();
            ordered(
                threads,
                3,
                0..100u64,
                || 0u64,
                |calls, i, x| {
                    *calls += 1;
                    assert_eq!(i as u64, x);
                    // Uneven work, so that outputs finish out of order.
                    std::hint::black_box((0..(x % 7) * 1000).sum::<u64>());
                    x
                },
                |x| {
                    seen.push(x);
                    true
                },
            )
            .unwrap();
            assert_eq!(seen, (0..100).collect::<Vec<_>>(), "{threads} threads");
        }
    }

    #[test]
    fn consume_stops_the_inputs() {
        for threads in [1, 3] {
            let mut seen = Vec::new();
            let given = std::sync::atomic::AtomicUsize::new(0);
            ordered(
                threads,
                4,
                (0..1000).inspect(|_| {
                    given.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }),
                || (),
                |(), _, x| x,
                |x| {
                    seen.push(x);
                    x < 10
                },
            )
            .unwrap();
            assert_eq!(seen, (0..=10).collect::<Vec<_>>(), "{threads} threads");
            // Only the inputs in flight past the stop were handed out.
            assert!(given.into_inner() <= 11 + 4 + threads, "{threads} threads");
        }
    }

    #[test]
    fn a_panicking_worker_is_an_error() {
        let outcome = ordered(
            2,
            4,
            0..100,
            || (),
            |(), _, x| {
                assert_ne!(x, 37, "a bug in the work");
                x
            },
            |_| true,
        );
        assert_eq!(outcome, Err(Panicked));
    }
}
