//! Knob apply/restore against the recording fake: no root.

use crate::sys::{
    Ns, Offload, Sys,
    fake::{Call, FakeSys},
};

use super::{At, KnobGuard, Outcome, bql, gso, qdisc::QdiscTree, tc::TcCmd, tsq, txqueuelen};

const NS: Ns<'static> = Ns::Named("tb-sender");

fn fake() -> FakeSys {
    let f = FakeSys::new();
    f.create_netns("tb-sender").unwrap();
    f.with_link(NS, "eth0", true, 1500);
    f
}

fn s(x: &str) -> String {
    x.to_string()
}

#[test]
fn txqueuelen_apply_then_drop_restores_the_previous_value() {
    let f = fake();
    f.with_file(NS, "sysfs:class/net/eth0/tx_queue_len", "1000");
    let at = At::new(&f, NS);
    {
        let g = txqueuelen::apply(at, "eth0", 20).unwrap();
        assert_eq!(
            f.file(NS, "sysfs:class/net/eth0/tx_queue_len").unwrap(),
            "20"
        );
        assert_eq!(g.metadata().previous, 1000);
    }
    assert_eq!(
        f.file(NS, "sysfs:class/net/eth0/tx_queue_len").unwrap(),
        "1000"
    );
    let writes: Vec<Call> = f
        .changes()
        .into_iter()
        .filter(|c| matches!(c, Call::SysfsWrite(..)))
        .collect();
    assert_eq!(
        writes,
        vec![
            Call::SysfsWrite(s("tb-sender"), s("class/net/eth0/tx_queue_len"), s("20")),
            Call::SysfsWrite(s("tb-sender"), s("class/net/eth0/tx_queue_len"), s("1000")),
        ]
    );
    // Zero is refused before anything is touched.
    let before = f.calls().len();
    assert!(txqueuelen::apply(at, "eth0", 0).is_err());
    assert_eq!(f.calls().len(), before);
}

#[test]
fn bql_failing_on_the_second_queue_puts_the_first_back() {
    let f = fake();
    for q in ["tx-0", "tx-1", "tx-2"] {
        f.with_file(
            NS,
            &format!("sysfs:class/net/eth0/queues/{q}/byte_queue_limits/limit_max"),
            "1879048192",
        );
    }
    f.fail_when(|c| matches!(c, Call::SysfsWrite(_, p, v) if p.contains("tx-1") && v == "3000"));
    let e = match bql::apply(At::new(&f, NS), "eth0", 3000) {
        Err(e) => e,
        Ok(_) => panic!("the write to tx-1 fails"),
    };
    assert!(e.to_string().contains("injected failure"), "{e:#}");
    let writes: Vec<(String, String)> = f
        .changes()
        .into_iter()
        .filter_map(|c| match c {
            Call::SysfsWrite(_, p, v) => Some((p.split('/').nth(4).unwrap().to_string(), v)),
            _ => None,
        })
        .collect();
    assert_eq!(
        writes,
        vec![
            (s("tx-0"), s("3000")),
            (s("tx-1"), s("3000")),
            (s("tx-0"), s("1879048192")),
        ]
    );
}

#[test]
fn bql_without_queues_is_unsupported_and_touches_nothing() {
    let f = fake();
    f.with_file(NS, "sysfs:class/net/eth0/queues/rx-0/rps_cpus", "0");
    match bql::apply(At::new(&f, NS), "eth0", 3000).unwrap() {
        Outcome::Unsupported(why) => assert!(
            why.contains("no BQL on this device (eth0, driver fake"),
            "{why}"
        ),
        Outcome::Applied(_) => panic!("no tx queue has BQL"),
    }
    assert_eq!(f.changes(), vec![Call::CreateNetns(s("tb-sender"))]);
}

#[test]
fn tsq_is_written_in_the_namespace_and_restored() {
    let f = fake();
    f.with_file(NS, "sysctl:net.ipv4.tcp_limit_output_bytes", "4194304");
    f.with_file(
        Ns::Host,
        "sysctl:net.ipv4.tcp_limit_output_bytes",
        "1048576",
    );
    let mut g = tsq::apply(At::new(&f, NS), 65536).unwrap();
    assert_eq!(tsq::read(At::new(&f, NS)).unwrap(), 65536);
    assert_eq!(tsq::read(At::new(&f, Ns::Host)).unwrap(), 1048576);
    g.restore().unwrap();
    g.restore().unwrap();
    drop(g);
    assert_eq!(
        f.changes(),
        vec![
            Call::CreateNetns(s("tb-sender")),
            Call::SetSysctl(
                s("tb-sender"),
                s("net.ipv4.tcp_limit_output_bytes"),
                s("65536")
            ),
            Call::SetSysctl(
                s("tb-sender"),
                s("net.ipv4.tcp_limit_output_bytes"),
                s("4194304")
            ),
        ],
        "restored once, however often restore() is called"
    );
}

#[test]
fn gso_switches_only_what_differs_and_puts_it_back() {
    let f = fake();
    f.set_offload(NS, "eth0", Offload::Gso, false).unwrap();
    let n0 = f.changes().len();
    drop(gso::apply(At::new(&f, NS), "eth0", false).unwrap());
    assert_eq!(
        f.changes()[n0..].to_vec(),
        vec![
            Call::SetOffload(s("tb-sender"), s("eth0"), Offload::Tso, false),
            Call::SetOffload(s("tb-sender"), s("eth0"), Offload::Tso, true),
        ]
    );
}

#[test]
fn qdisc_tree_failing_midway_is_taken_down() {
    let f = fake();
    f.fail_when(|c| matches!(c, Call::Tc(_, l) if l.starts_with("class add")));
    let cmds = [
        TcCmd::parse("qdisc add dev eth0 root handle 1: htb default 1"),
        TcCmd::parse("class add dev eth0 parent 1: classid 1:1 htb rate 10mbit"),
        TcCmd::parse("qdisc add dev eth0 parent 1:1 pfifo limit 10"),
    ];
    let e = match QdiscTree::install(At::new(&f, NS), "eth0", &cmds) {
        Err(e) => e,
        Ok(_) => panic!("the class add fails"),
    };
    assert!(
        format!("{e:#}").contains("installing the qdisc tree on eth0"),
        "{e:#}"
    );
    let tc: Vec<Call> = f
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::Tc(..)))
        .collect();
    assert_eq!(
        tc,
        vec![
            Call::Tc(
                s("tb-sender"),
                s("qdisc add dev eth0 root handle 1: htb default 1")
            ),
            Call::Tc(
                s("tb-sender"),
                s("class add dev eth0 parent 1: classid 1:1 htb rate 10mbit")
            ),
            Call::Tc(s("tb-sender"), s("qdisc del dev eth0 root")),
        ]
    );
}

fn knobs_with(qdisc: &str, missing: super::MissingPolicy) -> super::Knobs {
    super::Knobs::from(super::KnobSpec {
        qdisc: Some(qdisc.parse().unwrap()),
        missing: Some(missing),
        ..Default::default()
    })
}

#[test]
fn a_qdisc_the_kernel_has_is_installed() {
    let f = fake();
    f.clear_calls();
    let k = knobs_with("prio", super::MissingPolicy::Fail);
    let (q, skipped) = super::decide_qdisc(&f, &k).unwrap();
    assert_eq!(q, k.qdisc);
    assert_eq!(skipped, None);
    assert_eq!(
        f.calls(),
        vec![Call::MissingQdiscKinds(vec![s("prio"), s("sfq"), s("u32")])]
    );
}

#[test]
fn a_missing_qdisc_fails_before_anything_is_touched_or_is_skipped_when_asked() {
    let f = fake();
    f.clear_calls();
    f.model.lock().unwrap().missing_qdisc_kinds.insert(s("u32"));
    let e = super::decide_qdisc(&f, &knobs_with("prio", super::MissingPolicy::Fail)).unwrap_err();
    assert!(
        matches!(
            e.downcast_ref::<crate::error::Error>(),
            Some(crate::error::Error::QdiscUnavailable { kind }) if kind == "u32"
        ),
        "{e:#}"
    );
    assert!(
        format!("{e:#}").contains("qdisc prio needs u32 (set missing = skip"),
        "{e:#}"
    );
    assert!(f.changes().is_empty());

    let (q, skipped) =
        super::decide_qdisc(&f, &knobs_with("prio", super::MissingPolicy::Skip)).unwrap();
    assert_eq!(q, None);
    let why = skipped.unwrap();
    assert!(why.contains("the kernel lacks u32"), "{why}");
    assert!(f.changes().is_empty());
}

/// Each guard's metadata, typed now, writes the JSON the `json!` builders
/// wrote before it was typed: the same keys, values and order.
#[test]
fn guard_metadata_keeps_the_json_it_had_as_a_map() {
    let f = fake();
    f.with_file(NS, "sysfs:class/net/eth0/tx_queue_len", "1000");
    f.with_file(NS, "sysctl:net.ipv4.tcp_limit_output_bytes", "4194304");
    f.with_file(
        NS,
        "sysfs:class/net/eth0/queues/tx-0/byte_queue_limits/limit_max",
        "1879048192",
    );
    f.set_offload(NS, "eth0", Offload::Gso, false).unwrap();
    let at = At::new(&f, NS);
    let mut k = crate::model::knobs::AppliedKnobs::default();
    txqueuelen::apply(at, "eth0", 20).unwrap().record(&mut k);
    tsq::apply(at, 65536).unwrap().record(&mut k);
    gso::apply(at, "eth0", false).unwrap().record(&mut k);
    match bql::apply(at, "eth0", 3000).unwrap() {
        Outcome::Applied(g) => g.record(&mut k),
        Outcome::Unsupported(w) => panic!("{w}"),
    }
    // The builders' `json!` as they were, field for field.
    let old = serde_json::json!({
        "bql": { "status": "applied", "netns": "tb-sender", "dev": "eth0",
                 "limit_max_bytes": 3000,
                 "queues": [{"queue": "tx-0", "previous": 1879048192u64}] },
        "gso": { "status": "applied", "netns": "tb-sender", "dev": "eth0",
                 "tso_gso": false, "previous": { "tso": true, "gso": false } },
        "tsq": { "status": "applied", "netns": "tb-sender",
                 "sysctl": "net.ipv4.tcp_limit_output_bytes",
                 "bytes": 65536, "previous": 4194304 },
        "txqueuelen": { "status": "applied", "netns": "tb-sender", "dev": "eth0",
                        "packets": 20, "previous": 1000 },
    });
    let new = serde_json::to_value(&k).unwrap();
    assert_eq!(new, old);
    // Fields in the map's (alphabetical) order, so the text is the same too.
    assert_eq!(serde_json::to_string(&k).unwrap(), old.to_string());
}
