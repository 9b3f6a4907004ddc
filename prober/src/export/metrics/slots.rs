//! The metrics server's connection cap, and which connection makes room.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// How long a connection may wait for its request head, once its task has
/// run, before it can be closed to make room: a scraper sends its head
/// with its connect, so only clients that connect and wait (idle,
/// slowloris) are past it. Not shorter: a scraper on a busy host can be
/// kept from a CPU between its connect and its write for 100 ms and more
/// (a unit test's 40 scrapers over a cap of 4 lost some at 100 ms with the
/// machine loaded).
pub(super) const HEAD_GRACE: Duration = Duration::from_millis(500);
/// How long a connection's answer may be stalled (the client not reading)
/// before it can be closed to make room. A scraper reading its answer
/// frees room in its window within a round trip.
pub(super) const STALL_GRACE: Duration = Duration::from_secs(1);

/// The connection cap. Every connection holds a slot from accept to
/// close. Under the cap a new connection is accepted at once. At the cap,
/// the connection that has gone longest without progress (no request head
/// [`HEAD_GRACE`] after its task first ran, or its answer unread for
/// [`STALL_GRACE`]) is closed to make room; when none has, nothing is
/// accepted: new connections wait in the kernel's listen backlog, served
/// in their turn, rather than being closed. A connection being answered
/// and read is never closed for another.
#[derive(Clone)]
pub(super) struct Slots(Arc<Shared>);

struct Shared {
    state: Mutex<SlotState>,
    /// Signalled when a slot is given back, or a connection may be closed
    /// to make room from some instant on.
    changed: tokio::sync::Notify,
}

struct SlotState {
    cap: usize,
    next_id: u64,
    open: HashMap<u64, Conn>,
}

/// Where a connection is, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Accepted; its task has not run yet.
    Accepted,
    /// Waiting for its request head.
    Head,
    /// Being answered, the client reading.
    Answering,
    /// Being answered, the client not reading.
    Stalled,
}

struct Conn {
    phase: Phase,
    since: Instant,
    task: Option<tokio::task::AbortHandle>,
}

impl Conn {
    /// When it may be closed to make room, if it ever may.
    fn evictable_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::Head => Some(self.since + HEAD_GRACE),
            Phase::Stalled => Some(self.since + STALL_GRACE),
            Phase::Accepted | Phase::Answering => None,
        }
    }
}

/// A connection's place under the cap; dropping it gives the place back.
pub(super) struct Slot {
    slots: Slots,
    pub(super) id: u64,
}

/// What [`Slots::make_room`] did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Room {
    /// Under the cap.
    Free,
    /// A connection was closed for the next one.
    Evicted,
    /// At the cap; one may be closed from this instant (None: every
    /// connection is being answered, or has yet to run: wait for a
    /// change).
    Full(Option<Instant>),
}

impl Slots {
    pub(super) fn new(cap: usize) -> Self {
        Self(Arc::new(Shared {
            state: Mutex::new(SlotState {
                cap,
                next_id: 0,
                open: HashMap::with_capacity(cap),
            }),
            changed: tokio::sync::Notify::new(),
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // Only this server's one thread takes the lock, and nothing in it
        // can panic halfway: a poisoned state is still consistent.
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Room for one more connection at `now` (see [`Slots`]).
    pub(super) fn make_room(&self, now: Instant) -> Room {
        let mut s = self.state();
        if s.open.len() < s.cap {
            return Room::Free;
        }
        let oldest = s
            .open
            .iter()
            .filter_map(|(id, c)| Some((c.evictable_at()?, *id)))
            .min();
        match oldest {
            Some((at, id)) if at <= now => {
                if let Some(task) = s.open.remove(&id).and_then(|c| c.task) {
                    // The task ends at its next poll; its socket closes then.
                    task.abort();
                }
                Room::Evicted
            }
            other => Room::Full(other.map(|(at, _)| at)),
        }
    }

    /// Waits until a slot is given back or a connection becomes one that
    /// may make room later (or returns at once if either happened since
    /// the last wait).
    pub(super) async fn changed(&self) {
        self.0.changed.notified().await;
    }

    /// A slot for a connection just accepted (call [`Slots::make_room`]
    /// first: this does not check the cap).
    pub(super) fn admit(&self, now: Instant) -> Slot {
        let mut s = self.state();
        let id = s.next_id;
        s.next_id += 1;
        s.open.insert(
            id,
            Conn {
                phase: Phase::Accepted,
                since: now,
                task: None,
            },
        );
        Slot {
            slots: self.clone(),
            id,
        }
    }

    /// The task serving connection `id`, to abort if it must make room.
    pub(super) fn set_task(&self, id: u64, task: tokio::task::AbortHandle) {
        if let Some(c) = self.state().open.get_mut(&id) {
            c.task = Some(task);
        }
    }

    fn enter(&self, id: u64, phase: Phase) {
        if let Some(c) = self.state().open.get_mut(&id)
            && c.phase != phase
        {
            c.phase = phase;
            c.since = Instant::now();
            if c.evictable_at().is_some() {
                // An accept waiting for room learns when this one may go.
                self.0.changed.notify_one();
            }
        }
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.state().open.len()
    }
}

impl Slot {
    /// Its task runs: from now on it waits for its request head.
    pub(super) fn running(&self) {
        self.slots.enter(self.id, Phase::Head);
    }

    /// The request head is in: it is being answered.
    pub(super) fn head_received(&self) {
        self.slots.enter(self.id, Phase::Answering);
    }

    /// The client stopped reading the answer (the socket is full).
    pub(super) fn stalled(&self) {
        self.slots.enter(self.id, Phase::Stalled);
    }

    /// The client reads again.
    pub(super) fn reading(&self) {
        self.slots.enter(self.id, Phase::Answering);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.state().open.remove(&self.id);
        self.slots.0.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cap's bookkeeping: under it every connection is admitted; at
    /// it, the one longest without progress past its grace makes room,
    /// and none does before its grace, nor while it is being answered.
    #[test]
    fn the_connection_longest_without_progress_makes_room() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let slots = Slots::new(3);
            let t0 = Instant::now();
            let admit = |now| {
                assert_ne!(slots.make_room(now), Room::Full(None));
                let slot = slots.admit(now);
                let task = tokio::spawn(std::future::pending::<()>());
                slots.set_task(slot.id, task.abort_handle());
                (slot, task)
            };
            let (a, a_task) = admit(t0);
            let (b, b_task) = admit(t0);
            let (c, c_task) = admit(t0);
            // Not yet run: never closed for another.
            assert_eq!(
                slots.make_room(t0 + Duration::from_secs(60)),
                Room::Full(None)
            );
            a.running();
            b.running();
            c.running();
            b.head_received();
            c.head_received();
            let now = Instant::now();
            // a waits for its head: closable after its grace, not before.
            match slots.make_room(now) {
                Room::Full(Some(at)) => assert!(at > now && at <= now + HEAD_GRACE),
                other => panic!("{other:?}"),
            }
            assert_eq!(slots.make_room(now + HEAD_GRACE), Room::Evicted);
            tokio::task::yield_now().await;
            assert!(a_task.is_finished() && !b_task.is_finished());
            assert_eq!(slots.open(), 2);
            drop(a); // as a's task does when it ends
            assert_eq!(slots.open(), 2);
            // b and c are answered and read: nothing to close.
            let (d, _d_task) = admit(now);
            d.running();
            d.head_received();
            assert_eq!(
                slots.make_room(now + Duration::from_secs(60)),
                Room::Full(None)
            );
            // c stops reading: closable a second later, and the first to go.
            c.stalled();
            let stalled_at = Instant::now();
            assert!(matches!(slots.make_room(stalled_at), Room::Full(Some(_))));
            b.stalled();
            assert_eq!(slots.make_room(stalled_at + STALL_GRACE), Room::Evicted);
            tokio::task::yield_now().await;
            assert!(c_task.is_finished() && !b_task.is_finished());
            // b reads again: not closable any more.
            b.reading();
            drop(c);
            assert_eq!(slots.make_room(Instant::now()), Room::Free);
            // A slot given back wakes a waiting accept.
            drop(b);
            tokio::time::timeout(Duration::from_secs(5), slots.changed())
                .await
                .expect("woken");
            b_task.abort();
        });
    }
}
