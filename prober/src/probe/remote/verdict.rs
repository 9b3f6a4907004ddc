//! What the echoes told besides the records: the ledger kept as they
//! arrive, the loss split by direction, the clock verdict on one-way
//! figures, the protocol facts, and from them a target's outcome and
//! summary.

use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::Result;

use super::{Prepared, RemoteLeg, Target};
use crate::stats::observer::LossDirections;
use crate::{
    probe::wire::ProtocolArg,
    probe::{
        SessionOutcome, engine,
        stamp::{ClockSync, ErrorEstimate},
        wire::{Echo, Wire},
    },
    stats::report::{ClockReport, ReflectorReport},
};

/// The STAMP status probe's sequence number: a stateful reflector answers
/// with its count instead, a stateless one with this number.
pub(super) const STAMP_STATUS_SEQ: u32 = u32::MAX - 2;

/// What the echoes told beyond the records. Constant size: it keeps no
/// per-seq state, whatever seqs arrive (how many probes came back is the
/// records' count, see [`split_loss`]).
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Highest seq echoed, with the reflector's count (rtprobe) or its own
    /// sequence number (STAMP) in that echo.
    pub(super) last: Option<(u64, Option<u64>, Option<u32>)>,
    /// STAMP: every reflector sequence number equalled the sender's.
    pub(super) stamp_seq_mirrored: bool,
    pub(super) ee: Option<ErrorEstimate>,
    pub(super) ttl_min: Option<u8>,
    pub(super) ttl_max: Option<u8>,
    /// The answer to the trailing status probe.
    pub(super) trailer: Option<Echo>,
    /// The latest echo that carried the reflector's count: its seq and
    /// how many of the session's probes the reflector had then.
    counted: Option<(u64, u64)>,
    /// Runs of seqs between two counted echoes (none of them echoed),
    /// oldest first: how many of them never reached the reflector.
    gaps: std::collections::VecDeque<Gap>,
    /// Each lost probe's direction as these told when it was given up.
    pub(super) labelled: LossDirections,
}

/// Seqs `first..end` between two echoes with the reflector's count: of
/// those lost, `forward` never reached it (the rest were lost on the way
/// back); `known` false when the counts cannot tell (a STAMP reflector
/// whose numbers follow the sender's: stateless, or no forward loss).
#[derive(Debug, Clone, Copy)]
struct Gap {
    first: u64,
    end: u64,
    forward: u64,
    known: bool,
}

/// Most gaps remembered: about the probes in flight of a target losing
/// every other probe; a flood of forged counts cannot grow it further.
const MAX_GAPS: usize = 1 << 16;

impl Ledger {
    /// Nothing seen yet (STAMP numbers taken as the sender's until one is not).
    pub(super) fn new() -> Self {
        Self {
            stamp_seq_mirrored: true,
            ..Self::default()
        }
    }

    /// Notes an echo from the target of this session for a seq that was
    /// sent (the I/O loop refuses the others before they get here).
    pub(super) fn on_echo(&mut self, e: &Echo) {
        if e.ee.is_some() {
            self.ee = e.ee;
        }
        if let Some(t) = e.ttl {
            self.ttl_min = Some(self.ttl_min.map_or(t, |m| m.min(t)));
            self.ttl_max = Some(self.ttl_max.map_or(t, |m| m.max(t)));
        }
        if e.warmup {
            return;
        }
        if let Some(rs) = e.reflector_seq
            && rs as u64 != e.seq
        {
            self.stamp_seq_mirrored = false;
        }
        if self.last.is_none_or(|(s, _, _)| e.seq > s) {
            self.last = Some((e.seq, e.received, e.reflector_seq));
        }
        self.note_gap(e);
    }

    /// A counted echo after the last one: the gap between them, and how
    /// many of its seqs the reflector never got (the split of
    /// [`split_loss`], for that run of seqs).
    fn note_gap(&mut self, e: &Echo) {
        // rtprobe's reflector counts the session's probes; a stateful STAMP
        // reflector numbers its replies from 0.
        let Some(count) = e.received.or(e.reflector_seq.map(|r| u64::from(r) + 1)) else {
            return;
        };
        let (first, counted_before) = match self.counted {
            Some((s, _)) if e.seq <= s => return,
            Some((s, c)) => (s + 1, c),
            None => (0, 0),
        };
        self.counted = Some((e.seq, count));
        if e.seq == first || self.gaps.len() >= MAX_GAPS {
            return;
        }
        let missing = e.seq - first;
        // Got by the reflector among them: the count's growth, less this echo's probe.
        let got = count.saturating_sub(counted_before).saturating_sub(1);
        let forward = missing.saturating_sub(got);
        let mirrored = e.reflector_seq.is_some_and(|r| u64::from(r) == e.seq);
        self.gaps.push_back(Gap {
            first,
            end: e.seq,
            forward,
            known: !(mirrored && forward == 0),
        });
    }

    /// Labels probe `seq`, just given up as lost, with what the counts
    /// tell now (each lost probe once, in seq order).
    pub(super) fn label_lost(&mut self, seq: u64) {
        while self.gaps.front().is_some_and(|g| g.end <= seq) {
            self.gaps.pop_front();
        }
        let l = &mut self.labelled;
        match self.gaps.front_mut() {
            Some(g) if g.first <= seq && g.known && g.forward > 0 => {
                g.forward -= 1;
                l.forward += 1;
            }
            Some(g) if g.first <= seq && g.known => l.r#return += 1,
            _ => l.unknown += 1,
        }
    }
}

pub(crate) use crate::stats::report::LossSplit;

/// Splits `lost` of `sent` probes (seqs 0..sent) by what the reflector
/// said. The probes that came back are the records' count, `sent - lost`:
/// every one of them is at or below the highest seq echoed, so that count
/// is also how many came back up to it.
fn split_loss(
    l: &Ledger,
    sent: u64,
    lost: u64,
    protocol: ProtocolArg,
    stateless: bool,
) -> LossSplit {
    let unknown = |basis: &str| LossSplit {
        forward: None,
        r#return: None,
        unknown: lost,
        basis: basis.into(),
    };
    // Reflector's count of this session's probes at the trailer, if it answered.
    let final_count = l.trailer.and_then(|t| match protocol {
        ProtocolArg::Rtprobe => t.received,
        ProtocolArg::Stamp => t.reflector_seq.map(u64::from),
    });
    // A stateless reflector answers the status probe with its own number.
    let mirrored_status =
        protocol == ProtocolArg::Stamp && final_count == Some(STAMP_STATUS_SEQ as u64);
    let mirrored_run =
        protocol == ProtocolArg::Stamp && final_count.is_none() && l.stamp_seq_mirrored && lost > 0;
    if protocol == ProtocolArg::Stamp && (stateless || mirrored_status || mirrored_run) {
        return unknown(
            "the STAMP reflector echoes the sender's sequence numbers (stateless), which do not tell forward from return loss",
        );
    }
    if let Some(received) = final_count {
        let forward = sent.saturating_sub(received).min(lost);
        return LossSplit {
            forward: Some(forward),
            r#return: Some(lost - forward),
            unknown: 0,
            basis: "the reflector's count of probes received, asked after the run".into(),
        };
    }
    let Some((seq, received, refl_seq)) = l.last else {
        return unknown("no echo came back: nothing tells where the probes were lost");
    };
    let count = match protocol {
        ProtocolArg::Rtprobe => received,
        ProtocolArg::Stamp => refl_seq.map(|r| r as u64 + 1),
    };
    let Some(received) = count else {
        return unknown(
            "the echoes carry no count of probes received (an in-kernel reflector, or probes under 64 bytes)",
        );
    };
    let through = seq + 1;
    let lost_through = through.saturating_sub(sent.saturating_sub(lost));
    let forward = through.saturating_sub(received).min(lost_through);
    LossSplit {
        forward: Some(forward),
        r#return: Some(lost_through - forward),
        unknown: lost.saturating_sub(lost_through),
        basis: "the reflector's count in the last echo; probes after it are unknown (the status probe after the run got no answer)".into(),
    }
}

pub(crate) use crate::stats::report::ClockVerdict;

pub(super) const NOT_SYNCED_NOTE: &str = "clocks not synchronised: one-way not shown";

pub(super) fn clock_verdict(local: &ClockSync, remote: Option<ErrorEstimate>) -> ClockVerdict {
    let r_sync = remote.map(|e| e.synchronized());
    let r_err = remote.and_then(|e| e.to_error_ns());
    let shown = local.synchronized && r_sync == Some(true) && r_err.is_some();
    let bound = shown.then(|| local.max_error_ns.saturating_add(r_err.unwrap_or(0)));
    let note = match bound {
        Some(b) => format!(
            "one-way between two clocks: each figure is within ±{} of the truth (sender's maximum error {} + reflector's {})",
            fmt_ns(b),
            fmt_ns(local.max_error_ns),
            fmt_ns(r_err.unwrap_or(0))
        ),
        None => {
            let why = match (local.synchronized, r_sync) {
                (false, _) => "this host's clock is not synchronised (adjtimex STA_UNSYNC)",
                (true, None) => "the reflector does not say whether its clock is synchronised",
                (true, Some(false)) => {
                    "the reflector's clock is not synchronised (its Error Estimate's S bit is 0)"
                }
                (true, Some(true)) => "the reflector's error estimate is invalid",
            };
            format!("{NOT_SYNCED_NOTE} ({why}); RTT needs one clock only and is shown")
        }
    };
    ClockVerdict {
        one_way_shown: shown,
        bound_ns: bound,
        sender_synchronized: local.synchronized,
        sender_max_error_ns: local.max_error_ns,
        reflector_synchronized: r_sync,
        reflector_error_ns: r_err,
        note,
    }
}

fn fmt_ns(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 => format!("{:.1} s", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} µs", n as f64 / 1e3),
        n => format!("{n} ns"),
    }
}

/// What a session against a reflector not ours learned besides the
/// records ([`SessionOutcome::remote`]).
#[derive(Debug, Clone)]
pub(crate) struct RemoteFacts {
    pub(crate) loss: LossSplit,
    pub(crate) clock: ClockVerdict,
    /// Protocol facts for the summary (SSID, TTLs seen, echoes); `kind`
    /// is left for the caller to say.
    pub(crate) info: ReflectorReport,
    /// Times the target failed to open (resolve, socket, connect), and
    /// the last failure's cause.
    pub(crate) open_errors: u64,
    pub(crate) last_open_error: Option<String>,
}

impl RemoteFacts {
    pub(super) fn set_open_errors(&mut self, e: &super::OpenErrors) {
        self.open_errors = e.count;
        self.last_open_error.clone_from(&e.last);
    }
}

/// The outcome of a target that never opened: no probe sent, its failed
/// opens and the last one's cause.
pub(super) fn never_opened(
    l: &RemoteLeg,
    local_clock: &ClockSync,
    errors: &super::OpenErrors,
    stop: &AtomicU8,
) -> SessionOutcome {
    let loss = LossSplit {
        forward: None,
        r#return: None,
        unknown: 0,
        basis: "the target never opened: no probe was sent".into(),
    };
    let info = ReflectorReport {
        protocol: Some(l.target.protocol.name().into()),
        target: Some(l.host.clone().unwrap_or_else(|| l.target.addr.to_string())),
        echoes: Some(0),
        ..Default::default()
    };
    let mut facts = RemoteFacts {
        loss,
        clock: clock_verdict(local_clock, None),
        info,
        open_errors: 0,
        last_open_error: None,
    };
    facts.set_open_errors(errors);
    SessionOutcome {
        stats: crate::stats::RunStats::one_of_many(l.cfg.interval.as_nanos() as i64),
        hardware_tx: false,
        hardware_rx: false,
        late_arrivals: 0,
        interrupted: stop.load(Ordering::SeqCst) != 0,
        kernel_drops: None,
        hw_clocks: Default::default(),
        output_error: None,
        remote: Some(facts),
    }
}

/// A target's outcome: its statistics with the loss split, the clock
/// verdict and the protocol facts its echoes told.
pub(super) fn outcome(
    l: &RemoteLeg,
    p: Prepared,
    c: engine::Collected,
    sent: u64,
    trailer: Option<Echo>,
    local_clock: &ClockSync,
    stop: &AtomicU8,
) -> Result<SessionOutcome> {
    let target = &l.target;
    let (mut stats, late_arrivals, output_error) = c;
    stats.set_attempts(sent);
    let mut ledger = p
        .ledger
        .into_inner()
        .map_err(|_| anyhow::anyhow!("echo ledger poisoned"))?;
    ledger.trailer = trailer;
    let loss = split_loss(
        &ledger,
        sent,
        stats.lost(),
        target.protocol,
        target.stateless_reflector,
    );
    let clock = final_clock(target, local_clock, p.early, &ledger);
    let info = protocol_info(target, &p.wire, &ledger, stats.counts().received);
    Ok(SessionOutcome {
        stats,
        hardware_tx: false,
        hardware_rx: false,
        late_arrivals,
        // A failed output stops the session too; that is no interruption
        // (as on the testbed: `super::super::session`).
        interrupted: stop.load(Ordering::SeqCst) != 0 && output_error.is_none(),
        kernel_drops: None,
        hw_clocks: Default::default(),
        output_error,
        remote: Some(RemoteFacts {
            loss,
            clock,
            info,
            open_errors: 0,
            last_open_error: None,
        }),
    })
}

/// The one-way verdict at the end: shared clocks need none; otherwise the
/// clocks as the run started (if they failed then) or as the last echo said.
fn final_clock(
    target: &Target,
    local_clock: &ClockSync,
    early: ClockVerdict,
    ledger: &Ledger,
) -> ClockVerdict {
    if target.shared_clock {
        ClockVerdict {
            one_way_shown: true,
            bound_ns: None,
            sender_synchronized: local_clock.synchronized,
            sender_max_error_ns: local_clock.max_error_ns,
            reflector_synchronized: None,
            reflector_error_ns: None,
            note: "sender and reflector share this host's clock (namespaces): one-way needs no synchronisation".into(),
        }
    } else if !early.one_way_shown {
        early
    } else {
        clock_verdict(local_clock, ledger.ee)
    }
}

/// Protocol facts for the summary: the session id or SSID, the echoes and
/// (STAMP) the sender TTLs the reflector saw.
fn protocol_info(target: &Target, wire: &Wire, ledger: &Ledger, echoes: u64) -> ReflectorReport {
    let mut info = ReflectorReport {
        protocol: Some(target.protocol.name().into()),
        target: Some(target.addr.to_string()),
        echoes: Some(echoes),
        ..Default::default()
    };
    match wire {
        Wire::Rtprobe { session, .. } => info.session = Some(format!("{session:#018x}")),
        Wire::Stamp { ssid, key, .. } => {
            info.ssid = Some(*ssid);
            info.authenticated = Some(key.is_some());
            info.sender_ttl_min = Some(ledger.ttl_min);
            info.sender_ttl_max = Some(ledger.ttl_max);
        }
    }
    info
}

/// The clock-related fields of a summary when the clocks are not shown to
/// agree: one-way figures and the two stages that cross between the clocks
/// (path, return path) are cleared, and what was said about them. RTT,
/// the stages on one host, and IPDV (a difference of one-way delays, in
/// which a constant offset cancels) are kept.
pub(crate) fn apply_clock_rule(s: &mut crate::stats::Summary, v: &ClockVerdict) {
    if !v.one_way_shown {
        s.one_way_ns = Default::default();
        s.stages_ns.path = Default::default();
        s.stages_ns.return_path = Default::default();
        s.one_way_dominant = None;
        s.rtt_dominant = None;
    }
    s.report.clock = Some(ClockReport::Verdict(v.clone()));
}

/// The summary of a session against a reflector, with what the reflector
/// told (`facts`: its clock rule, loss split and protocol facts).
pub(crate) fn summarise(
    o: &SessionOutcome,
    facts: &RemoteFacts,
    kind: &str,
) -> crate::stats::Summary {
    let mut s = o.stats.summary();
    s.xdp_mode_requested = "none".into();
    s.xdp_mode_attached = "none".into();
    apply_clock_rule(&mut s, &facts.clock);
    s.report.reflector = Some(ReflectorReport {
        kind: kind.into(),
        ..facts.info.clone()
    });
    s.report.loss_split = Some(facts.loss.clone());
    s.report.late_arrivals = Some(o.late_arrivals);
    s.report.peak_rss_kib = Some(crate::sys::host::peak_rss_kib());
    s.report.interrupted = o.interrupted;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(echoed: &[u64], last_received: Option<u64>) -> Ledger {
        let mut l = Ledger {
            stamp_seq_mirrored: true,
            ..Ledger::default()
        };
        for &s in echoed {
            l.on_echo(&Echo {
                seq: s,
                warmup: false,
                times: None,
                received: last_received,
                reflector_seq: None,
                ee: None,
                ttl: None,
            });
        }
        l
    }

    fn counted(seq: u64, received: Option<u64>, reflector_seq: Option<u32>) -> Echo {
        Echo {
            seq,
            warmup: false,
            times: None,
            received,
            reflector_seq,
            ee: None,
            ttl: None,
        }
    }

    #[test]
    fn each_lost_probe_is_labelled_once_with_what_the_counts_tell_then() {
        let mut l = Ledger::new();
        l.on_echo(&counted(0, Some(1), None));
        l.on_echo(&counted(1, Some(2), None));
        // 2 never reached the reflector: 3's count did not grow for it.
        l.on_echo(&counted(3, Some(3), None));
        l.label_lost(2);
        // 4 reached it (5's count grew by two): its echo was lost.
        l.on_echo(&counted(5, Some(5), None));
        l.label_lost(4);
        // 6 and 7 given up before any later echo: nothing tells yet, and
        // a label once given stays.
        l.label_lost(6);
        l.label_lost(7);
        l.on_echo(&counted(9, Some(7), None));
        let d = l.labelled;
        assert_eq!((d.forward, d.r#return, d.unknown), (1, 1, 2), "{d:?}");
        // A reflector whose echoes carry no count (the in-kernel one): unknown.
        let mut k = Ledger::new();
        k.on_echo(&counted(0, None, None));
        k.on_echo(&counted(2, None, None));
        k.label_lost(1);
        assert_eq!(k.labelled.unknown, 1);
        // STAMP numbers that follow the sender's: stateless, or no forward
        // loss; the counts cannot tell (the summary asks after the run).
        let mut st = Ledger::new();
        st.on_echo(&counted(0, None, Some(0)));
        st.on_echo(&counted(2, None, Some(2)));
        st.label_lost(1);
        assert_eq!(st.labelled.unknown, 1);
        // A stateful one that missed probe 1 numbers the next reply 1.
        let mut sf = Ledger::new();
        sf.on_echo(&counted(0, None, Some(0)));
        sf.on_echo(&counted(2, None, Some(1)));
        sf.label_lost(1);
        assert_eq!(sf.labelled.forward, 1);
    }

    #[test]
    fn trailer_count_splits_loss_exactly() {
        // 10 sent, 7 echoed; the reflector got 9: 1 forward, 2 return.
        let mut l = ledger(&[0, 1, 2, 4, 5, 6, 8], None);
        l.trailer = Some(Echo {
            seq: u64::MAX - 1,
            warmup: true,
            times: None,
            received: Some(9),
            reflector_seq: None,
            ee: None,
            ttl: None,
        });
        let s = split_loss(&l, 10, 3, ProtocolArg::Rtprobe, false);
        assert_eq!((s.forward, s.r#return, s.unknown), (Some(1), Some(2), 0));
    }

    #[test]
    fn without_trailer_the_tail_is_unknown() {
        // Echoes up to seq 8 said 8 received; 10 sent, lost: 3, 7, 9.
        let l = ledger(&[0, 1, 2, 4, 5, 6, 8], Some(8));
        let s = split_loss(&l, 10, 3, ProtocolArg::Rtprobe, false);
        // Through seq 8: 9 sent, 8 received -> 1 forward, 1 return; seq 9 unknown.
        assert_eq!((s.forward, s.r#return, s.unknown), (Some(1), Some(1), 1));
        let none = split_loss(&Ledger::default(), 10, 10, ProtocolArg::Rtprobe, false);
        assert_eq!((none.forward, none.unknown), (None, 10));
    }

    #[test]
    fn the_ledger_keeps_no_state_per_seq_and_splits_by_the_records() {
        // The echoes that once grew a bitmap to 512 MiB leave it as it was.
        let mut l = ledger(&[0, 1, 2, 4], Some(4));
        let before = format!("{l:?}").len();
        for seq in [0xFFFF_FFFF, 0x7FFF_FFFF, u64::MAX] {
            l.on_echo(&Echo {
                seq,
                warmup: true,
                times: None,
                received: Some(1),
                reflector_seq: None,
                ee: None,
                ttl: None,
            });
        }
        assert_eq!(
            format!("{l:?}").len(),
            before,
            "warm-ups only touch clock facts"
        );
        // 6 sent, 4 came back (3 and 5 lost): through seq 4, 5 sent and the
        // reflector got 4 -> 1 lost forward, none on return; seq 5 unknown.
        let s = split_loss(&l, 6, 2, ProtocolArg::Rtprobe, false);
        assert_eq!((s.forward, s.r#return, s.unknown), (Some(1), Some(0), 1));
    }

    #[test]
    fn stateless_stamp_gives_no_split() {
        let mut l = ledger(&[0, 1], None);
        let s = split_loss(&l, 3, 1, ProtocolArg::Stamp, true);
        assert_eq!((s.forward, s.unknown), (None, 1));
        // Not known beforehand: the status probe's number came back as sent.
        let status = |refl: u32| Echo {
            seq: STAMP_STATUS_SEQ as u64,
            warmup: false,
            times: None,
            received: None,
            reflector_seq: Some(refl),
            ee: None,
            ttl: None,
        };
        l.trailer = Some(status(STAMP_STATUS_SEQ));
        let s = split_loss(&l, 3, 1, ProtocolArg::Stamp, false);
        assert_eq!((s.forward, s.unknown), (None, 1));
        // A stateful reflector counted 3 of 3: the loss was on the way back.
        l.trailer = Some(status(3));
        let s = split_loss(&l, 3, 1, ProtocolArg::Stamp, false);
        assert_eq!((s.forward, s.r#return, s.unknown), (Some(0), Some(1), 0));
    }

    #[test]
    fn one_way_only_with_both_clocks_synchronised() {
        let synced = ClockSync {
            synchronized: true,
            max_error_ns: 2_000_000,
            tai_offset_s: 37,
        };
        let unsynced = ClockSync {
            synchronized: false,
            ..synced
        };
        let ee = ErrorEstimate::from_error_ns(true, 1_000_000, false);
        let v = clock_verdict(&synced, Some(ee));
        assert!(v.one_way_shown);
        assert!(v.bound_ns.unwrap() >= 3_000_000);
        let v = clock_verdict(&unsynced, Some(ee));
        assert!(!v.one_way_shown);
        assert!(v.note.starts_with(NOT_SYNCED_NOTE));
        let v = clock_verdict(&synced, Some(ErrorEstimate::from_error_ns(false, 0, false)));
        assert!(!v.one_way_shown && v.note.contains("reflector's clock"));
        assert!(!clock_verdict(&synced, None).one_way_shown);
    }
}
