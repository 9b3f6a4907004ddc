//! Matches the four things a probe produces — the send, the kernel TX
//! timestamp (by OPT_ID), the arrival at the receiver and the echo back at
//! the sender — into one [`ProbeRecord`], and hands records out strictly in
//! sequence order once complete or timed out. Pure: events in, records out,
//! memory bounded by the probes in flight.

use std::collections::{HashMap, VecDeque, hash_map::Entry};

use crate::export::{ProbeRecord, TsSource};
use crate::stats::RunStats;

/// A probe further ahead of the oldest unfinished one than this is not ours.
const MAX_WINDOW: u64 = 1 << 24;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event {
    /// sendmsg() returned; `opt_id` is the id its TX timestamp will carry.
    Sent {
        seq: u64,
        opt_id: u32,
        sched_ns: i64,
        send_ns: i64,
    },
    /// sendmsg() failed: the probe is accounted as lost without a TX timestamp.
    SendFailed {
        seq: u64,
        sched_ns: i64,
        send_ns: i64,
    },
    /// A TX timestamp from the sender's error queue.
    TxTimestamp {
        opt_id: u32,
        ts_ns: i64,
        src: TsSource,
    },
    /// The probe arrived at the receiver.
    Arrived {
        seq: u64,
        ts: Option<(i64, TsSource)>,
    },
    /// The reflector's TX timestamp of an echo, whose OPT_ID is the low 32
    /// bits of the probe's seq.
    EchoTx {
        opt_id: u32,
        ts_ns: i64,
        src: TsSource,
    },
    /// Its echo arrived back at the sender.
    Echoed {
        seq: u64,
        ts: Option<(i64, TsSource)>,
    },
    /// A datagram on the probe port that is not one of this run's probes.
    Foreign,
}

#[derive(Debug, Default, Clone)]
struct Slot {
    sent: Option<(i64, i64, u32)>,
    send_failed: bool,
    tx: Option<(i64, TsSource)>,
    rx: Option<(i64, TsSource)>,
    echo_tx: Option<(i64, TsSource)>,
    arrived: bool,
    echo: Option<(i64, TsSource)>,
    echoed: bool,
}

impl Slot {
    fn complete(&self, want_tx: bool, want_echo_tx: bool) -> bool {
        if self.send_failed {
            return true;
        }
        self.sent.is_some()
            && self.arrived
            && self.echoed
            && (self.tx.is_some() || !want_tx)
            && (self.echo_tx.is_some() || !want_echo_tx)
    }
}

pub struct Matcher {
    size: u32,
    flow: u8,
    timeout_ns: i64,
    /// Whether TX timestamps are expected (wait for them until the timeout).
    want_tx: bool,
    /// Whether the reflector's echo TX timestamps are expected.
    want_echo_tx: bool,
    base: u64,
    window: VecDeque<Slot>,
    opt_to_seq: HashMap<u32, u64>,
    early_tx: HashMap<u32, (i64, TsSource)>,
    /// Highest OPT_ID whose probe was already finalized.
    finalized_opt: Option<u32>,
    late_arrivals: u64,
    late_tx: u64,
}

impl Matcher {
    pub fn new(size: u32, flow: u8, timeout_ns: i64, want_tx: bool) -> Self {
        Self {
            size,
            flow,
            timeout_ns,
            want_tx,
            want_echo_tx: false,
            base: 0,
            window: VecDeque::new(),
            opt_to_seq: HashMap::new(),
            early_tx: HashMap::new(),
            finalized_opt: None,
            late_arrivals: 0,
            late_tx: 0,
        }
    }

    /// Waits (until the timeout) for the reflector's echo TX timestamps too.
    pub fn expect_echo_tx(mut self, on: bool) -> Self {
        self.want_echo_tx = on;
        self
    }

    /// The seq whose low 32 bits are `id`, among the probes in the window.
    fn seq_of_low_bits(&self, id: u32) -> Option<u64> {
        let seq = self.base + u64::from(id.wrapping_sub(self.base as u32));
        (seq - self.base < MAX_WINDOW).then_some(seq)
    }

    /// Probes that arrived after they had been given up as lost.
    pub fn late_arrivals(&self) -> u64 {
        self.late_arrivals
    }

    /// Probes in flight (not yet finalized).
    pub fn in_flight(&self) -> usize {
        self.window.len()
    }

    fn slot(&mut self, seq: u64) -> Option<&mut Slot> {
        if seq < self.base || seq - self.base >= MAX_WINDOW {
            return None;
        }
        let idx = (seq - self.base) as usize;
        if idx >= self.window.len() {
            self.window.resize(idx + 1, Slot::default());
        }
        self.window.get_mut(idx)
    }

    /// Feeds one event. Arrival-order facts (reordering, duplicates) go to `stats` directly.
    pub fn on_event(&mut self, ev: Event, stats: &mut RunStats) {
        match ev {
            Event::Sent {
                seq,
                opt_id,
                sched_ns,
                send_ns,
            } => {
                let early = self.early_tx.remove(&opt_id);
                if let Some(s) = self.slot(seq) {
                    s.sent = Some((sched_ns, send_ns, opt_id));
                    if let Some(tx) = early {
                        s.tx = Some(tx);
                    }
                    self.opt_to_seq.insert(opt_id, seq);
                }
            }
            Event::SendFailed {
                seq,
                sched_ns,
                send_ns,
            } => {
                if let Some(s) = self.slot(seq) {
                    s.sent = Some((sched_ns, send_ns, u32::MAX));
                    s.send_failed = true;
                }
            }
            Event::TxTimestamp { opt_id, ts_ns, src } => {
                if self.finalized_opt.is_some_and(|f| opt_id <= f) {
                    self.late_tx += 1;
                    stats.on_tx_timestamp_duplicate();
                    return;
                }
                match self.opt_to_seq.get(&opt_id).copied() {
                    Some(seq) => {
                        if let Some(s) = self.slot(seq) {
                            match s.tx {
                                None => s.tx = Some((ts_ns, src)),
                                // A hardware stamp beats a software one for the same send.
                                Some((_, TsSource::Software)) if src == TsSource::Hardware => {
                                    s.tx = Some((ts_ns, src))
                                }
                                Some((_, old)) if old != src => {}
                                Some(_) => stats.on_tx_timestamp_duplicate(),
                            }
                        }
                    }
                    None => match self.early_tx.entry(opt_id) {
                        Entry::Vacant(v) => {
                            v.insert((ts_ns, src));
                        }
                        Entry::Occupied(mut o) => match o.get().1 {
                            TsSource::Software if src == TsSource::Hardware => {
                                o.insert((ts_ns, src));
                            }
                            old if old != src => {}
                            // Keep the first: a second stamp of the same kind comes
                            // from a later hop (e.g. skb-mode redirect out of a veth).
                            _ => stats.on_tx_timestamp_duplicate(),
                        },
                    },
                }
            }
            Event::Arrived { seq, ts } => {
                if seq < self.base {
                    self.late_arrivals += 1;
                    return;
                }
                match self.slot(seq) {
                    Some(s) => {
                        let first = !s.arrived;
                        if first {
                            s.arrived = true;
                            s.rx = ts;
                        }
                        stats.on_arrival(seq, first);
                    }
                    None => stats.on_foreign_packet(),
                }
            }
            Event::EchoTx { opt_id, ts_ns, src } => {
                if let Some(seq) = self.seq_of_low_bits(opt_id)
                    && let Some(s) = self.slot(seq)
                    && s.echo_tx.is_none()
                {
                    s.echo_tx = Some((ts_ns, src));
                }
            }
            Event::Echoed { seq, ts } => {
                if seq < self.base {
                    return;
                }
                if let Some(s) = self.slot(seq)
                    && !s.echoed
                {
                    s.echoed = true;
                    s.echo = ts;
                }
            }
            Event::Foreign => stats.on_foreign_packet(),
        }
    }

    /// Hands out, in seq order, every probe that is complete or whose
    /// timeout passed at `now_ns`. With `flush_all` everything sent is
    /// finalized (end of run).
    pub fn drain(&mut self, now_ns: i64, flush_all: bool, mut out: impl FnMut(ProbeRecord)) {
        while let Some(front) = self.window.front() {
            let Some((_, send_ns, _)) = front.sent else {
                if flush_all {
                    // Seen at the receiver but never recorded as sent: cannot
                    // happen for our own session; drop the slot.
                    self.window.pop_front();
                    self.base += 1;
                    continue;
                }
                break;
            };
            let expired = now_ns - send_ns >= self.timeout_ns;
            if !(flush_all || expired || front.complete(self.want_tx, self.want_echo_tx)) {
                break;
            }
            let slot = self.window.pop_front().expect("front exists");
            let seq = self.base;
            self.base += 1;
            out(self.finalize(seq, slot));
        }
        // Early TX stamps whose send never showed up within the window are stale.
        if flush_all {
            self.early_tx.clear();
        }
    }

    fn finalize(&mut self, seq: u64, s: Slot) -> ProbeRecord {
        let (sched_ns, send_ns, opt_id) = s.sent.expect("finalized slots were sent");
        if !s.send_failed {
            self.opt_to_seq.remove(&opt_id);
            self.finalized_opt = Some(self.finalized_opt.map_or(opt_id, |f| f.max(opt_id)));
        }
        let tx = s.tx;
        let one_way = match (tx, s.rx) {
            (Some((t, ts)), Some((r, rs))) => Some((r - t, TsSource::combine(ts, rs))),
            _ => None,
        };
        let rtt = match (tx, s.echo) {
            (Some((t, ts)), Some((e, es))) => Some((e - t, TsSource::combine(ts, es))),
            _ => None,
        };
        // Probe RX stamp to echo TX stamp, both from the reflector's
        // kernel; a hardware stamp is on another clock than a software one.
        let turnaround = match (s.rx, s.echo_tx) {
            (Some((r, rs)), Some((e, es))) if rs == es => Some(e - r),
            _ => None,
        };
        ProbeRecord {
            seq,
            flow: self.flow,
            size: self.size,
            sched_ns,
            send_ns,
            tx_ns: tx.map(|t| t.0),
            rx_ns: s.rx.map(|t| t.0),
            echo_ns: s.echo.map(|t| t.0),
            one_way_ns: one_way.map(|o| o.0),
            rtt_ns: rtt.map(|r| r.0),
            tx_src: tx.map(|t| t.1),
            rx_src: s.rx.map(|t| t.1),
            echo_src: s.echo.map(|t| t.1),
            ts_source: one_way.or(rtt).map(|x| x.1),
            lost: !s.arrived,
            turnaround_ns: turnaround,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TsSource::*;

    fn sent(seq: u64) -> Event {
        Event::Sent {
            seq,
            opt_id: seq as u32,
            sched_ns: 1000 * seq as i64,
            send_ns: 1000 * seq as i64 + 1,
        }
    }

    fn run(m: &mut Matcher, evs: &[Event], now: i64, all: bool) -> (Vec<ProbeRecord>, RunStats) {
        let mut st = RunStats::new();
        for e in evs {
            m.on_event(*e, &mut st);
        }
        let mut v = vec![];
        m.drain(now, all, |r| v.push(r));
        (v, st)
    }

    #[test]
    fn complete_probe_any_event_order() {
        let mut m = Matcher::new(64, 0, 1_000_000, true);
        let evs = [
            Event::Arrived {
                seq: 0,
                ts: Some((50, Software)),
            },
            Event::TxTimestamp {
                opt_id: 0,
                ts_ns: 10,
                src: Software,
            },
            sent(0),
            Event::EchoTx {
                opt_id: 0,
                ts_ns: 62,
                src: Software,
            },
            Event::Echoed {
                seq: 0,
                ts: Some((90, Software)),
            },
        ];
        let (v, _) = run(&mut m, &evs, 0, false);
        assert_eq!(v.len(), 1);
        let r = &v[0];
        assert_eq!(
            (r.tx_ns, r.rx_ns, r.echo_ns),
            (Some(10), Some(50), Some(90))
        );
        assert_eq!((r.one_way_ns, r.rtt_ns), (Some(40), Some(80)));
        assert_eq!(r.ts_source, Some(Software));
        assert_eq!(
            r.turnaround_ns,
            Some(12),
            "the echo left 12 ns after the probe's RX stamp"
        );
        assert!(!r.lost);
    }

    #[test]
    fn waits_in_order_then_times_out() {
        let mut m = Matcher::new(64, 0, 500, true);
        // seq 1 complete, seq 0 still missing its arrival.
        let evs = [
            sent(0),
            sent(1),
            Event::TxTimestamp {
                opt_id: 0,
                ts_ns: 5,
                src: Software,
            },
            Event::TxTimestamp {
                opt_id: 1,
                ts_ns: 1005,
                src: Software,
            },
            Event::Arrived {
                seq: 1,
                ts: Some((1100, Software)),
            },
            Event::Echoed {
                seq: 1,
                ts: Some((1200, Software)),
            },
        ];
        let (v, _) = run(&mut m, &evs, 100, false);
        assert!(v.is_empty(), "seq 1 must wait for seq 0");
        let mut out = vec![];
        m.drain(600, false, |r| out.push(r));
        assert_eq!(out.len(), 2);
        assert!(out[0].lost && out[0].one_way_ns.is_none());
        assert_eq!(out[1].one_way_ns, Some(95));
        // Arrives after being given up.
        let mut st = RunStats::new();
        m.on_event(Event::Arrived { seq: 0, ts: None }, &mut st);
        assert_eq!(m.late_arrivals(), 1);
    }

    #[test]
    fn duplicate_tx_timestamps_keep_first_and_count() {
        let mut m = Matcher::new(64, 0, 1_000, true);
        let evs = [
            sent(0),
            Event::TxTimestamp {
                opt_id: 0,
                ts_ns: 10,
                src: Software,
            },
            Event::TxTimestamp {
                opt_id: 0,
                ts_ns: 30,
                src: Software,
            },
            Event::Arrived {
                seq: 0,
                ts: Some((50, Software)),
            },
            Event::Echoed {
                seq: 0,
                ts: Some((90, Software)),
            },
        ];
        let (v, st) = run(&mut m, &evs, 0, false);
        assert_eq!(v[0].tx_ns, Some(10));
        assert_eq!(st.summary().tx_timestamp_duplicates, 1);
        // And one after finalization is counted too, not matched to anything.
        let mut st = RunStats::new();
        m.on_event(
            Event::TxTimestamp {
                opt_id: 0,
                ts_ns: 40,
                src: Software,
            },
            &mut st,
        );
        assert_eq!(st.summary().tx_timestamp_duplicates, 1);
    }

    #[test]
    fn duplicate_tx_timestamps_before_the_send_event_keep_the_first() {
        let mut m = Matcher::new(64, 0, 1_000, true);
        let evs = [
            Event::TxTimestamp {
                opt_id: 0,
                ts_ns: 10,
                src: Software,
            },
            Event::TxTimestamp {
                opt_id: 0,
                ts_ns: 30,
                src: Software,
            },
            sent(0),
            Event::Arrived {
                seq: 0,
                ts: Some((50, Software)),
            },
            Event::Echoed {
                seq: 0,
                ts: Some((90, Software)),
            },
        ];
        let (v, st) = run(&mut m, &evs, 0, false);
        assert_eq!(v[0].tx_ns, Some(10));
        assert_eq!(v[0].one_way_ns, Some(40));
        assert_eq!(st.summary().tx_timestamp_duplicates, 1);
    }

    #[test]
    fn hardware_beats_software_and_mixed_source() {
        let mut m = Matcher::new(64, 0, 1_000, true);
        let evs = [
            sent(0),
            Event::TxTimestamp {
                opt_id: 0,
                ts_ns: 10,
                src: Software,
            },
            Event::TxTimestamp {
                opt_id: 0,
                ts_ns: 12,
                src: Hardware,
            },
            Event::Arrived {
                seq: 0,
                ts: Some((50, Software)),
            },
            Event::Echoed { seq: 0, ts: None },
        ];
        let (v, st) = run(&mut m, &evs, 0, false);
        assert_eq!(v[0].tx_ns, Some(12));
        assert_eq!(v[0].tx_src, Some(Hardware));
        assert_eq!(v[0].ts_source, Some(Mixed));
        assert_eq!(v[0].rtt_ns, None);
        assert_eq!(st.summary().tx_timestamp_duplicates, 0);
    }

    #[test]
    fn duplicates_reorder_and_foreign() {
        let mut m = Matcher::new(64, 0, 1_000, false);
        let evs = [
            sent(0),
            sent(1),
            Event::Arrived { seq: 1, ts: None },
            Event::Arrived { seq: 0, ts: None },
            Event::Arrived { seq: 0, ts: None },
            Event::Arrived {
                seq: u64::MAX,
                ts: None,
            },
            Event::Foreign,
        ];
        let (v, st) = run(&mut m, &evs, 5000, false);
        assert_eq!(v.len(), 2);
        let s = st.summary();
        assert_eq!((s.reordered, s.duplicates, s.foreign_packets), (1, 1, 2));
    }

    #[test]
    fn echo_tx_stamps_by_low_seq_bits_and_waited_for() {
        let mut m = Matcher::new(64, 0, 1_000, true).expect_echo_tx(true);
        let done = |seq: u64| {
            [
                sent(seq),
                Event::TxTimestamp {
                    opt_id: seq as u32,
                    ts_ns: 1,
                    src: Software,
                },
                Event::Arrived {
                    seq,
                    ts: Some((10, Software)),
                },
                Event::Echoed {
                    seq,
                    ts: Some((30, Software)),
                },
            ]
        };
        let (v, _) = run(&mut m, &done(0), 0, false);
        assert!(v.is_empty(), "waits for the echo's TX stamp");
        let (v, _) = run(
            &mut m,
            &[Event::EchoTx {
                opt_id: 0,
                ts_ns: 14,
                src: Software,
            }],
            0,
            false,
        );
        assert_eq!(v[0].turnaround_ns, Some(4));
        // Low bits resolve across the 2^32 wrap relative to the window base.
        assert_eq!(m.seq_of_low_bits(1), Some(1));
        let mut far = Matcher::new(64, 0, 1_000, true);
        far.base = (1 << 32) - 2;
        assert_eq!(far.seq_of_low_bits(1), Some((1 << 32) + 1));
        assert_eq!(far.seq_of_low_bits(u32::MAX - 1), Some((1 << 32) - 2));
        assert_eq!(far.seq_of_low_bits(u32::MAX - 2), None, "behind the window");
        // A hardware RX stamp and a software echo stamp are on two clocks.
        let mut m = Matcher::new(64, 0, 1_000, false).expect_echo_tx(true);
        let (v, _) = run(
            &mut m,
            &[
                sent(0),
                Event::Arrived {
                    seq: 0,
                    ts: Some((10, Hardware)),
                },
                Event::EchoTx {
                    opt_id: 0,
                    ts_ns: 14,
                    src: Software,
                },
                Event::Echoed { seq: 0, ts: None },
            ],
            0,
            false,
        );
        assert_eq!(v[0].turnaround_ns, None);
    }

    #[test]
    fn send_failure_is_accounted_as_lost() {
        let mut m = Matcher::new(64, 0, 1_000, true);
        let (v, _) = run(
            &mut m,
            &[Event::SendFailed {
                seq: 0,
                sched_ns: 0,
                send_ns: 1,
            }],
            0,
            false,
        );
        assert_eq!(v.len(), 1);
        assert!(v[0].lost && v[0].tx_ns.is_none());
    }

    #[test]
    fn flush_all_finalizes_everything_sent() {
        let mut m = Matcher::new(64, 0, i64::MAX / 2, true);
        let (v, _) = run(&mut m, &[sent(0), sent(1), sent(2)], 0, true);
        assert_eq!(v.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(m.in_flight(), 0);
    }
}
