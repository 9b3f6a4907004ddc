//! A socket of their own for the known peers: with an allowlist, each
//! `--listen` address gets two UDP sockets in one SO_REUSEPORT group, and
//! a classic BPF program attached to the group (SO_ATTACH_REUSEPORT_CBPF)
//! hands the datagrams of known peers to the second and everything else
//! to the first. A flood fills the first socket's queue, and its receive
//! buffer drops what does not fit; the peers' queue stays short, and the
//! serve loop's turn per socket reads it every pass. The budgets of
//! [`super::RateLimits`] still apply to both.
//!
//! The program runs on the datagram with its data at the UDP payload (the
//! kernel pulls the UDP header first), so the source address is read
//! relative to the network header (`SKF_NET_OFF`). It compares the source
//! with each prefix of the socket's family and returns the index of the
//! socket in the group: 1 for a known peer, 0 otherwise. Classic BPF has
//! no maps and at most [`MAX_INSNS`] instructions: about 2000 IPv4 hosts
//! (or 300 IPv6 prefixes) fit; a longer allowlist is not steered (its
//! peers keep their budgets and share the one socket).
//!
//! Kernel interfaces: SO_REUSEPORT (Linux >= 3.9) and
//! SO_ATTACH_REUSEPORT_CBPF (Linux >= 4.5), unprivileged.

use std::net::IpAddr;

use super::Prefix;

/// BPF_MAXINSNS: the longest classic BPF program the kernel takes.
pub(super) const MAX_INSNS: usize = 4096;

/// Where negative absolute loads start reading the network header.
const SKF_NET_OFF: i32 = -0x10_0000;
/// The opcodes used (linux/filter.h): BPF_LD|BPF_W|BPF_ABS, BPF_LD|BPF_MEM,
/// BPF_ST, BPF_ALU|BPF_AND|BPF_K, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K.
const LD_W_ABS: u16 = 0x20;
const LD_MEM: u16 = 0x60;
const ST: u16 = 0x02;
const AND_K: u16 = 0x54;
const JEQ_K: u16 = 0x15;
const RET_K: u16 = 0x06;

/// Socket index a known peer's datagram goes to; every other one to 0.
pub(super) const PEER_SOCKET: u32 = 1;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn load_net(offset: i32) -> libc::sock_filter {
    insn(LD_W_ABS, 0, 0, (SKF_NET_OFF + offset) as u32)
}

fn mask32(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

/// The program for the IPv4 socket (`v6` false: IPv4 prefixes, the
/// source at offset 12) or the IPv6 one (IPv6 prefixes, offset 8); None
/// when no prefix is of that family or the program would be too long.
pub(super) fn program(prefixes: &[Prefix], v6: bool) -> Option<Vec<libc::sock_filter>> {
    let mine: Vec<&Prefix> = prefixes.iter().filter(|p| p.addr.is_ipv6() == v6).collect();
    if mine.is_empty() {
        return None;
    }
    let yes = insn(RET_K, 0, 0, PEER_SOCKET);
    let mut prog = if v6 {
        program6(&mine, yes)
    } else {
        program4(&mine, yes)
    };
    prog.push(insn(RET_K, 0, 0, 0));
    (prog.len() <= MAX_INSNS).then_some(prog)
}

/// The source once in M[0]; then per prefix length, the source masked
/// and compared with each prefix: `jeq net` falls into a `ret 1` or skips
/// it (no jump longer than one instruction, whatever the list's length).
fn program4(prefixes: &[&Prefix], yes: libc::sock_filter) -> Vec<libc::sock_filter> {
    let mut prog = vec![load_net(12), insn(ST, 0, 0, 0)];
    let mut lens: Vec<u8> = prefixes.iter().map(|p| p.len).collect();
    lens.sort_unstable_by_key(|l| std::cmp::Reverse(*l));
    lens.dedup();
    for len in lens {
        if len == 0 {
            prog.push(yes);
            break;
        }
        prog.push(insn(LD_MEM, 0, 0, 0));
        if len < 32 {
            prog.push(insn(AND_K, 0, 0, mask32(len)));
        }
        for p in prefixes.iter().filter(|p| p.len == len) {
            let IpAddr::V4(net) = p.addr else { continue };
            prog.push(insn(JEQ_K, 0, 1, u32::from(net)));
            prog.push(yes);
        }
    }
    prog
}

/// Per prefix, the words of the source it covers, each masked where the
/// prefix ends inside it; a word that differs skips to the next prefix.
fn program6(prefixes: &[&Prefix], yes: libc::sock_filter) -> Vec<libc::sock_filter> {
    let mut prog = Vec::new();
    for p in prefixes {
        let IpAddr::V6(net) = p.addr else { continue };
        let words = usize::from(p.len).div_ceil(32);
        if words == 0 {
            prog.push(yes);
            continue;
        }
        let bits = u128::from(net);
        let mut block = Vec::new();
        for w in 0..words {
            let left = u32::from(p.len) - 32 * w as u32;
            let mask = if left >= 32 {
                u32::MAX
            } else {
                mask32(left as u8)
            };
            let want = (bits >> (96 - 32 * w)) as u32 & mask;
            block.push(load_net(8 + 4 * w as i32));
            if mask != u32::MAX {
                block.push(insn(AND_K, 0, 0, mask));
            }
            // The jump past this prefix is patched below.
            block.push(insn(JEQ_K, 0, 0, want));
        }
        block.push(yes);
        let end = block.len();
        for (i, b) in block.iter_mut().enumerate() {
            if b.code == JEQ_K {
                b.jf = (end - i - 1) as u8;
            }
        }
        prog.extend(block);
    }
    prog
}

/// Attaches `prog` to the SO_REUSEPORT group of the socket `fd`.
pub(super) fn attach(fd: i32, prog: &[libc::sock_filter]) -> std::io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: fprog points at `prog`, alive through the call; the kernel
    // copies the program.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&raw const fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small classic BPF interpreter for what [`program`] emits, with the
    /// packet's network header as the only memory.
    fn run(prog: &[libc::sock_filter], net: &[u8]) -> u32 {
        let (mut a, mut m0, mut pc) = (0u32, 0u32, 0usize);
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    let off = (i.k as i32 - SKF_NET_OFF) as usize;
                    a = u32::from_be_bytes(net[off..off + 4].try_into().unwrap());
                }
                ST => m0 = a,
                LD_MEM => a = m0,
                AND_K => a &= i.k,
                JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                RET_K => return i.k,
                c => panic!("opcode {c:#x}"),
            }
        }
    }

    fn v4_header(src: &str) -> Vec<u8> {
        let mut h = vec![0u8; 20];
        h[12..16].copy_from_slice(&src.parse::<std::net::Ipv4Addr>().unwrap().octets());
        h
    }

    fn v6_header(src: &str) -> Vec<u8> {
        let mut h = vec![0u8; 40];
        h[8..24].copy_from_slice(&src.parse::<std::net::Ipv6Addr>().unwrap().octets());
        h
    }

    fn prefixes(list: &[&str]) -> Vec<Prefix> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn ipv4_sources_in_a_prefix_go_to_the_peers_socket() {
        let p = prefixes(&["10.77.0.1", "10.78.0.0/16", "192.0.2.128/25", "fd77::/64"]);
        let prog = program(&p, false).unwrap();
        for (src, want) in [
            ("10.77.0.1", 1),
            ("10.77.0.2", 0),
            ("10.78.9.9", 1),
            ("10.79.0.1", 0),
            ("192.0.2.200", 1),
            ("192.0.2.100", 0),
        ] {
            assert_eq!(run(&prog, &v4_header(src)), want, "{src}");
        }
        let all = program(&prefixes(&["0.0.0.0/0"]), false).unwrap();
        assert_eq!(run(&all, &v4_header("198.51.100.1")), 1);
        assert!(
            program(&prefixes(&["fd77::/64"]), false).is_none(),
            "no IPv4 prefix"
        );
    }

    #[test]
    fn ipv6_sources_in_a_prefix_go_to_the_peers_socket() {
        let p = prefixes(&[
            "fd77::/64",
            "2001:db8::5",
            "2001:db8:4000::/35",
            "10.0.0.0/8",
        ]);
        let prog = program(&p, true).unwrap();
        for (src, want) in [
            ("fd77::1:2:3:4", 1),
            ("fd77:0:0:1::1", 0),
            ("2001:db8::5", 1),
            ("2001:db8::6", 0),
            ("2001:db8:5fff::1", 1),
            ("2001:db8:6000::1", 0),
            ("2001:db8:3fff::1", 0),
        ] {
            assert_eq!(run(&prog, &v6_header(src)), want, "{src}");
        }
        let all = program(&prefixes(&["::/0"]), true).unwrap();
        assert_eq!(run(&all, &v6_header("2001:db8::1")), 1);
    }

    #[test]
    fn a_list_too_long_for_one_program_is_not_steered() {
        let hosts = |n: u32| -> Vec<Prefix> {
            (0..n)
                .map(|i| Prefix::host(std::net::Ipv4Addr::from(0x0a00_0000 + i).into()))
                .collect()
        };
        let fits = program(&hosts(2000), false).unwrap();
        assert!(fits.len() <= MAX_INSNS);
        assert_eq!(run(&fits, &v4_header("10.0.7.207")), 1, "the 2000th host");
        assert_eq!(run(&fits, &v4_header("10.0.7.208")), 0);
        assert!(program(&hosts(2100), false).is_none());
    }
}
