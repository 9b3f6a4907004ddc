//! The receiver's sink for `bench-forward`'s load: a native XDP program on
//! the receiver's veth that drops IPv4/UDP datagrams to the load's port and
//! passes everything else (the probes). Without it every load packet would
//! climb the receiver's whole stack (skb, IP, UDP lookup, ICMP), and that
//! cost, the same in every mode, would hide the router's: a traffic
//! analyzer, not a host, is what counts packets in a forwarding test.
//! Packets it drops still count as received on the veth (its rx_packets).
//!
//! Kernel interfaces: see [`super::bpf`] (BPF_PROG_LOAD, BPF_LINK_CREATE
//! with XDP_FLAGS_DRV_MODE; Linux >= 5.9).

use std::os::fd::OwnedFd;

use anyhow::{Context, Result};

use super::bpf::{self, BpfInsn, ins, op};
use crate::testbed::Netns;

/// The program: XDP_DROP for IPv4 (no options) UDP to `port`, else XDP_PASS.
fn sink_program(port: u16) -> Vec<BpfInsn> {
    // Loads are little-endian, packet fields big-endian: compare swapped.
    let be16 = |v: u16| i32::from(u16::from_le_bytes(v.to_be_bytes()));
    let mut p = vec![
        // r2 = data, r3 = data_end; need 38 bytes (up to the UDP dst port).
        ins(op::LDX_W, 2, 1, 0, 0),
        ins(op::LDX_W, 3, 1, 4, 0),
        ins(op::MOV64_REG, 4, 2, 0, 0),
        ins(op::ADD64_IMM, 4, 0, 0, 38),
        ins(op::JGT_REG, 4, 3, 0, 0),
        // ethertype 0x0800
        ins(op::LDX_H, 5, 2, 12, 0),
        ins(op::JNE_IMM, 5, 0, 0, be16(0x0800)),
        // version 4, IHL 5
        ins(op::LDX_B, 5, 2, 14, 0),
        ins(op::JNE_IMM, 5, 0, 0, 0x45),
        // protocol UDP
        ins(op::LDX_B, 5, 2, 23, 0),
        ins(op::JNE_IMM, 5, 0, 0, i32::from(libc::IPPROTO_UDP as u8)),
        // destination port
        ins(op::LDX_H, 5, 2, 36, 0),
        ins(op::JNE_IMM, 5, 0, 0, be16(port)),
        ins(op::MOV64_IMM, 0, 0, 0, bpf::XDP_DROP),
        ins(op::EXIT, 0, 0, 0, 0),
    ];
    let pass = p.len();
    p.push(ins(op::MOV64_IMM, 0, 0, 0, bpf::XDP_PASS));
    p.push(ins(op::EXIT, 0, 0, 0, 0));
    for (i, insn) in p.iter_mut().enumerate() {
        if insn.code == op::JGT_REG || insn.code == op::JNE_IMM {
            insn.off = (pass - i - 1) as i16;
        }
    }
    p
}

/// The sink attached to one interface; dropping it detaches it (the BPF
/// link goes with its fd).
pub struct Sink {
    _link: OwnedFd,
    _prog: OwnedFd,
}

impl Sink {
    /// Attaches the sink for UDP `port` to `ifname` in `ns`, in native mode.
    pub fn attach(ns: &Netns, ifname: &str, port: u16) -> Result<Self> {
        let prog = bpf::load_xdp("rtprobe_sink", &sink_program(port))?;
        let link = ns.run(|| {
            let ifindex = nix::net::if_::if_nametoindex(ifname)
                .with_context(|| format!("interface {ifname} not found"))?;
            bpf::attach_xdp(&prog, ifindex, bpf::XDP_FLAGS_DRV_MODE)
                .with_context(|| format!("attach the load sink to {ifname} (native XDP)"))
        })?;
        Ok(Self {
            _link: link,
            _prog: prog,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_falls_through_to_pass() {
        let p = sink_program(9);
        let pass = p.len() - 2;
        assert_eq!(p[pass].imm, bpf::XDP_PASS);
        for (i, insn) in p.iter().enumerate() {
            if insn.code == op::JNE_IMM || insn.code == op::JGT_REG {
                assert_eq!(i + 1 + insn.off as usize, pass, "jump at {i}");
            }
        }
        // Port 9 is 0x0009 on the wire, 0x0900 as a little-endian load.
        let port = p.iter().rev().find(|i| i.code == op::JNE_IMM).unwrap();
        assert_eq!(port.imm, 0x0900);
        assert_eq!(p[pass - 2].imm, bpf::XDP_DROP);
    }
}
