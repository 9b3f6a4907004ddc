//! BPF_PROG_TEST_RUN over tables of crafted IPv6 and IPv4 frames: each
//! frame's action, its counter, and what forwarding changed in it.

use super::*;

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn test_run_table_of_ipv6_frames() {
    require_root();
    let net = fib_net();
    let mut router = Router::load(crate::sys::linux(), false).unwrap();
    router.add_egress(&net.ns, "out0").unwrap();
    let to_us = net.in_mac;

    let good = ip6("fd00:2::2", 64);
    let table = [
        ipv6_cases_forwarded_or_with_options(&good, to_us),
        ipv6_cases_malformed(&good, to_us),
        ipv6_cases_not_forwarded(&good, to_us),
    ]
    .concat();

    let mut expected = zero_counters();
    for case in &table {
        check_ipv6_case(&router, &net, &mut expected, case);
    }
    assert_eq!(router.counters().unwrap(), expected);
    assert_eq!(expected[Outcome::Redirected.name6()].packets, 5);
    assert_eq!(
        expected[Outcome::Redirected.name()].packets,
        0,
        "IPv4 counters untouched"
    );
}

/// A frame of a test_run table: its name, the frame, the action and the
/// outcome it must get.
type FrameCase = (&'static str, Vec<u8>, u32, Outcome);

/// IPv6 frames the router forwards, or passes for their extension headers.
fn ipv6_cases_forwarded_or_with_options(good: &Ip6, to_us: [u8; 6]) -> Vec<FrameCase> {
    let with = |f: &dyn Fn(&mut Ip6)| {
        let mut p = good.clone();
        f(&mut p);
        p.frame(to_us)
    };
    let mut padded = with(&|p| p.payload = 8);
    padded.resize(100, 0);

    use Outcome::*;
    vec![
        ("good IPv6/UDP", good.frame(to_us), XDP_REDIRECT, Redirected),
        (
            "hop limit 2",
            ip6("fd00:2::2", 2).frame(to_us),
            XDP_REDIRECT,
            Redirected,
        ),
        (
            "hop limit 1",
            ip6("fd00:2::2", 1).frame(to_us),
            XDP_PASS,
            PassTtl,
        ),
        (
            "hop limit 0",
            ip6("fd00:2::2", 0).frame(to_us),
            XDP_PASS,
            PassTtl,
        ),
        (
            "traffic class 0xb8",
            with(&|p| p.traffic_class = 0xb8),
            XDP_REDIRECT,
            Redirected,
        ),
        (
            "ICMPv6",
            with(&|p| p.next_header = 58),
            XDP_REDIRECT,
            Redirected,
        ),
        ("Ethernet padding", padded, XDP_REDIRECT, Redirected),
        (
            "hop-by-hop options",
            with(&|p| p.next_header = 0),
            XDP_PASS,
            PassIpOptions,
        ),
        (
            "routing header",
            with(&|p| p.next_header = 43),
            XDP_PASS,
            PassIpOptions,
        ),
        (
            "fragment header",
            with(&|p| p.next_header = 44),
            XDP_PASS,
            PassIpOptions,
        ),
        (
            "destination options",
            with(&|p| p.next_header = 60),
            XDP_PASS,
            PassIpOptions,
        ),
    ]
}

/// Malformed IPv6 frames.
fn ipv6_cases_malformed(good: &Ip6, to_us: [u8; 6]) -> Vec<FrameCase> {
    let mut long_payload_len = good.frame(to_us);
    long_payload_len[14 + 4..14 + 6].copy_from_slice(&2000u16.to_be_bytes());
    let mut version4 = good.frame(to_us);
    version4[14] = 0x40;

    use Outcome::*;
    vec![
        (
            "truncated header",
            eth(to_us, 0x86dd, &good.packet()[..30]),
            XDP_PASS,
            Malformed,
        ),
        (
            "Ethernet header only",
            eth(to_us, 0x86dd, &[]),
            XDP_PASS,
            Malformed,
        ),
        (
            "payload length beyond frame",
            long_payload_len,
            XDP_PASS,
            Malformed,
        ),
        ("version 4 in 0x86dd", version4, XDP_PASS, Malformed),
    ]
}

/// IPv6 frames the router passes to the stack or drops by route.
fn ipv6_cases_not_forwarded(good: &Ip6, to_us: [u8; 6]) -> Vec<FrameCase> {
    let with = |f: &dyn Fn(&mut Ip6)| {
        let mut p = good.clone();
        f(&mut p);
        p.frame(to_us)
    };

    use Outcome::*;
    vec![
        (
            "link-local destination",
            ip6("fe80::2", 64).frame(to_us),
            XDP_PASS,
            Passed,
        ),
        (
            "link-local source",
            with(&|p| p.src = "fe80::2".parse().unwrap()),
            XDP_PASS,
            Passed,
        ),
        (
            "multicast destination",
            ip6("ff02::1", 64).frame(to_us),
            XDP_PASS,
            Passed,
        ),
        (
            "no neighbour",
            ip6("fd00:2::3", 64).frame(to_us),
            XDP_PASS,
            Passed,
        ),
        (
            "local destination",
            ip6("fd00:1::1", 64).frame(to_us),
            XDP_PASS,
            Passed,
        ),
        (
            "beyond egress MTU",
            with(&|p| p.payload = 1600),
            XDP_PASS,
            Passed,
        ),
        (
            "egress not in map",
            ip6("fd00:3::2", 64).frame(to_us),
            XDP_PASS,
            PassNotInMap,
        ),
        (
            "blackhole route",
            ip6("fd00:9::1", 64).frame(to_us),
            XDP_DROP,
            DroppedUnreachable,
        ),
        (
            "unreachable route",
            ip6("fd00:8::1", 64).frame(to_us),
            XDP_DROP,
            DroppedUnreachable,
        ),
        (
            "prohibit route",
            ip6("fd00:7::1", 64).frame(to_us),
            XDP_DROP,
            DroppedUnreachable,
        ),
    ]
}

/// One IPv6 case through BPF_PROG_TEST_RUN: its action, its counter (added
/// to `expected`), and a forwarded frame's MACs and hop limit.
fn check_ipv6_case(
    router: &Router,
    net: &FibNet,
    expected: &mut XdpCounters,
    (name, frame, want_action, want_outcome): &FrameCase,
) {
    let (action, out) = test_run(router, &net.ns, net.in_ifindex, frame)
        .unwrap_or_else(|e| panic!("{name}: test_run failed: {e:#}"));
    assert_eq!(action, *want_action, "{name}: action");
    let e = expected.get_mut(want_outcome.name6()).unwrap();
    e.packets += 1;
    e.bytes += frame.len() as u64;
    assert_eq!(out.len(), frame.len(), "{name}: length");
    if action != XDP_REDIRECT {
        assert_eq!(
            &out, frame,
            "{name}: a frame not forwarded must be untouched"
        );
        return;
    }
    assert_eq!(out[0..6], NEIGH_MAC, "{name}: destination MAC");
    assert_eq!(out[6..12], net.out_mac, "{name}: source MAC");
    assert_eq!(out[14 + 7], frame[14 + 7] - 1, "{name}: hop limit");
    let (mut rest_in, mut rest_out) = (frame[14..].to_vec(), out[14..].to_vec());
    rest_in[7] = 0;
    rest_out[7] = 0;
    assert_eq!(rest_in, rest_out, "{name}: only the hop limit changes");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn test_run_table_of_frames() {
    require_root();
    let net = fib_net();
    let mut router = Router::load(crate::sys::linux(), false).unwrap();
    router.add_egress(&net.ns, "out0").unwrap();
    let to_us = net.in_mac;

    let good = ip4("10.2.0.2", 64);
    let table = [
        ipv4_cases_forwarded_or_with_options(&good, to_us),
        ipv4_cases_malformed_or_not_ip(&good, to_us),
        ipv4_cases_routed_elsewhere(&good, to_us),
    ]
    .concat();

    let mut expected = zero_counters();
    for case in &table {
        check_ipv4_case(&router, &net, &mut expected, case);
    }
    // Shorter than an Ethernet header: the kernel refuses to run the
    // program at all (drivers drop runts before XDP), so it is not counted.
    let runt = test_run(&router, &net.ns, net.in_ifindex, &[0u8; 10]);
    assert!(runt.is_err(), "the kernel runs XDP on a 10-byte frame?");

    assert_eq!(router.counters().unwrap(), expected);
    assert_eq!(outcome_total(&expected, Outcome::Redirected).packets, 6);
}

/// IPv4 frames the router forwards, or passes for their IP options.
fn ipv4_cases_forwarded_or_with_options(good: &Ip4, to_us: [u8; 6]) -> Vec<FrameCase> {
    let mut options = good.clone();
    options.options = vec![1, 1, 1, 0]; // NOP NOP NOP EOL: IHL 6
    let mut first_frag = good.clone();
    first_frag.frag = 0x2000; // MF, offset 0
    let mut later_frag = good.clone();
    later_frag.frag = 185; // offset 1480 bytes, last fragment
    let mut small = good.clone();
    small.udp_payload = 4;
    let mut padded = small.frame(to_us);
    padded.resize(60, 0); // Ethernet minimum frame: padding after the datagram

    use Outcome::*;
    vec![
        ("good IPv4/UDP", good.frame(to_us), XDP_REDIRECT, Redirected),
        (
            "TTL 2",
            ip4("10.2.0.2", 2).frame(to_us),
            XDP_REDIRECT,
            Redirected,
        ),
        ("TTL 1", ip4("10.2.0.2", 1).frame(to_us), XDP_PASS, PassTtl),
        ("TTL 0", ip4("10.2.0.2", 0).frame(to_us), XDP_PASS, PassTtl),
        (
            "first fragment",
            first_frag.frame(to_us),
            XDP_REDIRECT,
            Redirected,
        ),
        (
            "later fragment",
            later_frag.frame(to_us),
            XDP_REDIRECT,
            Redirected,
        ),
        ("Ethernet padding", padded, XDP_REDIRECT, Redirected),
        (
            "TOS 0xC0",
            Ip4 {
                tos: 0xc0,
                ..good.clone()
            }
            .frame(to_us),
            XDP_REDIRECT,
            Redirected,
        ),
        (
            "IHL 6 with options",
            options.frame(to_us),
            XDP_PASS,
            PassIpOptions,
        ),
    ]
}

/// Malformed IPv4 frames, and frames that are not IPv4.
fn ipv4_cases_malformed_or_not_ip(good: &Ip4, to_us: [u8; 6]) -> Vec<FrameCase> {
    let mut bad_csum = good.frame(to_us);
    bad_csum[14 + 10] ^= 0xff;
    // Each with a valid checksum, so that only the field under test is wrong.
    let mut long_tot_len = good.frame(to_us);
    long_tot_len[14 + 2..14 + 4].copy_from_slice(&2000u16.to_be_bytes());
    refresh_checksum(&mut long_tot_len);
    let mut version6 = good.frame(to_us);
    version6[14] = 0x65;
    refresh_checksum(&mut version6);
    let mut ihl4 = good.frame(to_us);
    ihl4[14] = 0x44;
    refresh_checksum(&mut ihl4);

    let mut vlan_payload = vec![0x00, 0x64, 0x08, 0x00]; // VID 100, then IPv4
    vlan_payload.extend_from_slice(&good.packet());
    let arp = {
        let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1];
        a.extend_from_slice(&SRC_MAC);
        a.extend_from_slice(&[10, 1, 0, 2]);
        a.extend_from_slice(&[0; 6]);
        a.extend_from_slice(&[10, 1, 0, 1]);
        a
    };

    use Outcome::*;
    vec![
        (
            "truncated IP",
            eth(to_us, 0x0800, &good.packet()[..10]),
            XDP_PASS,
            Malformed,
        ),
        (
            "Ethernet header only",
            eth(to_us, 0x0800, &[]),
            XDP_PASS,
            Malformed,
        ),
        ("bad header checksum", bad_csum, XDP_PASS, Malformed),
        ("tot_len beyond frame", long_tot_len, XDP_PASS, Malformed),
        ("version 6 in 0x0800", version6, XDP_PASS, Malformed),
        ("IHL 4", ihl4, XDP_PASS, Malformed),
        (
            "VLAN-tagged IPv4",
            eth(to_us, 0x8100, &vlan_payload),
            XDP_PASS,
            NotIp,
        ),
        ("ARP", eth([0xff; 6], 0x0806, &arp), XDP_PASS, NotIp),
    ]
}

/// IPv4 frames the router drops by route or passes to the stack.
fn ipv4_cases_routed_elsewhere(good: &Ip4, to_us: [u8; 6]) -> Vec<FrameCase> {
    let mut too_big = good.clone();
    too_big.udp_payload = 1600; // > the egress MTU of 1500

    use Outcome::*;
    vec![
        (
            "blackhole route",
            ip4("10.9.0.1", 64).frame(to_us),
            XDP_DROP,
            DroppedUnreachable,
        ),
        (
            "unreachable route",
            ip4("10.8.0.1", 64).frame(to_us),
            XDP_DROP,
            DroppedUnreachable,
        ),
        (
            "prohibit route",
            ip4("10.7.0.1", 64).frame(to_us),
            XDP_DROP,
            DroppedUnreachable,
        ),
        (
            "no neighbour",
            ip4("10.2.0.3", 64).frame(to_us),
            XDP_PASS,
            Passed,
        ),
        (
            "local destination",
            ip4("10.1.0.1", 64).frame(to_us),
            XDP_PASS,
            Passed,
        ),
        ("beyond egress MTU", too_big.frame(to_us), XDP_PASS, Passed),
        (
            "egress not in map",
            ip4("10.3.0.2", 64).frame(to_us),
            XDP_PASS,
            PassNotInMap,
        ),
    ]
}

/// One IPv4 case through BPF_PROG_TEST_RUN: its action, its counter (added
/// to `expected`), and a forwarded frame's MACs, TTL and checksum.
fn check_ipv4_case(
    router: &Router,
    net: &FibNet,
    expected: &mut XdpCounters,
    (name, frame, want_action, want_outcome): &FrameCase,
) {
    let (action, out) = test_run(router, &net.ns, net.in_ifindex, frame)
        .unwrap_or_else(|e| panic!("{name}: test_run failed: {e:#}"));
    assert_eq!(action, *want_action, "{name}: action");
    let e = expected.get_mut(want_outcome.name()).unwrap();
    e.packets += 1;
    e.bytes += frame.len() as u64;
    assert_eq!(out.len(), frame.len(), "{name}: length");
    if action != XDP_REDIRECT {
        assert_eq!(
            &out, frame,
            "{name}: a frame not forwarded must be untouched"
        );
        return;
    }
    // Forwarded: MACs of the next hop, TTL one less, checksum valid.
    assert_eq!(out[0..6], NEIGH_MAC, "{name}: destination MAC");
    assert_eq!(out[6..12], net.out_mac, "{name}: source MAC");
    assert_eq!(out[14 + 8], frame[14 + 8] - 1, "{name}: TTL");
    let hdr: &[u8; 20] = out[14..34].try_into().unwrap();
    assert!(
        xdp_common::ipv4_checksum_ok(hdr),
        "{name}: checksum must verify"
    );
    assert_eq!(
        header_checksum(&{
            let mut h = *hdr;
            h[10] = 0;
            h[11] = 0;
            h
        }),
        u16::from_be_bytes([hdr[10], hdr[11]]),
        "{name}: checksum equals a full recomputation"
    );
    let mut rest_in = frame[14..].to_vec();
    let mut rest_out = out[14..].to_vec();
    for r in [&mut rest_in, &mut rest_out] {
        r[8] = 0;
        r[10] = 0;
        r[11] = 0;
    }
    assert_eq!(rest_in, rest_out, "{name}: only TTL and checksum change");
}
