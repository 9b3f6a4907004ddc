//! The known-peers allowlist both reflectors share: `--peer PREFIX` and
//! the addresses of a `--peers` targets file, as a set of prefixes.
//! Sources inside it draw from budgets of their own ([`super::RateLimits`]),
//! so that a flood from elsewhere cannot spend them. Pure: the user-space
//! reflector asks [`Peers::contains`] per datagram, the in-kernel one gets
//! [`Peers::lpm_entries`] in an LPM trie.
//!
//! A peer is recognised by its source address alone, which anyone can
//! forge: a flood forging a peer's address spends that peer's own bucket
//! and at most the peers' total, never the other peers' buckets or the
//! strangers' budget. Only authentication (STAMP `--auth-key`) proves a
//! sender; the allowlist protects peers from a flood of strangers.

use std::{
    collections::HashSet,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use xdp_common::{AddrKey, addr_key, addr_key_is_v4};

/// Most prefixes in the allowlist: the in-kernel reflector's LPM trie
/// holds this many (`xdp_common::REFLECTOR_PEERS_MAX`), and a targets file
/// names at most 10 000 targets.
pub(crate) const MAX_PEERS: usize = xdp_common::REFLECTOR_PEERS_MAX as usize;

/// An address prefix, `192.0.2.0/24` or `2001:db8::/48`; a bare address is
/// the host alone (/32, /128). The bits past the length are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    pub(crate) addr: IpAddr,
    pub(crate) len: u8,
}

impl Prefix {
    /// `addr/len` with the host bits cleared; None if `len` is too long
    /// for the family.
    pub(crate) fn new(addr: IpAddr, len: u8) -> Option<Self> {
        // ::ffff:a.b.c.d/120 is an IPv4 prefix written as IPv6.
        let (addr, len) = match addr {
            IpAddr::V6(a) if len >= 96 && a.to_ipv4_mapped().is_some() => {
                (IpAddr::V4(a.to_ipv4_mapped().expect("mapped")), len - 96)
            }
            a => (a, len),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return None;
        }
        let addr = match addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Some(Prefix { addr, len })
    }

    /// The host `addr` alone.
    pub(crate) fn host(addr: IpAddr) -> Self {
        let len = if addr.is_ipv4() { 32 } else { 128 };
        Prefix::new(addr, len).expect("a host's length")
    }

    /// The prefix over [`AddrKey`]s (IPv4 as IPv4-mapped IPv6: 96 bits
    /// more), as the LPM trie keys it.
    pub(crate) fn key_len(&self) -> u8 {
        if self.addr.is_ipv4() {
            self.len + 96
        } else {
            self.len
        }
    }

    pub(crate) fn key(&self) -> AddrKey {
        addr_key(self.addr)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Prefix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let example = "give ADDR or ADDR/LEN, e.g. 192.0.2.0/24 or 2001:db8::/48";
        let (a, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or prefix: {example}"))?;
        let Some(len) = len else {
            return Ok(Prefix::host(addr));
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len: u8 = len
            .parse()
            .ok()
            .filter(|&l| l <= max)
            .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}: {example}"))?;
        Ok(Prefix::new(addr, len).expect("length checked"))
    }
}

/// As written on the command line ("192.0.2.0/24"), in a TOML file too.
impl<'de> serde::Deserialize<'de> for Prefix {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The allowlist: prefixes of either family, looked up by source address.
#[derive(Debug, Clone, Default)]
pub struct Peers {
    /// Normalised, sorted, without duplicates.
    prefixes: Vec<Prefix>,
    /// Keys by key length, longest first: a lookup masks the source once
    /// per length present (a fleet has one or two: /32 and /128).
    by_len: Vec<(u8, HashSet<AddrKey>)>,
}

impl Peers {
    /// The set of `prefixes` (duplicates dropped). Refused past
    /// [`MAX_PEERS`].
    pub fn new(prefixes: impl IntoIterator<Item = Prefix>) -> Result<Self, String> {
        let mut prefixes: Vec<Prefix> = prefixes.into_iter().collect();
        prefixes.sort();
        prefixes.dedup();
        if prefixes.len() > MAX_PEERS {
            return Err(format!(
                "{} known peers: at most {MAX_PEERS}; give wider prefixes (--peer 192.0.2.0/24)",
                prefixes.len()
            ));
        }
        let mut by_len: Vec<(u8, HashSet<AddrKey>)> = Vec::new();
        for p in &prefixes {
            let len = p.key_len();
            match by_len.iter_mut().find(|(l, _)| *l == len) {
                Some((_, set)) => {
                    set.insert(p.key());
                }
                None => by_len.push((len, HashSet::from([p.key()]))),
            }
        }
        by_len.sort_by_key(|b| std::cmp::Reverse(b.0));
        Ok(Peers { prefixes, by_len })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.prefixes.len()
    }

    pub(crate) fn prefixes(&self) -> &[Prefix] {
        &self.prefixes
    }

    /// Whether `ip` is inside one of the prefixes (an IPv4-mapped IPv6
    /// address, as a dual-stack socket reports an IPv4 peer, as IPv4).
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        self.contains_key(&addr_key(ip))
    }

    /// [`Self::contains`] for a source as the map key both reflectors use.
    pub(crate) fn contains_key(&self, key: &AddrKey) -> bool {
        // An IPv4 source (keyed IPv4-mapped) only against IPv4 prefixes,
        // which are the keys of 96 bits and more: IPv6's ::/0 is not every
        // IPv4 address. Masked to 96 bits or more, an IPv6 source keeps
        // its own first 96 bits and so never equals an IPv4 key.
        let v4 = addr_key_is_v4(key);
        self.by_len
            .iter()
            .any(|(len, set)| (!v4 || *len >= 96) && set.contains(&mask(key, *len)))
    }

    /// (prefix length over the 128-bit key, key) for the in-kernel
    /// reflector's LPM trie.
    #[cfg(test)]
    pub(crate) fn lpm_entries(&self) -> impl Iterator<Item = (u32, AddrKey)> + '_ {
        self.prefixes
            .iter()
            .map(|p| (u32::from(p.key_len()), p.key()))
    }
}

/// `key` with the bits past `len` cleared.
fn mask(key: &AddrKey, len: u8) -> AddrKey {
    let bits = u128::from_be_bytes(*key);
    let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    (bits & m).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_parse_normalise_and_refuse_with_an_example() {
        assert_eq!(p("192.0.2.7/24").to_string(), "192.0.2.0/24");
        assert_eq!(p("192.0.2.7").to_string(), "192.0.2.7/32");
        assert_eq!(p("2001:db8::1/48").to_string(), "2001:db8::/48");
        assert_eq!(p("[2001:db8::1]").to_string(), "2001:db8::1/128");
        assert_eq!(p("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert_eq!(p("::ffff:10.1.2.3/120").to_string(), "10.1.2.0/24");
        for bad in ["", "db-1", "192.0.2.0/33", "2001:db8::/129", "10.0.0.0/x"] {
            let e = bad.parse::<Prefix>().unwrap_err();
            assert!(e.contains("e.g. 192.0.2.0/24"), "{bad}: {e}");
        }
    }

    #[test]
    fn lookups_match_prefixes_of_their_own_family_only() {
        let peers = Peers::new([
            p("10.77.0.1"),
            p("10.78.0.0/16"),
            p("fd77::/64"),
            p("2001:db8::5"),
            p("10.77.0.1"),
        ])
        .unwrap();
        assert_eq!(peers.len(), 4, "the duplicate is dropped");
        for yes in [
            "10.77.0.1",
            "10.78.200.3",
            "fd77::1234:5",
            "2001:db8::5",
            "::ffff:10.77.0.1",
        ] {
            assert!(peers.contains(ip(yes)), "{yes}");
        }
        for no in [
            "10.77.0.2",
            "10.79.0.1",
            "fd77:0:0:1::1",
            "2001:db8::6",
            "::a4d:1",
        ] {
            assert!(!peers.contains(ip(no)), "{no}");
        }
        // ::/0 is every IPv6 address, not every IPv4 one; 0.0.0.0/0 the
        // other way round.
        let all6 = Peers::new([p("::/0")]).unwrap();
        assert!(all6.contains(ip("2001:db8::1")) && !all6.contains(ip("192.0.2.1")));
        let all4 = Peers::new([p("0.0.0.0/0")]).unwrap();
        assert!(all4.contains(ip("192.0.2.1")) && !all4.contains(ip("2001:db8::1")));
        assert!(!Peers::default().contains(ip("192.0.2.1")));
    }

    #[test]
    fn lpm_entries_key_ipv4_as_mapped_with_96_more_bits() {
        let peers = Peers::new([p("10.78.0.0/16"), p("fd77::/64")]).unwrap();
        let e: Vec<(u32, AddrKey)> = peers.lpm_entries().collect();
        assert_eq!(e[0].0, 112);
        assert_eq!(e[0].1, addr_key(ip("10.78.0.0")));
        assert_eq!(e[1], (64, addr_key(ip("fd77::"))));
    }

    #[test]
    fn too_many_peers_are_refused_with_what_to_do() {
        let many = (0..=MAX_PEERS as u32).map(|i| Prefix::host(IpAddr::V4(Ipv4Addr::from(i))));
        let e = Peers::new(many).unwrap_err();
        assert!(e.contains("wider prefixes"), "{e}");
    }
}
