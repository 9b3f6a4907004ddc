//! Parsing of the control messages that carry kernel timestamps
//! (SCM_TIMESTAMPING) and TX-timestamp identities (IP_RECVERR with
//! SO_EE_ORIGIN_TIMESTAMPING). Pure byte parsing, so it is unit-tested and
//! benchmarked without sockets. Layout from linux/errqueue.h and
//! Documentation/networking/timestamping.rst (Linux >= 2.6.30; OPT_ID >= 3.19).

use crate::export::TsSource;

/// `SO_EE_ORIGIN_TIMESTAMPING` from linux/errqueue.h.
pub const SO_EE_ORIGIN_TIMESTAMPING: u8 = 4;
/// `SCM_TSTAMP_SND`: the driver handed the packet to the NIC.
pub const SCM_TSTAMP_SND: u32 = 0;
/// `SCM_TSTAMP_SCHED`: the packet entered the device layer (before the qdisc).
pub const SCM_TSTAMP_SCHED: u32 = 1;
/// `SCM_TSTAMP_ACK`: TCP only.
pub const SCM_TSTAMP_ACK: u32 = 2;

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
        // A cheap deterministic sweep; proptest covers more in tests/.
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
}
