//! The two ends of a session this process drives both of (the testbed
//! or a NIC pair): the sender's and the receiver's sockets bound in
//! their namespaces, hardware timestamping on their NICs and the NICs'
//! PTP clocks sampled while it runs, the namespaces' drop counters
//! around it. What the ends are comes in plain [`Endpoints`]; the
//! session itself runs through the [`engine`].

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU8, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{
    Endpoints, HwSetup, ProbeConfig, SessionOutcome, TimestampSource, engine, kstats, matcher,
    new_session_id,
    packet::HEADER_LEN,
    phc,
    socket::{self, HwTimestamping, ProbeSocket, TsFlags},
    wire,
};
use crate::{
    stats::report::{HardwareClock, HardwareClocks, SampledClock},
    sys::Netns,
};

/// A NIC's PTP hardware clock, sampled against CLOCK_REALTIME while the
/// session runs so its hardware stamps can be put on the system clock.
struct NicClock {
    conv: Arc<Mutex<phc::PhcConverter>>,
    sampler: Option<phc::PhcSampler>,
}

/// How often a PHC is read against the system clock: often enough that
/// interpolation over a drift of tens of ppm stays within a few ns.
const PHC_SAMPLE_PERIOD: Duration = Duration::from_millis(100);

/// Finds and samples the PHC of `ifname` (in `ns`). None, with the reason
/// in words, where the NIC has none or it cannot be read.
fn nic_clock(ns: &Netns, ifname: &str) -> Result<NicClock, String> {
    let index = ns
        .run(|| Ok(phc::phc_index(ifname)))
        .map_err(|e| format!("{e:#}"))?
        .map_err(|e| format!("{e:#}"))?
        .ok_or_else(|| {
            format!("{ifname} has no PTP hardware clock: its hardware stamps cannot be put on the system clock and are left out")
        })?;
    let clock = phc::PtpClock::open(index).map_err(|e| format!("{e:#}"))?;
    let mut conv = phc::PhcConverter::new();
    conv.set_phc_index(index);
    let conv = Arc::new(Mutex::new(conv));
    let sampler = phc::PhcSampler::spawn(clock, PHC_SAMPLE_PERIOD, conv.clone())
        .map_err(|e| format!("{e:#}"))?;
    Ok(NicClock {
        conv,
        sampler: Some(sampler),
    })
}

impl NicClock {
    /// Stops sampling; the converter's report.
    fn finish(&mut self) -> HardwareClock {
        let sampler = self.sampler.take().map(|s| s.stop());
        let Ok(phc) = self.conv.lock().map(|c| c.report()) else {
            return HardwareClock::Failed {
                error: "the PHC converter was poisoned by a panic".into(),
            };
        };
        let (read_errors, last_read_error) = match sampler {
            Some(Ok(st)) => (Some(st.errors), st.last_error),
            _ => (None, None),
        };
        HardwareClock::Sampled(SampledClock {
            phc,
            read_errors,
            last_read_error,
        })
    }
}

/// Puts hardware stamps on the system clock with each NIC's sampled PHC.
struct PhcClocks {
    sender: Option<Arc<Mutex<phc::PhcConverter>>>,
    receiver: Option<Arc<Mutex<phc::PhcConverter>>>,
}

impl matcher::HwClocks for PhcClocks {
    fn sender(&self, raw_ns: i64) -> Option<i64> {
        self.sender.as_ref()?.lock().ok()?.to_realtime(raw_ns)
    }
    fn receiver(&self, raw_ns: i64) -> Option<i64> {
        self.receiver.as_ref()?.lock().ok()?.to_realtime(raw_ns)
    }
}

/// Timestamping for one side: hardware if asked and the NIC can.
fn side_timestamping(
    ns: &Netns,
    ifname: &str,
    want: TimestampSource,
) -> Result<Option<HwTimestamping>> {
    if want == TimestampSource::Software {
        return Ok(None);
    }
    match ns.run(|| Ok(HwTimestamping::enable(ifname)))? {
        Ok(h) => Ok(Some(h)),
        Err(e) if want == TimestampSource::Hardware => bail!(
            "{ifname} cannot timestamp in hardware (SIOCSHWTSTAMP: {e}); use --timestamps software or auto"
        ),
        Err(e) => {
            log::info!("{ifname}: no hardware timestamping ({e}), using software timestamps");
            Ok(None)
        }
    }
}

/// Hardware timestamping of a testbed session's two sides and their NICs'
/// clocks, held while it runs.
struct Stamping {
    hw_tx: Option<HwTimestamping>,
    hw_rx: Option<HwTimestamping>,
    sender_clock: Option<Result<NicClock, String>>,
    receiver_clock: Option<Result<NicClock, String>>,
}

impl Stamping {
    /// Turns on hardware timestamping where asked and the NICs can, and
    /// starts sampling the clocks of those that stamp.
    fn enable(ep: &Endpoints<'_>, want: TimestampSource) -> Result<Self> {
        let hw_tx = side_timestamping(ep.sender_ns, ep.sender_if, want)?;
        let hw_rx = side_timestamping(ep.receiver_ns, ep.receiver_if, want)?;
        let sender_clock = hw_tx
            .is_some()
            .then(|| nic_clock(ep.sender_ns, ep.sender_if));
        let receiver_clock = hw_rx
            .is_some()
            .then(|| nic_clock(ep.receiver_ns, ep.receiver_if));
        for (side, c) in [("sender", &sender_clock), ("receiver", &receiver_clock)] {
            if let Some(Err(why)) = c {
                log::warn!("{side}: {why}");
            }
        }
        Ok(Self {
            hw_tx,
            hw_rx,
            sender_clock,
            receiver_clock,
        })
    }

    fn hardware_tx(&self) -> bool {
        self.hw_tx.is_some()
    }

    fn hardware_rx(&self) -> bool {
        self.hw_rx.is_some()
    }

    fn phc_clocks(&self) -> PhcClocks {
        let conv = |c: &Option<Result<NicClock, String>>| {
            c.as_ref()
                .and_then(|c| c.as_ref().ok())
                .map(|c| c.conv.clone())
        };
        PhcClocks {
            sender: conv(&self.sender_clock),
            receiver: conv(&self.receiver_clock),
        }
    }

    /// Turns hardware timestamping off and stops the clocks: per side, its
    /// clock's report or why it had none.
    fn finish(mut self) -> HardwareClocks {
        drop((self.hw_tx.take(), self.hw_rx.take()));
        let report = |c: &mut Option<Result<NicClock, String>>| match c {
            Some(Ok(c)) => Some(c.finish()),
            Some(Err(why)) => Some(HardwareClock::Failed { error: why.clone() }),
            None => None,
        };
        HardwareClocks {
            sender: report(&mut self.sender_clock),
            receiver: report(&mut self.receiver_clock),
        }
    }
}

/// The testbed's two probe sockets, bound in their namespaces in the
/// run's family (`--ip`), and where the probes go.
fn bind_sides(
    ep: &Endpoints<'_>,
    cfg: &ProbeConfig,
    st: &Stamping,
) -> Result<(ProbeSocket, ProbeSocket, SocketAddr)> {
    let dst = SocketAddr::new(ep.dst_ip, cfg.port);
    let any = SocketAddr::new(unspecified(dst.ip()), cfg.port);
    let rcvbuf_bytes = socket::rcvbuf_bytes(cfg.interval, cfg.timeout);
    let bind = |hardware: bool| {
        ProbeSocket::bind(
            any,
            cfg.tos,
            TsFlags {
                tx: true,
                rx: true,
                hardware,
            },
            rcvbuf_bytes,
        )
    };
    let tx_sock = ep.sender_ns.run(|| bind(st.hardware_tx()))?;
    // The reflector timestamps its echoes too: the RTT of the path is the
    // two kernel-stamped legs, without the reflector's user-space time.
    let rx_sock = ep.receiver_ns.run(|| bind(st.hardware_rx()))?;
    // Every probe goes to `dst` and every echo comes from it.
    if let Err(e) = tx_sock.connect(dst) {
        log::info!("probe socket not connected to {dst} ({e}): a route lookup per probe");
    }
    Ok((tx_sock, rx_sock, dst))
}

/// One flow's two sockets, its destination and its wire.
struct FlowEnds {
    tx: ProbeSocket,
    rx: ProbeSocket,
    dst: SocketAddr,
    session: u64,
    wire: wire::Wire,
}

impl FlowEnds {
    fn bind(ep: &Endpoints<'_>, cfg: &ProbeConfig, st: &Stamping) -> Result<Self> {
        if cfg.size < HEADER_LEN {
            bail!(
                "--size {} is too small: a probe needs at least {HEADER_LEN} bytes",
                cfg.size
            );
        }
        let (tx, rx, dst) = bind_sides(ep, cfg, st)?;
        let session = new_session_id();
        let wire = wire::Wire::Rtprobe {
            session,
            flow: cfg.flow,
        };
        Ok(Self {
            tx,
            rx,
            dst,
            session,
            wire,
        })
    }

    /// The engine's session: the reflector ours (in this process, or in
    /// the kernel with `kernel_reflector`).
    fn session(&self, cfg: &ProbeConfig) -> engine::Session<'_> {
        let (sock, session) = (&self.rx, self.session);
        let echo_side = if cfg.kernel_reflector {
            engine::EchoSide::Kernel { sock, session }
        } else {
            engine::EchoSide::InProcess { sock, session }
        };
        engine::Session {
            sock: &self.tx,
            dst: self.dst,
            wire: &self.wire,
            echo_side,
            on_echoes: None,
            foreign_before: 0,
        }
    }
}

/// The testbed's (or NIC pair's) side of [`super::run_testbed`]: every
/// flow a leg of one engine session, each with both sockets in their
/// namespaces on its own port; hardware timestamping where asked, and the
/// namespaces' drop counters around it. Outcomes in the order of `cfgs`.
pub(super) fn testbed_session(
    ep: &Endpoints<'_>,
    cfgs: &[ProbeConfig],
    outs: &mut [engine::LegOut<'_>],
    stop: &AtomicU8,
) -> Result<Vec<SessionOutcome>> {
    let first = cfgs
        .first()
        .context("internal: a testbed run without a flow")?;
    let stamping = Stamping::enable(ep, first.timestamps)?;
    let (hardware_tx, hardware_rx) = (stamping.hardware_tx(), stamping.hardware_rx());
    let ends = cfgs
        .iter()
        .map(|cfg| FlowEnds::bind(ep, cfg, &stamping))
        .collect::<Result<Vec<_>>>()?;
    let drops_before =
        kstats::DropSnapshot::take(ep.sys, ep.sender_ns.into(), ep.receiver_ns.into());
    let result = (|| {
        let mut legs = Vec::with_capacity(cfgs.len());
        for (e, cfg) in ends.iter().zip(cfgs) {
            let mut s = e.session(cfg);
            // A stop during the warm-up lets the run go on: the pacer sends
            // nothing and the summary says it was interrupted.
            let w = engine::warm_up(&s, cfg.size, stop)?;
            // Datagrams on the probe port during the warm-up are counted too.
            s.foreign_before = w.foreign;
            legs.push(engine::Leg::one(s, cfg));
        }
        let hw = HwSetup {
            // The warm-up's echoes told whether the kernel takes per-send OPT_IDs.
            echo_stamps: ends[0].rx.per_send_opt_id(),
            sender_tx: hardware_tx,
            receiver_tx: hardware_rx,
            clocks: Arc::new(stamping.phc_clocks()),
        };
        let got = engine::drive(&legs, hw, outs, stop, engine::Round::whole())?.finished()?;
        let attempts: Vec<u64> = legs
            .iter()
            .map(|l| l.attempts.load(Ordering::SeqCst))
            .collect();
        Ok::<_, anyhow::Error>(got.into_iter().zip(attempts))
    })();
    let hw_clocks = stamping.finish();
    let got = result?;
    let drops_after =
        kstats::DropSnapshot::take(ep.sys, ep.sender_ns.into(), ep.receiver_ns.into());
    let kernel_drops = drops_after.report_since(&drops_before);
    let stopped = stop.load(Ordering::SeqCst) != 0;
    Ok(got
        .map(|((mut stats, late_arrivals, output_error), attempts)| {
            stats.set_attempts(attempts);
            SessionOutcome {
                stats,
                hardware_tx,
                hardware_rx,
                late_arrivals,
                // A failed output stops the session too; that is no interruption.
                interrupted: stopped && output_error.is_none(),
                kernel_drops: Some(kernel_drops.clone()),
                hw_clocks: hw_clocks.clone(),
                output_error,
                remote: None,
            }
        })
        .collect())
}

/// The unspecified address of `a`'s family: the sockets bind to it.
fn unspecified(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}
