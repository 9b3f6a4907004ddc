//! Test-only fixtures the reflector's tests share: a [`Core`] with a
//! known clock, a source address and an rtprobe probe.

use std::net::SocketAddr;

use super::{Core, Peers, Policy, RateLimits};
use crate::{
    probe::wire::ProtocolArg,
    probe::{
        packet::Probe,
        stamp::{ClockSync, HmacKey},
    },
};

pub(super) const NOW: i64 = 1_763_850_000_000_000_000;

pub(super) fn core(protocol: ProtocolArg, key: Option<HmacKey>, rate: u32, stateful: bool) -> Core {
    let mut c = Core::new(Policy {
        protocol,
        key,
        limits: RateLimits {
            per_source_pps: (rate > 0).then_some(rate),
            ..RateLimits::NONE
        },
        peers: Peers::default(),
        stateful,
    });
    c.set_clock(
        Some(ClockSync {
            synchronized: true,
            max_error_ns: 1_000_000,
            tai_offset_s: 37,
        }),
        NOW,
    );
    c
}

pub(super) fn src(port: u16) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, 1], port))
}

pub(super) fn probe(session: u64, seq: u64, size: usize) -> Vec<u8> {
    let mut b = vec![0u8; size];
    Probe {
        session,
        seq,
        flow: 0,
        echo: false,
        send_ns: NOW,
        kernel_times: None,
    }
    .encode(&mut b);
    b
}
