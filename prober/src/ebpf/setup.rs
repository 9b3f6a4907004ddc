//! Puts the XDP router on a testbed: which interfaces, which mode, and what
//! veth needs for native XDP (GRO on the peer of a redirect target, TX
//! checksum offload off on veths that send UDP from local sockets). Every
//! offload it changes is put back on `detach()` (and on drop), which
//! matters for NIC-pair interfaces that go back to the host afterwards.
//! Kernel interfaces: see [`super`] (bpf, rtnetlink); attach, detach and
//! offloads all through [`crate::sys::Sys`], so the order of the calls and
//! the undo on error and on drop are tested against the fake (the programs
//! themselves come from a [`Loader`], stand-ins in those tests).

use anyhow::{Context, Result};

use super::{AttachedMode, Reflector, Router};
use crate::{
    ebpf::{XdpAction, XdpMode},
    stats::XdpCounters,
    sys::{Ns, Offload, SysRef},
    testbed::Testbed,
};

/// Where the programs go: namespace and interface names of a testbed.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// (namespace, interface) of the sender.
    sender: (String, String),
    receiver: (String, String),
    /// The router's namespace, its interface towards the sender and the
    /// one towards the receiver (None in NIC-pair mode).
    router: Option<(String, String, String)>,
}

impl Layout {
    fn of(tb: &Testbed) -> Result<Self> {
        let router = match &tb.router {
            Some(ns) => {
                let rin = tb
                    .router_in
                    .as_ref()
                    .context("veth testbed without router_in")?;
                let rout = tb
                    .router_out
                    .as_ref()
                    .context("veth testbed without router_out")?;
                Some((ns.name().into(), rin.name.clone(), rout.name.clone()))
            }
            None => None,
        };
        Ok(Self {
            sender: (tb.sender.name().into(), tb.sender_if.name.clone()),
            receiver: (tb.receiver.name().into(), tb.receiver_if.name.clone()),
            router,
        })
    }
}

/// Loads the programs: aya in a run, stand-ins in the orchestration tests.
pub(crate) trait Loader {
    fn router(&mut self, pass_only: bool) -> Result<Router>;
    fn reflector(
        &mut self,
        probe_port: u16,
        stamp_port: u16,
        reply_ifindex: u32,
    ) -> Result<Reflector>;
}

/// The real programs, attached through `sys`.
pub(crate) struct KernelLoader(pub(crate) SysRef);

impl Loader for KernelLoader {
    fn router(&mut self, pass_only: bool) -> Result<Router> {
        Router::load(self.0.clone(), pass_only)
    }

    fn reflector(
        &mut self,
        probe_port: u16,
        stamp_port: u16,
        reply_ifindex: u32,
    ) -> Result<Reflector> {
        // No rate limit: the testbed's reflector answers only the testbed's
        // own sender, inside its namespaces, at the rate the run asks for
        // (benches probe far above any per-source default); no known peers
        // either, as nothing is limited.
        let limits = super::reflector::RateLimits::NONE;
        Reflector::load(
            self.0.clone(),
            probe_port,
            stamp_port,
            reply_ifindex,
            limits,
            &crate::probe::reflect::Peers::default(),
        )
    }
}

/// An offload setting to put back: namespace, interface, feature, old value.
#[derive(Debug, Clone, PartialEq)]
struct Changed {
    ns: String,
    ifname: String,
    what: Offload,
    old: bool,
}

/// The offloads XDP on veth needs, each noted with its old value and put
/// back newest first by [`Offloads::restore`].
pub(crate) struct Offloads {
    sys: SysRef,
    changed: Vec<Changed>,
}

impl Offloads {
    pub(crate) fn new(sys: SysRef) -> Self {
        Self {
            sys,
            changed: Vec::new(),
        }
    }

    fn is_veth(&self, ns: &str, ifname: &str) -> bool {
        self.sys
            .driver(Ns::Named(ns), ifname)
            .is_ok_and(|d| d == "veth")
    }

    fn set(&mut self, ns: &str, ifname: &str, what: Offload, on: bool) -> Result<()> {
        let old = self.sys.offload(Ns::Named(ns), ifname, what)?;
        if old == on {
            return Ok(());
        }
        self.sys
            .set_offload(Ns::Named(ns), ifname, what, on)
            .with_context(|| {
                format!(
                    "native XDP on veth needs {} {} on {ifname}",
                    what.name(),
                    if on { "on" } else { "off" }
                )
            })?;
        self.changed.push(Changed {
            ns: ns.to_string(),
            ifname: ifname.to_string(),
            what,
            old,
        });
        Ok(())
    }

    /// GRO asked for explicitly on a veth: veth enables the NAPI that takes
    /// XDP_TX frames from its peer only for GRO the user requested (or an
    /// XDP program), and a GRO that is merely on by default is not, so it
    /// is switched off and on again. Put back as it was found.
    pub(crate) fn request_gro(&mut self, ns: &str, ifname: &str) -> Result<()> {
        let n = Ns::Named(ns);
        let old = self.sys.offload(n, ifname, Offload::Gro)?;
        self.changed.push(Changed {
            ns: ns.to_string(),
            ifname: ifname.to_string(),
            what: Offload::Gro,
            old,
        });
        self.sys
            .set_offload(n, ifname, Offload::Gro, false)
            .and_then(|()| self.sys.set_offload(n, ifname, Offload::Gro, true))
            .with_context(|| format!("XDP_TX into {ifname} needs GRO requested there"))
    }

    /// What native XDP on veth needs, applied where the interface is a veth.
    pub(crate) fn prepare_native(&mut self, ns: &str, ifname: &str) -> Result<()> {
        if !self.is_veth(ns, ifname) {
            return Ok(());
        }
        // Redirected frames into this veth's peer need GRO here (or an XDP program).
        self.set(ns, ifname, Offload::Gro, true)?;
        // Local UDP leaves with a partial checksum that native XDP on the
        // other side cannot complete: checksum in software instead.
        self.set(ns, ifname, Offload::TxCsum, false)
    }

    /// Puts every offload back, newest first; returns the first failure.
    pub(crate) fn restore(&mut self) -> Result<()> {
        let mut first_err = None;
        for c in self.changed.drain(..).rev() {
            let r = self
                .sys
                .set_offload(Ns::Named(&c.ns), &c.ifname, c.what, c.old)
                .with_context(|| format!("restore {} on {}", c.what.name(), c.ifname));
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// The router as attached to one testbed.
pub(crate) struct XdpSetup {
    /// One router per namespace it is attached in (ifindexes are per namespace).
    routers: Vec<Router>,
    /// Mode per attached interface, in attach order.
    modes: Vec<(String, AttachedMode)>,
    offloads: Offloads,
    /// rtprobe's in-kernel reflector on the receiver's interface, if attached.
    reflector: Option<(Reflector, AttachedMode)>,
}

impl std::fmt::Debug for XdpSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpSetup")
            .field("routers", &self.routers)
            .field("modes", &self.modes)
            .field("reflector", &self.reflector.as_ref().map(|(_, m)| m))
            .finish_non_exhaustive()
    }
}

impl XdpSetup {
    fn none(sys: SysRef) -> Self {
        Self {
            routers: Vec::new(),
            modes: Vec::new(),
            offloads: Offloads::new(sys),
            reflector: None,
        }
    }

    /// Attaches the in-kernel reflector, answering rtprobe probes to UDP
    /// `port` (0: none) and STAMP session-sender packets to `stamp_port`
    /// (0: none), to the receiver's interface, native where the driver can,
    /// else generic. On a veth it prepares what the replies and the
    /// reflector's checksum update need (GRO requested on the peer, which
    /// receives the replies; TX checksum offload off at the sender, so
    /// probes carry full UDP checksums), put back with everything else, and
    /// has the reflector redirect its replies to its own veth rather than
    /// XDP_TX them (see [`Self::reflector_replies_get_through`]). It
    /// answers only probes to the receiver interface's MAC and addresses,
    /// without a rate limit: only the testbed's own sender reaches it, at
    /// whatever rate the run (a bench) asks for. Fails when another XDP
    /// program holds the interface (the router in NIC-pair mode).
    pub(crate) fn attach_reflector_ports(
        &mut self,
        tb: &Testbed,
        port: u16,
        stamp_port: u16,
    ) -> Result<AttachedMode> {
        let mut loader = KernelLoader(self.offloads.sys.clone());
        self.attach_reflector_with(&Layout::of(tb)?, port, stamp_port, &mut loader)
    }

    pub(crate) fn attach_reflector_with(
        &mut self,
        l: &Layout,
        port: u16,
        stamp_port: u16,
        loader: &mut dyn Loader,
    ) -> Result<AttachedMode> {
        let (rcv_ns, rcv_if) = (&l.receiver.0, &l.receiver.1);
        let mut reply_ifindex = 0;
        if self.offloads.is_veth(rcv_ns, rcv_if) {
            // The router's veth towards the receiver takes the replies.
            if let Some((ns, _, peer)) = &l.router {
                self.offloads.request_gro(ns, peer)?;
            }
            self.offloads
                .set(&l.sender.0, &l.sender.1, Offload::TxCsum, false)?;
            reply_ifindex = self
                .offloads
                .sys
                .link(Ns::Named(rcv_ns), rcv_if)?
                .ok_or_else(|| {
                    crate::error::Error::InterfaceNotFound(format!(
                        "{rcv_if} (in namespace {rcv_ns})"
                    ))
                })?
                .index;
        }
        let r = loader.reflector(port, stamp_port, reply_ifindex)?;
        let (r, mode) = super::reflector::put_on(r, Ns::Named(rcv_ns), rcv_if)?;
        self.reflector = Some((r, mode));
        Ok(mode)
    }

    /// Whether the in-kernel reflector's replies get back from the
    /// receiver's interface. Physical NICs transmit XDP_TX themselves. On
    /// a veth, XDP_TX puts the reply into the peer's ring but, on Linux
    /// 6.18, wakes the peer's NAPI only when the peer runs an XDP program
    /// (`veth_xdp_flush` checks the peer queue's `xdp_prog`): measured with
    /// the router off, `ethtool -S` of the receiver's veth counts every
    /// reply in `xdp_tx` with `xdp_tx_err` 0 while the peer's
    /// `rx_queue_0_xdp_packets` and RX packets stay flat. A redirect to the
    /// veth itself goes through `ndo_xdp_xmit`, whose flush wakes the
    /// peer's NAPI whenever it exists, and [`Self::attach_reflector_ports`]
    /// requests GRO on the peer so that it does: the replies get through
    /// with the router native, generic or off. The peer is the testbed's
    /// router; a veth without one (a NIC pair made of a veth pair) is not
    /// prepared, so it is not trusted.
    pub(crate) fn reflector_replies_get_through(&self, tb: &Testbed) -> bool {
        Layout::of(tb).is_ok_and(|l| self.replies_get_through(&l))
    }

    fn replies_get_through(&self, l: &Layout) -> bool {
        !self.offloads.is_veth(&l.receiver.0, &l.receiver.1) || l.router.is_some()
    }

    /// The in-kernel reflector's counters, if it is attached.
    pub(crate) fn reflector_counters(&self) -> Option<Result<XdpCounters>> {
        self.reflector.as_ref().map(|(r, _)| r.counters())
    }

    /// "none", "skb", "native", or "mixed (if1 native, if2 skb)".
    pub(crate) fn attached_mode_name(&self) -> String {
        let Some((_, first)) = self.modes.first() else {
            return "none".into();
        };
        if self.modes.iter().all(|(_, m)| m == first) {
            return first.to_string();
        }
        let parts: Vec<String> = self.modes.iter().map(|(i, m)| format!("{i} {m}")).collect();
        format!("mixed ({})", parts.join(", "))
    }

    /// Counters summed over every router of the testbed.
    pub(crate) fn counters(&self) -> Result<XdpCounters> {
        let mut total = XdpCounters::new();
        for r in &self.routers {
            for (k, v) in r.counters()? {
                let e = total.entry(k).or_default();
                e.packets += v.packets;
                e.bytes += v.bytes;
            }
        }
        Ok(total)
    }

    /// Detaches every router and restores every offload changed, reporting the first failure.
    pub(crate) fn detach(mut self) -> Result<()> {
        self.undo()
    }

    fn undo(&mut self) -> Result<()> {
        let mut first_err = None;
        if let Some((mut r, _)) = self.reflector.take()
            && let Err(e) = r.detach()
        {
            first_err.get_or_insert(e);
        }
        for mut r in self.routers.drain(..) {
            if let Err(e) = r.detach_all() {
                first_err.get_or_insert(e);
            }
        }
        if let Err(e) = self.offloads.restore() {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for XdpSetup {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            log::warn!("XDP teardown: {e:#}");
        }
    }
}

/// Loads and attaches the router for `tb`: on the router's two interfaces
/// in the veth testbed, on both NICs in NIC-pair mode (where the kernel
/// delivers locally and the router passes).
pub(crate) fn attach_for_testbed(
    tb: &Testbed,
    mode: XdpMode,
    action: XdpAction,
) -> Result<XdpSetup> {
    let mut loader = KernelLoader(tb.sys_ref());
    attach_for_testbed_with(tb, mode, action, &mut loader)
}

/// [`attach_for_testbed`] with the programs from `loader` (stand-ins in
/// the run's orchestration tests).
pub(crate) fn attach_for_testbed_with(
    tb: &Testbed,
    mode: XdpMode,
    action: XdpAction,
    loader: &mut dyn Loader,
) -> Result<XdpSetup> {
    attach_with(tb.sys_ref(), &Layout::of(tb)?, mode, action, loader)
}

/// [`attach_for_testbed`] on a layout, with the programs from `loader`.
/// On an error everything done so far is undone (the routers detached,
/// then the offloads put back), as on drop.
pub(crate) fn attach_with(
    sys: SysRef,
    l: &Layout,
    mode: XdpMode,
    action: XdpAction,
    loader: &mut dyn Loader,
) -> Result<XdpSetup> {
    let mut setup = XdpSetup::none(sys);
    if mode == XdpMode::Off {
        return Ok(setup);
    }
    let pass_only = action == XdpAction::Pass;
    let native_possible = matches!(mode, XdpMode::Native | XdpMode::Auto);
    // (namespace, interface) groups, one router per namespace.
    let groups: Vec<(&str, Vec<&str>)> = match &l.router {
        Some((ns, rin, rout)) => vec![(ns.as_str(), vec![rin.as_str(), rout.as_str()])],
        None => vec![
            (l.sender.0.as_str(), vec![l.sender.1.as_str()]),
            (l.receiver.0.as_str(), vec![l.receiver.1.as_str()]),
        ],
    };
    if native_possible {
        setup.offloads.prepare_native(&l.sender.0, &l.sender.1)?;
        setup
            .offloads
            .prepare_native(&l.receiver.0, &l.receiver.1)?;
    }
    for (ns, ifaces) in groups {
        // Kept by the setup before its first attach, so that a failure
        // detaches it before the offloads are put back.
        setup.routers.push(loader.router(pass_only)?);
        let router = setup.routers.last_mut().expect("just pushed");
        for ifname in ifaces {
            let got = router.attach(Ns::Named(ns), ifname, mode)?;
            setup.modes.push((ifname.to_string(), got));
        }
    }
    Ok(setup)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sys::{
        Sys,
        fake::{Call, FakeSys},
    };

    fn veth_pair() -> Arc<FakeSys> {
        let f = Arc::new(FakeSys::new());
        f.create_netns("snd").unwrap();
        f.create_netns("rtr").unwrap();
        f.with_link(Ns::Named("snd"), "veth-snd", true, 1500);
        f.with_link(Ns::Named("rtr"), "veth-rout", true, 1500);
        f
    }

    /// The fake's driver is "fake", not "veth": nothing is touched.
    #[test]
    fn prepare_native_leaves_a_non_veth_alone() {
        let f = veth_pair();
        let mut o = Offloads::new(f.clone());
        o.prepare_native("snd", "veth-snd").unwrap();
        assert!(o.changed.is_empty());
    }

    #[test]
    fn offloads_are_put_back_newest_first_even_after_a_failure() {
        let f = veth_pair();
        let mut o = Offloads::new(f.clone());
        o.set("snd", "veth-snd", Offload::TxCsum, false).unwrap();
        // Already as asked: not switched, not recorded.
        o.set("snd", "veth-snd", Offload::TxCsum, false).unwrap();
        o.request_gro("rtr", "veth-rout").unwrap();
        // A later step fails: what was changed so far is still put back.
        f.fail_when(|c| matches!(c, Call::SetOffload(_, _, Offload::Gro, _)));
        let e = o.set("snd", "veth-snd", Offload::Gro, false).unwrap_err();
        assert!(
            format!("{e:#}").contains("needs GRO off on veth-snd"),
            "{e:#}"
        );
        let n = f.changes().len();
        // Restoring GRO fails too (injected), TX checksumming still comes back.
        assert!(o.restore().is_err());
        let sets: Vec<Call> = f.changes()[n..].to_vec();
        assert_eq!(
            sets,
            vec![
                Call::SetOffload("rtr".into(), "veth-rout".into(), Offload::Gro, true),
                Call::SetOffload("snd".into(), "veth-snd".into(), Offload::TxCsum, true),
            ]
        );
        assert!(
            f.offload(Ns::Named("snd"), "veth-snd", Offload::TxCsum)
                .unwrap()
        );
    }
}

/// The orchestration against the recording fake: which calls, in which
/// order, and what is undone on error and on drop.
#[cfg(test)]
#[path = "setup_tests.rs"]
mod fake_tests;
