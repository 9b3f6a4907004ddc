//! The user-space reflector's sockets: [`bind`] and the default
//! `--listen` of both families ([`bind_both_families`]); with known peers,
//! [`bind_steered`] gives each address a second socket for them
//! (`steer.rs`).
//!
//! Kernel interfaces (the options are set here, `serve.rs` uses them):
//! UDP sockets with SO_TIMESTAMPING (software RX stamps, Linux >= 2.6.30;
//! a software TX stamp asked for per reply, >= 4.6, with its id set per
//! reply, SCM_TS_OPT_ID, >= 6.13: older kernels get no turnaround),
//! IP_RECVTTL or IPV6_RECVHOPLIMIT (IPv6 sockets, `--listen [::]:862`),
//! and IP_PKTINFO or IPV6_RECVPKTINFO (each datagram's destination and
//! interface; a socket on a wildcard address sends each reply from that
//! destination, [`bound_to_wildcard`]); getsockname; SO_REUSEPORT and
//! SO_ATTACH_REUSEPORT_CBPF for a peers' socket.

use std::net::SocketAddr;

use anyhow::Result;

use super::{Peers, steer};
use crate::probe::socket::ProbeSocket;

/// What was bound: the sockets (a known peers' socket right after its
/// address's other one), and the addresses whose peers could not be given
/// a socket of their own (too many prefixes for one program).
pub(crate) struct Bound {
    pub(crate) socks: Vec<ProbeSocket>,
    pub(crate) listen: Vec<SocketAddr>,
    pub(crate) peers_steered: Vec<SocketAddr>,
    pub(crate) peers_not_steered: Vec<SocketAddr>,
}

/// The errno under an error's chain, if an OS call failed.
fn errno_of(e: &anyhow::Error) -> Option<i32> {
    e.chain()
        .find_map(|c| c.downcast_ref::<std::io::Error>())
        .and_then(|io| io.raw_os_error())
}

/// The default `--listen`: `0.0.0.0:PORT` and `[::]:PORT` (each socket
/// answers its own family), or IPv4 alone on a host without IPv6, which it
/// says.
pub(crate) fn bind_both_families(port: u16, peers: &Peers) -> Result<Bound> {
    let (listen, bound) = bind_both_families_with(port, |a| bind_steered(a, peers))?;
    let mut all = Bound {
        socks: Vec::new(),
        listen,
        peers_steered: Vec::new(),
        peers_not_steered: Vec::new(),
    };
    for b in bound {
        all.socks.extend(b.socks);
        all.peers_steered.extend(b.peers_steered);
        all.peers_not_steered.extend(b.peers_not_steered);
    }
    Ok(all)
}

fn bind_both_families_with<S>(
    port: u16,
    bind: impl Fn(&[SocketAddr]) -> Result<S>,
) -> Result<(Vec<SocketAddr>, Vec<S>)> {
    let v4 = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port);
    let v6 = SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), port);
    let mut socks = vec![bind(&[v4])?];
    match bind(&[v6]) {
        Ok(s) => {
            socks.push(s);
            Ok((vec![v4, v6], socks))
        }
        Err(e) if matches!(errno_of(&e), Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)) => {
            eprintln!("rtprobe reflect: this host has no IPv6 ({e:#}): answering IPv4 only");
            Ok((vec![v4], socks))
        }
        Err(e) => Err(e),
    }
}

/// Binds the reflector's sockets (in the calling thread's namespace).
pub fn bind(listen: &[SocketAddr]) -> Result<Vec<ProbeSocket>> {
    listen.iter().map(|&a| bind_one(a, false)).collect()
}

/// [`bind`], and for each address with known peers of its family a second
/// socket that only their datagrams reach (an SO_REUSEPORT group with a
/// classic BPF program, `steer.rs`); an allowlist too long for one
/// program is not steered, which [`Bound`] says.
pub(crate) fn bind_steered(listen: &[SocketAddr], peers: &Peers) -> Result<Bound> {
    let mut b = Bound {
        socks: Vec::new(),
        listen: listen.to_vec(),
        peers_steered: Vec::new(),
        peers_not_steered: Vec::new(),
    };
    for &a in listen {
        let has_peers = peers
            .prefixes()
            .iter()
            .any(|p| p.addr.is_ipv6() == a.is_ipv6());
        match steer::program(peers.prefixes(), a.is_ipv6()) {
            Some(prog) => {
                b.socks.extend(bind_pair(a, &prog)?);
                b.peers_steered.push(a);
            }
            None => {
                b.socks.push(bind_one(a, false)?);
                if has_peers {
                    b.peers_not_steered.push(a);
                }
            }
        }
    }
    Ok(b)
}

/// Two sockets on `a` in one SO_REUSEPORT group, `prog` choosing between
/// them: the first for everyone, the second for known peers.
fn bind_pair(a: SocketAddr, prog: &[libc::sock_filter]) -> Result<[ProbeSocket; 2]> {
    // A plain bind first: if anyone holds the port (another reflector,
    // perhaps with SO_REUSEPORT itself), this fails as `bind` would,
    // rather than joining a group of theirs.
    if a.port() != 0 {
        drop(bind_one(a, false)?);
    }
    let first = bind_one(a, true)?;
    let a = SocketAddr::new(a.ip(), local_port(&first));
    let second = bind_one(a, true)?;
    steer::attach(first.fd(), prog).map_err(|e| {
        anyhow::anyhow!("cannot answer on {a}: SO_ATTACH_REUSEPORT_CBPF (Linux >= 4.5): {e}")
    })?;
    Ok([first, second])
}

/// One socket of the reflector on `a` (`shared`: SO_REUSEPORT).
fn bind_one(a: SocketAddr, shared: bool) -> Result<ProbeSocket> {
    // TX stamps only for the replies serve() samples.
    let opened = if shared {
        ProbeSocket::bind_tx_on_request_shared(a, true, 32 << 20)
    } else {
        ProbeSocket::bind_tx_on_request(a, 0, true, 32 << 20)
    };
    let s = opened.map_err(|e| {
        match errno_of(&e) {
            // One line that says what to do, not the socket's chain.
            Some(libc::EADDRINUSE) => anyhow::anyhow!(
                "cannot answer on {a}: the port is already in use (another `rtprobe reflect`?): stop that program or answer on another port with --listen ADDR:PORT"
            ),
            Some(libc::EACCES) if a.port() < 1024 => anyhow::anyhow!(
                "cannot answer on {a}: ports below 1024 need root or CAP_NET_BIND_SERVICE (or use --listen with another port)"
            ),
            _ => e.context(format!("cannot answer on {a}")),
        }
    })?;
    // Each datagram's destination and interface (IP_PKTINFO,
    // IPV6_RECVPKTINFO): a socket bound to the wildcard address
    // also gets broadcasts, and only this tells them apart.
    // Without it the reflector could not keep its promise, so a
    // failure is an error.
    let pktinfo = match a {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_PKTINFO, "IP_PKTINFO"),
        SocketAddr::V6(_) => (
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVPKTINFO,
            "IPV6_RECVPKTINFO",
        ),
    };
    turn_on(&s, pktinfo)
        .map_err(|e| anyhow::anyhow!("cannot answer on {a}: {}: {e}", pktinfo.2))?;
    // The arrival TTL (IPv4) or hop limit (IPv6) for STAMP's reply.
    let ttl = match a {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_RECVTTL, "IP_RECVTTL"),
        SocketAddr::V6(_) => (
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVHOPLIMIT,
            "IPV6_RECVHOPLIMIT",
        ),
    };
    if let Err(e) = turn_on(&s, ttl) {
        log::warn!("{} on {a}: {e}", ttl.2);
    }
    Ok(s)
}

/// The port `s` is bound to (0 if the kernel would not say).
pub(super) fn local_port(s: &ProbeSocket) -> u16 {
    // SAFETY: sockaddr_storage is plain data, valid all-zero.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getsockname writes at most `len` bytes into `ss`.
    let r = unsafe { libc::getsockname(s.fd(), (&raw mut ss).cast(), &mut len) };
    if r != 0 {
        return 0;
    }
    // sin_port and sin6_port: the same place, network order.
    // SAFETY: both families start like sockaddr_in.
    let sin = unsafe { &*(&raw const ss).cast::<libc::sockaddr_in>() };
    u16::from_be(sin.sin_port)
}

/// Whether `s` is bound to `0.0.0.0` or `[::]`: then a reply without a
/// source of its own would leave from whichever of the host's addresses
/// routing picks, not the one the probe was sent to, and a sender that
/// checks (a connected socket, a STAMP client) drops it. A socket bound
/// to one address always answers from it. False if the kernel cannot say.
pub(super) fn bound_to_wildcard(s: &ProbeSocket) -> bool {
    // SAFETY: sockaddr_storage is plain data, valid all-zero.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getsockname writes at most `len` bytes into `ss`.
    let r = unsafe { libc::getsockname(s.fd(), (&raw mut ss).cast(), &mut len) };
    if r != 0 {
        return false;
    }
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says `ss` holds a sockaddr_in.
            let a = unsafe { &*(&raw const ss).cast::<libc::sockaddr_in>() };
            a.sin_addr.s_addr == 0
        }
        libc::AF_INET6 => {
            // SAFETY: the family says `ss` holds a sockaddr_in6.
            let a = unsafe { &*(&raw const ss).cast::<libc::sockaddr_in6>() };
            a.sin6_addr.s6_addr == [0; 16]
        }
        _ => false,
    }
}

/// Sets the integer socket option `(level, name, _)` to 1.
fn turn_on(
    s: &ProbeSocket,
    (level, name, _): (libc::c_int, libc::c_int, &str),
) -> std::io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: plain setsockopt on an owned socket with a live int.
    let r = unsafe {
        libc::setsockopt(
            s.fd(),
            level,
            name,
            (&on as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
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

    #[test]
    fn default_listen_is_both_families_or_ipv4_without_ipv6() {
        let os = |errno| Err(anyhow::Error::new(std::io::Error::from_raw_os_error(errno)));
        let both = bind_both_families_with(862, |a| Ok(a[0])).unwrap();
        assert_eq!(
            both.0.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["0.0.0.0:862", "[::]:862"]
        );
        assert_eq!(both.0, both.1);
        // No IPv6 on this host: IPv4 alone.
        let v4 = bind_both_families_with(862, |a| {
            if a[0].is_ipv6() {
                os(libc::EAFNOSUPPORT)
            } else {
                Ok(a[0])
            }
        })
        .unwrap();
        assert_eq!(v4.0.len(), 1);
        // Any other failure (the IPv6 port taken) is the user's to see.
        let taken = bind_both_families_with(862, |a| {
            if a[0].is_ipv6() {
                os(libc::EADDRINUSE)
            } else {
                Ok(a[0])
            }
        });
        assert!(taken.is_err());
        // IPv4 first: its failure stops everything.
        assert!(bind_both_families_with(862, |_| os(libc::EACCES)).is_err());
    }

    /// With a known peer, the address gets two sockets: the peer's
    /// datagrams reach only the second, everyone else's only the first.
    /// A second reflector on the port is refused, as without peers.
    #[test]
    fn known_peers_get_a_socket_of_their_own() {
        let peers = Peers::new(["127.0.0.1".parse().unwrap()]).unwrap();
        let b = bind_steered(&["127.0.0.1:0".parse().unwrap()], &peers).unwrap();
        assert_eq!(b.socks.len(), 2);
        assert_eq!(b.peers_steered.len(), 1);
        let port = local_port(&b.socks[0]);
        assert_eq!(local_port(&b.socks[1]), port);
        let to = SocketAddr::from(([127, 0, 0, 1], port));
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let stranger = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
        for _ in 0..20 {
            peer.send_to(b"peer", to).unwrap();
            stranger.send_to(b"stranger", to).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut batch = crate::probe::socket::RecvBatch::new(64, 64);
        let got = |s: &ProbeSocket, batch: &mut crate::probe::socket::RecvBatch| {
            let n = s.recv_batch(batch, false).unwrap();
            (0..n).map(|i| batch.get(i).0.to_vec()).collect::<Vec<_>>()
        };
        let first = got(&b.socks[0], &mut batch);
        let second = got(&b.socks[1], &mut batch);
        assert_eq!(first, vec![b"stranger".to_vec(); 20]);
        assert_eq!(second, vec![b"peer".to_vec(); 20]);
        // The port is taken: a plain reflector or another steered one is refused.
        let again: SocketAddr = to;
        let e = bind_steered(&[again], &peers).err().unwrap();
        assert!(e.to_string().contains("already in use"), "{e}");
        assert!(bind(&[again]).is_err());
        // No peer of the family: one socket.
        let v6only = Peers::new(["fd77::/64".parse().unwrap()]).unwrap();
        let one = bind_steered(&["127.0.0.1:0".parse().unwrap()], &v6only).unwrap();
        assert_eq!((one.socks.len(), one.peers_steered.len()), (1, 0));
    }

    #[test]
    fn a_socket_knows_whether_it_is_on_a_wildcard_address() {
        let wild = bind(&["0.0.0.0:0".parse().unwrap()]).unwrap();
        assert!(bound_to_wildcard(&wild[0]));
        let one = bind(&["127.0.0.1:0".parse().unwrap()]).unwrap();
        assert!(!bound_to_wildcard(&one[0]));
        // IPv6 where this host has it.
        if let Ok(s) = bind(&["[::]:0".parse().unwrap()]) {
            assert!(bound_to_wildcard(&s[0]));
        }
        if let Ok(s) = bind(&["[::1]:0".parse().unwrap()]) {
            assert!(!bound_to_wildcard(&s[0]));
        }
    }
}
