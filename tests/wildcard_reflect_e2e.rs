//! End-to-end: `rtprobe reflect` on the wildcard addresses (`0.0.0.0:P`
//! and `[::]:P`) of a namespace with extra addresses answers a probe sent
//! to any of them from that very address. rtprobe's sender connects its
//! socket to the target, so the kernel drops a reply from any other
//! address; before the reflector set each reply's source, every probe to
//! an extra address was lost (routing answered from the interface's
//! first address). With the rtprobe protocol and STAMP, IPv4 and IPv6.
//! Needs root; run by `cargo xtask test` with `--ignored --test-threads=1`.
//! About 15 s.

mod common;

use common::{pair::*, *};

const COUNT: u64 = 50;
/// Extra addresses of namespace B, on its veth next to B_IP / B_IP6 (in
/// the same subnets, so routing would answer from B_IP / B_IP6).
const EXTRA_V4: [&str; 3] = ["10.77.0.151", "10.77.0.152", "10.77.0.153"];
const EXTRA_V6: [&str; 2] = ["fd77::151", "fd77::1:152"];

/// `COUNT` probes from A to `addr:port`: how many were answered (0 if
/// the sender gave up).
fn answered(p: &Pair, protocol: &str, addr: &str, port: u16) -> u64 {
    let dst = if addr.contains(':') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    };
    let t = target(
        p,
        &[
            "--target",
            &dst,
            "--protocol",
            protocol,
            "--count",
            &COUNT.to_string(),
            "--interval",
            "1ms",
            "--timeout",
            "200ms",
        ],
    );
    // A sender that gets no answer to its warm-up stops with an error
    // before the first counted probe: none of them answered.
    if t.code != 0 {
        eprintln!("{protocol} to {dst}: {}", t.stderr.trim());
        return 0;
    }
    assert_eq!(t.json["sent"], COUNT, "{dst}: {}", t.stdout);
    COUNT - t.json["lost"].as_u64().unwrap()
}

fn every_address_answers(protocol: &str, port: u16) {
    let p = Pair::new();
    for a in EXTRA_V4 {
        sh_ok(&format!("ip -n {} addr add {a}/24 dev {}", p.b, p.vb));
    }
    for a in EXTRA_V6 {
        sh_ok(&format!("ip -n {} addr add {a}/64 dev {} nodad", p.b, p.vb));
    }
    let r = Reflector::start(
        &p,
        &[
            "--protocol",
            protocol,
            "--listen",
            &format!("0.0.0.0:{port}"),
            "--listen",
            &format!("[::]:{port}"),
            "-q",
        ],
    );
    let addrs = [B_IP, B_IP6].into_iter().chain(EXTRA_V4).chain(EXTRA_V6);
    let got: Vec<(&str, u64)> = addrs
        .map(|a| (a, answered(&p, protocol, a, port)))
        .collect();
    let (refl, _) = r.stop();
    for (a, n) in &got {
        eprintln!(
            "{protocol}: {n}/{COUNT} answered from {a} (reflector on 0.0.0.0:{port} and [::]:{port})"
        );
    }
    for (a, n) in &got {
        assert_eq!(*n, COUNT, "{protocol} to {a}: {got:?}");
    }
    let c = &refl["counters"];
    assert_eq!(c["send_errors"], 0, "{c}");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn rtprobe_protocol_answered_from_every_address_of_a_wildcard_reflector() {
    if !is_root("rtprobe_protocol_answered_from_every_address_of_a_wildcard_reflector") {
        return;
    }
    every_address_answers("rtprobe", 5061);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn stamp_answered_from_every_address_of_a_wildcard_reflector() {
    if !is_root("stamp_answered_from_every_address_of_a_wildcard_reflector") {
        return;
    }
    every_address_answers("stamp", 862);
}
