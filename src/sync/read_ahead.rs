//! Reading a known list of items ahead of the one consuming them, on a thread of its own, within
//! a budget of items and bytes: `ckpt.dcp.Reader` decodes the next items of its load plan from
//! the store while DCP's `torch.load` and copy of the current one run.
//!
//! The list is the order the consumer is expected to ask in; it may ask in any other. An item
//! asked for that the worker has not started is the consumer's to read itself
//! ([`ReadAhead::take`] returns `None`) and the worker skips it; one being read is waited for.
//! Items larger than the byte budget are never read ahead, so what is held ahead is at most
//! the budget whatever the items' sizes.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// How far a [`ReadAhead`] may run ahead of its consumer: items read (or being read) and not
/// taken yet, in number and in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadAheadLimits {
    /// Items held at most.
    pub max_items: usize,
    /// Bytes held at most; an item larger than this is never read ahead.
    pub max_bytes: u64,
}

enum Slot<T, E> {
    /// Not started.
    Waiting,
    /// The consumer reads it itself (it asked first, or the item is over the byte budget).
    Consumer,
    /// The worker is reading it.
    Reading,
    Ready(Result<T, E>),
    /// Taken by the consumer.
    Taken,
}

struct State<T, E> {
    slots: Vec<Slot<T, E>>,
    held_items: usize,
    held_bytes: u64,
    /// Set when the reader is dropped: the worker stops after its current item.
    stop: bool,
    /// Set when the worker has ended (also by a panic): nothing more will be ready.
    worker_done: bool,
}

struct Shared<T, E> {
    state: Mutex<State<T, E>>,
    changed: Condvar,
}

impl<T, E> Shared<T, E> {
    fn lock(&self) -> MutexGuard<'_, State<T, E>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Marks the worker done when it ends, however it ends (a panicking `read` included), so that a
/// consumer waiting on an item is never left waiting.
struct DoneGuard<T, E>(Arc<Shared<T, E>>);

impl<T, E> Drop for DoneGuard<T, E> {
    fn drop(&mut self) {
        self.0.lock().worker_done = true;
        self.0.changed.notify_all();
    }
}

/// Items `0..n` read ahead, in order, by `read(i)` on a thread of its own. Dropping it stops the
/// worker (after the item it is reading) and waits for it.
pub struct ReadAhead<T, E> {
    shared: Arc<Shared<T, E>>,
    lens: Arc<[u64]>,
    worker: Option<JoinHandle<()>>,
}

impl<T: Send + 'static, E: Send + 'static> ReadAhead<T, E> {
    /// Starts reading items of lengths `lens` (item `i` is `read(i)`, `lens[i]` bytes as far
    /// as the budget counts) ahead of [`Self::take`], within `limits`.
    pub fn start<F>(lens: Vec<u64>, limits: ReadAheadLimits, read: F) -> std::io::Result<Self>
    where
        F: FnMut(usize) -> Result<T, E> + Send + 'static,
    {
        let lens: Arc<[u64]> = lens.into();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: lens.iter().map(|_| Slot::Waiting).collect(),
                held_items: 0,
                held_bytes: 0,
                stop: false,
                worker_done: false,
            }),
            changed: Condvar::new(),
        });
        let worker = {
            let (shared, lens) = (shared.clone(), lens.clone());
            std::thread::Builder::new()
                .name("ckpt-read-ahead".into())
                .spawn(move || work(&shared, &lens, limits, read))?
        };
        Ok(ReadAhead { shared, lens, worker: Some(worker) })
    }
}

impl<T, E> ReadAhead<T, E> {
    /// Item `i` as the worker read it, waiting while it is being read; `None` when the worker
    /// has not started it (it will not now: the caller reads it), when it was taken before, or
    /// when `i` is not an item.
    pub fn take(&self, i: usize) -> Option<Result<T, E>> {
        let mut state = self.shared.lock();
        loop {
            let worker_done = state.worker_done;
            let slot = state.slots.get_mut(i)?;
            match slot {
                Slot::Waiting | Slot::Consumer => {
                    *slot = Slot::Consumer;
                    return None;
                }
                Slot::Taken => return None,
                Slot::Reading if worker_done => return None,
                Slot::Reading => state = self.shared.changed.wait(state).unwrap_or_else(|p| p.into_inner()),
                Slot::Ready(_) => {
                    let Slot::Ready(result) = std::mem::replace(slot, Slot::Taken) else { return None };
                    state.held_items -= 1;
                    state.held_bytes -= self.lens.get(i).copied().unwrap_or(0);
                    self.shared.changed.notify_all();
                    return Some(result);
                }
            }
        }
    }
}

impl<T, E> Drop for ReadAhead<T, E> {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(worker) = self.worker.take() {
            // A panic in `read` already marked the worker done; nothing to report here.
            let _ = worker.join();
        }
    }
}

/// The worker: each item still waiting, in order, once the budget has room for it.
fn work<T, E, F>(shared: &Arc<Shared<T, E>>, lens: &[u64], limits: ReadAheadLimits, mut read: F)
where
    F: FnMut(usize) -> Result<T, E>,
{
    let _done = DoneGuard(shared.clone());
    let mut next = 0usize;
    loop {
        let i = {
            let mut state = shared.lock();
            loop {
                if state.stop {
                    return;
                }
                while matches!(state.slots.get(next), Some(s) if !matches!(s, Slot::Waiting)) {
                    next += 1;
                }
                let Some(&len) = lens.get(next) else { return };
                if len > limits.max_bytes || limits.max_items == 0 {
                    // Never held ahead: the consumer reads it when it comes to it.
                    state.slots[next] = Slot::Consumer;
                    continue;
                }
                if state.held_items < limits.max_items && state.held_bytes + len <= limits.max_bytes {
                    state.slots[next] = Slot::Reading;
                    state.held_items += 1;
                    state.held_bytes += len;
                    break next;
                }
                state = shared.changed.wait(state).unwrap_or_else(|p| p.into_inner());
            }
        };
        let result = read(i);
        let mut state = shared.lock();
        if let Some(slot @ Slot::Reading) = state.slots.get_mut(i) {
            *slot = Slot::Ready(result);
        }
        drop(state);
        shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn limits(max_items: usize, max_bytes: u64) -> ReadAheadLimits {
        ReadAheadLimits { max_items, max_bytes }
    }

    /// A reader of `lens` whose `read(i)` reports `i` on the channel as it starts.
    fn started(lens: Vec<u64>, limits: ReadAheadLimits) -> (ReadAhead<usize, ()>, mpsc::Receiver<usize>) {
        let (tx, rx) = mpsc::channel();
        let ahead = ReadAhead::start(lens, limits, move |i| {
            let _ = tx.send(i);
            Ok(i * 7)
        })
        .unwrap();
        (ahead, rx)
    }

    const QUIET: Duration = Duration::from_millis(200);

    #[test]
    fn items_taken_in_order_are_the_worker_s() {
        let (ahead, rx) = started(vec![10; 5], limits(5, 100));
        assert_eq!((0..5).map(|_| rx.recv().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        for i in 0..5 {
            assert_eq!(ahead.take(i), Some(Ok(i * 7)));
        }
        assert_eq!(ahead.take(0), None, "taken once");
        assert_eq!(ahead.take(9), None, "not an item");
    }

    #[test]
    fn the_worker_holds_no_more_than_the_budget() {
        // 100 bytes and 3 items allowed: two items of 40 fit, a third waits for one to be
        // taken; an item of 200 is never read ahead; one of 10 after it is.
        let (ahead, rx) = started(vec![40, 40, 40, 200, 10], limits(3, 100));
        assert_eq!((rx.recv().unwrap(), rx.recv().unwrap()), (0, 1));
        assert!(rx.recv_timeout(QUIET).is_err(), "a third item of 40 is over 100 bytes");
        assert_eq!(ahead.take(0), Some(Ok(0)));
        assert_eq!(rx.recv().unwrap(), 2);
        assert_eq!(rx.recv().unwrap(), 4, "200 bytes is skipped; 10 fit beside the 80 held");
        assert_eq!(ahead.take(3), None, "an item over the budget is the consumer's");
        assert_eq!(ahead.take(1), Some(Ok(7)));
        assert_eq!(ahead.take(2), Some(Ok(14)));
        assert_eq!(ahead.take(4), Some(Ok(28)));
    }

    #[test]
    fn the_worker_holds_no_more_than_the_item_count() {
        let (ahead, rx) = started(vec![1; 4], limits(2, 100));
        assert_eq!((rx.recv().unwrap(), rx.recv().unwrap()), (0, 1));
        assert!(rx.recv_timeout(QUIET).is_err(), "two items held");
        assert_eq!(ahead.take(1), Some(Ok(7)), "taken out of order");
        assert_eq!(rx.recv().unwrap(), 2);
        assert_eq!(ahead.take(0), Some(Ok(0)));
        assert_eq!(rx.recv().unwrap(), 3);
    }

    #[test]
    fn an_item_asked_for_before_the_worker_reached_it_is_the_consumer_s() {
        let gate = Arc::new(Mutex::new(()));
        let hold = gate.lock().unwrap();
        let (tx, rx) = mpsc::channel();
        let ahead = {
            let gate = gate.clone();
            ReadAhead::start(vec![1; 4], limits(1, 100), move |i| {
                let _ = tx.send(i);
                drop(gate.lock().unwrap_or_else(|p| p.into_inner()));
                Ok::<_, ()>(i)
            })
            .unwrap()
        };
        assert_eq!(rx.recv().unwrap(), 0);
        // The worker is held reading item 0 with its one item of budget: 3 and 2 are not started.
        assert_eq!(ahead.take(3), None);
        assert_eq!(ahead.take(2), None);
        drop(hold);
        assert_eq!(ahead.take(0), Some(Ok(0)), "waited for");
        assert_eq!(rx.recv().unwrap(), 1);
        assert_eq!(ahead.take(1), Some(Ok(1)));
        drop(ahead);
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), Vec::<usize>::new(), "3 and 2 were left to the consumer");
    }

    #[test]
    fn an_error_is_returned_for_its_item_only() {
        let (tx, rx) = mpsc::channel();
        let ahead = ReadAhead::start(vec![1; 3], limits(3, 100), move |i| {
            let _ = tx.send(i);
            if i == 1 {
                Err("bad")
            } else {
                Ok(i)
            }
        })
        .unwrap();
        assert_eq!(rx.iter().take(3).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(ahead.take(0), Some(Ok(0)));
        assert_eq!(ahead.take(1), Some(Err("bad")));
        assert_eq!(ahead.take(2), Some(Ok(2)));
    }

    #[test]
    fn a_panicking_read_leaves_the_consumer_to_read() {
        let (tx, rx) = mpsc::channel();
        let ahead = ReadAhead::start(vec![1; 2], limits(2, 100), move |i| -> Result<usize, ()> {
            let _ = tx.send(i);
            if i == 0 {
                panic!("read failed");
            }
            Ok(i)
        })
        .unwrap();
        assert_eq!(rx.recv().unwrap(), 0);
        assert_eq!(ahead.take(0), None, "not left waiting on the item it was reading");
        assert_eq!(ahead.take(1), None, "the worker is gone");
    }

    #[test]
    fn dropping_it_stops_a_worker_waiting_for_budget() {
        let (ahead, rx) = started(vec![1; 100], limits(1, 100));
        assert_eq!(rx.recv().unwrap(), 0);
        assert_eq!(ahead.take(0), Some(Ok(0)));
        assert_eq!(rx.recv().unwrap(), 1);
        drop(ahead); // the worker waits for item 1 to be taken; the drop must not hang
        assert!(rx.iter().all(|i| i == 2), "at most the item it was starting");
    }
}
