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
    pub hw_ns: Option<i64>,
    pub ext_err: Option<ExtErr>,
    /// IP_TTL (with IP_RECVTTL on) or IPV6_HOPLIMIT (with IPV6_RECVHOPLIMIT):
    /// the TTL or hop limit the datagram arrived with.
    pub ttl: Option<u8>,
    /// IP_PKTINFO's `ipi_addr` or IPV6_PKTINFO's `ipi6_addr` (with
    /// IP_PKTINFO or IPV6_RECVPKTINFO on): the destination in the
    /// datagram's IP header, which tells a broadcast or multicast
    /// datagram from one sent to this host's own address.
    pub dst: Option<std::net::IpAddr>,
    /// The interface it arrived on (the same control message).
    pub ifindex: Option<u32>,
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
mod tests {
    use super::*;

    /// One control message as the kernel lays it out.
    fn one_cmsg(level: i32, ty: i32, data: &[u8]) -> Vec<u8> {
        let len = DATA_OFF + data.len();
        let mut m = vec![0u8; cmsg_align(len)];
        m[..ALIGN].copy_from_slice(&len.to_ne_bytes());
        m[ALIGN..ALIGN + 4].copy_from_slice(&level.to_ne_bytes());
        m[ALIGN + 4..ALIGN + 8].copy_from_slice(&ty.to_ne_bytes());
        m[DATA_OFF..DATA_OFF + data.len()].copy_from_slice(data);
        m
    }

    #[test]
    fn ipv6_error_queue_and_hop_limit() {
        // IPv6 sockets get their TX stamps' identity as SOL_IPV6/IPV6_RECVERR
        // and the arrival hop limit as SOL_IPV6/IPV6_HOPLIMIT.
        let mut ee = [0u8; 16];
        ee[..4].copy_from_slice(&(libc::ENOMSG as u32).to_ne_bytes());
        ee[4] = SO_EE_ORIGIN_TIMESTAMPING;
        ee[8..12].copy_from_slice(&SCM_TSTAMP_SCHED.to_ne_bytes());
        ee[12..16].copy_from_slice(&41u32.to_ne_bytes());
        let mut b = one_cmsg(libc::SOL_IPV6, libc::IPV6_RECVERR, &ee);
        b.extend(encode_for_test(Some([(6, 0), (0, 0), (0, 0)]), None));
        let c = parse(&b);
        assert_eq!(c.tx_stamp(), Some((41, TxKind::Sched, 6_000_000_000)));
        let c = parse(&one_cmsg(
            libc::SOL_IPV6,
            libc::IPV6_HOPLIMIT,
            &63i32.to_ne_bytes(),
        ));
        assert_eq!(c.ttl, Some(63));
        let c = parse(&one_cmsg(libc::SOL_IP, libc::IP_TTL, &64i32.to_ne_bytes()));
        assert_eq!(c.ttl, Some(64));
        // IPV6_HOPLIMIT on the IPv4 level is another option: ignored.
        let c = parse(&one_cmsg(
            libc::SOL_IP,
            libc::IPV6_HOPLIMIT,
            &9i32.to_ne_bytes(),
        ));
        assert_eq!(c.ttl, None);
    }

    #[test]
    fn packet_info_gives_the_header_destination_and_interface() {
        let mut v4 = Vec::new();
        v4.extend(3i32.to_ne_bytes());
        v4.extend([10, 77, 0, 2]); // spec_dst: the local address routing picked
        v4.extend([10, 77, 0, 255]); // the header's destination
        let c = parse(&one_cmsg(libc::SOL_IP, libc::IP_PKTINFO, &v4));
        assert_eq!(c.dst, Some("10.77.0.255".parse().unwrap()));
        assert_eq!(c.ifindex, Some(3));
        let mut v6 = "ff02::1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets()
            .to_vec();
        v6.extend(4u32.to_ne_bytes());
        let mut b = encode_for_test(Some([(6, 0), (0, 0), (0, 0)]), None);
        b.extend(one_cmsg(libc::SOL_IPV6, libc::IPV6_PKTINFO, &v6));
        let c = parse(&b);
        assert_eq!(c.dst, Some("ff02::1".parse().unwrap()));
        assert_eq!(c.ifindex, Some(4));
        assert_eq!(c.sw_ns, Some(6_000_000_000));
        // Truncated: ignored, not misread.
        let c = parse(&one_cmsg(libc::SOL_IP, libc::IP_PKTINFO, &v4[..8]));
        assert_eq!((c.dst, c.ifindex), (None, None));
    }

    #[test]
    fn a_source_message_is_laid_out_as_the_kernel_reads_it() {
        let mut buf = [0xffu8; SOURCE_SPACE];
        let used = put_source(&mut buf, "10.91.3.151".parse().unwrap());
        // Header, then in_pktinfo: ifindex 0, spec_dst, addr 0.
        let len = DATA_OFF + 12;
        assert_eq!(used, cmsg_align(len));
        assert_eq!(read_usize(&buf), len);
        assert_eq!(read_i32(&buf[ALIGN..]), libc::SOL_IP);
        assert_eq!(read_i32(&buf[ALIGN + 4..]), libc::IP_PKTINFO);
        assert_eq!(read_i32(&buf[DATA_OFF..]), 0);
        assert_eq!(buf[DATA_OFF + 4..DATA_OFF + 8], [10, 91, 3, 151]);
        assert_eq!(buf[DATA_OFF + 8..DATA_OFF + 12], [0; 4]);
        assert!(buf[len..used].iter().all(|&b| b == 0), "padding zeroed");
        assert_eq!(buf[used], 0xff, "nothing written past the message");
        buf.fill(0xff);
        // IPv6: the same layout the kernel gives on receive, so it parses.
        let used = put_source(&mut buf, "fd91::3:151".parse().unwrap());
        assert_eq!(used, SOURCE_SPACE);
        let c = parse(&buf[..used]);
        assert_eq!(c.dst, Some("fd91::3:151".parse().unwrap()));
        assert_eq!(c.ifindex, Some(0));
        // The same as the C macros lay out.
        // SAFETY: CMSG_LEN / CMSG_SPACE are arithmetic.
        unsafe {
            assert_eq!(read_usize(&buf), libc::CMSG_LEN(20) as usize);
            assert_eq!(SOURCE_SPACE, libc::CMSG_SPACE(20) as usize);
        }
    }

    #[test]
    fn software_rx_timestamp() {
        let b = encode_for_test(Some([(5, 7), (0, 0), (0, 0)]), None);
        let c = parse(&b);
        assert_eq!(c.sw_ns, Some(5_000_000_007));
        assert_eq!(c.hw_ns, None);
        assert_eq!(c.best(), Some((5_000_000_007, TsSource::Software)));
        assert_eq!(c.tx_opt_id(), None);
    }

    #[test]
    fn hardware_preferred_and_opt_id() {
        let ext = ExtErr {
            errno: libc::ENOMSG as u32,
            origin: SO_EE_ORIGIN_TIMESTAMPING,
            info: SCM_TSTAMP_SND,
            data: 99,
        };
        let b = encode_for_test(Some([(1, 0), (0, 0), (2, 5)]), Some(ext));
        let c = parse(&b);
        assert_eq!(c.best(), Some((2_000_000_005, TsSource::Hardware)));
        assert_eq!(c.tx_opt_id(), Some(99));
    }

    #[test]
    fn tx_stamp_kinds_from_ee_info() {
        let ext = |info| ExtErr {
            errno: libc::ENOMSG as u32,
            origin: SO_EE_ORIGIN_TIMESTAMPING,
            info,
            data: 7,
        };
        let sw = Some([(3, 0), (0, 0), (0, 0)]);
        let hw = Some([(0, 0), (0, 0), (4, 0)]);
        let c = parse(&encode_for_test(sw, Some(ext(SCM_TSTAMP_SCHED))));
        assert_eq!(c.tx_stamp(), Some((7, TxKind::Sched, 3_000_000_000)));
        let c = parse(&encode_for_test(sw, Some(ext(SCM_TSTAMP_SND))));
        assert_eq!(c.tx_stamp(), Some((7, TxKind::Software, 3_000_000_000)));
        let c = parse(&encode_for_test(hw, Some(ext(SCM_TSTAMP_SND))));
        assert_eq!(c.tx_stamp(), Some((7, TxKind::Hardware, 4_000_000_000)));
        // A SCHED notification never carries a hardware time.
        assert_eq!(
            parse(&encode_for_test(hw, Some(ext(SCM_TSTAMP_SCHED)))).tx_stamp(),
            None
        );
        assert_eq!(
            parse(&encode_for_test(sw, Some(ext(SCM_TSTAMP_ACK)))).tx_stamp(),
            None
        );
        assert_eq!(parse(&encode_for_test(None, Some(ext(0)))).tx_stamp(), None);
    }

    #[test]
    fn ignores_other_errors_and_garbage() {
        let ext = ExtErr {
            errno: libc::ECONNREFUSED as u32,
            origin: 2,
            info: 0,
            data: 1,
        };
        let c = parse(&encode_for_test(None, Some(ext)));
        assert_eq!(c.tx_opt_id(), None);
        assert_eq!(parse(&[]), Cmsgs::default());
        assert_eq!(parse(&[0xff; 7]), Cmsgs::default());
        // A length pointing past the end must not panic.
        let mut b = encode_for_test(Some([(1, 0), (0, 0), (0, 0)]), None);
        b[..8].copy_from_slice(&1000usize.to_ne_bytes());
        assert_eq!(parse(&b), Cmsgs::default());
    }

    #[test]
    fn corrupt_lengths_and_huge_times_do_not_panic() {
        // Found by this module's proptests: a length near usize::MAX after a
        // first message overflowed `off + len`, and a seconds field beyond
        // i64 nanoseconds overflowed the conversion (debug builds panic,
        // release builds wrapped to a wrong time).
        let mut b = encode_for_test(Some([(1, 0), (0, 0), (0, 0)]), None);
        let first = b.len();
        b.extend(encode_for_test(Some([(2, 0), (0, 0), (0, 0)]), None));
        b[first..first + 8].copy_from_slice(&usize::MAX.to_ne_bytes());
        assert_eq!(parse(&b).sw_ns, Some(1_000_000_000));

        let c = parse(&encode_for_test(
            Some([(i64::MAX, 0), (0, 0), (9_223_372_036, 854_775_808)]),
            None,
        ));
        assert_eq!((c.sw_ns, c.hw_ns), (None, None));
        let c = parse(&encode_for_test(
            Some([(0, 0), (0, 0), (9_223_372_036, 854_775_807)]),
            None,
        ));
        assert_eq!(c.hw_ns, Some(i64::MAX));
    }

    #[test]
    fn never_panics_on_any_bytes() {
        // A cheap deterministic sweep over short buffers; the proptests
        // below start from well-formed buffers, which random bytes almost
        // never are.
        let mut x: u32 = 12345;
        for len in 0..200 {
            let v: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (x >> 16) as u8
                })
                .collect();
            let _ = parse(&v);
        }
    }

    fn tx_ext(info: u32, id: u32) -> ExtErr {
        ExtErr {
            errno: libc::ENOMSG as u32,
            origin: SO_EE_ORIGIN_TIMESTAMPING,
            info,
            data: id,
        }
    }

    const SW: [(i64, i64); 3] = [(10, 1), (0, 0), (0, 0)];
    const HW: [(i64, i64); 3] = [(0, 0), (0, 0), (20, 2)];
    const BOTH: [(i64, i64); 3] = [(10, 1), (0, 0), (20, 2)];

    #[test]
    fn hardware_only() {
        let c = parse(&encode_for_test(Some(HW), Some(tx_ext(SCM_TSTAMP_SND, 5))));
        assert_eq!((c.sw_ns, c.hw_ns), (None, Some(20_000_000_002)));
        assert_eq!(c.best(), Some((20_000_000_002, TsSource::Hardware)));
        assert_eq!(c.tx_stamp(), Some((5, TxKind::Hardware, 20_000_000_002)));
    }

    #[test]
    fn software_only() {
        let c = parse(&encode_for_test(Some(SW), Some(tx_ext(SCM_TSTAMP_SND, 5))));
        assert_eq!((c.sw_ns, c.hw_ns), (Some(10_000_000_001), None));
        assert_eq!(c.best(), Some((10_000_000_001, TsSource::Software)));
        assert_eq!(c.tx_stamp(), Some((5, TxKind::Software, 10_000_000_001)));
    }

    #[test]
    fn hardware_and_software_in_one_message() {
        // What the kernel sends with both SOF_TIMESTAMPING_*_SOFTWARE and
        // *_HARDWARE: one scm_timestamping, ts[0] and ts[2] set.
        let c = parse(&encode_for_test(
            Some(BOTH),
            Some(tx_ext(SCM_TSTAMP_SND, 6)),
        ));
        assert_eq!(
            (c.sw_ns, c.hw_ns),
            (Some(10_000_000_001), Some(20_000_000_002))
        );
        assert_eq!(c.best(), Some((20_000_000_002, TsSource::Hardware)));
        assert_eq!(c.tx_stamp(), Some((6, TxKind::Hardware, 20_000_000_002)));
        // The same as an RX stamp (no error queue message).
        let c = parse(&encode_for_test(Some(BOTH), None));
        assert_eq!(c.best(), Some((20_000_000_002, TsSource::Hardware)));
        assert_eq!((c.tx_opt_id(), c.tx_stamp()), (None, None));
    }

    #[test]
    fn two_timestamping_messages_last_one_wins_whole() {
        // The kernel sends one scm_timestamping per recvmsg(); should two
        // ever arrive, the parser takes the last one as a whole (its zero
        // entries clear the earlier one's), it does not merge them.
        let hw_then_sw = [
            encode_for_test(Some(HW), None),
            encode_for_test(Some(SW), Some(tx_ext(SCM_TSTAMP_SND, 7))),
        ]
        .concat();
        let c = parse(&hw_then_sw);
        assert_eq!((c.sw_ns, c.hw_ns), (Some(10_000_000_001), None));
        assert_eq!(c.tx_stamp(), Some((7, TxKind::Software, 10_000_000_001)));

        let sw_then_hw = [
            encode_for_test(Some(SW), Some(tx_ext(SCM_TSTAMP_SND, 8))),
            encode_for_test(Some(HW), None),
        ]
        .concat();
        let c = parse(&sw_then_hw);
        assert_eq!((c.sw_ns, c.hw_ns), (None, Some(20_000_000_002)));
        assert_eq!(c.best(), Some((20_000_000_002, TsSource::Hardware)));
        assert_eq!(c.tx_stamp(), Some((8, TxKind::Hardware, 20_000_000_002)));
    }

    #[test]
    fn missing_timestamps() {
        // A TX notification without its scm_timestamping (truncated
        // control buffer): the OPT_ID is known, the stamp is not.
        let c = parse(&encode_for_test(None, Some(tx_ext(SCM_TSTAMP_SND, 9))));
        assert_eq!(c.tx_opt_id(), Some(9));
        assert_eq!((c.best(), c.tx_stamp()), (None, None));
        // All-zero timespecs mean "not stamped" (e.g. hardware asked for,
        // NIC did not stamp this packet).
        let c = parse(&encode_for_test(
            Some([(0, 0); 3]),
            Some(tx_ext(SCM_TSTAMP_SND, 9)),
        ));
        assert_eq!((c.sw_ns, c.hw_ns, c.best()), (None, None, None));
        assert_eq!(c.tx_stamp(), None);
        // A SCHED notification whose software stamp is missing.
        let c = parse(&encode_for_test(
            Some(HW),
            Some(tx_ext(SCM_TSTAMP_SCHED, 9)),
        ));
        assert_eq!(c.tx_stamp(), None);
        // No control messages at all.
        let c = parse(&encode_for_test(None, None));
        assert_eq!(c, Cmsgs::default());
        assert_eq!((c.best(), c.tx_stamp()), (None, None));
    }

    /// Property tests against a model of the kernel's encoding (put_cmsg:
    /// CMSG_LEN in the header, CMSG_SPACE in the buffer).
    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Msg {
            /// SOL_SOCKET/SCM_TIMESTAMPING: ts[3] as (sec, nsec).
            Stamp([(i64, i64); 3]),
            /// IP_RECVERR or IPV6_RECVERR: sock_extended_err and the
            /// offender address the kernel appends.
            Err {
                v6: bool,
                ext: ExtErr,
                ee_type: u8,
                ee_code: u8,
                offender: Vec<u8>,
            },
            /// Anything else, including known kinds too short to parse.
            Other { level: i32, ty: i32, data: Vec<u8> },
        }

        fn known(level: i32, ty: i32) -> Option<usize> {
            match (level, ty) {
                (libc::SOL_SOCKET, libc::SCM_TIMESTAMPING) => Some(48),
                (libc::SOL_IP, libc::IP_RECVERR) | (libc::SOL_IPV6, libc::IPV6_RECVERR) => Some(16),
                _ => None,
            }
        }

        fn timespec() -> impl Strategy<Value = (i64, i64)> {
            prop_oneof![
                Just((0, 0)),
                (0i64..=9_223_372_035, 0i64..1_000_000_000),
                // i64::MAX ns, the largest stamp that fits.
                Just((9_223_372_036, 854_775_807)),
            ]
        }

        fn msg() -> impl Strategy<Value = Msg> {
            let stamp = [timespec(), timespec(), timespec()].prop_map(Msg::Stamp);
            let err = (
                any::<bool>(),
                prop_oneof![Just(libc::ENOMSG as u32), any::<u32>()],
                prop_oneof![Just(SO_EE_ORIGIN_TIMESTAMPING), any::<u8>()],
                prop_oneof![0u32..3, any::<u32>()],
                any::<(u32, u8, u8)>(),
                proptest::collection::vec(any::<u8>(), 28),
            )
                .prop_map(
                    |(v6, errno, origin, info, (data, ee_type, ee_code), mut off)| {
                        // struct sockaddr_in (16) or sockaddr_in6 (28).
                        off.truncate(if v6 { 28 } else { 16 });
                        Msg::Err {
                            v6,
                            ext: ExtErr {
                                errno,
                                origin,
                                info,
                                data,
                            },
                            ee_type,
                            ee_code,
                            offender: off,
                        }
                    },
                );
            let other = (
                prop_oneof![
                    Just(libc::SOL_SOCKET),
                    Just(libc::SOL_IP),
                    Just(libc::SOL_IPV6),
                    any::<i32>()
                ],
                prop_oneof![
                    Just(libc::SCM_TIMESTAMPING),
                    Just(libc::IP_RECVERR),
                    Just(libc::IPV6_RECVERR),
                    Just(libc::SO_TIMESTAMPNS),
                    any::<i32>()
                ],
                proptest::collection::vec(any::<u8>(), 0..80),
            )
                .prop_map(|(level, ty, mut data)| {
                    if let Some(min) = known(level, ty) {
                        data.truncate(min - 1);
                    }
                    Msg::Other { level, ty, data }
                });
            prop_oneof![stamp, err, other]
        }

        /// Appends one message as put_cmsg() does; returns (offset, cmsg_len).
        fn put_cmsg(buf: &mut Vec<u8>, level: i32, ty: i32, data: &[u8]) -> (usize, usize) {
            let n = data.len() as libc::c_uint;
            // SAFETY: pure arithmetic (unsafe only in older libc versions).
            #[allow(unused_unsafe)]
            let (len, space) =
                unsafe { (libc::CMSG_LEN(n) as usize, libc::CMSG_SPACE(n) as usize) };
            let off = buf.len();
            buf.resize(off + space, 0);
            let hdr = libc::cmsghdr {
                cmsg_len: len as _,
                cmsg_level: level,
                cmsg_type: ty,
            };
            // SAFETY: cmsghdr is plain old data; the buffer has room for it.
            let hdr_bytes = unsafe {
                std::slice::from_raw_parts(
                    (&hdr as *const libc::cmsghdr).cast::<u8>(),
                    std::mem::size_of::<libc::cmsghdr>(),
                )
            };
            buf[off..off + hdr_bytes.len()].copy_from_slice(hdr_bytes);
            let data_off = off + len - data.len();
            buf[data_off..data_off + data.len()].copy_from_slice(data);
            (off, len)
        }

        fn encode(msgs: &[Msg]) -> (Vec<u8>, Vec<(usize, usize)>) {
            let mut buf = Vec::new();
            let mut at = Vec::new();
            for m in msgs {
                let (level, ty, data) = match m {
                    Msg::Stamp(ts) => {
                        let mut d = Vec::new();
                        for (s, n) in ts {
                            d.extend_from_slice(&s.to_ne_bytes());
                            d.extend_from_slice(&n.to_ne_bytes());
                        }
                        (libc::SOL_SOCKET, libc::SCM_TIMESTAMPING, d)
                    }
                    Msg::Err {
                        v6,
                        ext,
                        ee_type,
                        ee_code,
                        offender,
                    } => {
                        let mut d = Vec::new();
                        d.extend_from_slice(&ext.errno.to_ne_bytes());
                        d.extend_from_slice(&[ext.origin, *ee_type, *ee_code, 0]);
                        d.extend_from_slice(&ext.info.to_ne_bytes());
                        d.extend_from_slice(&ext.data.to_ne_bytes());
                        d.extend_from_slice(offender);
                        if *v6 {
                            (libc::SOL_IPV6, libc::IPV6_RECVERR, d)
                        } else {
                            (libc::SOL_IP, libc::IP_RECVERR, d)
                        }
                    }
                    Msg::Other { level, ty, data } => (*level, *ty, data.clone()),
                };
                at.push(put_cmsg(&mut buf, level, ty, &data));
            }
            (buf, at)
        }

        /// What parse() must say: the last message of each kind wins, a
        /// timestamping message as a whole.
        fn model(msgs: &[Msg]) -> Cmsgs {
            let ns = |(s, n): (i64, i64)| (s != 0 || n != 0).then_some(s * 1_000_000_000 + n);
            let mut c = Cmsgs::default();
            for m in msgs {
                match m {
                    Msg::Stamp(ts) => {
                        c.sw_ns = ns(ts[0]);
                        c.hw_ns = ns(ts[2]);
                    }
                    Msg::Err { ext, .. } => c.ext_err = Some(*ext),
                    Msg::Other { .. } => {}
                }
            }
            c
        }

        /// The TX stamp the kernel's notification means, spelled out from
        /// the model rather than from Cmsgs' own methods.
        fn model_tx(c: &Cmsgs) -> Option<(u32, TxKind, i64)> {
            let e = c.ext_err?;
            if e.errno != libc::ENOMSG as u32 || e.origin != SO_EE_ORIGIN_TIMESTAMPING {
                return None;
            }
            match (e.info, c.hw_ns, c.sw_ns) {
                (SCM_TSTAMP_SCHED, _, Some(s)) => Some((e.data, TxKind::Sched, s)),
                (SCM_TSTAMP_SND, Some(h), _) => Some((e.data, TxKind::Hardware, h)),
                (SCM_TSTAMP_SND, None, Some(s)) => Some((e.data, TxKind::Software, s)),
                _ => None,
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn parses_what_the_kernel_encodes(msgs in proptest::collection::vec(msg(), 0..8)) {
                let (buf, _) = encode(&msgs);
                let want = model(&msgs);
                let got = parse(&buf);
                prop_assert_eq!(got, want);
                prop_assert_eq!(got.tx_stamp(), model_tx(&want));
                // encode_for_test (used by the benches) agrees with the model.
                if let [Msg::Stamp(ts)] = msgs.as_slice() {
                    prop_assert_eq!(parse(&encode_for_test(Some(*ts), None)), want);
                }
            }

            #[test]
            fn truncation_keeps_the_whole_messages(
                msgs in proptest::collection::vec(msg(), 0..8),
            ) {
                let (buf, at) = encode(&msgs);
                for cut in 0..=buf.len() {
                    // Messages whose cmsg_len fits before the cut parse;
                    // the first that does not ends the parse.
                    let whole = at.iter().take_while(|(o, l)| o + l <= cut).count();
                    prop_assert_eq!(parse(&buf[..cut]), model(&msgs[..whole]), "cut at {}", cut);
                }
            }

            #[test]
            fn flipped_bytes_never_panic(
                msgs in proptest::collection::vec(msg(), 1..8),
                flips in proptest::collection::vec((any::<proptest::sample::Index>(), 1u8..=255), 1..4),
            ) {
                let (mut buf, _) = encode(&msgs);
                for (i, x) in flips {
                    let i = i.index(buf.len());
                    buf[i] ^= x;
                }
                let c = parse(&buf);
                let _ = (c.best(), c.tx_stamp(), c.tx_opt_id());
            }

            #[test]
            fn bad_length_fields_stop_the_parse(
                msgs in proptest::collection::vec(msg(), 1..8),
                which in any::<proptest::sample::Index>(),
                len in prop_oneof![
                    any::<usize>(),
                    Just(usize::MAX),
                    Just(usize::MAX - 7),
                    0usize..64,
                ],
            ) {
                let (mut buf, at) = encode(&msgs);
                let k = which.index(msgs.len());
                let (off, _) = at[k];
                buf[off..off + std::mem::size_of::<usize>()].copy_from_slice(&len.to_ne_bytes());
                let c = parse(&buf);
                let _ = (c.best(), c.tx_stamp(), c.tx_opt_id());
                if len < HDR_LEN || len > buf.len() - off {
                    // Nothing from message k on is believed.
                    prop_assert_eq!(c, model(&msgs[..k]));
                }
            }
        }
    }
}
