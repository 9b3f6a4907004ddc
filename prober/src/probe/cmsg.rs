//! Parsing of the control messages that carry kernel timestamps
//! (SCM_TIMESTAMPING) and TX-timestamp identities (IP_RECVERR with
//! SO_EE_ORIGIN_TIMESTAMPING), and the one message rtprobe writes beyond
//! u32 options: a reply's source ([`put_source`], IP_PKTINFO /
//! IPV6_PKTINFO, Linux >= 2.6.14). Pure bytes, so it is unit-tested and
//! benchmarked without sockets. Layout from linux/errqueue.h and
//! Documentation/networking/timestamping.rst (Linux >= 2.6.30; OPT_ID >= 3.19).

use crate::model::record::TsSource;

/// `SO_EE_ORIGIN_TIMESTAMPING` from linux/errqueue.h.
pub const SO_EE_ORIGIN_TIMESTAMPING: u8 = 4;
/// `SCM_TSTAMP_SND`: the driver handed the packet to the NIC.
pub const SCM_TSTAMP_SND: u32 = 0;
/// `SCM_TSTAMP_SCHED`: the packet entered the device layer (before the qdisc).
pub(crate) const SCM_TSTAMP_SCHED: u32 = 1;
/// `SCM_TSTAMP_ACK`: TCP only.
#[cfg(test)]
pub(crate) const SCM_TSTAMP_ACK: u32 = 2;

/// Which point of the send path a TX timestamp marks (`ee_info`), and on
/// which clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxKind {
    /// Entered the device layer, before the qdisc (software clock).
    Sched,
    /// The driver took the packet (software clock).
    Software,
    /// The NIC sent it (its PHC, raw).
    Hardware,
}

/// `struct sock_extended_err` (linux/errqueue.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtErr {
    pub errno: u32,
    pub origin: u8,
    pub info: u32,
    /// The OPT_ID of the timestamped send.
    pub data: u32,
}

/// What one recvmsg() control buffer said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cmsgs {
    /// ts[0] of scm_timestamping: software timestamp, CLOCK_REALTIME ns.
    pub sw_ns: Option<i64>,
    /// ts[2]: raw hardware timestamp (NIC clock) ns.
    pub(crate) hw_ns: Option<i64>,
    pub(crate) ext_err: Option<ExtErr>,
    /// IP_TTL (with IP_RECVTTL on) or IPV6_HOPLIMIT (with IPV6_RECVHOPLIMIT):
    /// the TTL or hop limit the datagram arrived with.
    pub(crate) ttl: Option<u8>,
    /// IP_PKTINFO's `ipi_addr` or IPV6_PKTINFO's `ipi6_addr` (with
    /// IP_PKTINFO or IPV6_RECVPKTINFO on): the destination in the
    /// datagram's IP header, which tells a broadcast or multicast
    /// datagram from one sent to this host's own address.
    pub(crate) dst: Option<std::net::IpAddr>,
    /// The interface it arrived on (the same control message).
    pub(crate) ifindex: Option<u32>,
}

impl Cmsgs {
    /// The best timestamp present: hardware if the NIC gave one.
    pub fn best(&self) -> Option<(i64, TsSource)> {
        match (self.hw_ns, self.sw_ns) {
            (Some(h), _) => Some((h, TsSource::Hardware)),
            (None, Some(s)) => Some((s, TsSource::Software)),
            _ => None,
        }
    }

    /// A TX timestamp notification's OPT_ID, which point of the send path
    /// it marks, and the time. A SCHED notification is software only; an
    /// SND one carries the hardware stamp (ts[2]) or the software one
    /// (ts[0]), one per message with OPT_TSONLY. None for anything else
    /// (ACK stamps, other errors, no time at all).
    pub fn tx_stamp(&self) -> Option<(u32, TxKind, i64)> {
        let id = self.tx_opt_id()?;
        let info = self.ext_err?.info;
        match info {
            SCM_TSTAMP_SCHED => self.sw_ns.map(|t| (id, TxKind::Sched, t)),
            SCM_TSTAMP_SND => match (self.hw_ns, self.sw_ns) {
                (Some(h), _) => Some((id, TxKind::Hardware, h)),
                (None, Some(s)) => Some((id, TxKind::Software, s)),
                (None, None) => None,
            },
            _ => None,
        }
    }

    /// The OPT_ID if this is a TX timestamp notification.
    pub fn tx_opt_id(&self) -> Option<u32> {
        self.ext_err
            .filter(|e| e.origin == SO_EE_ORIGIN_TIMESTAMPING && e.errno == libc::ENOMSG as u32)
            .map(|e| e.data)
    }
}

const ALIGN: usize = std::mem::size_of::<usize>();
const fn cmsg_align(n: usize) -> usize {
    (n + ALIGN - 1) & !(ALIGN - 1)
}
const HDR_LEN: usize = std::mem::size_of::<libc::cmsghdr>();
const DATA_OFF: usize = cmsg_align(HDR_LEN);

fn read_usize(b: &[u8]) -> usize {
    usize::from_ne_bytes(b[..ALIGN].try_into().expect("ALIGN bytes"))
}
fn read_i32(b: &[u8]) -> i32 {
    i32::from_ne_bytes(b[..4].try_into().expect("4 bytes"))
}
fn read_u32(b: &[u8]) -> u32 {
    u32::from_ne_bytes(b[..4].try_into().expect("4 bytes"))
}
fn read_i64(b: &[u8]) -> i64 {
    i64::from_ne_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Parses a control buffer as filled by recvmsg() (only the first
/// `msg_controllen` bytes). Unknown or truncated messages are skipped.
pub fn parse(control: &[u8]) -> Cmsgs {
    let mut out = Cmsgs::default();
    let mut off = 0usize;
    while off + HDR_LEN <= control.len() {
        let hdr = &control[off..];
        let len = read_usize(hdr);
        let level = read_i32(&hdr[ALIGN..]);
        let ty = read_i32(&hdr[ALIGN + 4..]);
        // `len` comes from the buffer: compare without `off + len`, which
        // a corrupt length would overflow.
        if len < HDR_LEN || len > control.len() - off {
            break;
        }
        let data = &control[off + DATA_OFF.min(len)..off + len];
        match (level, ty) {
            (libc::SOL_SOCKET, libc::SCM_TIMESTAMPING) if data.len() >= 48 => {
                // struct scm_timestamping { struct timespec ts[3]; } on LP64.
                let ts = |i: usize| {
                    let sec = read_i64(&data[16 * i..]);
                    let nsec = read_i64(&data[16 * i + 8..]);
                    if sec == 0 && nsec == 0 {
                        return None;
                    }
                    // A time beyond i64 ns (year 2262) is no kernel stamp.
                    sec.checked_mul(1_000_000_000)?.checked_add(nsec)
                };
                out.sw_ns = ts(0);
                out.hw_ns = ts(2);
            }
            // IPv4's TTL (IP_RECVTTL) or IPv6's hop limit (IPV6_RECVHOPLIMIT).
            (libc::SOL_IP, libc::IP_TTL) | (libc::SOL_IPV6, libc::IPV6_HOPLIMIT)
                if data.len() >= 4 =>
            {
                out.ttl = u8::try_from(read_i32(data)).ok();
            }
            // struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }
            (libc::SOL_IP, libc::IP_PKTINFO) if data.len() >= 12 => {
                let a: [u8; 4] = data[8..12].try_into().expect("4 bytes");
                out.dst = Some(std::net::Ipv4Addr::from(a).into());
                out.ifindex = Some(read_u32(data));
            }
            // struct in6_pktinfo { in6_addr addr; unsigned int ifindex; }
            (libc::SOL_IPV6, libc::IPV6_PKTINFO) if data.len() >= 20 => {
                let a: [u8; 16] = data[..16].try_into().expect("16 bytes");
                out.dst = Some(std::net::Ipv6Addr::from(a).into());
                out.ifindex = Some(read_u32(&data[16..]));
            }
            (libc::SOL_IP, libc::IP_RECVERR) | (libc::SOL_IPV6, libc::IPV6_RECVERR)
                if data.len() >= 16 =>
            {
                out.ext_err = Some(ExtErr {
                    errno: read_u32(data),
                    origin: data[4],
                    info: read_u32(&data[8..]),
                    data: read_u32(&data[12..]),
                });
            }
            _ => {}
        }
        off += cmsg_align(len);
    }
    out
}

/// Bytes [`put_source`] writes at most: IPV6_PKTINFO's 20 bytes of data
/// after the header, aligned (CMSG_SPACE(20) = 40 on 64-bit).
pub(crate) const SOURCE_SPACE: usize = cmsg_align(DATA_OFF + 20);

/// Writes into `buf` (from its start) the control message that sends a
/// datagram from `src`: IP_PKTINFO with `ipi_spec_dst = src`, or
/// IPV6_PKTINFO with `ipi6_addr = src`. The interface stays 0 so that the
/// route to the destination picks it, as for any other send (forcing the
/// arrival interface would break a host whose replies leave by another
/// one). Returns the bytes used (CMSG_SPACE), to add to `msg_controllen`.
pub(crate) fn put_source(buf: &mut [u8; SOURCE_SPACE], src: std::net::IpAddr) -> usize {
    let (level, ty, data_len) = match src {
        std::net::IpAddr::V4(_) => (libc::SOL_IP, libc::IP_PKTINFO, 12),
        std::net::IpAddr::V6(_) => (libc::SOL_IPV6, libc::IPV6_PKTINFO, 20),
    };
    let len = DATA_OFF + data_len;
    let space = cmsg_align(len);
    let m = &mut buf[..space];
    m.fill(0);
    m[..ALIGN].copy_from_slice(&len.to_ne_bytes());
    m[ALIGN..ALIGN + 4].copy_from_slice(&level.to_ne_bytes());
    m[ALIGN + 4..ALIGN + 8].copy_from_slice(&ty.to_ne_bytes());
    let data = &mut m[DATA_OFF..];
    match src {
        // struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }:
        // a send reads spec_dst (the source) and ignores addr.
        std::net::IpAddr::V4(a) => data[4..8].copy_from_slice(&a.octets()),
        // struct in6_pktinfo { in6_addr addr; unsigned int ifindex; }
        std::net::IpAddr::V6(a) => data[..16].copy_from_slice(&a.octets()),
    }
    space
}

/// Builds a control buffer the way the kernel does. For tests and benches.
pub fn encode_for_test(ts: Option<[(i64, i64); 3]>, ext: Option<ExtErr>) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut push = |level: i32, ty: i32, data: &[u8]| {
        let len = DATA_OFF + data.len();
        let mut m = vec![0u8; cmsg_align(len)];
        m[..ALIGN].copy_from_slice(&len.to_ne_bytes());
        m[ALIGN..ALIGN + 4].copy_from_slice(&level.to_ne_bytes());
        m[ALIGN + 4..ALIGN + 8].copy_from_slice(&ty.to_ne_bytes());
        m[DATA_OFF..DATA_OFF + data.len()].copy_from_slice(data);
        buf.extend_from_slice(&m);
    };
    if let Some(e) = ext {
        let mut d = [0u8; 16];
        d[..4].copy_from_slice(&e.errno.to_ne_bytes());
        d[4] = e.origin;
        d[8..12].copy_from_slice(&e.info.to_ne_bytes());
        d[12..16].copy_from_slice(&e.data.to_ne_bytes());
        push(libc::SOL_IP, libc::IP_RECVERR, &d);
    }
    if let Some(ts) = ts {
        let mut d = [0u8; 48];
        for (i, (s, n)) in ts.iter().enumerate() {
            d[16 * i..16 * i + 8].copy_from_slice(&s.to_ne_bytes());
            d[16 * i + 8..16 * i + 16].copy_from_slice(&n.to_ne_bytes());
        }
        push(libc::SOL_SOCKET, libc::SCM_TIMESTAMPING, &d);
    }
    buf
}

#[cfg(test)]
#[path = "cmsg_tests.rs"]
mod tests;
