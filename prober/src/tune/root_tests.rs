//! Root tests of the knob layer on namespaces and veths of their own
//! (`testutil`): each knob is applied, checked in the kernel, restored,
//! and the namespace is compared before/after (qdiscs, classes, filters,
//! sysctls, offloads, txqueuelen, interfaces present).
//! Run by `cargo xtask test` (root, --ignored --test-threads=1).

use std::{
    net::UdpSocket,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{testutil::*, *};
use crate::{
    error::Error,
    sys::{Netns, Ns, Sys as _},
    testbed::Testbed,
};

/// A namespace of a root test, through the real kernel.
fn at(ns: &Netns) -> At<'_> {
    At::new(crate::sys::linux_static(), Ns::Named(ns.name()))
}

fn knobs(toml_text: &str) -> Knobs {
    let k: Knobs = toml::from_str(toml_text).expect("test knobs parse");
    k.validate().expect("test knobs validate");
    k
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn sysfs_is_the_namespace_s_own() {
    if !root_or_skip("sysfs_is_the_namespace_s_own") {
        return;
    }
    let tb = direct().unwrap();
    let mounts_before = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let devs = sysfs::with_sysfs(&tb.sender, |sys| {
        let mut v: Vec<String> = std::fs::read_dir(sys.join("class/net"))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        Ok(v)
    })
    .unwrap();
    assert_eq!(devs, ["lo", "rtp-s"]);
    // Nothing leaked into the host's mount table.
    assert_eq!(
        std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
        mounts_before
    );
    // A device of another namespace is not found.
    let e = txqueuelen::read(at(&tb.sender), "rtp-r").unwrap_err();
    assert!(e.downcast_ref::<Error>().is_some(), "{e:#}");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn tsq_is_set_in_the_sender_namespace_only() {
    if !root_or_skip("tsq_is_set_in_the_sender_namespace_only") {
        return;
    }
    let tb = direct().unwrap();
    let host = std::fs::read_to_string(tsq::SYSCTL).unwrap();
    let before = snapshot(&tb.sender, "rtp-s").unwrap();
    let orig = tsq::read(at(&tb.sender)).unwrap();
    {
        let g = tsq::apply(at(&tb.sender), 65536).unwrap();
        assert_eq!(tsq::read(at(&tb.sender)).unwrap(), 65536);
        assert_eq!(tsq::read(at(&tb.receiver)).unwrap(), orig);
        assert_eq!(std::fs::read_to_string(tsq::SYSCTL).unwrap(), host);
        assert_eq!(g.metadata().previous, orig);
    }
    assert_eq!(tsq::read(at(&tb.sender)).unwrap(), orig);
    assert_eq!(snapshot(&tb.sender, "rtp-s").unwrap(), before);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn txqueuelen_applies_and_restores() {
    if !root_or_skip("txqueuelen_applies_and_restores") {
        return;
    }
    let tb = direct().unwrap();
    let before = snapshot(&tb.sender, "rtp-s").unwrap();
    let mut g = txqueuelen::apply(at(&tb.sender), "rtp-s", 20).unwrap();
    assert_eq!(txqueuelen::read(at(&tb.sender), "rtp-s").unwrap(), 20);
    g.restore().unwrap();
    g.restore().unwrap(); // idempotent
    assert_eq!(snapshot(&tb.sender, "rtp-s").unwrap(), before);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn bql_unsupported_on_veth_applied_on_ifb() {
    if !root_or_skip("bql_unsupported_on_veth_applied_on_ifb") {
        return;
    }
    let tb = direct().unwrap();
    match bql::apply(at(&tb.sender), "rtp-s", 3000).unwrap() {
        Outcome::Unsupported(why) => {
            assert!(why.contains("no BQL on this device"), "{why}");
            assert!(why.contains("veth"), "{why}");
        }
        Outcome::Applied(_) => panic!("veth has no BQL"),
    }
    // ifb keeps the byte_queue_limits directory: a device that has BQL.
    ip(&[
        "-n",
        tb.sender.name(),
        "link",
        "add",
        "name",
        "rtp-ifb",
        "type",
        "ifb",
    ])
    .unwrap();
    let before = bql::read(at(&tb.sender), "rtp-ifb").unwrap();
    assert!(!before.is_empty());
    match bql::apply(at(&tb.sender), "rtp-ifb", 3000).unwrap() {
        Outcome::Applied(mut g) => {
            let now = bql::read(at(&tb.sender), "rtp-ifb").unwrap();
            assert!(now.iter().all(|(_, v)| *v == 3000), "{now:?}");
            assert_eq!(g.metadata().limit_max_bytes, 3000);
            g.restore().unwrap();
        }
        Outcome::Unsupported(w) => panic!("{w}"),
    }
    assert_eq!(bql::read(at(&tb.sender), "rtp-ifb").unwrap(), before);
    // Through apply(): veth reports, `device_unsupported = fail` fails.
    let k = knobs("bql_limit_max = 3000");
    let a = apply(&tb, &k).unwrap();
    assert!(a.metadata().unsupported["bql"].contains("no BQL"));
    drop(a);
    let k = knobs("bql_limit_max = 3000\ndevice_unsupported = \"fail\"");
    let e = apply(&tb, &k).err().unwrap();
    assert!(format!("{e:#}").contains("no BQL"), "{e:#}");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn tx_ring_on_veth_is_reported() {
    if !root_or_skip("tx_ring_on_veth_is_reported") {
        return;
    }
    let tb = direct().unwrap();
    match ring::apply(at(&tb.sender), "rtp-s", 64).unwrap() {
        Outcome::Unsupported(why) => assert!(why.contains("not adjustable"), "{why}"),
        Outcome::Applied(_) => panic!("veth has no ring"),
    }
}

fn qdisc_kinds(ns: &crate::sys::Netns, dev: &str) -> Vec<String> {
    use crate::sys::Sys as _;
    let mut v: Vec<String> = crate::sys::linux_static()
        .qdiscs(ns.into(), dev)
        .unwrap()
        .into_iter()
        .map(|q| format!("{} {} {}", q.kind, q.handle, q.parent))
        .collect();
    v.sort();
    v
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn available_qdiscs_apply_and_restore() {
    if !root_or_skip("available_qdiscs_apply_and_restore") {
        return;
    }
    let tb = direct().unwrap();
    let before = snapshot(&tb.sender, "rtp-s").unwrap();
    for (text, expect) in [
        ("qdisc = \"pfifo\"", vec!["pfifo 10: root"]),
        ("qdisc = \"bfifo,limit=30000\"", vec!["bfifo 10: root"]),
        ("qdisc = \"pfifo_fast\"", vec!["pfifo_fast 10: root"]),
        ("qdisc = \"tbf\"", vec!["tbf 10: root"]),
        (
            "qdisc = \"htb,leaf=pfifo\"",
            vec!["htb 10: root", "pfifo 11: 10:10", "pfifo 12: 10:20"],
        ),
        (
            "link_rate = \"100mbit\"\nqueue_limit = 20",
            vec!["htb 1: root", "pfifo 10: 1:1"],
        ),
        (
            "link_rate = \"10mbit\"\nshaper = \"tbf\"\nqueue_limit = \"16kb\"\nburst = 1600",
            // tbf's own bfifo child is not listed in the dump.
            vec!["tbf 1: root"],
        ),
        (
            "link_rate = \"100mbit\"\nqdisc = \"htb,leaf=pfifo\"",
            vec![
                "htb 10: 1:1",
                "htb 1: root",
                "pfifo 11: 10:10",
                "pfifo 12: 10:20",
            ],
        ),
        (
            "link_rate = \"100mbit\"\nshaper = \"tbf\"\nqdisc = \"pfifo,limit=50\"",
            vec!["pfifo 10: 1:1", "tbf 1: root"],
        ),
    ] {
        let k = knobs(text);
        let a = apply(&tb, &k).unwrap_or_else(|e| panic!("{text}: {e:#}"));
        assert_eq!(qdisc_kinds(&tb.sender, "rtp-s"), expect, "{text}");
        let m = serde_json::to_value(a.metadata()).unwrap();
        assert_eq!(m["qdisc_tree"]["status"], "applied", "{text}");
        assert!(m.get("skipped").is_none());
        if text.contains("htb,leaf") {
            let f = exec(
                &tb.sender,
                &["tc", "filter", "show", "dev", "rtp-s", "parent", "10:"],
            )
            .unwrap();
            assert!(f.contains("flowid 10:10"), "{f}");
        }
        a.restore().unwrap();
        assert_eq!(snapshot(&tb.sender, "rtp-s").unwrap(), before, "{text}");
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn missing_qdisc_fails_or_skips_visibly() {
    if !root_or_skip("missing_qdisc_fails_or_skips_visibly") {
        return;
    }
    // This machine lacks fq_codel, prio, hfsc, sfq; a kernel that has
    // them takes the available path (tested above), so only assert when
    // the check says missing.
    let missing = crate::sys::linux_static()
        .missing_qdisc_kinds(&["fq_codel", "prio", "sfq", "hfsc", "pfifo", "u32"])
        .unwrap();
    assert!(!missing.contains(&"pfifo".to_string()));
    assert!(!missing.contains(&"u32".to_string()));
    let Some(kind) = ["fq_codel", "prio", "hfsc"]
        .into_iter()
        .find(|k| missing.iter().any(|m| m == k))
    else {
        eprintln!("SKIPPED missing-qdisc path: this kernel has fq_codel, prio and hfsc");
        return;
    };
    let tb = direct().unwrap();
    let before = snapshot(&tb.sender, "rtp-s").unwrap();
    let k = knobs(&format!("link_rate = \"100mbit\"\nqdisc = \"{kind}\""));
    let e = apply(&tb, &k)
        .err()
        .expect("a missing qdisc fails by default");
    let typed = e.downcast_ref::<Error>();
    assert!(
        matches!(typed, Some(Error::QdiscUnavailable { .. })),
        "{e:#}"
    );
    assert!(format!("{e:#}").contains("missing skip"), "{e:#}");
    assert_eq!(snapshot(&tb.sender, "rtp-s").unwrap(), before);

    let k = knobs(&format!(
        "link_rate = \"100mbit\"\nqdisc = \"{kind}\"\nmissing = \"skip\"\nqueue_sample = \"10ms\""
    ));
    let mut a = apply(&tb, &k).unwrap();
    let m = serde_json::to_value(a.metadata()).unwrap();
    let skipped = m["skipped"][0].as_str().unwrap();
    assert!(
        skipped.contains(kind) && skipped.contains("skipped"),
        "{skipped}"
    );
    assert!(m["qdisc_tree"].get("qdisc").is_none());
    assert_eq!(m["qdisc_tree"]["shaping"]["rate"], "100mbit");
    // The shaper is there, the qdisc is not.
    let kinds = qdisc_kinds(&tb.sender, "rtp-s");
    assert!(kinds.contains(&"htb 1: root".to_string()), "{kinds:?}");
    assert!(!kinds.iter().any(|q| q.starts_with(kind)), "{kinds:?}");
    let (_, skipped) = a.stop_load().unwrap();
    assert!(skipped[0].contains(kind), "{skipped:?}");
    a.restore().unwrap();
    assert_eq!(snapshot(&tb.sender, "rtp-s").unwrap(), before);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn refuses_an_interface_with_a_configured_qdisc() {
    if !root_or_skip("refuses_an_interface_with_a_configured_qdisc") {
        return;
    }
    let tb = direct().unwrap();
    exec(
        &tb.sender,
        &[
            "tc", "qdisc", "add", "dev", "rtp-s", "root", "handle", "5:", "pfifo", "limit", "7",
        ],
    )
    .unwrap();
    let e = apply(&tb, &knobs("qdisc = \"pfifo\"")).err().unwrap();
    assert!(
        format!("{e:#}").contains("already has a configured root qdisc"),
        "{e:#}"
    );
    // The user's qdisc is untouched.
    assert!(
        exec(&tb.sender, &["tc", "qdisc", "show", "dev", "rtp-s"])
            .unwrap()
            .contains("limit 7p")
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn everything_at_once_on_the_router_restores_every_namespace() {
    if !root_or_skip("everything_at_once_on_the_router_restores_every_namespace") {
        return;
    }
    let tb = routed().unwrap();
    let router = tb.router.as_ref().unwrap();
    let snap = |tb: &Testbed| {
        (
            snapshot(&tb.sender, "rtp-s").unwrap(),
            snapshot(router, "rtp-ro").unwrap() + &snapshot(router, "rtp-ri").unwrap(),
            snapshot(&tb.receiver, "rtp-r").unwrap(),
        )
    };
    let before = snap(&tb);
    let mut k = knobs(
        r#"
        bottleneck = "router"
        link_rate = "50mbit"
        qdisc = "pfifo,limit=30"
        txqueuelen = 50
        tx_ring = 128
        gso = false
        bql_limit_max = 3000
        tsq = "64KiB"
        stress = 1
        load = ["tcp:50%,cc=cubic", "udp:5mbit,size=1000"]
        load_warmup = "300ms"
        queue_sample = "20ms"
        rt_priority = 10
        "#,
    );
    k.set_probe(5061, 200, Duration::from_millis(10));
    let dir = tempfile::tempdir().unwrap();
    let qcsv = dir.path().join("q.csv");
    let mut a = apply(&tb, &k).unwrap();
    assert!(a.start_queue_sampler(&qcsv).unwrap());
    assert_eq!(a.bottleneck().1, "rtp-ro");
    assert_eq!(txqueuelen::read(at(router), "rtp-ro").unwrap(), 50);
    assert_eq!(tsq::read(at(&tb.sender)).unwrap(), 65536);
    assert_eq!(
        qdisc_kinds(router, "rtp-ro"),
        ["htb 1: root", "pfifo 10: 1:1"]
    );
    std::thread::sleep(Duration::from_millis(700));
    let m = serde_json::to_value(a.metadata()).unwrap();
    for key in [
        "bottleneck",
        "txqueuelen",
        "gso",
        "qdisc_tree",
        "tsq",
        "stress",
        "load",
        "rt",
        "queue_sampler",
        "unsupported",
    ] {
        assert!(m.get(key).is_some(), "metadata lacks {key}: {m:?}");
    }
    assert!(m["unsupported"]["tx_ring"].is_string());
    assert!(m["unsupported"]["bql"].is_string());
    assert_eq!(a.rt().fifo_priority, Some(10));
    let rep: LoadReport = a.stop_load().unwrap().0.expect("a load report");
    assert_eq!(rep.flows.len(), 2);
    assert!(rep.flows.iter().all(|f| f.achieved_bps > 0.0), "{rep:?}");
    a.restore().unwrap();
    assert_eq!(snap(&tb), before);
    let rows = std::fs::read_to_string(&qcsv).unwrap();
    assert!(rows.starts_with(sampler::HEADER));
    assert!(rows.lines().count() > 10, "{rows}");
}

/// Shaped link + load, measured with the knob layer alone.
fn shaped(tb: &Testbed, text: &str, hold: Duration) -> Result<LoadReport> {
    let mut k = knobs(text);
    k.set_probe(5061, 64, Duration::from_millis(1));
    let mut a = apply(tb, &k)?;
    std::thread::sleep(hold);
    let (load, _) = a.stop_load()?;
    a.restore()?;
    load.context("no load report")
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn tcp_load_reaches_its_share_of_a_shaped_link() {
    if !root_or_skip("tcp_load_reaches_its_share_of_a_shaped_link") {
        return;
    }
    let tb = direct().unwrap();
    let avail = load::available_cc(crate::sys::linux_static()).unwrap();
    // Full link: goodput close to 100 Mbit/s of frames (1448/1538 of it).
    let r = shaped(
        &tb,
        "link_rate = \"100mbit\"\nload = [\"tcp\"]\nload_warmup = \"500ms\"",
        Duration::from_secs(2),
    )
    .unwrap();
    let full = r.total_achieved_bps / 1e6;
    let read = r.flows[0].received_bps.unwrap() / 1e6;
    eprintln!(
        "tcp:100%: {full:.1} Mbit/s acknowledged, {read:.1} Mbit/s read ({:?} B acked, {} B read)",
        r.flows[0].acked_bytes, r.flows[0].bytes
    );
    // How much of the link TCP fills is the machine's speed (`cargo xtask
    // bench --only study` prints it against its 85 Mbit/s bound); the
    // mechanisms: data flowed, the shaper is never beaten, and what was
    // acknowledged was read.
    assert!(full > 0.0 && full <= 100.0, "tcp:100% got {full} Mbit/s");
    // Acknowledged and read differ by what sits in the receive buffer.
    assert!(r.flows[0].acked_bytes.is_some(), "{r:?}");
    assert!(
        (full - read).abs() < 0.05 * full,
        "acked {full} vs read {read}"
    );
    // Half the link, paced, once per congestion control the kernel has:
    // the pacing rate caps the flow at its share whatever the machine.
    for cc in ["cubic", "bbr", "reno"] {
        if !avail.iter().any(|a| a == cc) {
            eprintln!("SKIPPED cc {cc}: not in this kernel");
            continue;
        }
        let r = shaped(
            &tb,
            &format!("link_rate = \"100mbit\"\nload = [\"tcp:50%,cc={cc}\"]\nload_warmup = \"1s\""),
            Duration::from_secs(3),
        )
        .unwrap();
        let got = r.total_achieved_bps / 1e6;
        eprintln!("tcp:50% cc={cc}: {got:.1} Mbit/s");
        assert_eq!(r.flows[0].cc.as_deref(), Some(cc));
        assert_eq!(r.flows[0].target_bps, Some(50_000_000));
        assert!(got > 0.0 && got <= 55.0, "tcp:50% cc={cc} got {got} Mbit/s");
    }
    // Two flows share one target, each paced to its half of it.
    let r = shaped(
        &tb,
        "link_rate = \"100mbit\"\nload = [\"tcp:40%,flows=2\"]\nload_warmup = \"500ms\"",
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(r.flows.len(), 2);
    assert!(
        r.flows.iter().all(|f| f.target_bps == Some(20_000_000)),
        "{r:?}"
    );
    let got = r.total_achieved_bps / 1e6;
    assert!(got > 0.0 && got <= 44.0, "tcp:40%,flows=2 got {got}");
    // A share without a link rate: a veth has no speed to take it from.
    let e = shaped(&tb, "load = [\"tcp:50%\"]", Duration::ZERO).unwrap_err();
    assert!(format!("{e:#}").contains("link rate is unknown"), "{e:#}");
    // A congestion control the kernel lacks is named with the ones it has.
    let e = shaped(
        &tb,
        "link_rate = \"100mbit\"\nload = [\"tcp,cc=nosuchcc\"]",
        Duration::ZERO,
    )
    .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("nosuchcc") && msg.contains("available"),
        "{msg}"
    );
}

/// Prints a UDP load flow's figures.
fn print_udp_flow(what: &str, f: &crate::stats::report::FlowReport) {
    let loss = f.loss_pct.unwrap();
    let expected = f.expected_loss_pct.unwrap();
    let offered = f.offered_bps.unwrap() / 1e6;
    let achieved = f.achieved_bps / 1e6;
    let (sent, received, lost) = (
        f.sent_packets.unwrap(),
        f.received_packets.unwrap(),
        f.lost_packets.unwrap(),
    );
    eprintln!(
        "{what}: offered {offered:.2} Mbit/s, achieved {achieved:.2} Mbit/s over {:.3} s, \
         sent {sent} received {received} lost {lost} dup {:?} reordered {:?}, \
         socket drops {:?}, sender lag max {:?} ms, loss {loss:.2} % (calculated {expected:.2} %)",
        f.receive_seconds.unwrap(),
        f.duplicate_packets,
        f.reordered_packets,
        f.socket_drops,
        f.max_send_lag_ms,
    );
}

/// The kernel's witness: the shaper's own drop counter over the same
/// window. Only the load crosses it here (no probes are sent), and each
/// window edge is off by at most the queue (100 datagrams).
fn check_loss_is_the_shaper_s(
    f: &crate::stats::report::FlowReport,
    q: &crate::stats::report::QueueWindow,
) {
    let (loss, lost) = (f.loss_pct.unwrap(), f.lost_packets.unwrap());
    eprintln!(
        "kernel at {} ({}): {} dropped, {} sent, {:.2} % dropped, {:.2} Mbit/s of frames",
        q.dev,
        q.qdisc,
        q.dropped_packets,
        q.sent_packets,
        q.drop_pct,
        q.delivered_bps / 1e6
    );
    assert!(q.qdisc.starts_with("htb"), "{q:?}");
    assert!(
        lost.abs_diff(q.dropped_packets) <= 2 * 100 + f.socket_drops.unwrap_or(0),
        "lost {lost} datagrams, the shaper dropped {}",
        q.dropped_packets
    );
    assert!(
        (loss - q.drop_pct).abs() <= 0.5,
        "measured loss {loss:.2} % vs the shaper's {:.2} %",
        q.drop_pct
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn cbr_udp_loss_at_150_percent_matches_the_calculation() {
    if !root_or_skip("cbr_udp_loss_at_150_percent_matches_the_calculation") {
        return;
    }
    let tb = direct().unwrap();
    // 6 s of window (~76 000 datagrams): a scheduling hiccup of the
    // sender on a busy machine moves the loss by well under 0.1 point.
    let r = shaped(
        &tb,
        "link_rate = \"100mbit\"\nqueue_limit = 100\nload = [\"udp:150%,size=1470\"]\nload_warmup = \"500ms\"",
        Duration::from_secs(6),
    )
    .unwrap();
    let f = &r.flows[0];
    let loss = f.loss_pct.unwrap();
    let expected = f.expected_loss_pct.unwrap();
    let achieved = f.achieved_bps / 1e6;
    let (sent, received, lost) = (
        f.sent_packets.unwrap(),
        f.received_packets.unwrap(),
        f.lost_packets.unwrap(),
    );
    print_udp_flow("udp:150%", f);
    // Sent, received and lost are the same datagrams.
    assert_eq!(sent, received + lost);
    let q = r.bottleneck.as_ref().expect("the shaper's counters");
    check_loss_is_the_shaper_s(f, q);
    // Against the calculation: a shaper never delivers more than its rate,
    // so the loss is never below the calculated one. Above it by what the
    // shaper fell short of its rate: on a quiet machine a few tenths of a
    // point; when the 150 % sender and htb's softirq fight over the two
    // vCPUs, htb loses tokens (its bucket holds 1 ms) and delivers a few
    // per cent less, which the kernel's sent counter shows.
    let frame = 1470.0 + 28.0 + 14.0;
    let link_frames = 100e6 / 8.0 / (frame + 24.0);
    let delivered_share = q.sent_packets as f64 / q.seconds / link_frames;
    let expected_at_delivered = 100.0 - (100.0 - expected) * delivered_share;
    assert!(
        loss >= expected - 0.5,
        "measured loss {loss:.2} % is below the calculated {expected:.2} %"
    );
    assert!(
        (loss - expected_at_delivered).abs() <= 1.0,
        "measured loss {loss:.2} % vs {expected_at_delivered:.2} % calculated at the \
         {:.1} % of the link rate the shaper delivered",
        delivered_share * 100.0
    );
    // The shaper is never beaten (95.7 Mbit/s of payload at its rate);
    // how far below it a shaper starved of CPU falls is the machine's,
    // printed by `cargo xtask bench --only study` against its 85 % bound.
    assert!(achieved <= 97.0, "achieved {achieved:.2} Mbit/s");
    // Below the link: no loss, while the shaper keeps its rate (the
    // kernel's counters say whether a starved one fell under the 90 %).
    let r = shaped(
        &tb,
        "link_rate = \"100mbit\"\nload = [\"udp:90%,size=1470\"]\nload_warmup = \"200ms\"",
        Duration::from_secs(1),
    )
    .unwrap();
    let q = r.bottleneck.as_ref().expect("the shaper's counters");
    let f = &r.flows[0];
    assert!(
        f.lost_packets.unwrap() <= q.dropped_packets + f.socket_drops.unwrap_or(0),
        "every datagram lost was dropped by the shaper or the socket: {r:?}"
    );
    if q.dropped_packets > 0 {
        eprintln!(
            "udp:90%: the shaper dropped {} (it delivered {:.1} Mbit/s of frames: starved of CPU)",
            q.dropped_packets,
            q.delivered_bps / 1e6
        );
    }
}

/// Median RTT of small UDP echoes across the testbed while knobs are on.
fn udp_echo_p50(tb: &Testbed, knobs_text: &str) -> Duration {
    let mut k = knobs(knobs_text);
    k.set_probe(5061, 64, Duration::from_millis(5));
    let a = apply(tb, &k).unwrap();
    let dst = std::net::SocketAddrV4::new(tb.receiver_if.addr, 5061);
    let echo = tb.receiver.run(|| Ok(UdpSocket::bind(dst)?)).unwrap();
    echo.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let h = std::thread::spawn(move || {
        let mut b = [0u8; 64];
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((n, from)) = echo.recv_from(&mut b) {
                let _ = echo.send_to(&b[..n], from);
            }
        }
    });
    let s = tb
        .sender
        .run(|| {
            let s = UdpSocket::bind("0.0.0.0:0")?;
            s.connect(dst)?;
            Ok(s)
        })
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut rtts = Vec::new();
    let mut b = [0u8; 64];
    for i in 0..200u32 {
        b[..4].copy_from_slice(&i.to_be_bytes());
        let t = Instant::now();
        s.send(&b).unwrap();
        while let Ok(n) = s.recv(&mut b) {
            if n >= 4 && b[..4] == i.to_be_bytes() {
                rtts.push(t.elapsed());
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    h.join().unwrap();
    drop(a);
    assert!(rtts.len() > 150, "only {} echoes came back", rtts.len());
    rtts.sort();
    rtts[rtts.len() / 2]
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn load_builds_a_queue_and_a_small_queue_limit_shortens_it() {
    if !root_or_skip("load_builds_a_queue_and_a_small_queue_limit_shortens_it") {
        return;
    }
    // At the router with segmentation off at the sender, the queue holds
    // wire frames: 20 of them are 2.5 ms at 100 Mbit/s (a switch port).
    let tb = routed().unwrap();
    let base = "bottleneck = \"router\"\nlink_rate = \"100mbit\"\ngso = false\n";
    let idle = udp_echo_p50(&tb, &format!("{base}queue_limit = 1000"));
    let loaded = udp_echo_p50(
        &tb,
        &format!("{base}queue_limit = 1000\nload = [\"tcp,cc=cubic\"]"),
    );
    let small = udp_echo_p50(
        &tb,
        &format!("{base}queue_limit = 20\nload = [\"tcp,cc=cubic\"]"),
    );
    eprintln!("p50 idle {idle:?}, loaded q=1000 {loaded:?}, loaded q=20 {small:?}");
    assert!(
        loaded >= idle + Duration::from_millis(1),
        "idle {idle:?} vs loaded {loaded:?}"
    );
    assert!(small * 2 < loaded, "q=20 {small:?} vs q=1000 {loaded:?}");

    // At the sender's own qdisc TCP queues GSO super-packets, so a packet
    // limit is not a wire-frame limit there; a byte limit is.
    let tb = direct().unwrap();
    let base = "link_rate = \"100mbit\"\nload = [\"tcp,cc=cubic\"]\n";
    let big = udp_echo_p50(&tb, &format!("{base}queue_limit = \"1500KiB\""));
    let small = udp_echo_p50(&tb, &format!("{base}queue_limit = \"30KiB\""));
    eprintln!("sender bottleneck p50: 1500KiB {big:?}, 30KiB {small:?}");
    assert!(small * 2 < big, "30KiB {small:?} vs 1500KiB {big:?}");
}
