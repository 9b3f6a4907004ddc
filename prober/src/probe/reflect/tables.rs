//! The reflector's bounded state per source: the session table (per full
//! source address and session id or SSID) and the rate-limit buckets (per
//! IPv4 address or IPv6 /64, [`rate_key`]). Both are LRU maps of a fixed
//! size, so each datagram costs constant work at any number of sources.
//! [`Limiter`] puts the buckets together as [`RateLimits`] says: known
//! peers in a table and a cap of their own, every other source in the
//! other table and the global cap.

use std::{
    net::{IpAddr, SocketAddr},
    num::NonZeroUsize,
};

use lru::LruCache;
use xdp_common::{AddrKey, addr_key, rate_key};

use super::{Drop, Peers, RateLimits};

/// Sessions (source + session id or SSID) remembered at once. About 130
/// bytes each (see `table_memory_per_entry`): 8.5 MiB when full.
pub const MAX_SESSIONS: usize = 65_536;
/// Sources with a rate-limit bucket at once: the per-source limit holds
/// for this many sources seen within a bucket's refill time. About 100
/// bytes each (see `table_memory_per_entry`): 13 MiB when full.
pub const MAX_SOURCES: usize = 131_072;
/// Known peers with a bucket at once (as the in-kernel reflector's
/// `REFLECTOR_PEER_SOURCES_MAX`): only allowlisted sources take a place.
pub const MAX_PEER_SOURCES: usize = xdp_common::REFLECTOR_PEER_SOURCES_MAX as usize;

/// One session's state. Recency lives in the LRU order, not here.
#[derive(Debug, Clone, Copy)]
pub(super) struct Session {
    /// Probes of this session (not warm-ups) seen, for the echo's state.
    pub(super) received: u64,
    /// STAMP stateful: the sequence number of the next reply.
    pub(super) next_seq: u32,
}

/// A token bucket: `tokens` as of `last_ns`. Time going back refills
/// nothing (and counts on from there); a jump forward refills at most the
/// burst.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last_ns: i64,
}

impl Bucket {
    fn full(rate_pps: u32, now_ns: i64) -> Self {
        Bucket {
            tokens: burst_of(rate_pps),
            last_ns: now_ns,
        }
    }

    /// The tokens it holds at `now_ns`.
    fn refilled(&self, rate_pps: u32, now_ns: i64) -> f64 {
        let dt_s = (now_ns - self.last_ns).max(0) as f64 / 1e9;
        (self.tokens + dt_s * f64::from(rate_pps)).min(burst_of(rate_pps))
    }

    /// Takes a token at `now_ns` if there is one.
    fn take(&mut self, rate_pps: u32, now_ns: i64) -> bool {
        self.tokens = self.refilled(rate_pps, now_ns);
        self.last_ns = now_ns;
        let ok = self.tokens >= 1.0;
        if ok {
            self.tokens -= 1.0;
        }
        ok
    }
}

fn burst_of(rate_pps: u32) -> f64 {
    f64::from(RateLimits::burst(rate_pps))
}

/// One bucket many sources share (a cap); None: no limit.
#[derive(Debug, Default)]
pub(super) struct Cap(Option<Bucket>);

impl Cap {
    pub(super) fn take(&mut self, rate_pps: Option<u32>, now_ns: i64) -> bool {
        let Some(rate) = rate_pps else {
            return true;
        };
        self.0
            .get_or_insert_with(|| Bucket::full(rate, now_ns))
            .take(rate, now_ns)
    }
}

fn capacity(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n.max(1)).expect("at least 1")
}

/// Sessions by source address and id; a full table forgets its least
/// recently seen session.
pub(super) struct Sessions(LruCache<(SocketAddr, u64), Session>);

impl Sessions {
    pub(super) fn new(max: usize) -> Self {
        Self(LruCache::new(capacity(max)))
    }

    /// The session `id` from `src`, and whether it is new; a new session
    /// in a full table takes the least recently seen one's place (the
    /// third value: one was forgotten).
    pub(super) fn open(&mut self, src: SocketAddr, id: u64) -> (&mut Session, bool, bool) {
        let full = self.0.len() >= self.0.cap().get();
        let mut new = false;
        let s = self.0.get_or_insert_mut((src, id), || {
            new = true;
            Session {
                received: 0,
                next_seq: 0,
            }
        });
        (s, new, new && full)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}

/// A token bucket per source, keyed by [`rate_key`]: an IPv4 address or
/// an IPv6 /64.
pub(super) struct Buckets(LruCache<AddrKey, Bucket>);

impl Buckets {
    pub(super) fn new(max: usize) -> Self {
        Self(LruCache::new(capacity(max)))
    }

    /// Takes a token from the bucket of `ip`'s [`rate_key`] (IPv6: its
    /// /64; burst: [`RateLimits::burst`]; `rate_pps` None: no limit). A
    /// new source takes the least recently seen source's place in a full
    /// table only if that bucket has refilled: forgetting it then changes
    /// nothing, while forgetting a half-empty bucket would hand its
    /// source a fresh burst. Otherwise the new source is refused until one
    /// has.
    pub(super) fn admit(&mut self, ip: IpAddr, rate_pps: Option<u32>, now_ns: i64) -> bool {
        let Some(rate) = rate_pps else {
            return true;
        };
        let key = rate_key(&addr_key(ip));
        if let Some(b) = self.0.get_mut(&key) {
            return b.take(rate, now_ns);
        }
        if self.0.len() >= self.0.cap().get() {
            let refilled = self
                .0
                .peek_lru()
                .is_some_and(|(_, b)| b.refilled(rate, now_ns) >= burst_of(rate));
            if !refilled {
                return false;
            }
            self.0.pop_lru();
        }
        let mut b = Bucket::full(rate, now_ns);
        let ok = b.take(rate, now_ns);
        self.0.push(key, b);
        ok
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}

/// Every budget a datagram may draw from, and which it does: a known
/// peer's own bucket and the peers' cap, or another source's bucket and
/// the global cap. The source's bucket first, so that a source over its
/// own limit spends nothing of what it shares with others.
pub(super) struct Limiter {
    limits: RateLimits,
    peers: Peers,
    sources: Buckets,
    global: Cap,
    peer_sources: Buckets,
    peer_cap: Cap,
}

impl Limiter {
    pub(super) fn new(limits: RateLimits, peers: Peers, sources: usize) -> Self {
        Limiter {
            limits,
            peers,
            sources: Buckets::new(sources),
            global: Cap::default(),
            peer_sources: Buckets::new(MAX_PEER_SOURCES),
            peer_cap: Cap::default(),
        }
    }

    /// Whether a datagram from `ip` at `now_ns` may be answered (`true`:
    /// from a known peer), or the limit it is over.
    pub(super) fn admit(&mut self, ip: IpAddr, now_ns: i64) -> Result<bool, Drop> {
        let l = self.limits;
        if self.peers.contains(ip) {
            if !self.peer_sources.admit(ip, l.per_source_pps, now_ns) {
                return Err(Drop::PeerRateLimited);
            }
            if !self.peer_cap.take(l.peers_pps, now_ns) {
                return Err(Drop::PeerGlobalLimited);
            }
            return Ok(true);
        }
        if !self.sources.admit(ip, l.per_source_pps, now_ns) {
            return Err(Drop::RateLimited);
        }
        if !self.global.take(l.global_pps, now_ns) {
            return Err(Drop::GlobalLimited);
        }
        Ok(false)
    }

    /// Sources (of both tables) with a bucket.
    pub(super) fn len(&self) -> usize {
        self.sources.len() + self.peer_sources.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{super::testutil::*, *};
    use crate::{
        probe::reflect::{Core, Drop, Verdict},
        probe::wire::ProtocolArg,
    };

    #[test]
    fn rate_limit_per_source_refills_with_time() {
        let mut c = core(ProtocolArg::Rtprobe, None, 100, false);
        let mut answered = 0;
        for i in 0..100 {
            let mut b = probe(1, i, 64);
            if matches!(
                c.handle(&mut b, src(4), None, None, NOW),
                Verdict::Reply { .. }
            ) {
                answered += 1;
            }
        }
        assert_eq!(answered, 16, "the burst");
        assert_eq!(c.counters.rate_limited, 84);
        // Another source has its own bucket; a second later the first refilled.
        let mut b = probe(2, 0, 64);
        let other = SocketAddr::from(([192, 0, 2, 2], 4));
        assert!(matches!(
            c.handle(&mut b, other, None, None, NOW),
            Verdict::Reply { .. }
        ));
        let mut b = probe(1, 200, 64);
        assert!(matches!(
            c.handle(&mut b, src(4), None, None, NOW + 1_000_000_000),
            Verdict::Reply { .. }
        ));
    }

    #[test]
    fn tables_stay_bounded_under_a_flood_of_sessions_and_sources() {
        let policy = core(ProtocolArg::Rtprobe, None, 1000, false)
            .policy()
            .clone();
        let mut c = Core::with_capacity(policy, 64, 128);
        for i in 0..(64 * 3) {
            let mut b = probe(i, 0, 64);
            let ip = SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 9));
            // A second apart: every bucket has refilled when it is forgotten.
            c.handle(&mut b, ip, None, None, NOW + i as i64 * 1_000_000_000);
        }
        assert_eq!(c.sessions_held(), 64);
        assert_eq!(c.sources_held(), 128);
        assert_eq!(c.counters.sessions_evicted, 64 * 2);
        assert_eq!(c.counters.reflected, 64 * 3);
    }

    /// Bytes one table entry costs: the LRU's boxed node (key, value, two
    /// links; rounded up to malloc's 16-byte chunks plus its 8-byte
    /// header) and the hash table's slot (key pointer, node pointer, one
    /// control byte) at hashbrown's worst load of 7/16.
    fn table_memory_per_entry<K, V>() -> usize {
        let node = size_of::<K>() + size_of::<V>() + 2 * size_of::<usize>();
        let malloc = (node + 8).div_ceil(16) * 16;
        let slot = (2 * size_of::<usize>() + 1) * 16 / 7;
        malloc + slot
    }

    #[test]
    fn table_memory_is_what_the_docs_say() {
        let per_source = table_memory_per_entry::<AddrKey, Bucket>();
        let per_session = table_memory_per_entry::<(SocketAddr, u64), Session>();
        eprintln!("bytes per entry: source {per_source}, session {per_session}");
        assert!(per_source <= 110, "{per_source}");
        assert!(per_session <= 140, "{per_session}");
        assert!(per_source * MAX_SOURCES <= 14 << 20);
        assert!(per_session * MAX_SESSIONS <= 9 << 20);
    }

    /// 100 k sources, 17 datagrams each in turn within 2 ms, 1/s each: every
    /// source gets its burst of 16 and no more, and each keeps its own
    /// bucket (the old 4096-entry table forgot them and gave each a new
    /// burst: nothing was limited).
    #[test]
    fn per_source_limit_holds_at_100k_sources() {
        const SOURCES: u32 = 100_000;
        let mut c = core(ProtocolArg::Rtprobe, None, 1, false);
        let template = probe(1, 0, 32);
        let mut b = template.clone();
        let t0 = std::time::Instant::now();
        for round in 0..17u32 {
            for i in 0..SOURCES {
                b.copy_from_slice(&template);
                let ip = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 9));
                let now = NOW + (round * SOURCES + i) as i64;
                c.handle(&mut b, ip, None, None, now);
            }
        }
        let k = &c.counters;
        eprintln!(
            "100k sources x 17: {:?}; reflected {} rate_limited {} sources held {}",
            t0.elapsed(),
            k.reflected,
            k.rate_limited,
            c.sources_held()
        );
        assert_eq!(k.reflected, 16 * SOURCES as u64);
        assert_eq!(k.rate_limited, SOURCES as u64);
        assert_eq!(c.sources_held(), SOURCES as usize);
        assert!(c.sources_held() <= MAX_SOURCES);
        assert!(c.sessions_held() <= MAX_SESSIONS);
    }

    /// `count` probes from `sources` in turn, evenly over `secs` seconds;
    /// returns how many were answered.
    fn flood(c: &mut Core, sources: &[IpAddr], count: u64, secs: u64) -> u64 {
        let gap_ns = (secs * 1_000_000_000 / count) as i64;
        let template = probe(7, 0, 32);
        let mut b = template.clone();
        let before = c.counters.reflected;
        for i in 0..count {
            b.copy_from_slice(&template);
            let ip = sources[(i % sources.len() as u64) as usize];
            c.handle(
                &mut b,
                SocketAddr::new(ip, 9),
                None,
                None,
                NOW + i as i64 * gap_ns,
            );
        }
        c.counters.reflected - before
    }

    /// `n` addresses of the /64 `prefix` (a host rotating privacy addresses).
    fn addrs_in_64(prefix: &str, n: u64) -> Vec<IpAddr> {
        let base = prefix.parse::<std::net::Ipv6Addr>().unwrap().octets();
        (0..n)
            .map(|i| {
                let mut a = base;
                let iid = 0x5eed_0000_0000_0000u64 ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                a[8..].copy_from_slice(&iid.to_be_bytes());
                IpAddr::from(a)
            })
            .collect()
    }

    /// One IPv6 host owns a /64: 1000 of its addresses draw from one
    /// bucket (at most rate x seconds + burst answered), another /64 has
    /// its own, IPv4 stays per address, sessions stay per full address.
    #[test]
    fn ipv6_sources_are_limited_per_64() {
        let (rate, secs, count) = (100u32, 2u64, 20_000u64);
        let burst = 16; // a tenth of a second's worth, at least 16
        let bound = u64::from(rate) * secs + burst;
        let one = addrs_in_64("2001:db8:1:2::", 1000);
        let mut c = core(ProtocolArg::Rtprobe, None, rate, false);
        let answered = flood(&mut c, &one, count, secs);
        eprintln!(
            "1000 addresses of one /64, {count} probes in {secs} s at {rate}/s: \
             {answered} answered (bound {bound}), {} rate-limited, {} bucket(s), {} sessions",
            c.counters.rate_limited,
            c.sources_held(),
            c.counters.sessions
        );
        assert!(answered <= bound && answered >= bound - 1, "{answered}");
        assert_eq!(c.sources_held(), 1);
        // The same session id from two addresses of the /64: two sessions.
        let mut c = core(ProtocolArg::Rtprobe, None, rate, false);
        assert_eq!(flood(&mut c, &one[..2], 2, 1), 2);
        assert_eq!((c.counters.sessions, c.sources_held()), (2, 1));

        let mut two = addrs_in_64("2001:db8:1:2::", 500);
        two.extend(addrs_in_64("2001:db8:1:3::", 500));
        let mut c = core(ProtocolArg::Rtprobe, None, rate, false);
        let answered = flood(&mut c, &two, count, secs);
        eprintln!("two /64s: {answered} answered (bound {})", 2 * bound);
        assert!(answered > bound && answered <= 2 * bound, "{answered}");
        assert_eq!(c.sources_held(), 2);

        // IPv4, and IPv4 as a dual-stack socket reports it: per address.
        for mapped in [false, true] {
            let v4: Vec<IpAddr> = (0..1000u32)
                .map(|i| {
                    let a = std::net::Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8);
                    if mapped {
                        IpAddr::V6(a.to_ipv6_mapped())
                    } else {
                        IpAddr::V4(a)
                    }
                })
                .collect();
            let mut c = core(ProtocolArg::Rtprobe, None, rate, false);
            let answered = flood(&mut c, &v4, count, secs);
            assert_eq!(answered, count, "20 each in 2 s: within each burst");
            assert_eq!(c.sources_held(), 1000, "mapped: {mapped}");
        }
    }

    /// The global cap holds over any number of sources, each within its
    /// own limit; a known peer draws from its own bucket and the peers'
    /// cap, so the strangers spending theirs costs it nothing; the peers'
    /// cap holds over many peers; everything refused is counted by limit.
    #[test]
    fn strangers_share_the_global_cap_and_peers_keep_their_own_budget() {
        let prefix = |s: &str| s.parse::<crate::probe::reflect::Prefix>().unwrap();
        let policy = crate::probe::reflect::Policy {
            limits: RateLimits {
                per_source_pps: Some(100),
                global_pps: Some(1000),
                peers_pps: Some(500),
            },
            peers: Peers::new([prefix("192.0.2.1"), prefix("10.9.0.0/16")]).unwrap(),
            ..core(ProtocolArg::Rtprobe, None, 0, false).policy().clone()
        };
        let mut c = Core::new(policy);
        let at = |a: [u8; 4]| SocketAddr::from((a, 9));
        let answered = |c: &mut Core, a: [u8; 4], n: u64, now: i64| {
            (0..n)
                .filter(|&i| {
                    let mut b = probe(1, i, 64);
                    matches!(
                        c.handle(&mut b, at(a), None, None, now),
                        Verdict::Reply { .. }
                    )
                })
                .count() as u64
        };
        // 1000 strangers, 16 each at one instant: the cap's burst (100).
        let strangers: u64 = (0..1000u32)
            .map(|i| answered(&mut c, [10, 1, (i >> 8) as u8, i as u8], 16, NOW))
            .sum();
        assert_eq!(strangers, 100);
        assert_eq!(c.counters.global_limited, 16_000 - 100);
        // The peer 192.0.2.1 (src()) at the same instant: its burst of 16.
        assert_eq!(answered(&mut c, [192, 0, 2, 1], 20, NOW), 16);
        assert_eq!(c.counters.peer_rate_limited, 4);
        assert_eq!(c.counters.peer_reflected, 16);
        // Peers of 10.9/16: their own buckets, until the peers' cap (burst 50).
        let peers: u64 = (0..10u8)
            .map(|i| answered(&mut c, [10, 9, 0, i], 16, NOW))
            .sum();
        assert_eq!(peers, 50 - 16);
        assert_eq!(c.counters.peer_global_limited, 160 - 34);
        // A second later every cap has refilled a second's worth (burst-capped).
        assert_eq!(answered(&mut c, [10, 1, 9, 9], 16, NOW + 1_000_000_000), 16);
        let k = &c.counters;
        assert_eq!(
            k.datagrams,
            k.reflected
                + k.rate_limited
                + k.global_limited
                + k.peer_rate_limited
                + k.peer_global_limited
        );
    }

    /// A full source table takes a new source only in place of one whose
    /// bucket has refilled; until then the newcomer is refused, so cycling
    /// through more sources than the table holds earns no extra bursts.
    #[test]
    fn a_full_source_table_refuses_newcomers_until_a_bucket_refilled() {
        let policy = core(ProtocolArg::Rtprobe, None, 10, false).policy().clone();
        let mut c = Core::with_capacity(policy, 16, 4);
        let ip = |i: u8| SocketAddr::from(([10, 1, 0, i], 9));
        for i in 0..4 {
            // Each spends its whole burst.
            for seq in 0..16 {
                let mut b = probe(1, seq, 64);
                assert!(matches!(
                    c.handle(&mut b, ip(i), None, None, NOW),
                    Verdict::Reply { .. }
                ));
            }
        }
        let mut b = probe(1, 0, 64);
        assert_eq!(
            c.handle(&mut b, ip(9), None, None, NOW + 1_000_000_000),
            Verdict::Drop(Drop::RateLimited),
            "burst 16 at 10/s: 1.6 s to refill"
        );
        let mut b = probe(1, 0, 64);
        assert!(matches!(
            c.handle(&mut b, ip(9), None, None, NOW + 2_000_000_000),
            Verdict::Reply { .. }
        ));
        assert_eq!(c.sources_held(), 4);
        assert_eq!(c.counters.rate_limited, 1);
    }
}
