//! One mode's testbed: GRO and threaded NAPI on the router's ingress, the
//! router (or its work variant) and the sink attached, and the counters a
//! step reads from it before and after.

use anyhow::{Context, Result};

use super::SINK_PORT;
use crate::{
    bench_forward::{
        cpu,
        kinds::{ForwardMode, Sink},
        links::{self, LinkCounters},
        plan::{Plan, Variant},
        sink,
        xdp::{BenchProgram, Hook},
    },
    ebpf::{XdpAction as XdpActionArg, XdpMode as XdpModeArg},
    stats::XdpCounters,
    sys::{Offload, SysRef},
    testbed::Testbed,
};

fn xdp_of(m: ForwardMode) -> (XdpModeArg, XdpActionArg) {
    match m {
        ForwardMode::Off => (XdpModeArg::Off, XdpActionArg::Redirect),
        ForwardMode::Skb => (XdpModeArg::Skb, XdpActionArg::Redirect),
        ForwardMode::Native => (XdpModeArg::Native, XdpActionArg::Redirect),
        ForwardMode::SkbPass => (XdpModeArg::Skb, XdpActionArg::Pass),
        ForwardMode::NativePass => (XdpModeArg::Native, XdpActionArg::Pass),
    }
}

/// The interfaces whose counters a step reads.
pub(super) struct Snapshot {
    pub(super) router_in: LinkCounters,
    pub(super) receiver: LinkCounters,
    pub(super) xdp: XdpCounters,
    /// CPU seconds of the router's NAPI threads.
    pub(super) router_cpu_secs: f64,
}

/// One mode's testbed and what the steps need to know about it.
pub(super) struct ModeBed {
    /// Dropped first: detaches from an interface that still exists.
    pub(super) _sink: Option<sink::Sink>,
    /// The router's work variant, attached instead of the router.
    pub(super) work: Option<(BenchProgram, u32)>,
    pub(super) tb: Testbed,
    pub(super) xdp: crate::ebpf::XdpSetup,
    /// The router's NAPI kernel threads (threaded NAPI only).
    pub(super) napi_tids: Vec<i32>,
    pub(super) router_mac: [u8; 6],
    pub(super) sender_mac: [u8; 6],
}

impl ModeBed {
    /// The XDP mode `mode`'s program runs in: the work router's as
    /// attached for the mode, else what the kernel reports.
    pub(super) fn attached_mode(&self, mode: ForwardMode) -> String {
        match &self.work {
            Some(_) if mode == ForwardMode::Skb => "skb".into(),
            Some(_) => "native".into(),
            None => self.xdp.attached_mode_name(),
        }
    }

    pub(super) fn snapshot(&self) -> Result<Snapshot> {
        let router = self
            .tb
            .router
            .as_ref()
            .context("the veth testbed has a router")?;
        let rin = self.tb.router_in.as_ref().context("router ingress")?;
        Ok(Snapshot {
            router_in: links::link_state(self.tb.sys(), router, &rin.name)?.0,
            receiver: links::link_state(
                self.tb.sys(),
                &self.tb.receiver,
                &self.tb.receiver_if.name,
            )?
            .0,
            xdp: match &self.work {
                Some((prog, _)) => prog.router_counters()?,
                None => self.xdp.counters()?,
            },
            router_cpu_secs: self
                .napi_tids
                .iter()
                .filter_map(|&t| cpu::task_cpu_secs(t))
                .sum(),
        })
    }
}

/// Frames that reached the router's ingress ring, taken or dropped.
pub(super) fn ingress_total(c: &LinkCounters) -> u64 {
    c.rx_packets + c.rx_dropped
}

/// Builds the testbed for one mode and prepares the receive paths.
pub(super) fn testbed_for(sys: SysRef, variant: Variant, plan: &Plan) -> Result<ModeBed> {
    let mode = variant.mode;
    let tb = Testbed::veth(sys)?;
    let router = tb
        .router
        .as_ref()
        .context("the veth testbed has a router")?;
    let rin = tb
        .router_in
        .as_ref()
        .context("router ingress")?
        .name
        .clone();
    links::set_gro(tb.sys(), router, &rin, true)?;
    links::set_gro(tb.sys(), &tb.receiver, &tb.receiver_if.name, true)?;
    let mut napi_tids = Vec::new();
    if plan.threaded_napi {
        let before = links::napi_threads(&rin);
        links::set_threaded_napi(tb.sys(), router, &rin, true)?;
        // Ours are the ones that were not there before (other testbeds
        // may have a veth of the same name).
        napi_tids = links::napi_threads(&rin)
            .into_iter()
            .filter(|t| !before.contains(t))
            .collect();
        if let Some(p) = plan.rt_priority {
            for &tid in &napi_tids {
                links::set_fifo(tid, p)?;
            }
        }
    }
    let (m, a) = xdp_of(mode);
    let (xdp, work) = match variant.work {
        None => (crate::ebpf::attach_for_testbed(&tb, m, a)?, None),
        Some(n) => (
            crate::ebpf::attach_for_testbed(&tb, XdpModeArg::Off, a)?,
            Some((attach_work_router(&tb, mode, n)?, n)),
        ),
    };
    let sink = match plan.sink {
        Sink::Stack => None,
        Sink::Xdp => {
            // Probes cross a native XDP program now: local UDP must leave
            // with a full checksum (the testbed goes away with the mode).
            tb.sys()
                .set_offload(
                    (&tb.sender).into(),
                    &tb.sender_if.name,
                    Offload::TxCsum,
                    false,
                )
                .context("TX checksum offload off on the sender (for the XDP sink)")?;
            Some(sink::Sink::attach(
                tb.sys_ref(),
                &tb.receiver,
                &tb.receiver_if.name,
                SINK_PORT,
            )?)
        }
    };
    let router_mac = links::link_state(tb.sys(), router, &rin)?.1;
    let sender_mac = links::link_state(tb.sys(), &tb.sender, &tb.sender_if.name)?.1;
    Ok(ModeBed {
        _sink: sink,
        work,
        tb,
        xdp,
        napi_tids,
        router_mac,
        sender_mac,
    })
}

/// Attaches the router's work variant (`n` memory accesses per packet) to
/// both router interfaces, where `attach_for_testbed` puts the router, and
/// prepares the end veths as `attach_for_testbed` does for native mode:
/// GRO on (frames redirected into a veth need NAPI on its peer) and TX
/// checksum offload off (local UDP through native XDP needs full
/// checksums). The testbed goes away with the variant, so nothing is put back.
fn attach_work_router(tb: &Testbed, mode: ForwardMode, n: u32) -> Result<BenchProgram> {
    let router = tb
        .router
        .as_ref()
        .context("the veth testbed has a router")?;
    let rin = &tb.router_in.as_ref().context("router ingress")?.name;
    let rout = &tb.router_out.as_ref().context("router egress")?.name;
    let hook = if mode == ForwardMode::Skb {
        Hook::Skb
    } else {
        Hook::Native
    };
    for (ns, ifname) in [
        (&tb.sender, &tb.sender_if.name),
        (&tb.receiver, &tb.receiver_if.name),
    ] {
        links::set_gro(tb.sys(), ns, ifname, true)?;
        tb.sys()
            .set_offload(ns.into(), ifname, Offload::TxCsum, false)
            .with_context(|| format!("TX checksum offload off on {ifname} (for native XDP)"))?;
    }
    let mut prog = BenchProgram::router_work(n)?;
    for ifname in [rin, rout] {
        prog.add_egress(tb.sys(), router, ifname)?;
        prog.attach(tb.sys_ref(), router, ifname, hook)?;
    }
    Ok(prog)
}
