//! The probe sender: an absolute schedule (probe n is due at start + n x
//! interval, so lateness never accumulates), a timer sleep up to a short
//! final spin (or a spin over the whole interval with `--busy-poll`), and
//! batched sends: when the sender wakes up late, every probe already due
//! goes out in one sendmmsg(2), each still with its own scheduled time and
//! OPT_ID, instead of the sender falling further behind one syscall at a time.
//!
//! Kernel interfaces: clock_nanosleep(2) TIMER_ABSTIME, prctl(2)
//! PR_SET_TIMERSLACK (Linux >= 2.6.28), sched_setscheduler(2) (any Linux;
//! the rest of the real-time settings are `tune::rt`'s), sendmmsg(2) (>= 3.0).

use std::{
    net::SocketAddrV4,
    sync::{
        atomic::{AtomicU8, AtomicU64, Ordering},
        mpsc,
    },
};

use anyhow::{Context, Result};

use crate::tune::rt::RtSettings;

use super::{
    ProbeConfig, clock,
    events::{self, EventBatch},
    matcher::Event,
    packet::Probe,
    socket::{ProbeSocket, SendBatch},
};

/// Most probes one sendmmsg() carries when the sender is behind.
pub const MAX_BATCH: usize = 64;
/// The sender looks at the stop flag at least this often.
const STOP_CHECK_NS: i64 = 100_000_000;

/// When each probe is due. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub start_ns: i64,
    pub interval_ns: i64,
    /// Probes to send (u64::MAX with only an end time).
    pub count: u64,
    /// No probe is scheduled at or after this time.
    pub end_ns: Option<i64>,
}

impl Schedule {
    /// Scheduled send time of probe `seq`.
    pub fn at(&self, seq: u64) -> i64 {
        self.start_ns + seq as i64 * self.interval_ns
    }

    /// Whether probe `seq` is past the end of the run.
    pub fn finished(&self, seq: u64) -> bool {
        seq >= self.count || self.end_ns.is_some_and(|e| self.at(seq) >= e)
    }

    /// The probes due at `now_ns` starting from `next`: returns the end
    /// (exclusive) of the run of probes whose time has come, at least
    /// `next + 1` (the caller waited for `next`), at most `next + max`.
    pub fn due(&self, next: u64, now_ns: i64, max: usize) -> u64 {
        let mut end = next + 1;
        while end < next + max as u64 && !self.finished(end) && self.at(end) <= now_ns {
            end += 1;
        }
        end
    }
}

/// Gives the calling thread (one of the probe's receive threads) the
/// sender's SCHED_FIFO priority, so echoes and TX timestamps are picked up
/// as promptly as probes are sent. A failure is logged, not fatal: the
/// sender's own settings already failed loudly if they could not be had.
pub fn share_fifo_priority(rt: &RtSettings) {
    if let Some(prio) = rt.fifo_priority {
        let param = libc::sched_param {
            sched_priority: prio.into(),
        };
        // SAFETY: plain syscall on the calling thread with a valid pointer.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
            log::warn!(
                "SCHED_FIFO {prio} for a probe receive thread: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Asks for exact timer wake-ups on this thread: a normal thread's sleeps
/// may otherwise end up to 50 µs late (the default timer slack), which is
/// most of a 100 µs interval.
fn tight_timer_slack() {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Sends the probe stream. Every probe it tries to send produces exactly
/// one `Sent` or `SendFailed` event and one count in `attempts` (for the
/// unaccounted-probe check).
pub fn pace(
    sock: &ProbeSocket,
    dst: SocketAddrV4,
    session: u64,
    cfg: &ProbeConfig,
    stop: &AtomicU8,
    attempts: &AtomicU64,
    ev: &mpsc::Sender<Vec<Event>>,
) -> Result<()> {
    tight_timer_slack();
    // Kept for the whole loop: dropping it puts the thread's policy back.
    let _rt = if cfg.rt.is_empty() {
        None
    } else {
        Some(
            cfg.rt
                .apply_to_current_thread()
                .context("real-time settings for the sender")?,
        )
    };
    let interval_ns = cfg.interval.as_nanos() as i64;
    // Start a little ahead so the first probe is paced too.
    let start_ns = clock::realtime_ns() + 10_000_000;
    let sched = Schedule {
        start_ns,
        interval_ns,
        count: cfg.count.unwrap_or(if cfg.duration.is_some() {
            u64::MAX
        } else {
            1000
        }),
        end_ns: cfg.duration.map(|d| start_ns + d.as_nanos() as i64),
    };
    let spin_ns = if cfg.busy_poll {
        i64::MAX
    } else {
        cfg.spin.as_nanos() as i64
    };
    let mut batch = SendBatch::new(MAX_BATCH, cfg.size, dst);
    let mut pending = EventBatch::new();
    let mut seq = 0u64;
    while !sched.finished(seq) && stop.load(Ordering::Relaxed) == 0 {
        let due_ns = sched.at(seq);
        // Long intervals are slept in slices so a stop request is seen.
        if due_ns - clock::realtime_ns() > STOP_CHECK_NS + spin_ns.min(STOP_CHECK_NS) {
            clock::sleep_until(clock::realtime_ns() + STOP_CHECK_NS);
            continue;
        }
        clock::wait_until(due_ns, spin_ns);
        let send_ns = clock::realtime_ns();
        let end = sched.due(seq, send_ns, MAX_BATCH);
        batch.clear();
        for s in seq..end {
            Probe {
                session,
                seq: s,
                flow: cfg.flow,
                echo: false,
                send_ns,
                kernel_times: None,
            }
            .encode(batch.push(s as u32));
        }
        let mut i = 0;
        while i < batch.len() {
            match sock.send_batch(&mut batch, i) {
                Ok(n) => {
                    for k in i..i + n {
                        let s = seq + k as u64;
                        pending.push(
                            Event::Sent {
                                seq: s,
                                opt_id: batch.opt_id(k),
                                sched_ns: sched.at(s),
                                send_ns,
                            },
                            send_ns,
                        );
                    }
                    i += n.max(1);
                }
                Err(err) => {
                    let s = seq + i as u64;
                    log::debug!("send of probe {s} failed: {err}");
                    pending.push(
                        Event::SendFailed {
                            seq: s,
                            sched_ns: sched.at(s),
                            send_ns,
                        },
                        send_ns,
                    );
                    i += 1;
                }
            }
        }
        attempts.fetch_add(batch.len() as u64, Ordering::SeqCst);
        seq = end;
        // Hand over when due, or now if the sender is about to sleep past it.
        let now = clock::realtime_ns();
        let next_in = sched.at(seq) - now;
        if (pending.due(now) || next_in >= events::MAX_AGE_NS || sched.finished(seq))
            && !pending.flush(ev)
        {
            break;
        }
    }
    pending.flush(ev);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(count: u64, end_ns: Option<i64>) -> Schedule {
        Schedule {
            start_ns: 1000,
            interval_ns: 10,
            count,
            end_ns,
        }
    }

    #[test]
    fn absolute_times_do_not_drift() {
        let s = sched(u64::MAX, None);
        assert_eq!(s.at(0), 1000);
        assert_eq!(s.at(1_000_000), 1000 + 10_000_000);
    }

    #[test]
    fn due_batches_only_what_has_come() {
        let s = sched(100, None);
        // On time: one probe.
        assert_eq!(s.due(0, 1000, 64), 1);
        assert_eq!(s.due(0, 1009, 64), 1);
        // Woke up 25 ns late: probes 0, 1, 2 are due (at 1000, 1010, 1020).
        assert_eq!(s.due(0, 1025, 64), 3);
        // Far behind: capped by the batch size.
        assert_eq!(s.due(0, 1_000_000, 8), 8);
        // Never past the count.
        assert_eq!(s.due(95, 1_000_000, 64), 100);
    }

    #[test]
    fn finished_by_count_or_end_time() {
        let s = sched(3, None);
        assert!(!s.finished(2));
        assert!(s.finished(3));
        let s = sched(u64::MAX, Some(1050));
        assert!(!s.finished(4));
        assert!(s.finished(5), "probe 5 is due at 1050, the end");
        assert_eq!(s.due(0, 5000, 64), 5);
    }
}
