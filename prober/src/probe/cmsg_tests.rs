//! Unit tests of `cmsg.rs` (kept apart so that the module itself stays short).

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
        let (len, space) = unsafe { (libc::CMSG_LEN(n) as usize, libc::CMSG_SPACE(n) as usize) };
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
