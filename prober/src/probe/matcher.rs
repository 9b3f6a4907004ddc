//! Matches what a probe produces — the send, the kernel's TX stamps (SCHED,
//! driver, NIC; by OPT_ID), the arrival at the receiver, the echo's TX
//! stamps at the reflector and the echo back at the sender — into one
//! [`ProbeRecord`], and hands records out strictly in sequence order once
//! complete or timed out. Every stamp is kept in its own field; a second
//! stamp of the same kind for the same send is counted as a duplicate and
//! never used. Pure: events in, records out, memory bounded by the probes
//! in flight.

use std::{
    collections::{HashMap, VecDeque, hash_map::Entry},
    net::SocketAddr,
    sync::atomic::AtomicU64,
};

use super::{
    cmsg::TxKind,
    packet::KernelTimes,
    socket,
    wire::{Echo, WARMUP_SEQ, Wire},
};
use crate::model::record::ProbeRecord;
use crate::stats::{RunStats, chain};

/// A probe further ahead of the oldest unfinished one than this is not ours.
const MAX_WINDOW: u64 = 1 << 24;
/// Finalized sends whose stamp kinds are remembered, to tell a late stamp
/// (its record went out without it) from a duplicate of one it used: at
/// most this many, and only those sent within [`FINALIZED_HORIZON_NS`]
/// beyond the timeout of the latest one. A count alone held 64 Ki sends
/// (1.2 MiB) per target once a slow stream had sent them (1.8 h at
/// 10/s); the horizon keeps that stream at a few hundred.
const FINALIZED_MEMORY: usize = 1 << 16;
/// A TX stamp comes within microseconds of its send, a late one within
/// milliseconds: 10 s past the timeout is far beyond either.
const FINALIZED_HORIZON_NS: i64 = 10_000_000_000;

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
    /// A TX timestamp from the sender's error queue (hardware: raw PHC time).
    TxTimestamp {
        opt_id: u32,
        kind: TxKind,
        ts_ns: i64,
    },
    /// The probe arrived at the receiver: its software and raw hardware RX
    /// stamps, the reflector's clock when recvmmsg() returned, and when it
    /// sent the echo back.
    Arrived {
        seq: u64,
        sw_ns: Option<i64>,
        hw_ns: Option<i64>,
        user_ns: i64,
        echo_send_ns: Option<i64>,
    },
    /// The reflector's TX timestamp of an echo, whose OPT_ID is the low 32
    /// bits of the probe's seq.
    EchoTx {
        opt_id: u32,
        kind: TxKind,
        ts_ns: i64,
    },
    /// Its echo arrived back at the sender. `reflector` carries the
    /// in-kernel reflector's receive and transmit times from the echo's
    /// payload, when it wrote them.
    Echoed {
        seq: u64,
        sw_ns: Option<i64>,
        hw_ns: Option<i64>,
        user_ns: i64,
        reflector: Option<KernelTimes>,
    },
    /// A datagram on the probe port that is not one of this run's probes.
    Foreign,
    /// A datagram of this session (an echo, or a probe at the receiver)
    /// whose seq had not been sent when it was read: forged. The thread
    /// that read it tells, as only it knows what had been sent by then.
    NeverSent,
}

/// Puts raw hardware (PHC) stamps on CLOCK_REALTIME: the sender's NIC for
/// the probe's TX and the echo's RX, the receiver's for the others. None
/// when it cannot (no PHC, no sample yet): the stamp is then left out.
pub trait HwClocks: Send {
    fn sender(&self, raw_ns: i64) -> Option<i64>;
    fn receiver(&self, raw_ns: i64) -> Option<i64>;
}

/// No hardware clock to convert from: hardware stamps are left out.
pub struct NoHwClocks;

impl HwClocks for NoHwClocks {
    fn sender(&self, _: i64) -> Option<i64> {
        None
    }
    fn receiver(&self, _: i64) -> Option<i64> {
        None
    }
}

/// The TX stamps of one send, by kind.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct TxStamps {
    sched: Option<i64>,
    sw: Option<i64>,
    hw: Option<i64>,
}

impl TxStamps {
    fn slot(&mut self, kind: TxKind) -> &mut Option<i64> {
        match kind {
            TxKind::Sched => &mut self.sched,
            TxKind::Software => &mut self.sw,
            TxKind::Hardware => &mut self.hw,
        }
    }

    /// Keeps the first stamp of each kind; false for a duplicate.
    fn put(&mut self, kind: TxKind, ts_ns: i64) -> bool {
        let s = self.slot(kind);
        if s.is_some() {
            return false;
        }
        *s = Some(ts_ns);
        true
    }
}

fn kind_bit(kind: TxKind) -> u8 {
    match kind {
        TxKind::Sched => 1,
        TxKind::Software => 2,
        TxKind::Hardware => 4,
    }
}

/// What the receiver saw of a probe: software and raw hardware RX stamps,
/// the reflector's read time and its echo's send time.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    sw_ns: Option<i64>,
    hw_ns: Option<i64>,
    /// None when the in-kernel reflector answered (no socket read it).
    user_ns: Option<i64>,
    echo_send_ns: Option<i64>,
}

#[derive(Debug, Default, Clone)]
struct Slot {
    sent: Option<(i64, i64, u32)>,
    send_failed: bool,
    tx: TxStamps,
    echo_tx: TxStamps,
    arrived: Option<Arrival>,
    /// (software, raw hardware, user-space read) of the echo at the sender.
    echoed: Option<(Option<i64>, Option<i64>, i64)>,
}

/// Which stamps a record waits for (until the timeout) before it is final.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expect {
    /// The sender's software TX stamp.
    pub tx: bool,
    /// The sender's hardware TX stamp.
    pub tx_hw: bool,
    /// The reflector's software TX stamp of the echo.
    pub echo_tx: bool,
    /// The reflector's hardware TX stamp of the echo.
    pub echo_tx_hw: bool,
}

impl Slot {
    fn complete(&self, e: Expect) -> bool {
        if self.send_failed {
            return true;
        }
        // SCHED stamps are queued before the driver's, so a present
        // software stamp means the SCHED one (if any) is in too.
        self.sent.is_some()
            && self.arrived.is_some()
            && self.echoed.is_some()
            && (self.tx.sw.is_some() || !e.tx)
            && (self.tx.hw.is_some() || !e.tx_hw)
            && (self.echo_tx.sw.is_some() || !e.echo_tx)
            && (self.echo_tx.hw.is_some() || !e.echo_tx_hw)
    }
}

pub struct Matcher {
    size: u32,
    flow: u8,
    timeout_ns: i64,
    expect: Expect,
    hw: Box<dyn HwClocks>,
    base: u64,
    window: VecDeque<Slot>,
    opt_to_seq: HashMap<u32, u64>,
    early_tx: HashMap<u32, TxStamps>,
    /// Stamp kinds of recently finalized sends, by OPT_ID (bit per kind).
    finalized: HashMap<u32, u8>,
    /// OPT_IDs in `finalized`, with their send time, oldest first.
    finalized_order: VecDeque<(u32, i64)>,
    late_arrivals: u64,
    late_tx: u64,
    /// Slots dropped without a record: seen at the receiver but never sent.
    unmatched: u64,
    /// Hardware stamps that could not be put on the system clock.
    hw_unconverted: u64,
    /// The in-kernel reflector answers: the receiver's socket never sees
    /// the probes, so an echo stands for the arrival.
    kernel_reflector: bool,
}

/// Below this many entries a collection keeps its allocation.
const KEEP_CAPACITY: usize = 4096;

fn shrink_deque<T>(d: &mut VecDeque<T>) {
    if d.capacity() > KEEP_CAPACITY && d.capacity() > 4 * d.len() {
        d.shrink_to((2 * d.len()).max(KEEP_CAPACITY));
    }
}

fn shrink_map<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>) {
    if m.capacity() > KEEP_CAPACITY && m.capacity() > 4 * m.len() {
        m.shrink_to((2 * m.len()).max(KEEP_CAPACITY));
    }
}

impl Matcher {
    pub fn new(size: u32, flow: u8, timeout_ns: i64, expect: Expect) -> Self {
        Self {
            size,
            flow,
            timeout_ns,
            expect,
            hw: Box::new(NoHwClocks),
            base: 0,
            window: VecDeque::new(),
            opt_to_seq: HashMap::new(),
            early_tx: HashMap::new(),
            finalized: HashMap::new(),
            finalized_order: VecDeque::new(),
            late_arrivals: 0,
            late_tx: 0,
            unmatched: 0,
            hw_unconverted: 0,
            kernel_reflector: false,
        }
    }

    /// The in-kernel reflector answers the probes: each echo synthesises
    /// the probe's arrival with the reflector's times from the payload
    /// (receive -> `rx_ns`, transmit -> `echo_tx_ns`). A probe whose echo
    /// never came is lost, whichever way it was lost.
    pub fn with_kernel_reflector(mut self, on: bool) -> Self {
        self.kernel_reflector = on;
        self
    }

    /// Converts hardware stamps with `hw` (default: none are converted).
    pub fn with_hw_clocks(mut self, hw: Box<dyn HwClocks>) -> Self {
        self.hw = hw;
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

    /// TX stamps that came after their probe's record was written.
    pub fn late_tx(&self) -> u64 {
        self.late_tx
    }

    /// Matcher slots dropped without a record (arrived, never sent).
    pub fn unmatched(&self) -> u64 {
        self.unmatched
    }

    /// Hardware stamps left out because no PHC conversion was possible.
    pub fn hw_unconverted(&self) -> u64 {
        self.hw_unconverted
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

    /// The slot of `seq` if the window already holds it. Events keyed by
    /// a seq from the wire that cannot come before the probe's send or
    /// arrival use this: they never grow the window.
    fn slot_held(&mut self, seq: u64) -> Option<&mut Slot> {
        let idx = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.window.get_mut(idx)
    }

    fn remember_finalized(&mut self, opt_id: u32, kinds: u8, send_ns: i64) {
        if self.finalized.insert(opt_id, kinds).is_none() {
            self.finalized_order.push_back((opt_id, send_ns));
        }
        let horizon = send_ns.saturating_sub(self.timeout_ns.saturating_add(FINALIZED_HORIZON_NS));
        while let Some(&(old, old_send_ns)) = self.finalized_order.front() {
            if self.finalized_order.len() <= FINALIZED_MEMORY && old_send_ns >= horizon {
                break;
            }
            self.finalized_order.pop_front();
            self.finalized.remove(&old);
        }
    }

    /// Feeds one event. Arrival-order facts (reordering, duplicates) go to `stats` directly.
    pub fn on_event(&mut self, ev: Event, stats: &mut RunStats) {
        match ev {
            Event::Sent {
                seq,
                opt_id,
                sched_ns,
                send_ns,
            } => self.on_sent(seq, opt_id, sched_ns, send_ns),
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
            Event::TxTimestamp {
                opt_id,
                kind,
                ts_ns,
            } => self.on_tx_timestamp(opt_id, kind, ts_ns, stats),
            Event::Arrived {
                seq,
                sw_ns,
                hw_ns,
                user_ns,
                echo_send_ns,
            } => {
                let arrival = Arrival {
                    sw_ns,
                    hw_ns,
                    user_ns: Some(user_ns),
                    echo_send_ns,
                };
                self.on_arrived(seq, arrival, stats);
            }
            Event::EchoTx {
                opt_id,
                kind,
                ts_ns,
            } => {
                // Sent after the probe's arrival, which made its slot.
                if let Some(seq) = self.seq_of_low_bits(opt_id)
                    && let Some(s) = self.slot_held(seq)
                    && !s.echo_tx.put(kind, ts_ns)
                {
                    stats.on_echo_tx_duplicate();
                }
            }
            Event::Echoed {
                seq,
                sw_ns,
                hw_ns,
                user_ns,
                reflector,
            } => self.on_echoed(seq, (sw_ns, hw_ns, user_ns), reflector, stats),
            Event::Foreign => stats.on_foreign_packet(),
            Event::NeverSent => stats.on_never_sent(),
        }
    }

    fn on_sent(&mut self, seq: u64, opt_id: u32, sched_ns: i64, send_ns: i64) {
        let early = self.early_tx.remove(&opt_id);
        if let Some(s) = self.slot(seq) {
            s.sent = Some((sched_ns, send_ns, opt_id));
            if let Some(tx) = early {
                s.tx = tx;
            }
            self.opt_to_seq.insert(opt_id, seq);
        }
    }

    fn on_tx_timestamp(&mut self, opt_id: u32, kind: TxKind, ts_ns: i64, stats: &mut RunStats) {
        if let Some(kinds) = self.finalized.get_mut(&opt_id) {
            // Its record is written: a kind it had is a duplicate
            // (e.g. skb-mode redirect stamps the send a second
            // time), a kind it lacked came too late to be used.
            if *kinds & kind_bit(kind) != 0 {
                stats.on_tx_timestamp_duplicate();
            } else {
                *kinds |= kind_bit(kind);
                self.late_tx += 1;
                stats.on_tx_timestamp_late();
            }
            return;
        }
        let fresh = match self.opt_to_seq.get(&opt_id).copied() {
            Some(seq) => self.slot(seq).is_none_or(|s| s.tx.put(kind, ts_ns)),
            None => match self.early_tx.entry(opt_id) {
                Entry::Vacant(v) => v.insert(TxStamps::default()).put(kind, ts_ns),
                Entry::Occupied(mut o) => o.get_mut().put(kind, ts_ns),
            },
        };
        if !fresh {
            // Keep the first: a second stamp of the same kind comes
            // from a later hop (skb-mode redirect out of a veth).
            stats.on_tx_timestamp_duplicate();
        }
    }

    fn on_arrived(&mut self, seq: u64, arrival: Arrival, stats: &mut RunStats) {
        if seq < self.base {
            self.late_arrivals += 1;
            return;
        }
        match self.slot(seq) {
            Some(s) => {
                let first = s.arrived.is_none();
                if first {
                    s.arrived = Some(arrival);
                }
                stats.on_arrival(seq, first);
            }
            None => stats.on_foreign_packet(),
        }
    }

    /// `echoed`: the echo's software and hardware RX stamps and when it was read.
    fn on_echoed(
        &mut self,
        seq: u64,
        echoed: (Option<i64>, Option<i64>, i64),
        reflector: Option<KernelTimes>,
        stats: &mut RunStats,
    ) {
        if seq < self.base {
            if self.kernel_reflector {
                self.late_arrivals += 1;
            }
            stats.on_late_echo();
            return;
        }
        let kernel = self.kernel_reflector;
        let Some(s) = self.slot(seq) else {
            // Further ahead than any window of probes in flight.
            stats.on_never_sent();
            return;
        };
        if s.echoed.is_some() {
            if kernel {
                stats.on_arrival(seq, false);
            }
            return;
        }
        s.echoed = Some(echoed);
        if kernel && s.arrived.is_none() {
            s.arrived = Some(Arrival {
                sw_ns: reflector.map(|k| k.rx_ns),
                hw_ns: None,
                user_ns: None,
                echo_send_ns: None,
            });
            if let Some(k) = reflector {
                s.echo_tx.sw.get_or_insert(k.tx_ns);
            }
            stats.on_arrival(seq, true);
        }
    }

    /// Hands out, in seq order, every probe that is complete or whose
    /// timeout passed at `now_ns`. With `flush_all` everything sent is
    /// finalized (end of run).
    pub fn drain(&mut self, now_ns: i64, flush_all: bool, mut out: impl FnMut(ProbeRecord)) {
        while let Some(front) = self.window.front() {
            let Some((_, send_ns, _)) = front.sent else {
                if flush_all {
                    // Seen at the receiver but never recorded as sent: no
                    // record can be written for it; counted as unaccounted.
                    self.window.pop_front();
                    self.base += 1;
                    self.unmatched += 1;
                    continue;
                }
                break;
            };
            let expired = now_ns - send_ns >= self.timeout_ns;
            if !(flush_all || expired || front.complete(self.expect)) {
                break;
            }
            let slot = self.window.pop_front().expect("front exists");
            let seq = self.base;
            self.base += 1;
            out(self.finalize(seq, slot));
        }
        // Early TX stamps whose send never showed up within the window are
        // stale. A run that never ends must not collect them forever: far
        // more than any batch holds in flight means they are orphans.
        if flush_all || self.early_tx.len() > FINALIZED_MEMORY {
            self.early_tx.clear();
        }
        // A stall fills the window up to rate x timeout; give the memory
        // back once it has drained, so a run that never ends keeps the
        // footprint of its present, not of its worst second.
        shrink_deque(&mut self.window);
        shrink_map(&mut self.opt_to_seq);
        shrink_map(&mut self.early_tx);
        shrink_map(&mut self.finalized);
        shrink_deque(&mut self.finalized_order);
    }

    fn convert(&mut self, raw: Option<i64>, sender_nic: bool) -> Option<i64> {
        let raw = raw?;
        let t = if sender_nic {
            self.hw.sender(raw)
        } else {
            self.hw.receiver(raw)
        };
        if t.is_none() {
            self.hw_unconverted += 1;
        }
        t
    }

    fn finalize(&mut self, seq: u64, s: Slot) -> ProbeRecord {
        let (sched_ns, send_ns, opt_id) = s.sent.expect("finalized slots were sent");
        if !s.send_failed {
            self.opt_to_seq.remove(&opt_id);
            let kinds = [
                (s.tx.sched, TxKind::Sched),
                (s.tx.sw, TxKind::Software),
                (s.tx.hw, TxKind::Hardware),
            ]
            .iter()
            .filter(|(t, _)| t.is_some())
            .fold(0u8, |acc, (_, k)| acc | kind_bit(*k));
            self.remember_finalized(opt_id, kinds, send_ns);
        }
        let (rx_sw, rx_hw, rx_user, echo_send) = match s.arrived {
            Some(a) => (a.sw_ns, a.hw_ns, a.user_ns, a.echo_send_ns),
            None => (None, None, None, None),
        };
        let (echo_sw, echo_hw, echo_user) = match s.echoed {
            Some((sw, hw, user)) => (sw, hw, Some(user)),
            None => (None, None, None),
        };
        let mut r = ProbeRecord {
            seq,
            flow: self.flow,
            size: self.size,
            sched_ns,
            send_ns,
            tx_sched_ns: s.tx.sched,
            tx_ns: s.tx.sw,
            tx_hw_ns: self.convert(s.tx.hw, true),
            rx_ns: rx_sw,
            rx_hw_ns: self.convert(rx_hw, false),
            rx_user_ns: rx_user,
            echo_send_ns: echo_send,
            echo_tx_sched_ns: s.echo_tx.sched,
            echo_tx_ns: s.echo_tx.sw,
            echo_tx_hw_ns: self.convert(s.echo_tx.hw, false),
            echo_ns: echo_sw,
            echo_hw_ns: self.convert(echo_hw, true),
            echo_user_ns: echo_user,
            lost: s.arrived.is_none(),
            ..Default::default()
        };
        chain::derive(&mut r);
        r
    }
}

/// Which datagrams on the probe socket are echoes of this run.
pub(crate) struct EchoRules<'a> {
    pub(crate) wire: &'a Wire,
    pub(crate) target: SocketAddr,
    /// The pacer's count of probes tried, raised before each send: the
    /// first seq not yet sent.
    pub(crate) issued: &'a AtomicU64,
}

/// What one datagram on the probe socket is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Verdict {
    /// An echo of a probe of the run (the matcher tells whether it is late).
    Probe(Echo),
    /// A late copy of the warm-up's echo: its clock and TTL facts only.
    WarmUp(Echo),
    /// From elsewhere, of another session, or not an echo at all.
    Foreign,
    /// Of this session, but its seq had not been sent when it was read.
    NeverSent,
}

impl EchoRules<'_> {
    /// `sent_end`: the issued count read after the datagram was.
    pub(crate) fn judge(&self, payload: &[u8], src: SocketAddr, sent_end: u64) -> Verdict {
        if !socket::same_endpoint(src, self.target) {
            return Verdict::Foreign;
        }
        match self.wire.decode(payload) {
            None => Verdict::Foreign,
            Some(e) if e.warmup && e.seq == WARMUP_SEQ => Verdict::WarmUp(e),
            Some(e) if !e.warmup && e.seq < sent_end => Verdict::Probe(e),
            Some(_) => Verdict::NeverSent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::{StartSrc, TsSource};

    const ALL: Expect = Expect {
        tx: true,
        tx_hw: false,
        echo_tx: false,
        echo_tx_hw: false,
    };

    fn sent(seq: u64) -> Event {
        Event::Sent {
            seq,
            opt_id: seq as u32,
            sched_ns: 1000 * seq as i64,
            send_ns: 1000 * seq as i64 + 1,
        }
    }

    fn tx(opt_id: u32, kind: TxKind, ts_ns: i64) -> Event {
        Event::TxTimestamp {
            opt_id,
            kind,
            ts_ns,
        }
    }

    fn arrived(seq: u64, sw: Option<i64>) -> Event {
        Event::Arrived {
            seq,
            sw_ns: sw,
            hw_ns: None,
            user_ns: sw.unwrap_or(0) + 3,
            echo_send_ns: sw.map(|t| t + 4),
        }
    }

    fn echoed(seq: u64, sw: Option<i64>) -> Event {
        Event::Echoed {
            seq,
            sw_ns: sw,
            hw_ns: None,
            user_ns: sw.unwrap_or(0) + 2,
            reflector: None,
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
    fn complete_probe_any_event_order_every_stamp_kept() {
        let mut m = Matcher::new(64, 0, 1_000_000, ALL);
        let evs = [
            arrived(0, Some(50)),
            tx(0, TxKind::Software, 10),
            sent(0),
            tx(0, TxKind::Sched, 4),
            Event::EchoTx {
                opt_id: 0,
                kind: TxKind::Sched,
                ts_ns: 58,
            },
            Event::EchoTx {
                opt_id: 0,
                kind: TxKind::Software,
                ts_ns: 62,
            },
            echoed(0, Some(90)),
        ];
        let (v, _) = run(&mut m, &evs, 0, false);
        assert_eq!(v.len(), 1);
        let r = &v[0];
        assert_eq!(
            (r.tx_sched_ns, r.tx_ns, r.rx_ns, r.echo_ns),
            (Some(4), Some(10), Some(50), Some(90))
        );
        assert_eq!((r.rx_user_ns, r.echo_send_ns), (Some(53), Some(54)));
        assert_eq!(
            (r.echo_tx_sched_ns, r.echo_tx_ns, r.echo_user_ns),
            (Some(58), Some(62), Some(92))
        );
        assert_eq!(r.start_src, Some(StartSrc::Sched));
        assert_eq!(
            (r.one_way_ns, r.rtt_ns),
            (Some(46), Some(86)),
            "from the SCHED stamp"
        );
        assert_eq!(r.path_ns, Some(40), "the old tx->rx figure");
        assert_eq!(r.sender_queue_ns, Some(6));
        assert_eq!(r.ts_source, Some(TsSource::Software));
        assert_eq!(
            r.turnaround_ns,
            Some(12),
            "the echo left 12 ns after the probe's RX stamp"
        );
        assert!(!r.lost);
    }

    #[test]
    fn waits_in_order_then_times_out() {
        let mut m = Matcher::new(64, 0, 500, ALL);
        // seq 1 complete, seq 0 still missing its arrival.
        let evs = [
            sent(0),
            sent(1),
            tx(0, TxKind::Software, 5),
            tx(1, TxKind::Software, 1005),
            arrived(1, Some(1100)),
            echoed(1, Some(1200)),
        ];
        let (v, _) = run(&mut m, &evs, 100, false);
        assert!(v.is_empty(), "seq 1 must wait for seq 0");
        let mut out = vec![];
        m.drain(600, false, |r| out.push(r));
        assert_eq!(out.len(), 2);
        assert!(out[0].lost && out[0].one_way_ns.is_none());
        assert_eq!(out[0].tx_ns, Some(5), "a lost probe keeps its TX stamp");
        assert_eq!(
            out[1].one_way_ns,
            Some(99),
            "no SCHED stamp: from the user-space send (1001)"
        );
        assert_eq!(out[1].start_src, Some(StartSrc::User));
        // Arrives after being given up.
        let mut st = RunStats::new();
        m.on_event(arrived(0, None), &mut st);
        assert_eq!(m.late_arrivals(), 1);
    }

    #[test]
    fn duplicate_stamps_keep_first_late_ones_are_counted_apart() {
        let mut m = Matcher::new(64, 0, 1_000, ALL);
        let evs = [
            sent(0),
            tx(0, TxKind::Software, 10),
            tx(0, TxKind::Software, 30),
            arrived(0, Some(50)),
            echoed(0, Some(90)),
        ];
        let (v, st) = run(&mut m, &evs, 0, false);
        assert_eq!(v[0].tx_ns, Some(10));
        assert_eq!(st.summary().tx_timestamp_duplicates, 1);
        // After finalization: a kind it had is a duplicate, one it lacked is late.
        let mut st = RunStats::new();
        m.on_event(tx(0, TxKind::Software, 40), &mut st);
        m.on_event(tx(0, TxKind::Sched, 5), &mut st);
        m.on_event(tx(0, TxKind::Sched, 6), &mut st);
        let s = st.summary();
        assert_eq!(s.tx_timestamp_duplicates, 2);
        assert_eq!(s.tx_timestamp_late, 1);
        assert_eq!(m.late_tx(), 1);
    }

    #[test]
    fn duplicate_tx_timestamps_before_the_send_event_keep_the_first() {
        let mut m = Matcher::new(64, 0, 1_000, ALL);
        let evs = [
            tx(0, TxKind::Sched, 3),
            tx(0, TxKind::Software, 10),
            tx(0, TxKind::Software, 30),
            sent(0),
            arrived(0, Some(50)),
            echoed(0, Some(90)),
        ];
        let (v, st) = run(&mut m, &evs, 0, false);
        assert_eq!(v[0].tx_ns, Some(10));
        assert_eq!(v[0].tx_sched_ns, Some(3));
        assert_eq!(v[0].one_way_ns, Some(47));
        assert_eq!(st.summary().tx_timestamp_duplicates, 1);
    }

    struct Offset(i64);
    impl HwClocks for Offset {
        fn sender(&self, raw: i64) -> Option<i64> {
            Some(raw + self.0)
        }
        fn receiver(&self, raw: i64) -> Option<i64> {
            Some(raw + 2 * self.0)
        }
    }

    #[test]
    fn hardware_stamps_are_kept_beside_software_ones_and_converted() {
        let expect = Expect { tx_hw: true, ..ALL };
        let mut m = Matcher::new(64, 0, 1_000, expect).with_hw_clocks(Box::new(Offset(100)));
        let evs = [
            sent(0),
            tx(0, TxKind::Software, 10),
            arrived(0, Some(50)),
            Event::Echoed {
                seq: 0,
                sw_ns: Some(95),
                hw_ns: Some(-20),
                user_ns: 99,
                reflector: None,
            },
        ];
        let (v, _) = run(&mut m, &evs, 0, false);
        assert!(v.is_empty(), "waits for the hardware TX stamp");
        let (v, st) = run(&mut m, &[tx(0, TxKind::Hardware, -88)], 0, false);
        assert_eq!(v[0].tx_ns, Some(10), "tx_ns stays the software stamp");
        assert_eq!(v[0].tx_hw_ns, Some(12), "PHC -88 + 100 on the system clock");
        assert_eq!(v[0].echo_hw_ns, Some(80));
        assert_eq!(v[0].driver_ns, Some(2));
        assert_eq!(v[0].tx_src, Some(TsSource::Hardware));
        assert_eq!(st.summary().tx_timestamp_duplicates, 0);
        // Without a PHC conversion the hardware stamps are left out and counted.
        let mut m = Matcher::new(64, 0, 1_000, ALL);
        let (v, _) = run(
            &mut m,
            &[
                sent(0),
                tx(0, TxKind::Software, 10),
                tx(0, TxKind::Hardware, 11),
                arrived(0, Some(50)),
                echoed(0, None),
            ],
            0,
            false,
        );
        assert_eq!(v[0].tx_hw_ns, None);
        assert_eq!(m.hw_unconverted(), 1);
        assert_eq!(v[0].rtt_ns, None);
    }

    #[test]
    fn duplicates_reorder_and_foreign() {
        let mut m = Matcher::new(64, 0, 1_000, Expect::default());
        let evs = [
            sent(0),
            sent(1),
            arrived(1, None),
            arrived(0, None),
            arrived(0, None),
            arrived(u64::MAX, None),
            Event::Foreign,
        ];
        let (v, st) = run(&mut m, &evs, 5000, false);
        assert_eq!(v.len(), 2);
        let s = st.summary();
        assert_eq!((s.reordered, s.duplicates, s.foreign_packets), (1, 1, 2));
    }

    #[test]
    fn echo_tx_stamps_by_low_seq_bits_and_waited_for() {
        let expect = Expect {
            echo_tx: true,
            ..ALL
        };
        let mut m = Matcher::new(64, 0, 1_000, expect);
        let done = |seq: u64| {
            [
                sent(seq),
                tx(seq as u32, TxKind::Software, 1),
                arrived(seq, Some(10)),
                echoed(seq, Some(30)),
            ]
        };
        let (v, _) = run(&mut m, &done(0), 0, false);
        assert!(v.is_empty(), "waits for the echo's TX stamp");
        let (v, st) = run(
            &mut m,
            &[
                Event::EchoTx {
                    opt_id: 0,
                    kind: TxKind::Software,
                    ts_ns: 14,
                },
                Event::EchoTx {
                    opt_id: 0,
                    kind: TxKind::Software,
                    ts_ns: 15,
                },
            ],
            0,
            false,
        );
        assert_eq!(v[0].turnaround_ns, Some(4));
        assert_eq!(v[0].reflector_ns, Some(1), "read at 13, echo stamped at 14");
        assert_eq!(v[0].return_ns, Some(16));
        assert_eq!(st.summary().echo_tx_duplicates, 1);
        // Low bits resolve across the 2^32 wrap relative to the window base.
        assert_eq!(m.seq_of_low_bits(1), Some(1));
        let mut far = Matcher::new(64, 0, 1_000, ALL);
        far.base = (1 << 32) - 2;
        assert_eq!(far.seq_of_low_bits(1), Some((1 << 32) + 1));
        assert_eq!(far.seq_of_low_bits(u32::MAX - 1), Some((1 << 32) - 2));
        assert_eq!(far.seq_of_low_bits(u32::MAX - 2), None, "behind the window");
    }

    #[test]
    fn send_failure_is_accounted_as_lost() {
        let mut m = Matcher::new(64, 0, 1_000, ALL);
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
    fn flush_all_finalizes_everything_sent_and_counts_unmatched_slots() {
        let mut m = Matcher::new(64, 0, i64::MAX / 2, ALL);
        let (v, _) = run(&mut m, &[sent(0), sent(1), sent(2)], 0, true);
        assert_eq!(v.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(m.in_flight(), 0);
        assert_eq!(m.unmatched(), 0);
        // Seq 3 arrived but its send was never recorded: no record, counted.
        let (v, _) = run(&mut m, &[arrived(3, Some(5)), sent(4)], 0, true);
        assert_eq!(v.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![4]);
        assert_eq!(m.unmatched(), 1);
    }

    #[test]
    fn finalized_memory_is_bounded() {
        let mut m = Matcher::new(64, 0, 0, Expect::default());
        let mut st = RunStats::new();
        for seq in 0..(FINALIZED_MEMORY as u64 + 100) {
            m.on_event(sent(seq), &mut st);
            m.drain(i64::MAX, false, |_| {});
        }
        assert_eq!(m.finalized.len(), FINALIZED_MEMORY);
        assert_eq!(m.finalized_order.len(), FINALIZED_MEMORY);
    }

    /// A slow stream remembers the sends of the last seconds, not 64 Ki.
    #[test]
    fn finalized_memory_of_a_slow_stream_is_its_last_seconds() {
        let timeout_ns = 1_000_000_000;
        let mut m = Matcher::new(64, 0, timeout_ns, Expect::default());
        let mut st = RunStats::new();
        let interval_ns = 100_000_000;
        for seq in 0..20_000u64 {
            let t = seq as i64 * interval_ns;
            m.on_event(
                Event::Sent {
                    seq,
                    opt_id: seq as u32,
                    sched_ns: t,
                    send_ns: t,
                },
                &mut st,
            );
            m.drain(t + 2 * timeout_ns, false, |_| {});
        }
        let kept = ((timeout_ns + FINALIZED_HORIZON_NS) / interval_ns + 1) as usize;
        assert_eq!(m.finalized.len(), kept);
        assert_eq!(m.finalized_order.len(), kept);
        assert!(m.finalized.capacity() <= 4 * KEEP_CAPACITY);
        // A stamp of a send within the horizon is still told late.
        m.on_event(
            Event::TxTimestamp {
                opt_id: 19_999,
                kind: TxKind::Software,
                ts_ns: 0,
            },
            &mut st,
        );
        assert_eq!(m.late_tx, 1);
    }

    #[test]
    fn kernel_reflector_echo_stands_for_the_arrival() {
        let mut m = Matcher::new(64, 0, 1_000, ALL).with_kernel_reflector(true);
        let kernel_echo = |seq: u64, times: Option<KernelTimes>| Event::Echoed {
            seq,
            sw_ns: Some(200 + seq as i64 * 1000),
            hw_ns: None,
            user_ns: 210 + seq as i64 * 1000,
            reflector: times,
        };
        let evs = [
            sent(0),
            tx(0, TxKind::Software, 10),
            kernel_echo(
                0,
                Some(KernelTimes {
                    rx_ns: 100,
                    tx_ns: 102,
                }),
            ),
            // Too short for times: arrived, but no reflector stamps.
            sent(1),
            tx(1, TxKind::Software, 1010),
            kernel_echo(1, None),
            // Never echoed: lost.
            sent(2),
            tx(2, TxKind::Software, 2010),
        ];
        let (v, st) = run(&mut m, &evs, 10_000, true);
        assert_eq!(v.len(), 3);
        let r = &v[0];
        assert!(!r.lost);
        assert_eq!((r.rx_ns, r.echo_tx_ns), (Some(100), Some(102)));
        assert_eq!(
            (r.rx_user_ns, r.echo_send_ns, r.echo_tx_sched_ns),
            (None, None, None)
        );
        assert_eq!(r.turnaround_ns, Some(2));
        assert_eq!(r.echo_ns, Some(200));
        assert!(!v[1].lost);
        assert_eq!((v[1].rx_ns, v[1].echo_tx_ns), (None, None));
        assert_eq!(v[1].echo_ns, Some(1200));
        assert!(v[2].lost);
        assert_eq!(st.summary().duplicates, 0);
        // A duplicate echo counts as a duplicate arrival; a late one as late.
        let mut st = RunStats::new();
        let mut m = Matcher::new(64, 0, 1_000, ALL).with_kernel_reflector(true);
        for e in [sent(0), kernel_echo(0, None), kernel_echo(0, None)] {
            m.on_event(e, &mut st);
        }
        assert_eq!(st.summary().duplicates, 1);
        m.drain(i64::MAX, true, |_| {});
        m.on_event(kernel_echo(0, None), &mut st);
        assert_eq!(m.late_arrivals(), 1);
    }

    #[test]
    fn late_and_never_sent_echoes_are_counted_apart_and_grow_nothing() {
        let mut m = Matcher::new(64, 0, 1_000, ALL).with_kernel_reflector(true);
        let mut st = RunStats::new();
        m.on_event(sent(0), &mut st);
        m.on_event(echoed(0, Some(5)), &mut st);
        m.drain(i64::MAX, true, |_| {});
        // The record of seq 0 is written: its echo again is late.
        m.on_event(echoed(0, Some(6)), &mut st);
        // Told by the reader, and beyond any window: both never sent.
        m.on_event(Event::NeverSent, &mut st);
        m.on_event(echoed(u64::MAX, Some(7)), &mut st);
        // An echo's TX stamp for a seq the window does not hold.
        m.on_event(
            Event::EchoTx {
                opt_id: 1 << 20,
                kind: TxKind::Software,
                ts_ns: 9,
            },
            &mut st,
        );
        let s = st.summary();
        assert_eq!((s.late_echoes, s.never_sent, s.foreign_packets), (1, 2, 0));
        assert_eq!(
            m.in_flight(),
            0,
            "nothing keyed by a seq from the wire was kept"
        );
        assert!(m.window.capacity() <= KEEP_CAPACITY);
    }

    #[test]
    fn the_window_gives_memory_back_after_a_stall() {
        let mut m = Matcher::new(64, 0, 1_000, ALL);
        let mut stats = RunStats::new();
        // 100 000 probes in flight at once (a stall), then all finalized.
        for seq in 0..100_000 {
            m.on_event(sent(seq), &mut stats);
        }
        assert!(m.window.capacity() >= 100_000);
        m.drain(i64::MAX, false, |_| {});
        assert_eq!(m.in_flight(), 0);
        assert!(
            m.window.capacity() <= 2 * KEEP_CAPACITY,
            "{}",
            m.window.capacity()
        );
        assert!(
            m.opt_to_seq.capacity() <= 2 * KEEP_CAPACITY,
            "{}",
            m.opt_to_seq.capacity()
        );
    }

    mod echo_rules {
        use super::super::*;
        use crate::probe::wire::ProtocolArg;
        use crate::probe::{
            stamp::{ErrorEstimate, Mode, ReflectorPacket, Timestamp},
            wire::SSID_WARMUP_BIT,
        };
        use std::sync::atomic::Ordering;

        fn rules_check(protocol: ProtocolArg) {
            let wire = match protocol {
                ProtocolArg::Rtprobe => Wire::Rtprobe {
                    session: 0x1234,
                    flow: 0,
                },
                ProtocolArg::Stamp => Wire::Stamp {
                    ssid: 77,
                    key: None,
                    ee: ErrorEstimate::from_error_ns(false, 0, false),
                    tai_offset_s: 0,
                },
            };
            let target: SocketAddr = "192.0.2.1:862".parse().unwrap();
            let issued = AtomicU64::new(10);
            let rules = EchoRules {
                wire: &wire,
                target,
                issued: &issued,
            };
            let echo = |w: &Wire, seq: u64, warmup: bool| {
                let mut buf = vec![0u8; 64];
                let mut scratch = Vec::new();
                w.encode(
                    seq,
                    1_763_850_000_000_000_000,
                    warmup,
                    &mut buf,
                    &mut scratch,
                );
                match w {
                    // The reflector's answer: the echo flag (rtprobe); STAMP's
                    // reflector packet carries the sender's seq and SSID.
                    Wire::Rtprobe { .. } => buf[5] |= crate::probe::packet::FLAG_ECHO,
                    Wire::Stamp { ssid, .. } => {
                        let ssid = if warmup {
                            ssid | SSID_WARMUP_BIT
                        } else {
                            *ssid
                        };
                        let r = ReflectorPacket {
                            seq: 0,
                            timestamp: Timestamp::from_bits(0, false).unwrap(),
                            error_estimate: ErrorEstimate::from_error_ns(false, 0, false),
                            ssid,
                            receive_timestamp: Timestamp::from_bits(0, false).unwrap(),
                            sender_seq: seq as u32,
                            sender_timestamp: Timestamp::from_bits(0, false).unwrap(),
                            sender_error_estimate: ErrorEstimate::from_error_ns(false, 0, false),
                            sender_ttl: 64,
                        };
                        r.encode(Mode::Unauthenticated, 64, &mut scratch).unwrap();
                        buf.copy_from_slice(&scratch);
                    }
                }
                buf
            };
            let judge =
                |b: &[u8], src: SocketAddr| rules.judge(b, src, issued.load(Ordering::SeqCst));
            assert!(
                matches!(judge(&echo(&wire, 9, false), target), Verdict::Probe(e) if e.seq == 9)
            );
            assert!(matches!(
                judge(&echo(&wire, WARMUP_SEQ, true), target),
                Verdict::WarmUp(_)
            ));
            // Foreign: another source (even with the right session), another
            // session, bytes that decode as nothing.
            let elsewhere: SocketAddr = "192.0.2.99:862".parse().unwrap();
            let other_port: SocketAddr = "192.0.2.1:863".parse().unwrap();
            assert_eq!(judge(&echo(&wire, 1, false), elsewhere), Verdict::Foreign);
            assert_eq!(judge(&echo(&wire, 1, false), other_port), Verdict::Foreign);
            let other = match &wire {
                Wire::Rtprobe { flow, .. } => Wire::Rtprobe {
                    session: 0x4321,
                    flow: *flow,
                },
                Wire::Stamp { ee, .. } => Wire::Stamp {
                    ssid: 78,
                    key: None,
                    ee: *ee,
                    tai_offset_s: 0,
                },
            };
            assert_eq!(judge(&echo(&other, 1, false), target), Verdict::Foreign);
            assert_eq!(judge(&[0u8; 7], target), Verdict::Foreign);
            // Never sent: at or past the pacer's count, or a warm-up-marked
            // echo of another seq.
            for seq in [10, 0x7FFF_FFFF, 0xFFFF_FFFF] {
                assert_eq!(
                    judge(&echo(&wire, seq, false), target),
                    Verdict::NeverSent,
                    "{seq}"
                );
            }
            assert_eq!(judge(&echo(&wire, 3, true), target), Verdict::NeverSent);
            issued.store(11, Ordering::SeqCst);
            assert!(matches!(
                judge(&echo(&wire, 10, false), target),
                Verdict::Probe(_)
            ));
        }

        #[test]
        fn echoes_only_from_the_target_of_this_session_for_a_seq_sent() {
            rules_check(ProtocolArg::Rtprobe);
            rules_check(ProtocolArg::Stamp);
        }
    }
}
