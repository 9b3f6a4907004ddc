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
pub trait HwClocks: Send + Sync {
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
    hw: std::sync::Arc<dyn HwClocks>,
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
            hw: std::sync::Arc::new(NoHwClocks),
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
    pub(crate) fn with_kernel_reflector(mut self, on: bool) -> Self {
        self.kernel_reflector = on;
        self
    }

    /// Converts hardware stamps with `hw` (default: none are converted).
    pub(crate) fn with_hw_clocks(mut self, hw: std::sync::Arc<dyn HwClocks>) -> Self {
        self.hw = hw;
        self
    }

    /// The seq whose low 32 bits are `id`, among the probes in the window.
    fn seq_of_low_bits(&self, id: u32) -> Option<u64> {
        let seq = self.base + u64::from(id.wrapping_sub(self.base as u32));
        (seq - self.base < MAX_WINDOW).then_some(seq)
    }

    /// Probes that arrived after they had been given up as lost.
    pub(crate) fn late_arrivals(&self) -> u64 {
        self.late_arrivals
    }

    /// TX stamps that came after their probe's record was written.
    #[cfg(test)]
    pub(crate) fn late_tx(&self) -> u64 {
        self.late_tx
    }

    /// Matcher slots dropped without a record (arrived, never sent).
    pub(crate) fn unmatched(&self) -> u64 {
        self.unmatched
    }

    /// Hardware stamps left out because no PHC conversion was possible.
    pub(crate) fn hw_unconverted(&self) -> u64 {
        self.hw_unconverted
    }

    /// Probes in flight (not yet finalized).
    pub(crate) fn in_flight(&self) -> usize {
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
#[path = "matcher_tests.rs"]
mod tests;
