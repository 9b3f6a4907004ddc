//! End-to-end, hostile network: the user-space reflector (`rtprobe
//! reflect` in namespace B) flooded by UDP probes with forged IPv4 sources
//! sent from namespace A through a raw socket (the forged range is routed
//! back into A, so no reply leaves the test). 20 k forged sources leave a
//! known peer's `rtprobe --target` client (`--peer`: its own socket and
//! budget, whatever share of the flood the reflector keeps up with) at
//! most 1 % loss and cost the reflector at most twice the CPU per datagram
//! of the same rate from 1000 sources, measured just before and just
//! after; the per-source limit holds with more sources than the old
//! 4096-entry table, over what the reflector read;
//! "new session" lines are rate-limited; probes to a broadcast or
//! multicast destination, or from a subnet-broadcast or multicast source,
//! get no reply and are counted, while a legitimate one and 127.0.0.1 on
//! loopback are answered. Needs root; run by `cargo xtask test` with
//! `--ignored --test-threads=1`. Each test takes 15-25 s.

mod common;

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use common::{pair::*, *};

/// The flood: 57 k datagrams/s (there from 1000 sources).
const FLOOD_PPS: u32 = 57_000;
const FLOOD_S: f64 = 5.0;
const PORT: u16 = 5061;
/// Session lines a second the reflector prints at most (LOG_LINES_PER_S).
const LINES_PER_S: usize = 10;

/// A 64-byte rtprobe probe: answered like any client's.
fn probe(session: u64, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    rtprobe::probe::packet::Probe {
        session,
        seq,
        flow: 0,
        echo: false,
        send_ns: 1,
        kernel_times: None,
    }
    .encode(&mut b);
    b
}

/// utime and stime of `pid`, in seconds.
fn cpu_s(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name in parentheses: state is the first,
    // utime the 12th and stime the 13th.
    let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let s = |i: usize| rest[i].parse::<u64>().unwrap() as f64 / hz;
    (s(11), s(12))
}

/// UDP `InDatagrams` (read by a socket) and `RcvbufErrors` (dropped on a
/// full receive buffer) of `pid`'s namespace: in B only the reflector
/// receives UDP.
fn udp_counts(pid: u32) -> (u64, u64) {
    let snmp = std::fs::read_to_string(format!("/proc/{pid}/net/snmp")).unwrap();
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let names: Vec<&str> = udp.next().unwrap().split_whitespace().collect();
    let values: Vec<&str> = udp.next().unwrap().split_whitespace().collect();
    let get = |k: &str| {
        let i = names.iter().position(|n| *n == k).unwrap();
        values[i].parse::<u64>().unwrap()
    };
    (get("InDatagrams"), get("RcvbufErrors"))
}

struct Flood {
    sent: u64,
    elapsed_s: f64,
    /// The reflector's user + system CPU time, and the user part.
    cpu_s: f64,
    user_s: f64,
    /// Datagrams the reflector read, and those its full buffer dropped.
    read: u64,
    dropped: u64,
}

impl Flood {
    /// The reflector's CPU per datagram it read, µs.
    fn cpu_us_per_datagram(&self) -> f64 {
        self.cpu_s * 1e6 / self.read.max(1) as f64
    }

    fn line(&self, what: &str) -> String {
        format!(
            "{what}: {} datagrams in {:.2} s ({:.0}/s), reflector read {} dropped {} (full buffer), CPU {:.2} s (user {:.2} s; {:.2} µs/datagram read)",
            self.sent,
            self.elapsed_s,
            self.sent as f64 / self.elapsed_s,
            self.read,
            self.dropped,
            self.cpu_s,
            self.user_s,
            self.cpu_us_per_datagram()
        )
    }
}

/// `count` probes at `pps` from `sources` forged sources taking turns
/// (source k: address `forged_source(k)`, port 40000, session k), and the
/// reflector's CPU time over it (read once its queue has drained).
fn flood(p: &Pair, pid: u32, sources: u32, count: u32, pps: u32) -> Flood {
    let dst = SocketAddrV4::new(B_IP.parse().unwrap(), PORT);
    let cpu0 = cpu_s(pid);
    let udp0 = udp_counts(pid);
    let start = Instant::now();
    let max_s = count as f64 / pps as f64 + 3.0;
    let sent = send_forged(&p.a, dst, count, pps, max_s, |i| Forged {
        src: SocketAddrV4::new(forged_source(i % sources), 40000),
        payload: probe((i % sources) as u64, (i / sources) as u64),
    });
    let elapsed_s = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let cpu1 = cpu_s(pid);
    let udp1 = udp_counts(pid);
    Flood {
        sent,
        elapsed_s,
        cpu_s: cpu1.0 + cpu1.1 - cpu0.0 - cpu0.1,
        user_s: cpu1.0 - cpu0.0,
        read: udp1.0 - udp0.0,
        dropped: udp1.1 - udp0.1,
    }
}

fn n(c: &serde_json::Value, k: &str) -> u64 {
    c[k].as_u64().unwrap_or_else(|| panic!("{k} in {c}"))
}

/// The 20 000-source flood with, inside it, a legitimate client's 2000
/// probes at 1 ms once the flood got going.
fn flood_with_client(p: &Pair, pid: u32, count: u32) -> (Flood, Run) {
    std::thread::scope(|s| {
        let h = s.spawn(|| flood(p, pid, 20_000, count, FLOOD_PPS));
        // Inside the flood: 2000 probes at 1 ms after the flood got going.
        std::thread::sleep(Duration::from_millis(500));
        let t = target(
            p,
            &[
                "--target",
                &format!("{B_IP}:{PORT}"),
                "--count",
                "2000",
                "--interval",
                "1ms",
            ],
        );
        (h.join().unwrap(), t)
    })
}

/// The reflector's counters after the floods (`total_sent` datagrams
/// sent to it, `lines` session lines in its log).
fn print_reflector(refl: &serde_json::Value, total_sent: u64, lines: usize) {
    let c = &refl["counters"];
    eprintln!(
        "reflector: datagrams {} of {} sent (the rest overflowed its socket) reflected {} rate_limited {} sessions {} evicted {} send_errors {} recv_errors {}; turnaround over {} of {} stamped replies (at most {}/s); {lines} session lines in {:.1} s",
        n(c, "datagrams"),
        total_sent,
        n(c, "reflected"),
        n(c, "rate_limited"),
        n(c, "sessions"),
        n(c, "sessions_evicted"),
        n(c, "send_errors"),
        c["recv_errors"],
        refl["turnaround_ns"]["count"],
        refl["turnaround_sampled"],
        refl["turnaround_stamps_per_s"],
        refl["duration_s"].as_f64().unwrap_or(0.0)
    );
}

/// The 1000-source floods are only the reference for CPU per datagram:
/// they need about the hostile flood's rate (within a factor of two: the
/// batching, and with it the cost per datagram, changes with the rate;
/// the machine's other work moves the forging thread's rate by a third
/// from one flood to the next), not the issue's, which a loaded
/// machine's (debug-built) forging thread does not reach.
fn check_reference_rates(base: &Flood, after: &Flood, hostile: &Flood) {
    let rate = |f: &Flood| f.sent as f64 / f.elapsed_s;
    for f in [base, after] {
        assert!(
            (0.5..=2.0).contains(&(rate(f) / rate(hostile))),
            "the 1000-source reference ran at {:.0}/s against {:.0}/s",
            rate(f),
            rate(hostile)
        );
    }
}

/// Stamps stay within their budget: a sample, not one per reply.
fn check_stamps_and_session_lines(refl: &serde_json::Value, log: &str, lines: usize, flood_s: f64) {
    let c = &refl["counters"];
    let stamp_most = (2000.0 * (refl["duration_s"].as_f64().unwrap() + 1.0)) as u64;
    assert!(n(refl, "turnaround_sampled") <= stamp_most, "{refl}");
    // 20 k forged sessions (the 1000 sources' among them: same source and
    // session id) and the client's; a few lines a second and a count of
    // the rest.
    assert!(n(c, "sessions") > 20_000, "{c}");
    let run_s = refl["duration_s"].as_f64().unwrap();
    assert!(
        lines <= LINES_PER_S * (run_s.ceil() as usize + 1),
        "{lines} session lines in {run_s:.1} s (flood {flood_s:.1} s)"
    );
    assert!(log.contains("more new sessions"), "no held-back count");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn twenty_thousand_forged_sources_leave_a_legit_client_under_1pct_loss() {
    if !is_root("twenty_thousand_forged_sources_leave_a_legit_client_under_1pct_loss") {
        return;
    }
    let p = Pair::new();
    own_range(&p, FORGED_RANGE);
    // Without -q: every new session may print a line. The client is a
    // known peer: on a machine too busy for the reflector to read the
    // whole flood (its socket then drops the rest), an unknown client's
    // probes are dropped with it; a peer's arrive on a socket of their own.
    let r = Reflector::start(
        &p,
        &["--listen", &format!("0.0.0.0:{PORT}"), "--peer", A_IP],
    );
    let count = (FLOOD_PPS as f64 * FLOOD_S) as u32;

    let base = flood(&p, r.pid(), 1000, count, FLOOD_PPS);
    let t_start = Instant::now();
    let (hostile, client) = flood_with_client(&p, r.pid(), count);
    let flood_s = t_start.elapsed().as_secs_f64();
    // The same 1000 sources again: the machine's load moves, so the
    // hostile flood is judged against the 1000-source cost on both sides.
    let after = flood(&p, r.pid(), 1000, count, FLOOD_PPS);
    let (refl, log) = r.stop();
    let c = &refl["counters"];

    let sent = client.json["sent"].as_u64().unwrap_or(0);
    let lost = client.json["lost"].as_u64().unwrap_or(u64::MAX);
    let loss_pct = 100.0 * lost as f64 / sent.max(1) as f64;
    let lines = log.matches("new session").count();
    // The reflector shares the CPUs: on a loaded machine it may get too
    // little of one to keep up, whatever its own cost per datagram.
    eprintln!(
        "load average: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    eprintln!("{}", base.line("1000 sources before"));
    eprintln!("{}", hostile.line("20000 sources + client"));
    eprintln!("{}", after.line("1000 sources after"));
    let base_us = (base.cpu_us_per_datagram() + after.cpu_us_per_datagram()) / 2.0;
    let ratio = hostile.cpu_us_per_datagram() / base_us;
    eprintln!(
        "CPU per datagram: 20000 sources {:.2} µs against {base_us:.2} µs from 1000 (mean of before and after): x{ratio:.2}",
        hostile.cpu_us_per_datagram()
    );
    eprintln!(
        "legit client during the flood: sent {sent} lost {lost} ({loss_pct:.2} %), RTT p50 {} ns p99 {} ns",
        client.json["rtt_ns"]["p50"], client.json["rtt_ns"]["p99"]
    );
    print_reflector(&refl, base.sent + hostile.sent + after.sent + 2000, lines);

    assert_eq!(client.code, 0, "{}\n{}", client.stderr, client.stdout);
    assert_eq!(sent, 2000, "{}", client.stdout);
    check_reference_rates(&base, &after, &hostile);
    assert_eq!(
        n(c, "peer_reflected"),
        2002,
        "the client's, as a peer's: {c}"
    );
    assert!(
        hostile.elapsed_s > 2.5 + 0.5,
        "the flood ended before the client did"
    );
    assert!(loss_pct <= 1.0, "legit client lost {loss_pct:.2} %");
    // Constant work per datagram: 20 k sources cost about what 1000 do.
    // Per datagram read, so that a reflector starved of CPU (which reads
    // fewer) is not judged by the load around it; twice is room for the
    // larger tables' cache misses and the machine's noise. The O(n)
    // eviction this replaced took 98.6 % of a CPU against 25-29 % for the
    // same rate from 1000 sources, over 3.4 times, while reading less.
    assert!(
        ratio <= 2.0,
        "20 k sources: {:.2} µs CPU per datagram against {base_us:.2} µs from 1000",
        hostile.cpu_us_per_datagram()
    );
    check_stamps_and_session_lines(&refl, &log, lines, flood_s);
}

/// 6000 sources (over the old 4096-entry table), 64 probes each in turn, at
/// 1/s per source: each gets its burst of 16 and about one a second more,
/// the rest of what the reflector read is counted rate-limited (a busy
/// machine's reflector reads less than was sent: its socket drops the
/// rest, counted by the kernel). The old table forgot every source before
/// its next probe, so nothing was limited.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn per_source_limit_holds_past_the_old_table_size() {
    if !is_root("per_source_limit_holds_past_the_old_table_size") {
        return;
    }
    const SOURCES: u32 = 6000;
    const EACH: u32 = 64;
    const BURST: u64 = 16;
    let p = Pair::new();
    own_range(&p, FORGED_RANGE);
    let r = Reflector::start(
        &p,
        &[
            "--listen",
            &format!("0.0.0.0:{PORT}"),
            "--rate-limit",
            "1/s",
            "-q",
        ],
    );
    let f = flood(&p, r.pid(), SOURCES, SOURCES * EACH, FLOOD_PPS);
    let (refl, _) = r.stop();
    let c = &refl["counters"];
    let per_source_max = BURST + f.elapsed_s.ceil() as u64 + 1;
    let allowed = SOURCES as u64 * per_source_max;
    eprintln!(
        "{SOURCES} sources x {EACH} at 1/s: sent {} in {:.2} s; reflector datagrams {} (its socket dropped {}) reflected {} rate_limited {} (at most {allowed} answers allowed)",
        f.sent,
        f.elapsed_s,
        n(c, "datagrams"),
        f.dropped,
        n(c, "reflected"),
        n(c, "rate_limited"),
    );
    // Everything sent was read or dropped by the full socket.
    assert!(n(c, "datagrams") + f.dropped >= f.sent * 99 / 100, "{c}");
    assert!(
        n(c, "datagrams") > allowed,
        "the reflector read too little to show the limit: {c}"
    );
    assert!(
        n(c, "reflected") <= allowed,
        "more answers than {SOURCES} x {per_source_max}: {c}"
    );
    assert!(n(c, "rate_limited") >= n(c, "datagrams") - allowed, "{c}");
}

/// The frames sent to B's user-space reflector: five it must not answer
/// (to a broadcast or multicast address, from a broadcast or multicast
/// source) and one legitimate one, from A (`a`) to B (`b`, `mac_b`).
fn frames_to_b(mac_b: [u8; 6], a: Ipv4Addr, b: Ipv4Addr) -> [Frame; 6] {
    let bcast: Ipv4Addr = "10.77.0.255".parse().unwrap();
    let all_hosts: Ipv4Addr = "224.0.0.1".parse().unwrap();
    [
        Frame {
            name: "to 255.255.255.255 (ff:ff:ff:ff:ff:ff)",
            dst_mac: [0xff; 6],
            src: a,
            dst: Ipv4Addr::BROADCAST,
            sport: 41_001,
        },
        Frame {
            name: "to the subnet broadcast 10.77.0.255",
            dst_mac: [0xff; 6],
            src: a,
            dst: bcast,
            sport: 41_002,
        },
        Frame {
            name: "to multicast 224.0.0.1 (01:00:5e:00:00:01)",
            dst_mac: [0x01, 0x00, 0x5e, 0, 0, 1],
            src: a,
            dst: all_hosts,
            sport: 41_003,
        },
        Frame {
            name: "from the subnet broadcast 10.77.0.255",
            dst_mac: mac_b,
            src: bcast,
            dst: b,
            sport: 41_004,
        },
        Frame {
            name: "from multicast 224.0.0.1",
            dst_mac: mac_b,
            src: all_hosts,
            dst: b,
            sport: 41_005,
        },
        Frame {
            name: "legitimate",
            dst_mac: mac_b,
            src: a,
            dst: b,
            sport: 41_006,
        },
    ]
}

/// One probe sent as a raw Ethernet frame from A: its name, Ethernet
/// destination, IPv4 source and destination, and the UDP source port that
/// tells its replies apart.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn user_reflector_answers_only_unicast_probes_from_good_sources() {
    if !is_root("user_reflector_answers_only_unicast_probes_from_good_sources") {
        return;
    }
    let p = Pair::new();
    // The wildcard address: the socket the kernel hands broadcasts to.
    let r = Reflector::start(&p, &["--listen", &format!("0.0.0.0:{PORT}"), "-q"]);
    let mac_b = mac_of(&p.b, &p.vb);
    let (a, b): (Ipv4Addr, Ipv4Addr) = (A_IP.parse().unwrap(), B_IP.parse().unwrap());
    let frames = frames_to_b(mac_b, a, b);
    const EACH: usize = 5;
    let replies = send_frames_and_catch_replies(&p, PORT, &frames, &probe(0x5eed, 1), EACH);
    // 127.0.0.1 to 127.0.0.1 inside B: loopback on loopback is answered.
    let lo = sh(&format!(
        "ip netns exec {} {} --quiet --out /tmp/{}.csv --target 127.0.0.1:{PORT} --count 20 --interval 1ms",
        p.b,
        bin().display(),
        unique("ulo")
    ));
    let lo_err = String::from_utf8_lossy(&lo.stderr).into_owned();
    let _ = sh("rm -f /tmp/ulo*.csv");
    let (refl, log) = r.stop();
    let c = &refl["counters"];
    for f in &frames {
        let got = replies.iter().filter(|(port, _)| *port == f.sport).count();
        eprintln!("{}: {got} replies to {EACH} probes", f.name);
        let want = if f.name == "legitimate" { EACH } else { 0 };
        assert_eq!(got, want, "{}: {refl}", f.name);
    }
    eprintln!(
        "reflector counters: datagrams {}, reflected {}, not_for_us {}, bad_source {}; 127.0.0.1 -> 127.0.0.1: exit {:?}",
        c["datagrams"],
        c["reflected"],
        c["not_for_us"],
        c["bad_source"],
        lo.status.code()
    );
    assert!(lo.status.success(), "loopback run: {lo_err}");
    assert_eq!(n(c, "not_for_us"), 3 * EACH as u64, "{refl} {log}");
    // The kernel itself drops a multicast source (a martian): the subnet
    // broadcast source is the one it delivers.
    assert!(n(c, "bad_source") >= EACH as u64, "{refl}");
    assert_eq!(
        n(c, "datagrams"),
        n(c, "reflected") + n(c, "not_for_us") + n(c, "bad_source"),
        "{refl}"
    );
    // The legitimate frames, and the loopback run's warm-up, 20 probes and status probe.
    assert_eq!(n(c, "reflected"), EACH as u64 + 22, "{refl}");
}
