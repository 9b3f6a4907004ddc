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
mod fake_tests {
    use std::sync::Arc;

    use xdp_common::EGRESS_MAP;

    use super::*;
    use crate::{
        error::Error,
        sys::{
            Sys, XdpFlags, XdpState,
            fake::{Call, FakeSys},
        },
    };

    /// Programs that were never loaded, with ids 101, 102, ...
    struct StandIns {
        sys: Arc<FakeSys>,
        next_id: u32,
        /// pass_only of each router asked for.
        routers: Vec<bool>,
        /// (probe port, STAMP port, reply ifindex) of each reflector.
        reflectors: Vec<(u16, u16, u32)>,
    }

    impl StandIns {
        fn new(sys: &Arc<FakeSys>) -> Self {
            Self {
                sys: sys.clone(),
                next_id: 100,
                routers: Vec::new(),
                reflectors: Vec::new(),
            }
        }
    }

    impl Loader for StandIns {
        fn router(&mut self, pass_only: bool) -> Result<Router> {
            self.next_id += 1;
            self.routers.push(pass_only);
            Ok(Router::stand_in(self.sys.clone(), pass_only, self.next_id))
        }

        fn reflector(&mut self, probe: u16, stamp: u16, reply_ifindex: u32) -> Result<Reflector> {
            self.next_id += 1;
            self.reflectors.push((probe, stamp, reply_ifindex));
            Ok(Reflector::stand_in(self.sys.clone(), self.next_id))
        }
    }

    fn n(s: &str) -> Ns<'_> {
        Ns::Named(s)
    }

    fn s(x: &str) -> String {
        x.to_string()
    }

    /// sender "snd" veth-snd -- veth-rin "rtr" veth-rout -- veth-rcv "rcv",
    /// all veths, GRO off on the sender's veth.
    fn veth_testbed() -> (Arc<FakeSys>, Layout) {
        let f = Arc::new(FakeSys::new());
        for (ns, devs) in [
            ("snd", &["veth-snd"][..]),
            ("rtr", &["veth-rin", "veth-rout"][..]),
            ("rcv", &["veth-rcv"][..]),
        ] {
            f.create_netns(ns).unwrap();
            for d in devs {
                f.with_link(n(ns), d, true, 1500)
                    .edit_link(n(ns), d, |l| l.driver = s("veth"));
            }
        }
        f.edit_link(n("snd"), "veth-snd", |l| {
            l.offloads.insert(Offload::Gro, false);
        });
        let l = Layout {
            sender: (s("snd"), s("veth-snd")),
            receiver: (s("rcv"), s("veth-rcv")),
            router: Some((s("rtr"), s("veth-rin"), s("veth-rout"))),
        };
        f.clear_calls();
        (f, l)
    }

    /// Two physical NICs moved into "snd" and "rcv".
    fn nic_pair() -> (Arc<FakeSys>, Layout) {
        let f = Arc::new(FakeSys::new());
        for (ns, d) in [("snd", "eth1"), ("rcv", "eth2")] {
            f.create_netns(ns).unwrap();
            f.with_link(n(ns), d, true, 1500);
        }
        let l = Layout {
            sender: (s("snd"), s("eth1")),
            receiver: (s("rcv"), s("eth2")),
            router: None,
        };
        f.clear_calls();
        (f, l)
    }

    /// A link of the model: namespace, name, XDP state, offloads.
    type LinkView = (String, String, XdpState, Vec<(Offload, bool)>);

    /// Every link of the model.
    fn links(f: &FakeSys) -> Vec<LinkView> {
        f.model
            .lock()
            .unwrap()
            .links
            .iter()
            .map(|((ns, d), l)| {
                let o = l.offloads.iter().map(|(k, v)| (*k, *v)).collect();
                (ns.clone(), d.clone(), l.xdp, o)
            })
            .collect()
    }

    fn devmap(f: &FakeSys) -> Vec<u32> {
        f.model
            .lock()
            .unwrap()
            .devmaps
            .get(EGRESS_MAP)
            .map(|m| m.iter().copied().collect())
            .unwrap_or_default()
    }

    fn index(f: &FakeSys, ns: &str, dev: &str) -> u32 {
        f.link_state(n(ns), dev).unwrap().index
    }

    fn offload(ns: &str, d: &str, what: Offload, on: bool) -> Call {
        Call::SetOffload(s(ns), s(d), what, on)
    }

    fn attach(ns: &str, d: &str, id: u32, flags: XdpFlags) -> Call {
        Call::XdpAttach(s(ns), s(d), id, flags)
    }

    fn detach(ns: &str, d: &str, id: u32) -> Call {
        Call::XdpDetach(s(ns), s(d), id)
    }

    fn insert(ns: &str, d: &str) -> Call {
        Call::DevmapInsert(s(ns), s(EGRESS_MAP), s(d))
    }

    #[test]
    fn native_on_the_veth_testbed_makes_these_calls_in_this_order_and_undoes_them() {
        let (f, l) = veth_testbed();
        let before = links(&f);
        let mut ld = StandIns::new(&f);
        let setup =
            attach_with(f.clone(), &l, XdpMode::Native, XdpAction::Redirect, &mut ld).unwrap();
        assert_eq!(ld.routers, vec![false], "one router, redirecting");
        assert_eq!(
            f.changes(),
            vec![
                // What native XDP on veth needs, before anything is attached.
                offload("snd", "veth-snd", Offload::Gro, true),
                offload("snd", "veth-snd", Offload::TxCsum, false),
                offload("rcv", "veth-rcv", Offload::TxCsum, false),
                // Each interface allowed as egress before the program sees a packet.
                insert("rtr", "veth-rin"),
                attach("rtr", "veth-rin", 101, XdpFlags::Drv),
                insert("rtr", "veth-rout"),
                attach("rtr", "veth-rout", 101, XdpFlags::Drv),
            ]
        );
        // The mode is read back from the kernel, not assumed.
        let rin = index(&f, "rtr", "veth-rin");
        assert!(f.calls().contains(&Call::XdpState(s("rtr"), rin)));
        assert_eq!(setup.attached_mode_name(), "native");
        let rin_state = f.link_state(n("rtr"), "veth-rin").unwrap().xdp;
        assert_eq!(rin_state.drv_prog_id, Some(101));
        assert_eq!(devmap(&f).len(), 2);

        let k = f.changes().len();
        setup.detach().unwrap();
        let rout = index(&f, "rtr", "veth-rout");
        assert_eq!(
            f.changes()[k..].to_vec(),
            vec![
                detach("rtr", "veth-rin", 101),
                detach("rtr", "veth-rout", 101),
                Call::DevmapRemove(s(EGRESS_MAP), rin),
                Call::DevmapRemove(s(EGRESS_MAP), rout),
                // Offloads back newest first, after the programs are gone.
                offload("rcv", "veth-rcv", Offload::TxCsum, true),
                offload("snd", "veth-snd", Offload::TxCsum, true),
                offload("snd", "veth-snd", Offload::Gro, false),
            ]
        );
        assert_eq!(links(&f), before, "every link as it was");
        assert!(devmap(&f).is_empty());
    }

    #[test]
    fn off_touches_nothing_and_skb_changes_no_offload() {
        let (f, l) = veth_testbed();
        let mut ld = StandIns::new(&f);
        let setup = attach_with(f.clone(), &l, XdpMode::Off, XdpAction::Redirect, &mut ld).unwrap();
        assert!(f.calls().is_empty() && ld.routers.is_empty());
        assert_eq!(setup.attached_mode_name(), "none");
        drop(setup);
        assert!(f.calls().is_empty());

        let setup = attach_with(f.clone(), &l, XdpMode::Skb, XdpAction::Pass, &mut ld).unwrap();
        assert_eq!(ld.routers, vec![true], "pass-only router");
        assert!(
            !f.changes()
                .iter()
                .any(|c| matches!(c, Call::SetOffload(..))),
            "{:?}",
            f.changes()
        );
        assert_eq!(setup.attached_mode_name(), "skb");
    }

    #[test]
    fn a_failure_on_the_second_interface_detaches_the_first_and_gives_offloads_back() {
        let (f, l) = veth_testbed();
        let before = links(&f);
        f.fail_when(|c| matches!(c, Call::XdpAttach(_, d, _, _) if d == "veth-rout"));
        let mut ld = StandIns::new(&f);
        let e =
            attach_with(f.clone(), &l, XdpMode::Native, XdpAction::Redirect, &mut ld).unwrap_err();
        assert!(format!("{e:#}").contains("injected failure"), "{e:#}");
        let changes = f.changes();
        let failed = changes
            .iter()
            .position(|c| *c == attach("rtr", "veth-rout", 101, XdpFlags::Drv))
            .unwrap();
        let (rin, rout) = (index(&f, "rtr", "veth-rin"), index(&f, "rtr", "veth-rout"));
        assert_eq!(
            changes[failed + 1..].to_vec(),
            vec![
                // The failed interface's egress entry goes at once ...
                Call::DevmapRemove(s(EGRESS_MAP), rout),
                // ... then the first interface is detached ...
                detach("rtr", "veth-rin", 101),
                Call::DevmapRemove(s(EGRESS_MAP), rin),
                // ... and only then the offloads come back.
                offload("rcv", "veth-rcv", Offload::TxCsum, true),
                offload("snd", "veth-snd", Offload::TxCsum, true),
                offload("snd", "veth-snd", Offload::Gro, false),
            ]
        );
        assert_eq!(links(&f), before);
        assert!(devmap(&f).is_empty());
    }

    #[test]
    fn a_failed_offload_change_undoes_the_ones_before_and_attaches_nothing() {
        let (f, l) = veth_testbed();
        let before = links(&f);
        f.fail_when(|c| *c == offload("rcv", "veth-rcv", Offload::TxCsum, false));
        let mut ld = StandIns::new(&f);
        let e =
            attach_with(f.clone(), &l, XdpMode::Auto, XdpAction::Redirect, &mut ld).unwrap_err();
        assert!(
            format!("{e:#}").contains("native XDP on veth needs TX checksumming off on veth-rcv"),
            "{e:#}"
        );
        assert!(ld.routers.is_empty(), "no program loaded");
        assert!(!f.changes().iter().any(|c| matches!(c, Call::XdpAttach(..))));
        assert_eq!(links(&f), before);
    }

    #[test]
    fn auto_falls_back_to_skb_where_the_driver_refuses_native() {
        let (f, l) = veth_testbed();
        f.edit_link(n("rtr"), "veth-rin", |l| {
            l.refuse_native = Some(libc::ERANGE)
        });
        let mut ld = StandIns::new(&f);
        let setup =
            attach_with(f.clone(), &l, XdpMode::Auto, XdpAction::Redirect, &mut ld).unwrap();
        let attaches: Vec<Call> = f
            .changes()
            .into_iter()
            .filter(|c| matches!(c, Call::XdpAttach(..)))
            .collect();
        assert_eq!(
            attaches,
            vec![
                attach("rtr", "veth-rin", 101, XdpFlags::Any),
                attach("rtr", "veth-rin", 101, XdpFlags::Skb),
                attach("rtr", "veth-rout", 101, XdpFlags::Any),
            ]
        );
        assert_eq!(
            setup.attached_mode_name(),
            "mixed (veth-rin skb, veth-rout native)"
        );
    }

    #[test]
    fn native_refused_is_a_typed_error_and_leaves_nothing_attached() {
        let (f, l) = veth_testbed();
        let before = links(&f);
        f.edit_link(n("rtr"), "veth-rin", |l| {
            l.refuse_native = Some(libc::EOPNOTSUPP)
        });
        let mut ld = StandIns::new(&f);
        let e =
            attach_with(f.clone(), &l, XdpMode::Native, XdpAction::Redirect, &mut ld).unwrap_err();
        match e.downcast_ref::<Error>() {
            Some(Error::XdpModeUnsupported { mode, ifname, .. }) => {
                assert_eq!((mode.as_str(), ifname.as_str()), ("native", "veth-rin"));
            }
            other => panic!("expected XdpModeUnsupported, got {other:?}: {e:#}"),
        }
        // No fallback for an explicit mode.
        assert_eq!(
            f.changes()
                .iter()
                .filter(|c| matches!(c, Call::XdpAttach(..)))
                .count(),
            1
        );
        assert_eq!(links(&f), before);
        assert!(devmap(&f).is_empty());
    }

    #[test]
    fn nic_pair_gets_one_router_per_namespace_and_drop_detaches_both() {
        let (f, l) = nic_pair();
        let before = links(&f);
        let mut ld = StandIns::new(&f);
        let setup = attach_with(f.clone(), &l, XdpMode::Auto, XdpAction::Pass, &mut ld).unwrap();
        assert_eq!(ld.routers, vec![true, true]);
        assert_eq!(
            f.changes(),
            vec![
                insert("snd", "eth1"),
                attach("snd", "eth1", 101, XdpFlags::Any),
                insert("rcv", "eth2"),
                attach("rcv", "eth2", 102, XdpFlags::Any),
            ],
            "not veths: no offload changed"
        );
        let k = f.changes().len();
        drop(setup);
        let detaches: Vec<Call> = f.changes()[k..]
            .iter()
            .filter(|c| matches!(c, Call::XdpDetach(..)))
            .cloned()
            .collect();
        assert_eq!(
            detaches,
            vec![detach("snd", "eth1", 101), detach("rcv", "eth2", 102)]
        );
        assert_eq!(links(&f), before);
    }

    #[test]
    fn a_failed_detach_still_detaches_the_rest_and_restores_offloads() {
        let (f, l) = veth_testbed();
        let before = links(&f);
        let mut ld = StandIns::new(&f);
        let setup =
            attach_with(f.clone(), &l, XdpMode::Native, XdpAction::Redirect, &mut ld).unwrap();
        f.fail_when(|c| matches!(c, Call::XdpDetach(_, d, _) if d == "veth-rin"));
        let e = setup.detach().unwrap_err();
        assert!(
            format!("{e:#}").contains("detaching the XDP router from veth-rin in namespace rtr"),
            "{e:#}"
        );
        assert!(f.changes().contains(&detach("rtr", "veth-rout", 101)));
        // Everything but the refused detach is back.
        let now = links(&f);
        for (was, is) in before.iter().zip(&now) {
            assert_eq!(was.3, is.3, "offloads of {}", was.1);
        }
        assert_eq!(
            f.link_state(n("rtr"), "veth-rin").unwrap().xdp.drv_prog_id,
            Some(101)
        );
    }

    #[test]
    fn reflector_on_a_veth_prepares_the_replies_path_and_undoes_it() {
        let (f, l) = veth_testbed();
        let before = links(&f);
        let mut ld = StandIns::new(&f);
        let mut setup =
            attach_with(f.clone(), &l, XdpMode::Off, XdpAction::Redirect, &mut ld).unwrap();
        let mode = setup.attach_reflector_with(&l, 5000, 862, &mut ld).unwrap();
        assert_eq!(mode, AttachedMode::Native);
        // Replies are redirected to the receiver's own veth.
        assert_eq!(
            ld.reflectors,
            vec![(5000, 862, index(&f, "rcv", "veth-rcv"))]
        );
        assert_eq!(
            f.changes(),
            vec![
                // GRO requested (off, on) on the router's veth that takes the replies.
                offload("rtr", "veth-rout", Offload::Gro, false),
                offload("rtr", "veth-rout", Offload::Gro, true),
                offload("snd", "veth-snd", Offload::TxCsum, false),
                attach("rcv", "veth-rcv", 101, XdpFlags::Any),
            ]
        );
        assert!(setup.replies_get_through(&l));
        let k = f.changes().len();
        drop(setup);
        assert_eq!(
            f.changes()[k..].to_vec(),
            vec![
                detach("rcv", "veth-rcv", 101),
                offload("snd", "veth-snd", Offload::TxCsum, true),
                offload("rtr", "veth-rout", Offload::Gro, true),
            ]
        );
        assert_eq!(links(&f), before);
    }

    #[test]
    fn reflector_refused_beside_the_router_leaves_the_router_and_nothing_else() {
        let (f, l) = nic_pair();
        let mut ld = StandIns::new(&f);
        let mut setup =
            attach_with(f.clone(), &l, XdpMode::Skb, XdpAction::Redirect, &mut ld).unwrap();
        let e = setup
            .attach_reflector_with(&l, 5000, 0, &mut ld)
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("another XDP program is already attached to eth2"),
            "{e:#}"
        );
        assert_eq!(
            ld.reflectors,
            vec![(5000, 0, 0)],
            "a NIC transmits XDP_TX itself: no redirect"
        );
        assert!(setup.replies_get_through(&l));
        let st = f.link_state(n("rcv"), "eth2").unwrap().xdp;
        assert_eq!(st.skb_prog_id, Some(102), "the router stays");
        drop(setup);
        assert!(f.link_state(n("rcv"), "eth2").unwrap().xdp.is_empty());
    }
}
