//! Socket addresses of either family in the layout the kernel takes and
//! writes (`struct sockaddr_in` / `sockaddr_in6`, network byte order), and
//! which datagram source counts as a peer. No system call of its own.

use std::{
    mem::{size_of, zeroed},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6},
};

/// A socket address of either family as the kernel takes it, with its length.
#[derive(Clone, Copy)]
pub(super) struct RawAddr {
    pub(super) storage: libc::sockaddr_storage,
    pub(super) len: libc::socklen_t,
}

impl RawAddr {
    pub(super) fn ptr(&self) -> *const libc::sockaddr {
        (&self.storage as *const libc::sockaddr_storage).cast()
    }
}

pub(super) fn sockaddr(a: SocketAddr) -> RawAddr {
    // SAFETY: sockaddr_storage is plain old data, valid when zeroed.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match a {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for a
            // sockaddr_in, plain old data, and borrowed only here.
            let s = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = a.port().to_be();
            s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for a sockaddr_in6.
            let s = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = a.port().to_be();
            s.sin6_addr.s6_addr = a.ip().octets();
            s.sin6_flowinfo = a.flowinfo().to_be();
            s.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    RawAddr {
        storage,
        len: len as libc::socklen_t,
    }
}

/// Whether a datagram from `src` comes from `peer`: same address and
/// port (an IPv6 flow label or scope id the kernel adds does not matter).
pub(crate) fn same_endpoint(src: SocketAddr, peer: SocketAddr) -> bool {
    src.ip() == peer.ip() && src.port() == peer.port()
}

/// The address the kernel wrote; an unknown family reads as 0.0.0.0:0.
pub(super) fn from_sockaddr(s: &libc::sockaddr_storage) -> SocketAddr {
    match s.ss_family as libc::c_int {
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (family AF_INET6).
            let s = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s.sin6_addr.s6_addr),
                u16::from_be(s.sin6_port),
                u32::from_be(s.sin6_flowinfo),
                s.sin6_scope_id,
            ))
        }
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family AF_INET).
            let s = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                u16::from_be(s.sin_port),
            ))
        }
        _ => SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::{from_sockaddr, sockaddr};

    #[test]
    fn both_families_round_trip_through_the_kernel_layout() {
        for a in [
            "192.0.2.7:862",
            "0.0.0.0:0",
            "[2001:db8::2]:862",
            "[::]:5061",
            "[fe80::1%3]:9",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let raw = sockaddr(a);
            let want = match a {
                SocketAddr::V4(_) => size_of::<libc::sockaddr_in>(),
                SocketAddr::V6(_) => size_of::<libc::sockaddr_in6>(),
            };
            assert_eq!(raw.len as usize, want, "{a}");
            assert_eq!(from_sockaddr(&raw.storage), a);
        }
        // Network byte order, as the kernel reads it.
        let raw = sockaddr("[2001:db8::2]:862".parse().unwrap());
        // SAFETY: raw.ptr() points to raw.storage, at least raw.len bytes.
        let bytes: &[u8] =
            unsafe { std::slice::from_raw_parts(raw.ptr().cast::<u8>(), raw.len as usize) };
        assert_eq!(&bytes[2..4], &862u16.to_be_bytes());
        assert_eq!(&bytes[8..12], &[0x20, 0x01, 0x0d, 0xb8]);
    }

    #[test]
    fn an_unknown_family_reads_as_unspecified() {
        // SAFETY: all-zero is a valid sockaddr_storage (family AF_UNSPEC).
        let s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(
            from_sockaddr(&s),
            "0.0.0.0:0".parse::<SocketAddr>().unwrap()
        );
    }
}
