//! The user-space reflector's sockets: [`bind`] and the default
//! `--listen` of both families ([`bind_both_families`]).
//!
//! Kernel interfaces (the options are set here, `serve.rs` uses them):
//! UDP sockets with SO_TIMESTAMPING (software RX stamps, Linux >= 2.6.30;
//! a software TX stamp asked for per reply, >= 4.6, with its id set per
//! reply, SCM_TS_OPT_ID, >= 6.13: older kernels get no turnaround),
//! IP_RECVTTL or IPV6_RECVHOPLIMIT (IPv6 sockets, `--listen [::]:862`),
//! and IP_PKTINFO or IPV6_RECVPKTINFO (each datagram's destination and
//! interface; a socket on a wildcard address sends each reply from that
//! destination, [`bound_to_wildcard`]); getsockname.

use std::net::SocketAddr;

use anyhow::Result;

use crate::probe::socket::ProbeSocket;

/// The errno under an error's chain, if an OS call failed.
fn errno_of(e: &anyhow::Error) -> Option<i32> {
    e.chain()
        .find_map(|c| c.downcast_ref::<std::io::Error>())
        .and_then(|io| io.raw_os_error())
}

/// The default `--listen`: `0.0.0.0:PORT` and `[::]:PORT` (each socket
/// answers its own family), or IPv4 alone on a host without IPv6, which it
/// says.
pub(crate) fn bind_both_families(port: u16) -> Result<(Vec<SocketAddr>, Vec<ProbeSocket>)> {
    bind_both_families_with(port, bind)
}

fn bind_both_families_with<S>(
    port: u16,
    bind: impl Fn(&[SocketAddr]) -> Result<Vec<S>>,
) -> Result<(Vec<SocketAddr>, Vec<S>)> {
    let v4 = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port);
    let v6 = SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), port);
    let mut socks = bind(&[v4])?;
    match bind(&[v6]) {
        Ok(s) => {
            socks.extend(s);
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
    listen
        .iter()
        .map(|&a| {
            // TX stamps only for the replies serve() samples.
            let s = ProbeSocket::bind_tx_on_request(a, 0, true, 32 << 20)
            .map_err(|e| {
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
                SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, "IPV6_RECVPKTINFO"),
            };
            turn_on(&s, pktinfo)
                .map_err(|e| anyhow::anyhow!("cannot answer on {a}: {}: {e}", pktinfo.2))?;
            // The arrival TTL (IPv4) or hop limit (IPv6) for STAMP's reply.
            let ttl = match a {
                SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_RECVTTL, "IP_RECVTTL"),
                SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, "IPV6_RECVHOPLIMIT"),
            };
            if let Err(e) = turn_on(&s, ttl) {
                log::warn!("{} on {a}: {e}", ttl.2);
            }
            Ok(s)
        })
        .collect()
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
        let both = bind_both_families_with(862, |a| Ok(vec![a[0]])).unwrap();
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
                Ok(vec![a[0]])
            }
        })
        .unwrap();
        assert_eq!(v4.0.len(), 1);
        // Any other failure (the IPv6 port taken) is the user's to see.
        let taken = bind_both_families_with(862, |a| {
            if a[0].is_ipv6() {
                os(libc::EADDRINUSE)
            } else {
                Ok(vec![a[0]])
            }
        });
        assert!(taken.is_err());
        // IPv4 first: its failure stops everything.
        assert!(bind_both_families_with(862, |_| os(libc::EACCES)).is_err());
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
