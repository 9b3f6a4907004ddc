//! `rtprobe testbed` (hidden): builds the veth testbed, attaches the XDP
//! router as asked, prints the testbed as one JSON line and keeps it until
//! stdin closes or a signal comes, so that other tools (ping, irtt,
//! sockperf) can be measured on exactly the path rtprobe measures.
//! `cargo xtask bench` uses it. Kernel interfaces: those of `testbed` and
//! `ebpf`.

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
    testbed::{Iface, Testbed},
};

pub(super) fn command(args: TestbedArgs) -> Result<ExitCode> {
    crate::testbed::require_root()?;
    with_signals(true, move |stop| hold(&args, crate::sys::linux(), &stop))?;
    Ok(ExitCode::SUCCESS)
}

/// What the JSON line says.
#[derive(Debug, Serialize)]
struct HeldTestbed {
    pub id: String,
    pub sender_ns: String,
    pub router_ns: String,
    pub receiver_ns: String,
    pub sender_if: String,
    pub receiver_if: String,
    pub router_in: String,
    pub router_out: String,
    pub sender_addr: String,
    pub receiver_addr: String,
    /// The same interfaces' IPv6 addresses ("" on a testbed without IPv6).
    pub sender_addr6: String,
    pub receiver_addr6: String,
    pub xdp_mode_requested: String,
    pub xdp_mode_attached: String,
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
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string(&info)?)?;
        out.flush().context("write the testbed line")?;
    }
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
    xdp.detach().context("detach the XDP router")?;
    tb.teardown()
}
