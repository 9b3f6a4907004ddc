//! The metrics server's connection cap.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

/// The connection cap. Every connection holds a slot from accept to close.
/// When all are taken, the connection that has waited longest without
/// sending a whole request head is closed to make room: a scrape sends its
/// head at once, so clients that connect and wait (idle, slowloris) cannot
/// lock it out, however many they open. When every open connection is
/// being answered, the new one is closed at once. Nothing waits in the
/// listen backlog either way.
#[derive(Clone)]
pub(super) struct Slots(Arc<Mutex<SlotState>>);

struct SlotState {
    cap: usize,
    open: usize,
    next_id: u64,
    /// Connections still waiting for their request head, oldest first.
    waiting: VecDeque<(u64, tokio::task::AbortHandle)>,
}

/// A connection's place under the cap; dropping it gives the place back.
pub(super) struct Slot {
    slots: Slots,
    pub(super) id: u64,
}

impl Slots {
    pub(super) fn new(cap: usize) -> Self {
        Self(Arc::new(Mutex::new(SlotState {
            cap,
            open: 0,
            next_id: 0,
            waiting: VecDeque::with_capacity(cap),
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // Only this server's one thread takes the lock, and nothing in it
        // can panic halfway: a poisoned state is still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a new connection, and whether an older connection was
    /// closed for it; None: every slot is being answered, close the new one.
    pub(super) fn admit(&self) -> Option<(Slot, bool)> {
        let mut s = self.state();
        let evicted = if s.open < s.cap {
            false
        } else {
            // Its task ends at its next poll; dropping its slot then
            // lowers `open` again.
            let (_, oldest) = s.waiting.pop_front()?;
            oldest.abort();
            true
        };
        s.open += 1;
        let id = s.next_id;
        s.next_id += 1;
        Some((
            Slot {
                slots: self.clone(),
                id,
            },
            evicted,
        ))
    }

    pub(super) fn wait_for_head(&self, id: u64, task: tokio::task::AbortHandle) {
        self.state().waiting.push_back((id, task));
    }

    fn forget(&self, id: u64) {
        let mut s = self.state();
        if let Some(i) = s.waiting.iter().position(|(w, _)| *w == id) {
            s.waiting.remove(i);
        }
    }
}

impl Slot {
    /// The request head is in: the connection is answered, not closed to
    /// make room.
    pub(super) fn head_received(&self) {
        self.slots.forget(self.id);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.forget(self.id);
        self.slots.state().open -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cap's bookkeeping: the oldest connection waiting for its head
    /// goes first; with every connection being answered a new one is refused.
    #[test]
    fn slots_evict_the_oldest_waiting_and_refuse_when_all_answer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let slots = Slots::new(2);
            let admit = || {
                let (slot, evicted) = slots.admit()?;
                let task = tokio::spawn(std::future::pending::<()>());
                slots.wait_for_head(slot.id, task.abort_handle());
                Some((slot, task, evicted))
            };
            let (a, a_task, a_evicted) = admit().unwrap();
            let (b, b_task, b_evicted) = admit().unwrap();
            assert!(!a_evicted && !b_evicted);
            // Over the cap: a, the oldest waiting, makes room.
            let (c, c_task, c_evicted) = admit().unwrap();
            assert!(c_evicted);
            tokio::task::yield_now().await;
            assert!(a_task.is_finished() && !b_task.is_finished());
            drop(a); // as a's task does when it is cancelled
            assert_eq!(slots.state().open, 2);
            // b and c are being answered: nothing to evict, refused.
            b.head_received();
            c.head_received();
            assert!(admit().is_none());
            assert_eq!(slots.state().open, 2);
            drop(b);
            let (_d, _, d_evicted) = admit().expect("a slot is free again");
            assert!(!d_evicted);
            b_task.abort();
            c_task.abort();
        });
    }
}
