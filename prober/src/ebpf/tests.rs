//! Root tests of the XDP router: BPF_PROG_TEST_RUN over crafted frames in
//! a namespace with routes and neighbours, attach/detach in every mode,
//! and real UDP traffic forwarded through the router between namespaces.

use std::{
    net::{Ipv4Addr, UdpSocket},
    time::Duration,
};

use aya::programs::{TestRun, TestRunOptions};

use super::*;
use crate::{
    sys::{Netns, ethtool},
    testbed::testutil::{exec, ifindex, ip, mac, netns, require_root},
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x11];
const NEIGH_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x22];
const OTHER_NEIGH_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x33];

/// A namespace laid out for FIB lookups: traffic enters on `in0`
/// (10.1.0.1/24) and may leave on `out0` (10.2.0.1/24, neighbour 10.2.0.2
/// known) or `oth0` (10.3.0.1/24, neighbour 10.3.0.2 known, but not in the
/// router's egress map). 10.7/8/9.0.0/24 are prohibit/unreachable/blackhole.
struct FibNet {
    ns: Netns,
    in_ifindex: u32,
    in_mac: [u8; 6],
    out_mac: [u8; 6],
}

fn fib_net() -> FibNet {
    let ns = netns("fib");
    for (a, b, addr) in [
        ("in0", "in1", "10.1.0.1/24"),
        ("out0", "out1", "10.2.0.1/24"),
        ("oth0", "oth1", "10.3.0.1/24"),
    ] {
        ip(&ns, &format!("link add {a} type veth peer name {b}"));
        ip(&ns, &format!("addr add {addr} dev {a}"));
        ip(&ns, &format!("link set {a} up"));
        ip(&ns, &format!("link set {b} up"));
    }
    let mac_str = |m: [u8; 6]| {
        m.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    ip(
        &ns,
        &format!(
            "neigh add 10.2.0.2 lladdr {} dev out0 nud permanent",
            mac_str(NEIGH_MAC)
        ),
    );
    ip(
        &ns,
        &format!(
            "neigh add 10.3.0.2 lladdr {} dev oth0 nud permanent",
            mac_str(OTHER_NEIGH_MAC)
        ),
    );
    ip(&ns, "route add blackhole 10.9.0.0/24");
    ip(&ns, "route add unreachable 10.8.0.0/24");
    ip(&ns, "route add prohibit 10.7.0.0/24");
    // The same layout in IPv6: fd00:1::/64 in, fd00:2::/64 out, fd00:3::/64
    // other (nodad: usable at once, no duplicate address detection).
    for (dev, addr) in [
        ("in0", "fd00:1::1/64"),
        ("out0", "fd00:2::1/64"),
        ("oth0", "fd00:3::1/64"),
    ] {
        ip(&ns, &format!("-6 addr add {addr} dev {dev} nodad"));
    }
    for (addr, dev, m) in [
        ("fd00:2::2", "out0", NEIGH_MAC),
        ("fd00:3::2", "oth0", OTHER_NEIGH_MAC),
    ] {
        ip(
            &ns,
            &format!(
                "-6 neigh add {addr} lladdr {} dev {dev} nud permanent",
                mac_str(m)
            ),
        );
    }
    ip(&ns, "-6 route add blackhole fd00:9::/64");
    ip(&ns, "-6 route add unreachable fd00:8::/64");
    ip(&ns, "-6 route add prohibit fd00:7::/64");
    // Namespaced sysctls: bpf_fib_lookup answers FWD_DISABLED without them.
    exec(&ns, "sysctl -qw net.ipv4.conf.all.forwarding=1");
    exec(&ns, "sysctl -qw net.ipv6.conf.all.forwarding=1");
    FibNet {
        in_ifindex: ifindex(&ns, "in0"),
        in_mac: mac(&ns, "in0"),
        out_mac: mac(&ns, "out0"),
        ns,
    }
}

/// Ethernet frame to the router's ingress MAC.
fn eth(dst: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&SRC_MAC);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// One's complement checksum of an IPv4 header of any length.
fn header_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for w in h.chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Recomputes the checksum of the 20-byte IPv4 header of an Ethernet frame.
fn refresh_checksum(frame: &mut [u8]) {
    frame[24] = 0;
    frame[25] = 0;
    let c = header_checksum(&frame[14..34]);
    frame[24..26].copy_from_slice(&c.to_be_bytes());
}

#[derive(Clone)]
struct Ip4 {
    dst: Ipv4Addr,
    ttl: u8,
    options: Vec<u8>,
    /// Flags (DF/MF) and fragment offset, host order.
    frag: u16,
    udp_payload: usize,
    tos: u8,
}

fn ip4(dst: &str, ttl: u8) -> Ip4 {
    Ip4 {
        dst: dst.parse().unwrap(),
        ttl,
        options: vec![],
        frag: 0x4000, // DF
        udp_payload: 32,
        tos: 0,
    }
}

impl Ip4 {
    /// IPv4 + UDP datagram with a correct header checksum.
    fn packet(&self) -> Vec<u8> {
        assert!(self.options.len().is_multiple_of(4));
        let hlen = 20 + self.options.len();
        let tot = hlen + 8 + self.udp_payload;
        let mut p = vec![0u8; tot];
        p[0] = 0x40 | (hlen / 4) as u8;
        p[1] = self.tos;
        p[2..4].copy_from_slice(&(tot as u16).to_be_bytes());
        p[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        p[6..8].copy_from_slice(&self.frag.to_be_bytes());
        p[8] = self.ttl;
        p[9] = 17; // UDP
        p[12..16].copy_from_slice(&[10, 1, 0, 2]);
        p[16..20].copy_from_slice(&self.dst.octets());
        p[20..hlen].copy_from_slice(&self.options);
        let c = header_checksum(&p[..hlen]);
        p[10..12].copy_from_slice(&c.to_be_bytes());
        // UDP 5061 -> 5061, checksum 0 (none, valid for IPv4).
        p[hlen..hlen + 2].copy_from_slice(&5061u16.to_be_bytes());
        p[hlen + 2..hlen + 4].copy_from_slice(&5061u16.to_be_bytes());
        p[hlen + 4..hlen + 6].copy_from_slice(&((8 + self.udp_payload) as u16).to_be_bytes());
        p
    }

    fn frame(&self, dst_mac: [u8; 6]) -> Vec<u8> {
        eth(dst_mac, 0x0800, &self.packet())
    }
}

/// Runs the router's program once over `frame` as if received on
/// `ingress_ifindex`, inside `ns` (the kernel resolves the ifindex in the
/// caller's namespace). Returns the action and the frame as it left.
fn test_run(
    router: &Router,
    ns: &Netns,
    ingress_ifindex: u32,
    frame: &[u8],
) -> Result<(u32, Vec<u8>)> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex,
    // rx_queue_index, egress_ifindex. data_end must equal the frame size.
    let mut ctx = Vec::with_capacity(24);
    for v in [0u32, frame.len() as u32, 0, ingress_ifindex, 0, 0] {
        ctx.extend_from_slice(&v.to_ne_bytes());
    }
    router.prog.obj.with(|ebpf| {
        let prog: &Xdp = ebpf.program(PROGRAM_NAME).context("program")?.try_into()?;
        ns.run(|| {
            let mut out = vec![0u8; frame.len() + 64];
            let res = prog.test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ctx_in: Some(&ctx),
                ..TestRunOptions::new()
            })?;
            out.truncate(res.data_size_out as usize);
            Ok((res.return_value, out))
        })
    })
}

fn outcome_total(c: &XdpCounters, o: Outcome) -> PacketsBytes {
    c[o.name()]
}

/// Every counter the router reports (both families), at zero.
fn zero_counters() -> XdpCounters {
    let mut c = XdpCounters::new();
    for o in Outcome::ALL {
        c.insert(o.name().into(), PacketsBytes::default());
    }
    for o in Outcome::IPV6 {
        c.insert(o.name6().into(), PacketsBytes::default());
    }
    c
}

#[derive(Clone)]
struct Ip6 {
    src: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    hop_limit: u8,
    next_header: u8,
    /// Bytes after the fixed header (an extension header or UDP + payload).
    payload: usize,
    traffic_class: u8,
}

fn ip6(dst: &str, hop_limit: u8) -> Ip6 {
    Ip6 {
        src: "fd00:1::2".parse().unwrap(),
        dst: dst.parse().unwrap(),
        hop_limit,
        next_header: 17,
        payload: 8 + 32,
        traffic_class: 0,
    }
}

impl Ip6 {
    fn packet(&self) -> Vec<u8> {
        let mut p = vec![0u8; 40 + self.payload];
        p[0] = 0x60 | (self.traffic_class >> 4);
        p[1] = (self.traffic_class << 4) | 0x0a; // flow label 0xa1234
        p[2..4].copy_from_slice(&0x1234u16.to_be_bytes());
        p[4..6].copy_from_slice(&(self.payload as u16).to_be_bytes());
        p[6] = self.next_header;
        p[7] = self.hop_limit;
        p[8..24].copy_from_slice(&self.src.octets());
        p[24..40].copy_from_slice(&self.dst.octets());
        if self.next_header == 17 && self.payload >= 8 {
            p[40..42].copy_from_slice(&5061u16.to_be_bytes());
            p[42..44].copy_from_slice(&5061u16.to_be_bytes());
            p[44..46].copy_from_slice(&(self.payload as u16).to_be_bytes());
            p[46..48].copy_from_slice(&0x5555u16.to_be_bytes()); // not checked en route
        } else if self.payload >= 8 {
            // An extension header: next header UDP, length 0 (8 bytes).
            p[40] = 17;
        }
        p
    }

    fn frame(&self, dst_mac: [u8; 6]) -> Vec<u8> {
        eth(dst_mac, 0x86dd, &self.packet())
    }
}

/// The test_run tables of IPv6 and IPv4 frames.
#[path = "tests_tables.rs"]
mod tables;

/// Keeps the records aya-log hands over.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<(log::Level, String)>>>);

impl log::Log for Captured {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        self.0
            .lock()
            .unwrap()
            .push((record.level(), record.args().to_string()));
    }
    fn flush(&self) {}
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn rare_paths_are_logged_only_when_asked() {
    require_root();
    let net = fib_net();
    let to_us = net.in_mac;
    let truncated = eth(to_us, 0x0800, &ip4("10.2.0.2", 64).packet()[..10]);
    let expiring = ip6("fd00:2::2", 1).frame(to_us);
    let not_in_map = ip4("10.3.0.2", 64).frame(to_us);
    let good = ip4("10.2.0.2", 64).frame(to_us);

    let seen = Captured::default();
    {
        let mut router = Router::load_logging_to(
            crate::sys::linux(),
            false,
            true,
            Some(Box::new(seen.clone())),
        )
        .unwrap();
        router.add_egress(&net.ns, "out0").unwrap();
        for f in [&good, &truncated, &expiring, &not_in_map, &good] {
            test_run(&router, &net.ns, net.in_ifindex, f).unwrap();
        }
        // Dropping the router stops the log thread after a last flush.
    }
    let records = seen.0.lock().unwrap().clone();
    let texts: Vec<&str> = records.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        records.len(),
        3,
        "one record per rare frame, none for good ones: {texts:?}"
    );
    assert!(
        texts[0].contains("malformed IPv4 frame of 24 bytes"),
        "{texts:?}"
    );
    assert!(texts[1].contains("IPv6 hop limit 1 expires"), "{texts:?}");
    assert!(texts[2].contains("not in the egress map"), "{texts:?}");
    assert_eq!(records[0].0, log::Level::Warn);
    assert_eq!(records[1].0, log::Level::Debug);

    // Off (the default): the same frames, nothing in the log's ring buffer
    // (read all the same), the same counts.
    let quiet = Captured::default();
    {
        let mut router = Router::load_logging_to(
            crate::sys::linux(),
            false,
            false,
            Some(Box::new(quiet.clone())),
        )
        .unwrap();
        router.add_egress(&net.ns, "out0").unwrap();
        for f in [&truncated, &expiring, &not_in_map] {
            test_run(&router, &net.ns, net.in_ifindex, f).unwrap();
        }
        assert_eq!(
            router.counters().unwrap()[Outcome::Malformed.name()].packets,
            1
        );
    }
    assert!(
        quiet.0.lock().unwrap().is_empty(),
        "{:?}",
        quiet.0.lock().unwrap()
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn pass_only_passes_and_counts() {
    require_root();
    let net = fib_net();
    let mut router = Router::load(crate::sys::linux(), true).unwrap();
    assert!(router.pass_only());
    router.add_egress(&net.ns, "out0").unwrap();
    let frame = ip4("10.2.0.2", 64).frame(net.in_mac);
    for _ in 0..3 {
        let (action, out) = test_run(&router, &net.ns, net.in_ifindex, &frame).unwrap();
        assert_eq!(action, XDP_PASS);
        assert_eq!(out, frame, "untouched");
    }
    let arp = eth([0xff; 6], 0x0806, &[0u8; 28]);
    assert_eq!(
        test_run(&router, &net.ns, net.in_ifindex, &arp).unwrap().0,
        XDP_PASS
    );
    let c = router.counters().unwrap();
    let p = outcome_total(&c, Outcome::PassOnly);
    assert_eq!(p.packets, 4);
    assert_eq!(p.bytes, 3 * frame.len() as u64 + arp.len() as u64);
    let others: u64 = c
        .iter()
        .filter(|(k, _)| *k != Outcome::PassOnly.name())
        .map(|(_, v)| v.packets)
        .sum();
    assert_eq!(others, 0, "{c:?}");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn attach_reports_kernel_mode_and_detaches() {
    require_root();
    let ns = netns("att");
    ip(&ns, "link add veth-a type veth peer name veth-b");
    ip(&ns, "link set veth-a up");
    ip(&ns, "link set veth-b up");
    let mut router = Router::load(crate::sys::linux(), false).unwrap();
    assert_eq!(
        attached_mode(crate::sys::linux_static(), &ns, "veth-a").unwrap(),
        None
    );

    for (mode, want) in [
        (XdpMode::Skb, AttachedMode::Skb),
        (XdpMode::Native, AttachedMode::Native),
        // veth has native XDP: with no flag the kernel picks it.
        (XdpMode::Auto, AttachedMode::Native),
    ] {
        let got = router.attach(&ns, "veth-a", mode).unwrap();
        assert_eq!(got, want, "{mode:?}");
        assert_eq!(
            attached_mode(crate::sys::linux_static(), &ns, "veth-a").unwrap(),
            Some(want)
        );
        assert_eq!(
            router.attached_to(),
            vec![(ns.name().to_string(), "veth-a".to_string())]
        );
        // Twice on the same interface is refused, not stacked.
        assert!(router.attach(&ns, "veth-a", mode).is_err());
        router.detach_all().unwrap();
        assert_eq!(
            attached_mode(crate::sys::linux_static(), &ns, "veth-a").unwrap(),
            None,
            "{mode:?} left behind"
        );
        assert!(router.attached_to().is_empty());
    }

    // Both ends, as the testbed does (ingress and return path).
    assert_eq!(
        router.attach(&ns, "veth-a", XdpMode::Native).unwrap(),
        AttachedMode::Native
    );
    assert_eq!(
        router.attach(&ns, "veth-b", XdpMode::Skb).unwrap(),
        AttachedMode::Skb
    );
    // Dropping the router detaches it (from the test's own namespace).
    drop(router);
    assert_eq!(
        attached_mode(crate::sys::linux_static(), &ns, "veth-a").unwrap(),
        None
    );
    assert_eq!(
        attached_mode(crate::sys::linux_static(), &ns, "veth-b").unwrap(),
        None
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn native_on_loopback_is_unsupported_and_auto_falls_back() {
    require_root();
    let ns = netns("lo");
    let mut router = Router::load(crate::sys::linux(), false).unwrap();
    let e = router.attach(&ns, "lo", XdpMode::Native).unwrap_err();
    match e.downcast_ref::<Error>() {
        Some(Error::XdpModeUnsupported { mode, ifname, .. }) => {
            assert_eq!(mode, "native");
            assert_eq!(ifname, "lo");
        }
        other => panic!("expected XdpModeUnsupported, got {other:?}: {e:#}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("try --xdp-mode auto, skb or off"), "{msg}");
    assert_eq!(
        attached_mode(crate::sys::linux_static(), &ns, "lo").unwrap(),
        None,
        "nothing left after a failure"
    );

    // lo has no driver XDP: with no flag the kernel attaches generic XDP.
    assert_eq!(
        router.attach(&ns, "lo", XdpMode::Auto).unwrap(),
        AttachedMode::Skb
    );
    assert_eq!(
        attached_mode(crate::sys::linux_static(), &ns, "lo").unwrap(),
        Some(AttachedMode::Skb)
    );
    router.detach_all().unwrap();
    assert_eq!(
        attached_mode(crate::sys::linux_static(), &ns, "lo").unwrap(),
        None
    );

    let e = router.attach(&ns, "nosuch0", XdpMode::Skb).unwrap_err();
    assert!(
        matches!(e.downcast_ref::<Error>(), Some(Error::InterfaceNotFound(_))),
        "{e:#}"
    );
    assert!(router.attach(&ns, "lo", XdpMode::Off).is_err());
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn one_router_one_namespace() {
    require_root();
    let a = netns("one");
    let b = netns("two");
    let mut router = Router::load(crate::sys::linux(), false).unwrap();
    router.attach(&a, "lo", XdpMode::Skb).unwrap();
    let e = router.attach(&b, "lo", XdpMode::Skb).unwrap_err();
    assert!(e.to_string().contains("one namespace"), "{e:#}");
    assert_eq!(
        attached_mode(crate::sys::linux_static(), &b, "lo").unwrap(),
        None
    );
    router.detach_all().unwrap();
}

/// sender (10.11.0.2) -- r0 [router ns] r1 -- receiver (10.12.0.2), with
/// the XDP router on r0 and r1. UDP datagrams go out and are echoed back;
/// every one of them must be redirected by XDP in both directions.
fn forward_real_traffic(mode: XdpMode, want: AttachedMode) {
    require_root();
    let (snd, rtr, rcv) = forward_testbed(want);

    let tx = snd.run(|| Ok(UdpSocket::bind("10.11.0.2:0")?)).unwrap();
    let echo = rcv.run(|| Ok(UdpSocket::bind("10.12.0.2:5061")?)).unwrap();
    for s in [&tx, &echo] {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    }
    let round_trip = |i: u32| {
        tx.send_to(&i.to_be_bytes(), "10.12.0.2:5061").unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = echo
            .recv_from(&mut buf)
            .expect("probe reaches the receiver");
        echo.send_to(&buf[..n], from).unwrap();
        let n = tx.recv(&mut buf).expect("echo comes back");
        assert_eq!(&buf[..n], &i.to_be_bytes());
    };
    let tx6 = snd.run(|| Ok(UdpSocket::bind("[fd00:11::2]:0")?)).unwrap();
    let echo6 = rcv
        .run(|| Ok(UdpSocket::bind("[fd00:12::2]:5061")?))
        .unwrap();
    for s in [&tx6, &echo6] {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    }
    let round_trip6 = |i: u32| {
        tx6.send_to(&i.to_be_bytes(), "[fd00:12::2]:5061").unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = echo6
            .recv_from(&mut buf)
            .expect("IPv6 probe reaches the receiver");
        echo6.send_to(&buf[..n], from).unwrap();
        let n = tx6.recv(&mut buf).expect("IPv6 echo comes back");
        assert_eq!(&buf[..n], &i.to_be_bytes());
    };
    // Resolve the neighbours (ARP, neighbour discovery) through the kernel
    // first, so that every datagram after that can be redirected.
    round_trip(0);
    warm_up_ipv6(&tx6, &echo6);

    let mut router = Router::load(crate::sys::linux(), false).unwrap();
    assert_eq!(router.attach(&rtr, "r0", mode).unwrap(), want);
    assert_eq!(router.attach(&rtr, "r1", mode).unwrap(), want);
    const N: u32 = 50;
    for i in 1..=N {
        round_trip(i);
        round_trip6(i);
    }
    let c = router.counters().unwrap();
    assert_forwarded_by_xdp(&c, N);
    router.detach_all().unwrap();
    assert_eq!(
        attached_mode(crate::sys::linux_static(), &rtr, "r0").unwrap(),
        None
    );
    assert_eq!(
        attached_mode(crate::sys::linux_static(), &rtr, "r1").unwrap(),
        None
    );
    // The kernel forwards again without the router.
    round_trip(N + 1);
}

/// The three namespaces of [`forward_real_traffic`], dual stack, routed
/// through `rtr`; GRO on and TX checksumming off at the ends for native.
fn forward_testbed(want: AttachedMode) -> (Netns, Netns, Netns) {
    let snd = netns("snd");
    let rtr = netns("rtr");
    let rcv = netns("rcv");
    ip(
        &rtr,
        &format!("link add r0 type veth peer name s0 netns {}", snd.name()),
    );
    ip(
        &rtr,
        &format!("link add r1 type veth peer name d0 netns {}", rcv.name()),
    );
    for (ns, dev, addr) in [
        (&snd, "s0", "10.11.0.2/24"),
        (&rtr, "r0", "10.11.0.1/24"),
        (&rtr, "r1", "10.12.0.1/24"),
        (&rcv, "d0", "10.12.0.2/24"),
    ] {
        ip(ns, &format!("addr add {addr} dev {dev}"));
        ip(ns, &format!("link set {dev} up"));
    }
    ip(&snd, "route add default via 10.11.0.1");
    ip(&rcv, "route add default via 10.12.0.1");
    exec(&rtr, "sysctl -qw net.ipv4.conf.all.forwarding=1");
    // Dual stack: the same path in IPv6.
    for (ns, dev, addr) in [
        (&snd, "s0", "fd00:11::2/64"),
        (&rtr, "r0", "fd00:11::1/64"),
        (&rtr, "r1", "fd00:12::1/64"),
        (&rcv, "d0", "fd00:12::2/64"),
    ] {
        ip(ns, &format!("-6 addr add {addr} dev {dev} nodad"));
    }
    ip(&snd, "-6 route add default via fd00:11::1");
    ip(&rcv, "-6 route add default via fd00:12::1");
    exec(&rtr, "sysctl -qw net.ipv6.conf.all.forwarding=1");
    if want == AttachedMode::Native {
        // Native redirect into a veth needs GRO (or XDP) on the peer that
        // receives, and UDP from a local socket needs its checksum filled
        // in by the sender (no TX offload: XDP frames lose CHECKSUM_PARTIAL).
        snd.run(|| {
            ethtool::set_gro("s0", true)?;
            ethtool::set_tx_csum("s0", false)
        })
        .unwrap();
        rcv.run(|| {
            ethtool::set_gro("d0", true)?;
            ethtool::set_tx_csum("d0", false)
        })
        .unwrap();
    }
    (snd, rtr, rcv)
}

/// Waits for the IPv6 path to come up, then drains what reached `echo6`.
fn warm_up_ipv6(tx6: &UdpSocket, echo6: &UdpSocket) {
    // The veths' link-local addresses finish duplicate address detection
    // about a second after the links come up; neighbour discovery waits
    // for them, so the first IPv6 datagrams may be lost.
    let warm = (0..50).any(|_| {
        tx6.send_to(&0u32.to_be_bytes(), "[fd00:12::2]:5061")
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut buf = [0u8; 64];
        echo6.set_nonblocking(true).unwrap();
        let got = echo6.recv_from(&mut buf).is_ok();
        echo6.set_nonblocking(false).unwrap();
        got
    });
    assert!(warm, "IPv6 path never came up");
    while echo6.set_nonblocking(true).is_ok() && echo6.recv_from(&mut [0u8; 64]).is_ok() {}
    echo6.set_nonblocking(false).unwrap();
}

/// Every datagram and echo of the `n` round trips in each family was
/// redirected by XDP, and none passed.
fn assert_forwarded_by_xdp(c: &XdpCounters, n: u32) {
    assert_eq!(
        c[Outcome::Redirected.name6()].packets,
        2 * u64::from(n),
        "every IPv6 datagram and echo forwarded by XDP: {c:?}"
    );
    assert_eq!(
        c[Outcome::Redirected.name()].packets,
        2 * u64::from(n),
        "every datagram and echo forwarded by XDP: {c:?}"
    );
    let pass_ipv4: u64 = [Outcome::Passed, Outcome::PassNotInMap, Outcome::PassTtl]
        .iter()
        .map(|o| c[o.name()].packets)
        .sum();
    assert_eq!(pass_ipv4, 0, "{c:?}");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn forwards_udp_in_skb_mode() {
    forward_real_traffic(XdpMode::Skb, AttachedMode::Skb);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn forwards_udp_in_native_mode() {
    forward_real_traffic(XdpMode::Native, AttachedMode::Native);
}

#[test]
fn router_can_move_between_threads() {
    fn send<T: Send>() {}
    send::<Router>();
}

#[test]
fn attached_mode_names() {
    assert_eq!(AttachedMode::Skb.to_string(), "skb");
    assert_eq!(AttachedMode::Native.to_string(), "native");
    assert_eq!(
        serde_json::to_string(&AttachedMode::Native).unwrap(),
        "\"native\""
    );
}

#[test]
fn embedded_object_is_an_ebpf_elf() {
    let obj = router_object();
    assert!(obj.len() > 64, "empty object: built with AYA_BUILD_SKIP?");
    assert_eq!(&obj[..4], b"\x7fELF");
    assert_eq!(obj[4], 2, "ELF64");
    // e_machine = EM_BPF (247)
    assert_eq!(u16::from_le_bytes([obj[18], obj[19]]), 247);
}
