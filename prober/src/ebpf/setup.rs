//! Puts the XDP router on a testbed: which interfaces, which mode, and what
//! veth needs for native XDP (GRO on the peer of a redirect target, TX
//! checksum offload off on veths that send UDP from local sockets). Every
//! offload it changes is put back on `detach()` (and on drop), which
//! matters for NIC-pair interfaces that go back to the host afterwards.
//! Kernel interfaces: see [`super`] (bpf, rtnetlink); offloads through
//! [`crate::sys::Sys`] (SIOCETHTOOL).

use anyhow::{Context, Result};

use super::{AttachedMode, Reflector, Router};
use crate::{
    ebpf::{XdpAction, XdpMode},
    stats::XdpCounters,
    sys::{Ns, Offload, SysRef},
    testbed::{Netns, Testbed},
};

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
pub struct XdpSetup {
    /// One router per namespace it is attached in (ifindexes are per namespace).
    routers: Vec<Router>,
    /// Mode per attached interface, in attach order.
    modes: Vec<(String, AttachedMode)>,
    offloads: Offloads,
    /// rtprobe's in-kernel reflector on the receiver's interface, if attached.
    reflector: Option<(Reflector, AttachedMode)>,
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

    /// Attaches the in-kernel reflector (answering rtprobe probes to UDP
    /// `port`) to the receiver's interface, native where the driver can,
    /// else generic. On a veth it prepares what the replies and the
    /// reflector's checksum update need (GRO requested on the peer, which
    /// receives the replies; TX checksum offload off at the sender, so
    /// probes carry full UDP checksums), put back with everything else, and
    /// has the reflector redirect its replies to its own veth rather than
    /// XDP_TX them (see [`Self::reflector_replies_get_through`]). Fails
    /// when another XDP program holds the interface (the router in NIC-pair
    /// mode).
    pub fn attach_reflector(&mut self, tb: &Testbed, port: u16) -> Result<AttachedMode> {
        self.attach_reflector_ports(tb, port, 0)
    }

    /// [`Self::attach_reflector`] answering rtprobe probes to `port` (0:
    /// none) and STAMP session-sender packets to `stamp_port` (0: none).
    pub fn attach_reflector_ports(
        &mut self,
        tb: &Testbed,
        port: u16,
        stamp_port: u16,
    ) -> Result<AttachedMode> {
        let mut reply_ifindex = 0;
        if self
            .offloads
            .is_veth(tb.receiver.name(), &tb.receiver_if.name)
        {
            if let (Some(ns), Some(peer)) = (&tb.router, &tb.router_out) {
                self.offloads.request_gro(ns.name(), &peer.name)?;
            }
            self.offloads
                .set(tb.sender.name(), &tb.sender_if.name, Offload::TxCsum, false)?;
            let name = &tb.receiver_if.name;
            reply_ifindex = tb
                .receiver
                .run(|| super::ifindex_of(name, tb.receiver.name()))?;
        }
        let mut r = Reflector::load(port, stamp_port, reply_ifindex)?;
        let mode = r.attach(&tb.receiver, &tb.receiver_if.name, XdpMode::Auto)?;
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
    /// peer's NAPI whenever it exists, and [`Self::attach_reflector`]
    /// requests GRO on the peer so that it does: the replies get through
    /// with the router native, generic or off. The peer is the testbed's
    /// router; a veth without one (a NIC pair made of a veth pair) is not
    /// prepared, so it is not trusted.
    pub fn reflector_replies_get_through(&self, tb: &Testbed) -> bool {
        !self
            .offloads
            .is_veth(tb.receiver.name(), &tb.receiver_if.name)
            || tb.router_out.is_some()
    }

    /// The in-kernel reflector's counters, if it is attached.
    pub fn reflector_counters(&self) -> Option<Result<XdpCounters>> {
        self.reflector.as_ref().map(|(r, _)| r.counters())
    }

    /// "none", "skb", "native", or "mixed (if1 native, if2 skb)".
    pub fn attached_mode_name(&self) -> String {
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
    pub fn counters(&self) -> Result<XdpCounters> {
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
    pub fn detach(mut self) -> Result<()> {
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
pub fn attach_for_testbed(tb: &Testbed, mode: XdpMode, action: XdpAction) -> Result<XdpSetup> {
    let mut setup = XdpSetup::none(tb.sys_ref());
    if mode == XdpMode::Off {
        return Ok(setup);
    }
    let pass_only = action == XdpAction::Pass;
    let native_possible = matches!(mode, XdpMode::Native | XdpMode::Auto);
    // (namespace, interface) groups, one router per namespace.
    let groups: Vec<(&Netns, Vec<&str>)> = match &tb.router {
        Some(router_ns) => {
            let rin = tb
                .router_in
                .as_ref()
                .context("veth testbed without router_in")?;
            let rout = tb
                .router_out
                .as_ref()
                .context("veth testbed without router_out")?;
            vec![(router_ns, vec![rin.name.as_str(), rout.name.as_str()])]
        }
        None => vec![
            (&tb.sender, vec![tb.sender_if.name.as_str()]),
            (&tb.receiver, vec![tb.receiver_if.name.as_str()]),
        ],
    };
    if native_possible {
        setup
            .offloads
            .prepare_native(tb.sender.name(), &tb.sender_if.name)?;
        setup
            .offloads
            .prepare_native(tb.receiver.name(), &tb.receiver_if.name)?;
    }
    for (ns, ifaces) in groups {
        let mut router = Router::load(pass_only)?;
        for ifname in ifaces {
            let got = router.attach(ns, ifname, mode)?;
            setup.modes.push((ifname.to_string(), got));
        }
        setup.routers.push(router);
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
