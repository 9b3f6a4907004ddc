//! The receiver's sink for `bench-forward`'s load: the `bench_sink` program
//! (Rust, `xdp-router/src/bench.rs`) in native XDP on the receiver's veth
//! drops IPv4/UDP datagrams to the load's port and passes everything else
//! (the probes). Without it every load packet would climb the receiver's
//! whole stack (skb, IP, UDP lookup, ICMP), and that cost, the same in
//! every mode, would hide the router's: a traffic analyzer, not a host, is
//! what counts packets in a forwarding test. Packets it drops still count
//! as received on the veth (its rx_packets).
//!
//! Kernel interfaces: see [`super::xdp`] (BPF_PROG_LOAD, BPF_LINK_CREATE
//! in driver mode through [`crate::sys::Sys`]; Linux >= 5.9).

use anyhow::{Context, Result};

use super::xdp::{BenchProgram, Hook};
use crate::sys::{Netns, SysRef};

/// The sink attached to one interface; dropping it detaches it (the BPF
/// link goes with the program).
#[derive(Debug)]
pub(crate) struct Sink {
    _prog: BenchProgram,
}

impl Sink {
    /// Attaches the sink for UDP `port` to `ifname` in `ns`, in native mode.
    pub(crate) fn attach(sys: SysRef, ns: &Netns, ifname: &str, port: u16) -> Result<Self> {
        let mut prog = BenchProgram::sink(port)?;
        prog.attach(sys, ns, ifname, Hook::Native)
            .with_context(|| format!("attach the load sink to {ifname} (native XDP)"))?;
        Ok(Self { _prog: prog })
    }
}
