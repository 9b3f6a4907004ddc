//! The session-sender towards a reflector that is not ours to drive: a
//! remote host (`rtprobe --target`), or the receiver of a testbed run with
//! `--protocol stamp`. One socket sends the paced probes and takes the TX
//! stamps and the echoes; the reflector's receive and transmit times come
//! from the echo (rtprobe echoes: bytes 32..48; STAMP: T2 and T3), as with
//! the in-kernel reflector, so the same matcher, CSV and summary serve.
//!
//! Loss by direction: the reflector says how many probes of the session it
//! received (rtprobe echoes: the state field, see [`super::reflect`];
//! STAMP stateful reflectors: their own sequence number, RFC 8762 §4.3).
//! After the run one more probe (a warm-up, not counted by rtprobe's
//! reflector) asks for the final count: forward loss = sent - received
//! there, return loss = the rest. A stateless STAMP reflector echoes the
//! sender's numbers, which say nothing about the way out: then the split
//! is "unknown".
//!
//! Clocks: one-way figures compare the reflector's clock with ours. They
//! are shown only when both kernels say their clock is synchronised
//! (`adjtimex`: no STA_UNSYNC; the reflector's state comes in its Error
//! Estimate), with the sum of both maximum errors as their bound.
//!
//! Trust: the socket is connected to the target, so the kernel delivers
//! only its datagrams; an echo then counts only if it is of this session,
//! for a seq already sent (the pacer counts a probe before sending it) and
//! while the matcher still awaits it. Foreign, never-sent and late echoes
//! are counted apart, and nothing kept grows with the seqs that arrive.
//!
//! Kernel interfaces: a connected UDP socket with SO_TIMESTAMPING
//! (software RX/TX stamps, no privilege), `adjtimex(2)` read only.

mod outputs;
mod setup;
mod verdict;

use std::{
    net::SocketAddr,
    sync::{
        Mutex,
        atomic::{AtomicU8, AtomicU64, Ordering},
    },
};

use anyhow::{Context, Result, bail};

pub use self::verdict::{ClockVerdict, LossSplit, RemoteFacts, apply_clock_rule, summarise};
use self::{
    outputs::{OneWayObserver, OneWaySink},
    setup::{WarmUp, in_parallel, prepare, trailer},
    verdict::{Ledger, outcome},
};
use super::{
    HwSetup, ProbeConfig, RecordSink, SessionOutcome, clock, engine,
    matcher::NoHwClocks,
    socket::ProbeSocket,
    stamp::{ClockSync, HmacKey},
    wire::{Echo, Wire},
};
use crate::{model::observer::SessionObserver, spec::remote::ProtocolArg, sys::Netns};

/// Where the probes go and how they look.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub protocol: ProtocolArg,
    pub key: Option<HmacKey>,
    /// The reflector is known to answer STAMP statelessly (rtprobe's
    /// in-kernel one): its sequence numbers tell nothing of forward loss.
    pub stateless_reflector: bool,
    /// Sender and reflector read the same clock (the namespace testbed):
    /// one-way needs no synchronisation.
    pub shared_clock: bool,
}

/// One remote target of a session: where, how, and its probe options.
pub(crate) struct RemoteLeg {
    pub target: Target,
    pub cfg: ProbeConfig,
    /// The CSV's `target` cell (None: a single `--target` run's CSV,
    /// which has no such column).
    pub name: Option<String>,
    /// Its metrics labels besides `target` (a targets file's).
    pub labels: std::collections::BTreeMap<String, String>,
}

impl RemoteLeg {
    /// Whether a reload leaves this target as it is (same name, address,
    /// protocol, probe options and labels): it keeps its statistics.
    fn same_as(&self, o: &RemoteLeg) -> bool {
        let (a, b) = (&self.cfg, &o.cfg);
        self.name == o.name
            && self.target.addr == o.target.addr
            && self.target.protocol == o.target.protocol
            && (a.size, a.tos, a.interval) == (b.size, b.tos, b.interval)
            && self.labels == o.labels
    }

    fn label(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.target.addr.to_string())
    }
}

/// How a run with a targets file reloads it (SIGHUP).
pub(crate) struct Reloads<'a> {
    /// Counts the reload requests.
    pub generation: &'a AtomicU64,
    /// Reads and checks the file again.
    pub read: &'a dyn Fn() -> Result<Vec<RemoteLeg>>,
}

/// Makes each target's observer (its metrics, or the progress and HDR
/// log of a single target).
pub(crate) type ObserverFor<'o> = dyn FnMut(&RemoteLeg) -> Box<dyn SessionObserver + 'o> + 'o;

/// A target of the running session and what it has so far.
struct Active<'o> {
    leg: RemoteLeg,
    p: Prepared,
    observer: Box<dyn SessionObserver + 'o>,
    /// Its collector from the round before a reload.
    collector: Option<super::Collector>,
    /// Probes tried so far (its next seq).
    sent: u64,
}

/// A target's state from set-up to its report.
struct Prepared {
    wire: Wire,
    sock: ProbeSocket,
    ledger: Mutex<Ledger>,
    show_one_way: bool,
    early: ClockVerdict,
}

/// The remote side of [`super::run_session`] and [`super::run_targets`]:
/// one connected socket per target, from namespace `ns` (None: the
/// calling thread's), the reflectors' stamps from their echoes, one
/// sender and one I/O thread for all, and after the run each target's
/// status probe, loss split and clock verdict. With one target a warm-up
/// without answer is an error; with several that target is warned about
/// and probed anyway (its loss shows in its report). With `reloads` a
/// reload request pauses the round: unchanged targets go on with their
/// statistics and sequence numbers, removed ones are finalized (and stay
/// in the result), new ones start. Returns each target with its outcome,
/// removed ones first.
pub(super) fn targets_session<'o>(
    legs: Vec<RemoteLeg>,
    ns: Option<&Netns>,
    csv: &mut dyn RecordSink,
    observer_for: &mut ObserverFor<'o>,
    reloads: Option<&Reloads<'_>>,
    stop: &AtomicU8,
) -> Result<Vec<(RemoteLeg, SessionOutcome)>> {
    let local_clock = ClockSync::read_kernel().unwrap_or(ClockSync {
        synchronized: false,
        max_error_ns: 0,
        tai_offset_s: 0,
    });
    let mode = if legs.len() == 1 && reloads.is_none() {
        WarmUp::Single
    } else {
        WarmUp::Many
    };
    let mut active = start(legs, ns, &local_clock, mode, stop, observer_for)?;
    if stop.load(Ordering::SeqCst) != 0 {
        // Before the pacer: no probe of the run has been sent, and none will.
        bail!("interrupted before probing started; nothing was measured");
    }
    let shared = Mutex::new(csv);
    // Over reloads the run keeps its one end.
    let end_mono_ns = reloads
        .and(active[0].leg.cfg.duration)
        .map(|d| clock::monotonic_ns() + super::pacer::START_AHEAD_NS + d.as_nanos() as i64);
    let counter = reloads.map(|r| r.generation);
    let generation = || counter.map_or(0, |g| g.load(Ordering::SeqCst));
    let mut done = Vec::new();
    loop {
        let seen = generation();
        let pause = || generation() != seen;
        match round(&mut active, &shared, end_mono_ns, &pause, stop)? {
            engine::Driven::Finished(collected) => {
                // The status probes in parallel: a silent target waits 300 ms.
                let asks: Vec<_> = active.iter().map(|a| (&a.leg, &a.p, a.sent)).collect();
                let trailers = in_parallel(&asks, |(l, p, sent)| trailer(l, p, *sent, stop));
                drop(asks);
                for ((a, c), t) in active.into_iter().zip(collected).zip(trailers) {
                    let o = outcome(&a.leg, a.p, c, a.sent, t, &local_clock, stop)?;
                    done.push((a.leg, o));
                }
                return Ok(done);
            }
            engine::Driven::Paused(cs) => {
                for (a, c) in active.iter_mut().zip(cs) {
                    a.collector = Some(c);
                }
                let Some(r) = reloads else {
                    bail!("internal: a session paused without a reload");
                };
                active = reload(
                    active,
                    r,
                    ns,
                    &local_clock,
                    &shared,
                    &mut done,
                    observer_for,
                    stop,
                )?;
            }
        }
    }
}

/// One round of the engine over the active targets; each target's probe
/// count is brought back for the next.
fn round(
    active: &mut [Active<'_>],
    shared: &Mutex<&mut dyn RecordSink>,
    end_mono_ns: Option<i64>,
    pause: &(dyn Fn() -> bool + Sync),
    stop: &AtomicU8,
) -> Result<engine::Driven> {
    let n = active.len() as i64;
    let carried = active.iter_mut().map(|a| a.collector.take()).collect();
    let (mut views, mut observers) = (Vec::new(), Vec::new());
    for a in active.iter_mut() {
        let Active {
            leg, p, observer, ..
        } = a;
        views.push((&*leg, &*p, a.sent));
        observers.push(OneWayObserver {
            inner: &mut **observer,
            show: p.show_one_way,
        });
    }
    let notes: Vec<_> = views
        .iter()
        .map(|(_, p, _)| {
            let ledger = &p.ledger;
            move |seen: &[Echo]| {
                if let Ok(mut l) = ledger.lock() {
                    for e in seen {
                        l.on_echo(e);
                    }
                }
            }
        })
        .collect();
    let legs: Vec<engine::Leg<'_>> = views
        .iter()
        .zip(&notes)
        .enumerate()
        .map(|(i, ((leg, p, sent), note))| engine::Leg {
            s: engine::Session {
                sock: &p.sock,
                dst: leg.target.addr,
                wire: &p.wire,
                reflector: engine::Reflector::Remote,
                on_echoes: Some(note),
                foreign_before: 0,
            },
            // The reflector's stamps come in its echoes, as the in-kernel one's do.
            cfg: ProbeConfig {
                kernel_reflector: true,
                ..leg.cfg.clone()
            },
            attempts: AtomicU64::new(*sent),
            // Target i starts i/N of its interval late: sends spread evenly.
            phase_ns: leg.cfg.interval.as_nanos() as i64 * i as i64 / n,
        })
        .collect();
    let mut sinks: Vec<OneWaySink<'_, '_>> = views
        .iter()
        .enumerate()
        .map(|(i, (leg, p, _))| OneWaySink {
            inner: shared,
            target: leg.name.as_deref(),
            show: p.show_one_way,
            flushes: i == 0,
        })
        .collect();
    let mut outs: Vec<engine::LegOut<'_>> = sinks
        .iter_mut()
        .zip(observers.iter_mut())
        .map(|(csv, observer)| engine::LegOut { csv, observer })
        .collect();
    let hw = HwSetup {
        echo_stamps: false,
        sender_tx: false,
        receiver_tx: false,
        clocks: Box::new(NoHwClocks),
    };
    let r = engine::Round {
        end_mono_ns,
        pause,
        carried,
    };
    let driven = engine::drive(&legs, hw, &mut outs, stop, r)?;
    let sent: Vec<u64> = legs
        .iter()
        .map(|l| l.attempts.load(Ordering::SeqCst))
        .collect();
    drop(outs);
    drop(observers);
    for (a, s) in active.iter_mut().zip(sent) {
        a.sent = s;
    }
    Ok(driven)
}

/// Sockets, wires and warm-ups of new targets (in parallel), and their observers.
fn start<'o>(
    legs: Vec<RemoteLeg>,
    ns: Option<&Netns>,
    local_clock: &ClockSync,
    mode: WarmUp,
    stop: &AtomicU8,
    observer_for: &mut ObserverFor<'o>,
) -> Result<Vec<Active<'o>>> {
    let prepared = in_parallel(&legs, |l| prepare(l, ns, local_clock, mode, stop));
    legs.into_iter()
        .zip(prepared)
        .map(|(leg, p)| {
            Ok(Active {
                observer: observer_for(&leg),
                p: p?,
                leg,
                collector: None,
                sent: 0,
            })
        })
        .collect()
}

/// Reads the targets again and applies the change, one log line per
/// target: unchanged ones go on, removed (or changed) ones are finalized
/// into `done`, new ones start. A file that fails its checks changes nothing.
#[allow(clippy::too_many_arguments)]
fn reload<'o>(
    active: Vec<Active<'o>>,
    r: &Reloads<'_>,
    ns: Option<&Netns>,
    local_clock: &ClockSync,
    shared: &Mutex<&mut dyn RecordSink>,
    done: &mut Vec<(RemoteLeg, SessionOutcome)>,
    observer_for: &mut ObserverFor<'o>,
    stop: &AtomicU8,
) -> Result<Vec<Active<'o>>> {
    let list = match (r.read)() {
        Ok(l) => l,
        Err(e) => {
            log::warn!(
                "reload: {e:#}; the {} targets probed go on unchanged",
                active.len()
            );
            return Ok(active);
        }
    };
    let mut old: Vec<Option<Active<'o>>> = active.into_iter().map(Some).collect();
    let (mut next, mut added) = (Vec::new(), Vec::new());
    for l in list {
        let at = old
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.leg.name == l.name));
        match at.and_then(|i| old[i].take().map(|a| (i, a))) {
            Some((_, a)) if a.leg.same_as(&l) => next.push(a),
            Some((_, a)) => {
                log::warn!("target {}: changed, finalized and started anew", l.label());
                done.push(finalize(a, shared, local_clock, stop)?);
                added.push(l);
            }
            None => added.push(l),
        }
    }
    for a in old.into_iter().flatten() {
        log::warn!(
            "target {}: removed after {} probes, finalized (it stays in the report)",
            a.leg.label(),
            a.sent
        );
        done.push(finalize(a, shared, local_clock, stop)?);
    }
    let names: Vec<String> = added.iter().map(RemoteLeg::label).collect();
    let kept = next.len();
    let mode = WarmUp::Reload;
    next.extend(start(added, ns, local_clock, mode, stop, observer_for)?);
    for name in &names {
        log::warn!("target {name}: added");
    }
    log::warn!(
        "reload: {kept} targets unchanged (their statistics go on), {} added, {} probed in all",
        names.len(),
        next.len()
    );
    Ok(next)
}

/// A target taken out mid-run: what is still in flight counts as lost,
/// then its report as at the end of a run.
fn finalize(
    mut a: Active<'_>,
    shared: &Mutex<&mut dyn RecordSink>,
    local_clock: &ClockSync,
    stop: &AtomicU8,
) -> Result<(RemoteLeg, SessionOutcome)> {
    let c = a
        .collector
        .take()
        .context("internal: a paused target without its collector")?;
    let mut sink = OneWaySink {
        inner: shared,
        target: a.leg.name.as_deref(),
        show: a.p.show_one_way,
        flushes: true,
    };
    let mut c = c;
    c.drain(
        clock::realtime_ns(),
        true,
        &mut sink,
        &mut *a.observer,
        stop,
    );
    let collected = c.finish(&mut sink, &mut *a.observer, stop);
    report(a, collected, local_clock, stop)
}

/// A target's outcome after its last probe: the status probe, then its
/// statistics with the loss split and clock verdict.
fn report(
    a: Active<'_>,
    c: engine::Collected,
    local_clock: &ClockSync,
    stop: &AtomicU8,
) -> Result<(RemoteLeg, SessionOutcome)> {
    let t = trailer(&a.leg, &a.p, a.sent, stop);
    let o = outcome(&a.leg, a.p, c, a.sent, t, local_clock, stop)?;
    Ok((a.leg, o))
}
