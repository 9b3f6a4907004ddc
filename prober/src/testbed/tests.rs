//! The testbed's orchestration against the recording fake: no root.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use super::*;
use crate::sys::{
    Offload,
    fake::{Call, FakeSys},
};

fn fake() -> Arc<FakeSys> {
    Arc::new(FakeSys::new())
}

fn undo_for(sys: &Arc<FakeSys>) -> Undo {
    Undo::new(sys.clone(), None)
}

fn h(s: &str) -> String {
    s.to_string()
}

/// Makes the k-th state-changing call (0-based) fail.
fn fail_change_k(sys: &FakeSys, k: usize) {
    let n = AtomicUsize::new(0);
    sys.fail_when(move |c| c.is_change() && n.fetch_add(1, Ordering::SeqCst) == k);
}

#[test]
fn veth_build_makes_these_calls_in_this_order() {
    let sys = fake();
    let mut undo = undo_for(&sys);
    let l = build_veth(sys.as_ref(), "abc", &mut undo).unwrap();
    assert_eq!(l.sender, "rtprobe-abc-sender");
    let (s, r, d) = (
        h("rtprobe-abc-sender"),
        h("rtprobe-abc-router"),
        h("rtprobe-abc-receiver"),
    );
    let prep = |ns: &String| {
        let mut v = vec![Call::CreateNetns(ns.clone())];
        for (k, val) in [
            ("net.ipv6.conf.all.disable_ipv6", "0"),
            ("net.ipv6.conf.default.disable_ipv6", "0"),
            ("net.ipv6.conf.all.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
            ("net.ipv6.conf.default.router_solicitations", "0"),
            ("net.ipv6.conf.default.accept_ra", "0"),
        ] {
            v.push(Call::SetSysctl(ns.clone(), h(k), h(val)));
        }
        v.push(Call::SetUp(ns.clone(), h("lo"), true));
        v
    };
    let a = |ip: [u8; 4]| Addr {
        addr: IpAddr::V4(Ipv4Addr::from(ip)),
        prefix_len: 24,
    };
    // One unique-local /64 per link next to each IPv4 /24.
    let a6 = |link: u16, host: u16| Addr {
        addr: IpAddr::V6(Ipv6Addr::new(0xfd71, link, 0, 0, 0, 0, 0, host)),
        prefix_len: 64,
    };
    let gw6 =
        |link: u16| Route::default_via(IpAddr::V6(Ipv6Addr::new(0xfd71, link, 0, 0, 0, 0, 0, 1)));
    let mut want = Vec::new();
    for ns in [&s, &r, &d] {
        want.extend(prep(ns));
    }
    want.extend([
        Call::AddVeth(r.clone(), h("veth-rin"), h("veth-snd")),
        Call::AddVeth(r.clone(), h("veth-rout"), h("veth-rcv")),
        Call::MoveLink(r.clone(), h("veth-snd"), s.clone()),
        Call::MoveLink(r.clone(), h("veth-rcv"), d.clone()),
        Call::AddAddr(r.clone(), h("veth-rin"), a([10, 71, 1, 1])),
        Call::AddAddr(r.clone(), h("veth-rin"), a6(1, 1)),
        Call::SetUp(r.clone(), h("veth-rin"), true),
        Call::AddAddr(r.clone(), h("veth-rout"), a([10, 71, 2, 1])),
        Call::AddAddr(r.clone(), h("veth-rout"), a6(2, 1)),
        Call::SetUp(r.clone(), h("veth-rout"), true),
        Call::SetSysctl(r.clone(), h("net.ipv4.ip_forward"), h("1")),
        Call::SetSysctl(r.clone(), h("net.ipv6.conf.all.forwarding"), h("1")),
        Call::AddAddr(s.clone(), h("veth-snd"), a([10, 71, 1, 2])),
        Call::AddAddr(s.clone(), h("veth-snd"), a6(1, 2)),
        Call::SetUp(s.clone(), h("veth-snd"), true),
        Call::AddRoute(s.clone(), Route::default_via(IpAddr::V4(ROUTER_IN_ADDR))),
        Call::AddRoute(s.clone(), gw6(1)),
        Call::AddAddr(d.clone(), h("veth-rcv"), a([10, 71, 2, 2])),
        Call::AddAddr(d.clone(), h("veth-rcv"), a6(2, 2)),
        Call::SetUp(d.clone(), h("veth-rcv"), true),
        Call::AddRoute(d.clone(), Route::default_via(IpAddr::V4(ROUTER_OUT_ADDR))),
        Call::AddRoute(d.clone(), gw6(2)),
    ]);
    assert!(l.ipv6);
    assert_eq!(sys.changes(), want);
    // Dropping the undo list removes the namespaces, newest first.
    drop(undo);
    let tail: Vec<Call> = sys.changes().split_off(want.len());
    assert_eq!(
        tail,
        vec![
            Call::DeleteNetns(d.clone()),
            Call::DeleteNetns(r.clone()),
            Call::DeleteNetns(s.clone())
        ]
    );
    assert!(sys.netns_list().is_empty());
}

#[test]
fn veth_build_failing_at_any_step_removes_what_it_made_in_reverse() {
    // Count the changes of a good build, then fail each one in turn.
    let probe = fake();
    let n = {
        let mut undo = undo_for(&probe);
        build_veth(probe.as_ref(), "abc", &mut undo).unwrap();
        let n = probe.changes().len();
        undo.steps.clear();
        n
    };
    for k in 0..n {
        let sys = fake();
        fail_change_k(&sys, k);
        let mut undo = undo_for(&sys);
        match build_veth(sys.as_ref(), "abc", &mut undo) {
            Err(err) => assert!(
                err.to_string().contains("injected failure"),
                "step {k}: {err:#}"
            ),
            // Preparing IPv6 is best effort (a kernel without IPv6): the
            // testbed is then IPv4 only, with no IPv6 address anywhere.
            Ok(l) => {
                assert!(
                    matches!(&sys.changes()[k], Call::SetSysctl(_, key, _) if key.contains("ipv6.conf")),
                    "step {k} failed and the build went on: {:?}",
                    sys.changes()[k]
                );
                assert!(!l.ipv6, "step {k}");
                assert!(
                    !sys.changes().iter().any(|c| matches!(c,
                        Call::AddAddr(_, _, a) if a.addr.is_ipv6())),
                    "step {k}: IPv6 addresses on an IPv4-only testbed"
                );
            }
        }
        let created: Vec<String> = sys
            .changes()
            .iter()
            .filter_map(|c| match c {
                Call::CreateNetns(n) => Some(n.clone()),
                _ => None,
            })
            .collect();
        drop(undo);
        let deleted: Vec<String> = sys
            .changes()
            .iter()
            .filter_map(|c| match c {
                Call::DeleteNetns(n) => Some(n.clone()),
                _ => None,
            })
            .collect();
        // The namespace whose creation failed is not ours to delete.
        let mut made: Vec<String> = created
            .into_iter()
            .filter(|n| {
                sys.calls()
                    .iter()
                    .any(|c| *c == Call::DeleteNetns(n.clone()))
            })
            .collect();
        made.reverse();
        assert_eq!(deleted, made, "step {k}");
        assert!(
            sys.netns_list().is_empty(),
            "step {k}: left {:?}",
            sys.netns_list()
        );
    }
}

#[test]
fn a_namespace_that_could_not_be_created_is_not_deleted() {
    let sys = fake();
    sys.fail_when(|c| matches!(c, Call::CreateNetns(n) if n.ends_with("-router")));
    let mut undo = undo_for(&sys);
    build_veth(sys.as_ref(), "abc", &mut undo).unwrap_err();
    drop(undo);
    let deletes: Vec<Call> = sys
        .changes()
        .into_iter()
        .filter(|c| matches!(c, Call::DeleteNetns(_)))
        .collect();
    assert_eq!(deletes, vec![Call::DeleteNetns(h("rtprobe-abc-sender"))]);
}

const V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);

/// A host with two NICs, eth1 carrying IPv4 and IPv6 addresses and routes.
fn host_with_pair(default_route_on_eth1: bool) -> Arc<FakeSys> {
    let sys = fake();
    sys.with_link(Ns::Host, "eth1", true, 9000)
        .with_link(Ns::Host, "eth2", false, 1500)
        .with_addr(
            Ns::Host,
            "eth1",
            Addr {
                addr: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)),
                prefix_len: 24,
            },
        )
        .with_addr(
            Ns::Host,
            "eth1",
            Addr {
                addr: IpAddr::V6(V6),
                prefix_len: 64,
            },
        );
    let mut r = Route {
        dst: IpAddr::V4(Ipv4Addr::new(198, 51, 100, 0)),
        prefix_len: 24,
        gateway: Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))),
        dev: Some(h("eth1")),
        metric: Some(100),
        protocol: 4,
        scope: 0,
        pref_src: None,
    };
    sys.with_route(Ns::Host, r.clone());
    if default_route_on_eth1 {
        r.dst = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
        r.prefix_len = 0;
        r.gateway = Some(IpAddr::V6(Ipv6Addr::new(
            0x2001, 0xdb8, 0, 0, 0, 0, 0, 0xfe,
        )));
        sys.with_route(Ns::Host, r);
    }
    // An offload the user had switched off.
    sys.model
        .lock()
        .unwrap()
        .links
        .get_mut(&(h("host"), h("eth1")))
        .unwrap()
        .offloads
        .insert(Offload::Gro, false);
    sys
}

#[test]
fn nic_pair_refuses_the_interface_with_the_default_route_unless_forced() {
    let sys = host_with_pair(true);
    let mut undo = undo_for(&sys);
    let e = build_nic_pair(sys.as_ref(), "abc", "eth1", "eth2", false, &mut undo).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("refusing to move eth1"), "{msg}");
    assert!(
        msg.contains("default route (default via 2001:db8::fe dev eth1"),
        "{msg}"
    );
    assert!(msg.contains("--force"), "{msg}");
    assert!(!msg.contains('\n'));
    assert!(
        sys.changes().is_empty(),
        "nothing may change before the refusal"
    );

    let mut undo = undo_for(&sys);
    build_nic_pair(sys.as_ref(), "abc", "eth1", "eth2", true, &mut undo).unwrap();
    assert!(
        sys.link_state(Ns::Named("rtprobe-abc-sender"), "eth1")
            .is_some()
    );
}

#[test]
fn nic_pair_refuses_the_ssh_sessions_interface() {
    let sys = host_with_pair(false);
    let b = nicpair::snapshot(sys.as_ref(), Ns::Host, "eth1").unwrap();
    let e = nicpair::check_safe(&b, Some("203.0.113.5 50022 2001:db8::1 22")).unwrap_err();
    assert!(
        e.to_string()
            .contains("2001:db8::1, the address of this SSH session"),
        "{e}"
    );
    nicpair::check_safe(&b, Some("203.0.113.5 50022 192.0.2.99 22")).unwrap();
    nicpair::check_safe(&b, None).unwrap();
    assert_eq!(
        nicpair::ssh_local_addr("fe80::2%eth0 1 fe80::1%eth1 22"),
        Some("fe80::1".parse().unwrap())
    );
    assert_eq!(nicpair::ssh_local_addr("garbage"), None);
}

#[test]
fn nic_pair_gives_back_addresses_routes_mtu_state_and_offloads() {
    let sys = host_with_pair(true);
    let before = |d: &str| {
        (
            sys.link_state(Ns::Host, d).unwrap(),
            sys.routes_of(Ns::Host),
        )
    };
    let (eth1, routes) = before("eth1");
    let mut undo = undo_for(&sys);
    build_nic_pair(sys.as_ref(), "abc", "eth1", "eth2", true, &mut undo).unwrap();
    // In the testbed: moved, addresses and routes gone, as the kernel does.
    assert!(sys.link_state(Ns::Host, "eth1").is_none());
    assert!(sys.routes_of(Ns::Host).is_empty());
    // The run changes things on them.
    sys.set_mtu(Ns::Named("rtprobe-abc-sender"), "eth1", 1500)
        .unwrap();
    sys.set_offload(Ns::Named("rtprobe-abc-sender"), "eth1", Offload::Gro, true)
        .unwrap();
    undo.run().unwrap();
    let after1 = sys.link_state(Ns::Host, "eth1").unwrap();
    let after2 = sys.link_state(Ns::Host, "eth2").unwrap();
    assert_eq!(after1.up, eth1.up);
    assert_eq!(after1.mtu, 9000);
    assert_eq!(after1.offloads, eth1.offloads);
    let mut a = after1.addrs.clone();
    a.sort();
    let mut b = eth1.addrs.clone();
    b.sort();
    assert_eq!(a, b);
    assert!(!after2.up);
    let mut r = sys.routes_of(Ns::Host);
    r.sort();
    let mut want = routes.clone();
    want.sort();
    assert_eq!(r, want);
    assert!(sys.netns_list().is_empty());
    // Give-back order: rx first (newest), then tx, then the namespaces.
    let moves: Vec<Call> = sys
        .changes()
        .into_iter()
        .filter(|c| {
            matches!(c, Call::MoveLink(_, _, to) if to == "host")
                || matches!(c, Call::DeleteNetns(_))
        })
        .collect();
    assert_eq!(
        moves,
        vec![
            Call::MoveLink(h("rtprobe-abc-receiver"), h("eth2"), h("host")),
            Call::MoveLink(h("rtprobe-abc-sender"), h("eth1"), h("host")),
            Call::DeleteNetns(h("rtprobe-abc-receiver")),
            Call::DeleteNetns(h("rtprobe-abc-sender")),
        ]
    );
}

#[test]
fn nic_pair_build_failure_gives_the_first_interface_back() {
    let sys = host_with_pair(false);
    sys.fail_when(|c| matches!(c, Call::MoveLink(_, n, _) if n == "eth2"));
    let mut undo = undo_for(&sys);
    let e = build_nic_pair(sys.as_ref(), "abc", "eth1", "eth2", false, &mut undo).unwrap_err();
    assert!(
        format!("{e:#}").contains("move eth2 into the testbed"),
        "{e:#}"
    );
    drop(undo);
    let eth1 = sys
        .link_state(Ns::Host, "eth1")
        .expect("eth1 back in the host");
    assert!(eth1.up);
    assert_eq!(eth1.addrs.len(), 2);
    assert_eq!(sys.routes_of(Ns::Host).len(), 1);
    assert!(sys.link_state(Ns::Host, "eth2").is_some());
    assert!(sys.netns_list().is_empty());
}

#[test]
fn cleanup_removes_testbeds_of_dead_owners_only() {
    let dir = tempfile::tempdir().unwrap();
    let sys = host_with_pair(false);
    // A run that built a NIC pair and died (its start time no longer matches).
    let mut dead = record::Record::new_in(dir.path(), "dead01", Kind::NicPair).unwrap();
    dead.start_time += 1;
    dead.save().unwrap();
    let mut undo = Undo::new(sys.clone(), Some(dead));
    build_nic_pair(sys.as_ref(), "dead01", "eth1", "eth2", false, &mut undo).unwrap();
    // SIGKILL: nothing is undone.
    std::mem::forget(undo);
    // A live run (this process) with a namespace of its own.
    let live = record::Record::new_in(dir.path(), "live01", Kind::Veth).unwrap();
    let mut live_undo = Undo::new(sys.clone(), Some(live));
    live_undo
        .create_netns(sys.as_ref(), "rtprobe-live01-sender")
        .unwrap();

    let mut out = Vec::new();
    let n = record::cleanup(sys.as_ref(), dir.path(), true, &mut out).unwrap();
    assert_eq!(n, 1);
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("testbed dead01 (nic-pair"), "{text}");
    assert!(text.contains("gives back eth1, eth2"), "{text}");
    assert_eq!(sys.netns_list().len(), 3, "a dry run changes nothing");

    let mut out = Vec::new();
    record::cleanup(sys.as_ref(), dir.path(), false, &mut out).unwrap();
    assert_eq!(sys.netns_list(), vec![h("rtprobe-live01-sender")]);
    let eth1 = sys.link_state(Ns::Host, "eth1").unwrap();
    assert_eq!((eth1.up, eth1.mtu, eth1.addrs.len()), (true, 9000, 2));
    assert!(!dir.path().join("dead01.json").exists());
    assert!(dir.path().join("live01.json").exists());

    let mut out = Vec::new();
    assert_eq!(
        record::cleanup(sys.as_ref(), dir.path(), false, &mut out).unwrap(),
        0
    );
    assert_eq!(String::from_utf8(out).unwrap(), "no stale testbeds\n");
    live_undo.run().unwrap();
    assert!(!dir.path().join("live01.json").exists());
}

#[test]
fn start_time_of_this_process_and_of_none() {
    let me = std::process::id();
    assert!(record::start_time(me).is_some());
    assert_eq!(record::start_time(u32::MAX), None);
}
