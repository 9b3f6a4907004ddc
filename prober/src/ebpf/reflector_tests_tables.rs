//! BPF_PROG_TEST_RUN over tables of crafted frames: probes and STAMP
//! answered field by field, and the frames the reflector must pass or
//! drop unchanged, each counted under its reason.

use super::*;

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflector_test_run_table() {
    require_root();
    let r = load_b(0, RateLimits::NONE);
    let t0 = now_ns();

    answers_probes_with_room_for_times(&r, t0);
    answers_probes_too_short_for_times(&r);
    answers_stamp(&r);

    // Frames the reflector must pass unchanged.
    let table = [
        passed_ipv4_cases(),
        passed_ipv6_cases(),
        passed_malformed_ipv4_cases(),
    ]
    .concat();
    check_passed_unchanged(&r, &table);
}

/// A good probe with room for the times is answered with them.
fn answers_probes_with_room_for_times(r: &Reflector, t0: i64) {
    // A good probe with room for the times: IPv4 with and without a UDP
    // checksum, IPv6 (where it is mandatory).
    for (v6, with_csum) in [(false, true), (false, false), (true, true)] {
        let mut f = Frame::new(PROBE_PORT, probe_payload(64, false));
        f.v6 = v6;
        f.with_udp_csum = with_csum;
        let input = f.bytes();
        let (action, out) = run(r, &input);
        assert_eq!(action, XDP_TX, "good probe is answered (IPv6: {v6})");
        check_reply_headers(&input, &out, with_csum);
        let p = &out[f.payload_off()..];
        let echo = Probe::decode(p, 0x0102_0304_0506_0708).expect("still a probe");
        assert!(echo.echo);
        let kt = echo.kernel_times.expect("kernel times decoded");
        assert_eq!(
            (echo.seq, echo.flow, echo.send_ns),
            (77, 3, 1_700_000_000_000_000_000)
        );
        assert_eq!(p[5], RTPB_FLAG_ECHO | RTPB_FLAG_KERNEL_TIMES);
        let (rx, tx) = (kt.rx_ns, kt.tx_ns);
        assert_eq!(rx, i64::from_be_bytes(p[32..40].try_into().unwrap()));
        let t1 = now_ns();
        assert!(rx <= tx, "rx {rx} <= tx {tx}");
        // On CLOCK_REALTIME: within the test's own readings (1 ms slack for
        // the offset's whole-second rounding being exact but clocks coarse).
        assert!(
            rx >= t0 - 1_000_000 && tx <= t1 + 1_000_000,
            "{t0} <= {rx} <= {tx} <= {t1}"
        );
        assert!(tx - rx < 1_000_000, "turnaround {} ns", tx - rx);
        assert_eq!(&p[48..], &[0u8; 16], "padding after the times untouched");
    }
    assert_eq!(counter(r, ReflectorOutcome::ReflectedRtprobe), 3);
}

fn answers_probes_too_short_for_times(r: &Reflector) {
    // A probe too short for the times: answered, marked, counted.
    for v6 in [false, true] {
        let mut f = Frame::new(PROBE_PORT, probe_payload(40, false));
        f.v6 = v6;
        let input = f.bytes();
        let (action, out) = run(r, &input);
        assert_eq!(action, XDP_TX);
        check_reply_headers(&input, &out, true);
        let off = f.payload_off();
        assert_eq!(out[off + 5], RTPB_FLAG_ECHO, "echo, no kernel times");
        assert_eq!(
            &out[off + 6..],
            &input[off + 6..],
            "rest of the payload unchanged"
        );
    }
    assert_eq!(counter(r, ReflectorOutcome::NoRoomForTimes), 2);
    assert_eq!(counter(r, ReflectorOutcome::ReflectedRtprobe), 5);
}

fn answers_stamp(r: &Reflector) {
    // STAMP, 44 bytes and padded to 60, over both families.
    for (v6, len) in [(false, 44), (false, 60), (true, 44), (true, 60)] {
        let mut f = Frame::new(STAMP_PORT, stamp_payload(len));
        f.v6 = v6;
        f.ttl = 61;
        let input = f.bytes();
        let t_before = now_ns();
        let (action, out) = run(r, &input);
        let t_after = now_ns();
        assert_eq!(action, XDP_TX, "STAMP {len}");
        check_reply_headers(&input, &out, true);
        let off = f.payload_off();
        let sender = SenderPacket::decode(&input[off..], Mode::Unauthenticated).unwrap();
        let refl = ReflectorPacket::decode(&out[off..], Mode::Unauthenticated).unwrap();
        assert_eq!(refl.seq, sender.seq, "stateless: the sender's seq");
        assert_eq!(refl.sender_seq, sender.seq);
        assert_eq!(refl.sender_timestamp, sender.timestamp);
        assert_eq!(refl.sender_error_estimate, sender.error_estimate);
        assert_eq!(refl.ssid, 0x5eed);
        assert_eq!(refl.sender_ttl, 61);
        assert!(!refl.error_estimate.ptp(), "NTP timestamps");
        let t2 = refl.receive_timestamp.to_realtime_ns(0);
        let t3 = refl.timestamp.to_realtime_ns(0);
        assert!(t2 <= t3, "T2 {t2} <= T3 {t3}");
        // NTP fractions are truncated: 1 ns slack each side.
        assert!(t2 >= t_before - 1_000_001 && t3 <= t_after + 1_000_001);
        assert_eq!(&out[off + 44..], &input[off + 44..], "padding copied");
    }
    assert_eq!(counter(r, ReflectorOutcome::ReflectedStamp), 4);
}

/// A frame the reflector must pass unchanged: its name, the frame and the
/// counter it goes under.
type PassCase = (&'static str, Vec<u8>, ReflectorOutcome);

/// IPv4 frames that are no probe, or no IP.
fn passed_ipv4_cases() -> Vec<PassCase> {
    let mut bad_magic = probe_payload(64, false);
    bad_magic[0] = b'X';
    let mut bad_version = probe_payload(64, false);
    bad_version[4] = 9;
    let good = Frame::new(PROBE_PORT, probe_payload(64, false));
    let mut options = good.clone();
    options.options = vec![1, 1, 1, 0];
    let mut first_frag = good.clone();
    first_frag.frag = 0x2000;
    let mut later_frag = good.clone();
    later_frag.frag = 185;
    let full = good.bytes();
    let mut arp = full[..12].to_vec();
    arp.extend_from_slice(&0x0806u16.to_be_bytes());
    arp.extend_from_slice(&[0u8; 28]);
    let mut tcp = full.clone();
    tcp[23] = 6;
    tcp[24] = 0;
    tcp[25] = 0;
    let c = !fold(sum16(&tcp[14..34]));
    tcp[24..26].copy_from_slice(&c.to_be_bytes());

    use ReflectorOutcome::*;
    vec![
        (
            "echo",
            Frame::new(PROBE_PORT, probe_payload(64, true)).bytes(),
            Echo,
        ),
        (
            "short echo",
            Frame::new(PROBE_PORT, probe_payload(32, true)).bytes(),
            Echo,
        ),
        (
            "other port",
            Frame::new(5062, probe_payload(64, false)).bytes(),
            NotProbe,
        ),
        (
            "bad magic",
            Frame::new(PROBE_PORT, bad_magic).bytes(),
            NotProbe,
        ),
        (
            "bad version",
            Frame::new(PROBE_PORT, bad_version).bytes(),
            NotProbe,
        ),
        (
            "payload shorter than a probe header",
            Frame::new(PROBE_PORT, vec![0u8; 31]).bytes(),
            NotProbe,
        ),
        ("TCP", tcp, NotProbe),
        ("IP options", options.bytes(), NotProbe),
        ("first fragment", first_frag.bytes(), NotProbe),
        ("later fragment", later_frag.bytes(), NotProbe),
        ("ARP", arp, NotIp),
    ]
}

/// IPv6 frames that are no probe, or malformed.
fn passed_ipv6_cases() -> Vec<PassCase> {
    let good6 = Frame::v6(PROBE_PORT, probe_payload(64, false)).bytes();
    // A hop-by-hop options header before UDP: the kernel's.
    let mut ext6 = good6[..54].to_vec();
    ext6[20] = 0;
    ext6.extend_from_slice(&[17, 0, 1, 4, 0, 0, 0, 0]);
    ext6.extend_from_slice(&good6[54..]);
    let len6 = (good6.len() - 54 + 8) as u16;
    ext6[18..20].copy_from_slice(&len6.to_be_bytes());
    let mut not_v6 = good6.clone();
    not_v6[14] = 0x40;
    let mut udp_len_past_v6 = good6.clone();
    udp_len_past_v6[58..60].copy_from_slice(&200u16.to_be_bytes());
    let mut no_csum_v6 = Frame::v6(PROBE_PORT, probe_payload(64, false));
    no_csum_v6.with_udp_csum = false;

    use ReflectorOutcome::*;
    vec![
        (
            "IPv6 echo",
            Frame::v6(PROBE_PORT, probe_payload(64, true)).bytes(),
            Echo,
        ),
        (
            "IPv6 other port",
            Frame::v6(5062, probe_payload(64, false)).bytes(),
            NotProbe,
        ),
        ("IPv6 extension header before UDP", ext6, NotProbe),
        ("IPv6 ethertype, version 4", not_v6, Malformed),
        (
            "truncated IPv6 header",
            good6[..14 + 30].to_vec(),
            Malformed,
        ),
        (
            "IPv6 payload length past the frame",
            good6[..good6.len() - 8].to_vec(),
            Malformed,
        ),
        (
            "IPv6 UDP length past the payload",
            udp_len_past_v6,
            Malformed,
        ),
        ("IPv6 UDP without a checksum", no_csum_v6.bytes(), Malformed),
    ]
}

/// Malformed IPv4 frames.
fn passed_malformed_ipv4_cases() -> Vec<PassCase> {
    let good = Frame::new(PROBE_PORT, probe_payload(64, false));
    let full = good.bytes();
    let mut udp_len_too_long = full.clone();
    udp_len_too_long[38..40].copy_from_slice(&200u16.to_be_bytes());
    let mut ip_only_udp = full[..34 + 4].to_vec();
    ip_only_udp[16..18].copy_from_slice(&24u16.to_be_bytes());
    ip_only_udp[24] = 0;
    ip_only_udp[25] = 0;
    let c = !fold(sum16(&ip_only_udp[14..34]));
    ip_only_udp[24..26].copy_from_slice(&c.to_be_bytes());
    let mut bad_ip_csum = full.clone();
    bad_ip_csum[24] ^= 0xff;

    use ReflectorOutcome::*;
    vec![
        // BPF_PROG_TEST_RUN (like a driver) refuses frames shorter than an
        // Ethernet header, so the shortest frame is a bare header.
        ("Ethernet header only", full[..14].to_vec(), Malformed),
        ("truncated IP header", full[..14 + 12].to_vec(), Malformed),
        (
            "truncated datagram (tot_len past the frame)",
            full[..full.len() - 20].to_vec(),
            Malformed,
        ),
        ("truncated UDP header", ip_only_udp, Malformed),
        ("UDP length past the datagram", udp_len_too_long, Malformed),
        ("bad IP checksum", bad_ip_csum, Malformed),
        (
            "STAMP shorter than 44 bytes",
            Frame::new(STAMP_PORT, vec![0u8; 30]).bytes(),
            Malformed,
        ),
    ]
}

/// Each frame of `table` passed unchanged, and counted under its outcome.
fn check_passed_unchanged(r: &Reflector, table: &[PassCase]) {
    let before = r.counters().unwrap();
    for (name, frame, _) in table {
        let (action, out) = run(r, frame);
        assert_eq!(action, XDP_PASS, "{name}: passed");
        assert_eq!(&out, frame, "{name}: unchanged");
    }
    let after = r.counters().unwrap();
    for o in ReflectorOutcome::ALL {
        let want = table.iter().filter(|(_, _, w)| *w == o).count() as u64;
        assert_eq!(
            after[o.name()].packets - before[o.name()].packets,
            want,
            "counter {}",
            o.name()
        );
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflector_redirects_replies_when_given_an_ifindex() {
    require_root();
    // XDP_REDIRECT from bpf_redirect; the test run does not send it.
    const XDP_REDIRECT: u32 = 4;
    // Loopback's ifindex, 1 in every namespace; any existing one would do.
    let r = load_b(1, RateLimits::NONE);
    let input = Frame::new(PROBE_PORT, probe_payload(64, false)).bytes();
    let (action, out) = run(&r, &input);
    assert_eq!(action, XDP_REDIRECT, "good probe is answered by a redirect");
    check_reply_headers(&input, &out, true);
    assert_eq!(counter(&r, ReflectorOutcome::ReflectedRtprobe), 1);
    let echo = Frame::new(PROBE_PORT, probe_payload(64, true)).bytes();
    assert_eq!(run(&r, &echo).0, XDP_PASS, "echoes still pass");
}

/// Probes not addressed to B (passed) or from sources no reply may go to
/// (dropped): each unchanged and counted under its reason; a good probe
/// after them is still answered.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflector_refuses_probes_not_for_it_and_bad_sources() {
    require_root();
    let good = || Frame::new(PROBE_PORT, probe_payload(64, false));
    let good6 = || Frame::v6(PROBE_PORT, probe_payload(64, false));

    blank_reflector_answers_nothing();

    let r = load_b(0, RateLimits::NONE);
    let table = [not_for_us_cases(), bad_source_cases()].concat();
    check_refused_unchanged(&r, &table);
    for f in [good(), good6()] {
        let input = f.bytes();
        let (action, out) = run(&r, &input);
        assert_eq!(action, XDP_TX, "a good probe is still answered");
        check_reply_headers(&input, &out, true);
    }
}

/// Loaded but never told its interface: answers nothing.
fn blank_reflector_answers_nothing() {
    let good = || Frame::new(PROBE_PORT, probe_payload(64, false));
    let blank = Reflector::load(
        crate::sys::linux(),
        PROBE_PORT,
        STAMP_PORT,
        0,
        RateLimits::NONE,
        &Peers::default(),
    )
    .unwrap();
    let (action, _) = run(&blank, &good().bytes());
    assert_eq!(action, XDP_PASS, "no identity, no answer");
    assert_eq!(counter(&blank, ReflectorOutcome::NotForUs), 1);
}

/// Probes for another host or address, which B must leave to the kernel.
fn not_for_us_cases() -> Vec<PassCase> {
    let good = || Frame::new(PROBE_PORT, probe_payload(64, false));
    let good6 = || Frame::v6(PROBE_PORT, probe_payload(64, false));
    let with = |f: &dyn Fn(&mut Frame)| {
        let mut fr = good();
        f(&mut fr);
        fr.bytes()
    };
    let with6 = |f: &dyn Fn(&mut Frame)| {
        let mut fr = good6();
        f(&mut fr);
        fr.bytes()
    };
    let v6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap().octets();
    use ReflectorOutcome::*;
    vec![
        (
            "broadcast MAC and 255.255.255.255",
            with(&|f| {
                f.dst_mac = [0xff; 6];
                f.dst = [255; 4];
            }),
            NotForUs,
        ),
        (
            "broadcast MAC to our IP",
            with(&|f| f.dst_mac = [0xff; 6]),
            NotForUs,
        ),
        (
            "multicast MAC",
            with(&|f| f.dst_mac = [0x01, 0, 0x5e, 0, 0, 1]),
            NotForUs,
        ),
        (
            "another host's MAC",
            with(&|f| f.dst_mac = [2, 0, 0, 0, 0, 0xcc]),
            NotForUs,
        ),
        (
            "an IP B does not own",
            with(&|f| f.dst = [10, 9, 0, 77]),
            NotForUs,
        ),
        (
            "B's subnet broadcast as destination",
            with(&|f| f.dst = [10, 9, 0, 255]),
            NotForUs,
        ),
        (
            "IPv6: an address B does not own",
            with6(&|f| f.dst6 = v6("fd71:9::77")),
            NotForUs,
        ),
        (
            "IPv6: all-nodes multicast",
            with6(&|f| {
                f.dst6 = v6("ff02::1");
                f.dst_mac = [0x33, 0x33, 0, 0, 0, 1];
            }),
            NotForUs,
        ),
    ]
}

/// Probes from sources no reply may go to, which B must drop.
fn bad_source_cases() -> Vec<PassCase> {
    let good = || Frame::new(PROBE_PORT, probe_payload(64, false));
    let good6 = || Frame::v6(PROBE_PORT, probe_payload(64, false));
    let with = |f: &dyn Fn(&mut Frame)| {
        let mut fr = good();
        f(&mut fr);
        fr.bytes()
    };
    let with6 = |f: &dyn Fn(&mut Frame)| {
        let mut fr = good6();
        f(&mut fr);
        fr.bytes()
    };
    let v6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap().octets();
    use ReflectorOutcome::*;
    vec![
        (
            "from the subnet broadcast",
            with(&|f| f.src = [10, 9, 0, 255]),
            BadSource,
        ),
        (
            "from the subnet's network address",
            with(&|f| f.src = [10, 9, 0, 0]),
            BadSource,
        ),
        (
            "from 255.255.255.255",
            with(&|f| f.src = [255; 4]),
            BadSource,
        ),
        (
            "from 224.0.0.1",
            with(&|f| f.src = [224, 0, 0, 1]),
            BadSource,
        ),
        (
            "from loopback",
            with(&|f| f.src = [127, 0, 0, 1]),
            BadSource,
        ),
        ("from 0.0.0.0", with(&|f| f.src = [0; 4]), BadSource),
        ("from B itself", with(&|f| f.src = IP_B), BadSource),
        (
            "from a multicast MAC",
            with(&|f| f.src_mac = [0x01, 0, 0x5e, 0, 0, 1]),
            BadSource,
        ),
        (
            "IPv6 from ff02::1",
            with6(&|f| f.src6 = v6("ff02::1")),
            BadSource,
        ),
        ("IPv6 from ::1", with6(&|f| f.src6 = v6("::1")), BadSource),
        ("IPv6 from ::", with6(&|f| f.src6 = v6("::")), BadSource),
        ("IPv6 from B itself", with6(&|f| f.src6 = IP6_B), BadSource),
        (
            "STAMP from 224.0.0.1",
            {
                let mut f = Frame::new(STAMP_PORT, stamp_payload(44));
                f.src = [224, 0, 0, 1];
                f.bytes()
            },
            BadSource,
        ),
    ]
}

/// Each frame of `table` passed (not for us) or dropped (bad source)
/// unchanged, and counted under its reason.
fn check_refused_unchanged(r: &Reflector, table: &[PassCase]) {
    use ReflectorOutcome::*;
    let before = r.counters().unwrap();
    for (name, frame, why) in table {
        let (action, out) = run(r, frame);
        // For another host or address: the kernel's, as without us. From a
        // bad source: dropped, so no socket on the port answers it either.
        let want = if *why == BadSource {
            XDP_DROP
        } else {
            XDP_PASS
        };
        assert_eq!(action, want, "{name}: action");
        assert_eq!(&out, frame, "{name}: unchanged");
    }
    let after = r.counters().unwrap();
    for o in ReflectorOutcome::ALL {
        let want = table.iter().filter(|(_, _, w)| *w == o).count() as u64;
        assert_eq!(
            after[o.name()].packets - before[o.name()].packets,
            want,
            "counter {}",
            o.name()
        );
    }
}
