//! `rtprobe testbed` (hidden): builds the veth testbed, attaches the XDP
//! router as asked, prints the testbed as one JSON line and keeps it until
//! stdin closes or a signal comes, so that other tools (ping, irtt,
//! sockperf) can be measured on exactly the path rtprobe measures.
//! `cargo xtask bench` uses it. With `--pair` it builds two namespaces
//! joined by one veth instead (`testbed::pair`): the bed of the root tests
//! and of the bench's pair, flood and fleet sections. Kernel interfaces:
//! those of `testbed` and `ebpf`.

use std::{
    io::{Read, Write},
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU8, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::{
    cli::TestbedArgs,
    signals::with_signals,
    sys::Addr,
    testbed::{
        Iface, Testbed,
        pair::{A_VETH, B_VETH, PairSpec, VethPair, read_addrs_file},
    },
};

/// How long a pair may take to answer across its veth: a deadline, not a
/// speed (the link watcher takes up to 1 s; a busy machine more).
const PAIR_ANSWERS_WITHIN: Duration = Duration::from_secs(20);

pub(super) fn command(args: TestbedArgs) -> Result<ExitCode> {
    crate::testbed::require_root()?;
    if args.pair {
        let spec = pair_spec(&args)?;
        let listed_b = args.b_addrs.len();
        with_signals(true, move |stop| {
            hold_pair(spec, listed_b, crate::sys::linux(), &stop)
        })?;
    } else {
        with_signals(true, move |stop| hold(&args, crate::sys::linux(), &stop))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn pair_spec(args: &TestbedArgs) -> Result<PairSpec> {
    let mut b_addrs = args.b_addrs.clone();
    if let Some(f) = &args.b_addrs_file {
        b_addrs.extend(read_addrs_file(f)?);
    }
    Ok(PairSpec {
        tag: args.name.clone(),
        a_addrs: args.a_addrs.clone(),
        b_addrs,
        xdp_peer: args.xdp_peer,
    })
}

/// What the JSON line of `--pair` says. B's addresses from a file are
/// counted, not listed (a fleet's line would be 20 kB).
#[derive(Debug, Serialize)]
struct HeldPair {
    pub(crate) id: String,
    pub(crate) a_ns: String,
    pub(crate) b_ns: String,
    pub(crate) a_if: String,
    pub(crate) b_if: String,
    pub(crate) a_addrs: Vec<String>,
    pub(crate) b_addrs: Vec<String>,
    pub(crate) b_file_addrs: usize,
}

/// Builds the pair, waits until it answers, announces, holds, tears down.
/// The first `listed_b` of B's addresses were given one by one.
fn hold_pair(
    spec: PairSpec,
    listed_b: usize,
    sys: crate::sys::SysRef,
    stop: &AtomicU8,
) -> Result<()> {
    let listed = |v: &[Addr]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let p = VethPair::new(sys, spec)?;
    p.wait_answering(PAIR_ANSWERS_WITHIN)?;
    let info = HeldPair {
        id: p.id.clone(),
        a_ns: p.layout.a.clone(),
        b_ns: p.layout.b.clone(),
        a_if: A_VETH.into(),
        b_if: B_VETH.into(),
        a_addrs: listed(&p.spec.a_addrs),
        b_addrs: listed(&p.spec.b_addrs[..listed_b]),
        b_file_addrs: p.spec.b_addrs.len() - listed_b,
    };
    announce(&info)?;
    wait_for_end(stop);
    p.teardown()
}

/// Prints `info` as one JSON line on stdout.
fn announce(info: &impl Serialize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(info)?)?;
    out.flush().context("write the testbed line")
}

/// Returns when stdin closes or a signal comes.
fn wait_for_end(stop: &AtomicU8) {
    let closed = Arc::new(AtomicBool::new(false));
    let c = closed.clone();
    // Detached: it ends with the process if stdin never closes.
    std::thread::spawn(move || {
        let mut sink = [0u8; 256];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        c.store(true, Ordering::SeqCst);
    });
    while !closed.load(Ordering::SeqCst) && stop.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the JSON line says.
#[derive(Debug, Serialize)]
struct HeldTestbed {
    pub(crate) id: String,
    pub(crate) sender_ns: String,
    pub(crate) router_ns: String,
    pub(crate) receiver_ns: String,
    pub(crate) sender_if: String,
    pub(crate) receiver_if: String,
    pub(crate) router_in: String,
    pub(crate) router_out: String,
    pub(crate) sender_addr: String,
    pub(crate) receiver_addr: String,
    /// The same interfaces' IPv6 addresses ("" on a testbed without IPv6).
    pub(crate) sender_addr6: String,
    pub(crate) receiver_addr6: String,
    pub(crate) xdp_mode_requested: String,
    pub(crate) xdp_mode_attached: String,
}

fn addr6(i: &Iface) -> String {
    i.addr6.map(|a| a.to_string()).unwrap_or_default()
}

fn name(i: &Option<Iface>) -> String {
    i.as_ref().map(|i| i.name.clone()).unwrap_or_default()
}

/// Builds, announces, holds, tears down.
fn hold(args: &TestbedArgs, sys: crate::sys::SysRef, stop: &AtomicU8) -> Result<()> {
    let tb = Testbed::veth(sys)?;
    let xdp = crate::ebpf::attach_for_testbed(&tb, args.xdp_mode, args.xdp_action)?;
    let info = HeldTestbed {
        id: tb.id.clone(),
        sender_ns: tb.sender.name().to_string(),
        router_ns: tb
            .router
            .as_ref()
            .map(|r| r.name().to_string())
            .unwrap_or_default(),
        receiver_ns: tb.receiver.name().to_string(),
        sender_if: tb.sender_if.name.clone(),
        receiver_if: tb.receiver_if.name.clone(),
        router_in: name(&tb.router_in),
        router_out: name(&tb.router_out),
        sender_addr: tb.sender_if.addr.to_string(),
        receiver_addr: tb.receiver_if.addr.to_string(),
        sender_addr6: addr6(&tb.sender_if),
        receiver_addr6: addr6(&tb.receiver_if),
        xdp_mode_requested: args.xdp_mode.as_str().to_string(),
        xdp_mode_attached: xdp.attached_mode_name(),
    };
    announce(&info)?;
    wait_for_end(stop);
    xdp.detach().context("detach the XDP router")?;
    tb.teardown()
}
