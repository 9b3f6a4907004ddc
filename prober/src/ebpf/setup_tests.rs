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
    let setup = attach_with(f.clone(), &l, XdpMode::Native, XdpAction::Redirect, &mut ld).unwrap();
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
    let e = attach_with(f.clone(), &l, XdpMode::Native, XdpAction::Redirect, &mut ld).unwrap_err();
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
    let e = attach_with(f.clone(), &l, XdpMode::Auto, XdpAction::Redirect, &mut ld).unwrap_err();
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
    let setup = attach_with(f.clone(), &l, XdpMode::Auto, XdpAction::Redirect, &mut ld).unwrap();
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
    let e = attach_with(f.clone(), &l, XdpMode::Native, XdpAction::Redirect, &mut ld).unwrap_err();
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
    let setup = attach_with(f.clone(), &l, XdpMode::Native, XdpAction::Redirect, &mut ld).unwrap();
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
    let mut setup = attach_with(f.clone(), &l, XdpMode::Off, XdpAction::Redirect, &mut ld).unwrap();
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
    let mut setup = attach_with(f.clone(), &l, XdpMode::Skb, XdpAction::Redirect, &mut ld).unwrap();
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
