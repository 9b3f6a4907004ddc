//! The user-space reflector: answers rtprobe probes or STAMP session-sender
//! packets (RFC 8762 §4.3, stateless or stateful, unauthenticated or
//! authenticated). [`Core`] decides per datagram and rewrites the reply in
//! place (pure, unit-tested); [`serve`] is the socket loop, and [`Host`]
//! the one home of a serving reflector (sockets, core, thread, stop flag)
//! that `rtprobe reflect` (`app::reflect`) and testbed runs with
//! `--protocol stamp` both use.
//!
//! Safe to leave running on a network:
//! - only datagrams addressed to one of this host's unicast addresses
//!   (not broadcast or multicast, told by IP_PKTINFO / IPV6_RECVPKTINFO)
//!   from a source one host can have (not broadcast, multicast,
//!   unspecified, 0/8, 240/4 or a subnet broadcast of this host; loopback
//!   only on loopback) are looked at: [`super::addresses`];
//! - only well-formed probes of the served protocol are answered (with a
//!   key: only valid HMACs); echoes are never answered again;
//! - a reply is the request's own buffer rewritten, never longer;
//! - a token bucket per source limits answers (counted): per address for
//!   IPv4, per /64 for IPv6, since one host owns a /64 (SLAAC, privacy
//!   addresses) and could otherwise rotate through it for fresh buckets
//!   (`xdp_common::rate_key`, the in-kernel reflector's rule too);
//!   sessions stay per full source address;
//! - a global cap bounds the answers to all sources together but the
//!   known peers ([`RateLimits`], the same in both reflectors); known
//!   peers ([`Peers`]) draw from a bucket table and a cap of their own,
//!   and get a socket of their own (`steer.rs`), so no flood from
//!   elsewhere spends their budget or fills their queue;
//! - the serve loop takes one batch per socket in turn and sees a stop or
//!   its deadline between batches, whatever arrives;
//! - the session and source tables are bounded ([`MAX_SESSIONS`],
//!   [`MAX_SOURCES`]) LRU maps: constant work per datagram at any number
//!   of sources. A full session table forgets its least recently seen
//!   session; a full source table forgets its least recently seen source
//!   only once that source's bucket has refilled (so forgetting it gives
//!   it nothing), else the new source is refused (counted rate-limited);
//! - "new session" lines and receive errors are logged at most
//!   [`LOG_LINES_PER_S`] a second, with a count of those held back.
//!
//! Every datagram is counted exactly once: reflected, not_for_us,
//! bad_source, malformed, rate_limited, global_limited, peer_rate_limited,
//! peer_global_limited or auth_failed (and a reply to a known peer also as
//! peer_reflected).
//!
//! The parts:
//! - `decide.rs`: [`Core`], the decision on one datagram and the reply
//!   rewritten in place (pure);
//! - `tables.rs`: its bounded per-source state, the session table and the
//!   rate-limit buckets, and the limiter that picks a datagram's budgets;
//! - `peers.rs`: the known-peers allowlist (`--peer`, `--peers FILE`);
//! - `echo.rs`: what an rtprobe echo carries beyond the probe (the
//!   reflector's times and state);
//! - `bind.rs`: the sockets and their options; `steer.rs`: the known
//!   peers' own socket (SO_REUSEPORT and a classic BPF program);
//! - `serve.rs`: [`serve`], the socket loop, with `budget.rs` (how many
//!   log lines and TX stamps a second, and the reply limits) and
//!   `report.rs` ([`ServeReport`],
//!   what a run reports);
//! - `host.rs`: [`Host`], the loop in a thread of its own with its stop
//!   flag, and [`Watch`], what its owner hears while it runs.
//!
//! `--kernel`, the in-kernel reflector set up on the interface of the
//! `--listen` address, is `ebpf`'s (`ebpf/host.rs`).

mod bind;
mod budget;
mod decide;
mod echo;
mod host;
mod peers;
mod report;
mod serve;
mod steer;
mod tables;
#[cfg(test)]
mod testutil;

pub use self::{
    bind::bind,
    budget::RateLimits,
    decide::{Core, Drop, Policy, Verdict},
    echo::{FLAG_REFLECTOR_STATE, FLAG_WARMUP, STATE_MIN_LEN, STATE_OFFSET, read_rtprobe_state},
    peers::{Peers, Prefix},
    serve::LOG_LINES_PER_S,
    tables::{MAX_PEER_SOURCES, MAX_SESSIONS, MAX_SOURCES},
};
pub(crate) use self::{
    bind::{Bound, bind_both_families, bind_steered},
    host::{Host, Watch},
    report::ServeReport,
};
pub use crate::stats::report::ReflectorCounters as Counters;
