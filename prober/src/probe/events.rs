//! Hands events to the collector in batches. Every channel send may wake
//! the collector, and on a VM a cross-core wake-up (an IPI, a VM exit)
//! costs about as much as handling a probe, so at high probe rates the
//! sender and the I/O thread gather events and send them at most every
//! [`MAX_AGE_NS`] or [`MAX_LEN`] events. Records are finalized much later
//! (on completion or timeout), so the delay changes no figure. Pure apart
//! from the channel.

use std::sync::mpsc;

use super::matcher::Event;

/// Longest an event waits before it is handed over.
pub(crate) const MAX_AGE_NS: i64 = 2_000_000;
/// Most events handed over at once.
pub(crate) const MAX_LEN: usize = 512;

/// An event and the index of the target (the session's leg) it is of.
pub(crate) type Tagged = (u32, Event);

/// Events waiting to be handed to the collector.
#[derive(Debug, Default)]
pub(crate) struct EventBatch {
    events: Vec<Tagged>,
    /// When the oldest waiting event was added.
    oldest_ns: Option<i64>,
}

impl EventBatch {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds an event of leg `leg`.
    pub(crate) fn push(&mut self, leg: u32, e: Event, now_ns: i64) {
        if self.events.is_empty() {
            self.oldest_ns = Some(now_ns);
        }
        self.events.push((leg, e));
    }

    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the batch should go now.
    pub(crate) fn due(&self, now_ns: i64) -> bool {
        self.events.len() >= MAX_LEN || self.oldest_ns.is_some_and(|t| now_ns - t >= MAX_AGE_NS)
    }

    /// How long a thread may block before the batch is due: `idle_ms`
    /// when empty, else the time left (at least 0).
    pub(crate) fn wait_ms(&self, now_ns: i64, idle_ms: i32) -> i32 {
        match self.oldest_ns {
            None => idle_ms,
            Some(t) => {
                let left_ns = (t + MAX_AGE_NS - now_ns).max(0);
                (((left_ns + 999_999) / 1_000_000) as i32).min(idle_ms)
            }
        }
    }

    /// Hands the events over. False once the collector is gone.
    pub(crate) fn flush(&mut self, tx: &mpsc::Sender<Vec<Tagged>>) -> bool {
        self.oldest_ns = None;
        if self.events.is_empty() {
            return true;
        }
        let batch = std::mem::replace(&mut self.events, Vec::with_capacity(64));
        tx.send(batch).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_by_age_or_length() {
        let mut b = EventBatch::new();
        assert!(!b.due(0));
        assert_eq!(b.wait_ms(0, 20), 20);
        b.push(0, Event::Foreign, 1_000);
        assert!(!b.due(1_000 + MAX_AGE_NS - 1));
        assert!(b.due(1_000 + MAX_AGE_NS));
        // 2 ms to go, rounded up; never negative; never above the idle wait.
        assert_eq!(b.wait_ms(1_000, 20), 2);
        assert_eq!(b.wait_ms(1_000 + 1_500_000, 20), 1);
        assert_eq!(b.wait_ms(1_000 + 10 * MAX_AGE_NS, 20), 0);
        assert_eq!(b.wait_ms(1_000, 1), 1);
        let mut b = EventBatch::new();
        for _ in 0..MAX_LEN {
            b.push(0, Event::Foreign, 0);
        }
        assert!(b.due(0));
    }

    #[test]
    fn flush_hands_over_and_resets() {
        let (tx, rx) = mpsc::channel();
        let mut b = EventBatch::new();
        assert!(b.flush(&tx), "an empty flush sends nothing");
        assert!(rx.try_recv().is_err());
        b.push(0, Event::Foreign, 5);
        b.push(0, Event::Foreign, 6);
        assert!(b.flush(&tx));
        assert_eq!(rx.try_recv().unwrap().len(), 2);
        assert!(b.len() == 0 && !b.due(i64::MAX));
        drop(rx);
        b.push(0, Event::Foreign, 7);
        assert!(!b.flush(&tx), "collector gone");
    }
}
