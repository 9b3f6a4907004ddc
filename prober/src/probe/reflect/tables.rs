//! The reflector's bounded state per source: the session table (per full
//! source address and session id or SSID) and the rate-limit buckets (per
//! IPv4 address or IPv6 /64, [`rate_key`]). Both are LRU maps of a fixed
//! size, so each datagram costs constant work at any number of sources.

use std::{
    net::{IpAddr, SocketAddr},
    num::NonZeroUsize,
};

use lru::LruCache;
use xdp_common::{AddrKey, addr_key, rate_key};

/// Sessions (source + session id or SSID) remembered at once. About 130
/// bytes each (see `table_memory_per_entry`): 8.5 MiB when full.
pub const MAX_SESSIONS: usize = 65_536;
/// Sources with a rate-limit bucket at once: the per-source limit holds
/// for this many sources seen within a bucket's refill time. About 100
/// bytes each (see `table_memory_per_entry`): 13 MiB when full.
pub const MAX_SOURCES: usize = 131_072;

/// One session's state. Recency lives in the LRU order, not here.
#[derive(Debug, Clone, Copy)]
pub(super) struct Session {
    /// Probes of this session (not warm-ups) seen, for the echo's state.
    pub(super) received: u64,
    /// STAMP stateful: the sequence number of the next reply.
    pub(super) next_seq: u32,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last_ns: i64,
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
    /// /64; burst: a tenth of a second's worth, at least 16; `rate_pps` 0:
    /// no limit). A new source takes the least recently seen source's
    /// place in a full table only if that bucket has refilled: forgetting
    /// it then changes nothing, while forgetting a half-empty bucket would
    /// hand its source a fresh burst. Otherwise the new source is refused
    /// until one has.
    pub(super) fn admit(&mut self, ip: IpAddr, rate_pps: u32, now_ns: i64) -> bool {
        if rate_pps == 0 {
            return true;
        }
        let rate = rate_pps as f64;
        let burst = (rate / 10.0).max(16.0);
        let refill = |b: &Bucket| {
            let dt_s = (now_ns - b.last_ns).max(0) as f64 / 1e9;
            (b.tokens + dt_s * rate).min(burst)
        };
        let take = |b: &mut Bucket| {
            b.tokens = refill(b);
            b.last_ns = now_ns;
            let ok = b.tokens >= 1.0;
            if ok {
                b.tokens -= 1.0;
            }
            ok
        };
        let key = rate_key(&addr_key(ip));
        if let Some(b) = self.0.get_mut(&key) {
            return take(b);
        }
        if self.0.len() >= self.0.cap().get() {
            let refilled = self.0.peek_lru().is_some_and(|(_, b)| refill(b) >= burst);
            if !refilled {
                return false;
            }
            self.0.pop_lru();
        }
        let mut b = Bucket {
            tokens: burst,
            last_ns: now_ns,
        };
        let ok = take(&mut b);
        self.0.push(key, b);
        ok
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{super::testutil::*, *};
    use crate::{
        probe::reflect::{Core, Drop, Verdict},
        spec::remote::ProtocolArg,
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
