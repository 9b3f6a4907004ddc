//! Which datagrams a reflector may answer by their addresses alone: never
//! one from a source no single host can have (broadcast, multicast,
//! unspecified, 0/8, 240/4, a subnet broadcast of this host), never one
//! sent to a broadcast or multicast destination, and a loopback source
//! only on a loopback interface. The same rules as the in-kernel
//! reflector's, and the reason the kernel has `icmp_echo_ignore_broadcasts`:
//! a reply to such a datagram goes to many hosts or to none that asked.
//!
//! Kernel interface: getifaddrs(3) (netlink RTM_GETADDR) for this
//! namespace's addresses, prefixes and loopback interfaces; the
//! destination and interface of each datagram come from IP_PKTINFO /
//! IPV6_RECVPKTINFO (Linux >= 2.2), see [`super::cmsg`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result};

/// What this host's interfaces say about addresses: the IPv4 subnet
/// broadcasts of its addresses and which interfaces are loopback.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LocalNets {
    broadcasts: Vec<Ipv4Addr>,
    loopback_ifindex: Vec<u32>,
}

impl LocalNets {
    /// From this host's IPv4 addresses with their prefix lengths (and any
    /// broadcast address set explicitly) and its loopback interfaces.
    pub(crate) fn new(
        v4: impl IntoIterator<Item = (Ipv4Addr, u8, Option<Ipv4Addr>)>,
        loopback_ifindex: Vec<u32>,
    ) -> Self {
        let mut broadcasts = Vec::new();
        for (addr, prefix, explicit) in v4 {
            // /31 (RFC 3021) and /32 have no broadcast address.
            if prefix >= 31 {
                continue;
            }
            let host_mask = u32::MAX >> prefix;
            broadcasts.push(Ipv4Addr::from(u32::from(addr) | host_mask));
            // glibc's getifaddrs puts the address itself in the broadcast
            // field when the kernel gave none: only another address of
            // the subnet is a broadcast set with `brd`.
            let in_subnet = |b: Ipv4Addr| (u32::from(b) ^ u32::from(addr)) & !host_mask == 0;
            broadcasts.extend(explicit.filter(|&b| b != addr && in_subnet(b)));
        }
        broadcasts.sort_unstable();
        broadcasts.dedup();
        Self {
            broadcasts,
            loopback_ifindex,
        }
    }

    /// This namespace's, from getifaddrs.
    pub(crate) fn read() -> Result<Self> {
        use nix::net::if_::{InterfaceFlags, if_nametoindex};
        let mut v4 = Vec::new();
        let mut loopback = Vec::new();
        for a in nix::ifaddrs::getifaddrs().context("getifaddrs")? {
            if a.flags.contains(InterfaceFlags::IFF_LOOPBACK)
                && let Ok(i) = if_nametoindex(a.interface_name.as_str())
                && !loopback.contains(&i)
            {
                loopback.push(i);
            }
            let Some(ip) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) else {
                continue;
            };
            let prefix = a
                .netmask
                .as_ref()
                .and_then(|m| m.as_sockaddr_in())
                .map_or(32, |m| u32::from(m.ip()).count_ones() as u8);
            let explicit = a
                .broadcast
                .as_ref()
                .and_then(|b| b.as_sockaddr_in())
                .map(|b| b.ip());
            v4.push((ip.ip(), prefix, explicit));
        }
        Ok(Self::new(v4, loopback))
    }

    /// A source no probe can honestly come from, or a loopback source
    /// that arrived on another interface (`ifindex` None: not known).
    pub(crate) fn is_bad_source(&self, src: IpAddr, ifindex: Option<u32>) -> bool {
        let on_loopback = ifindex.is_none_or(|i| self.loopback_ifindex.contains(&i));
        match src.to_canonical() {
            IpAddr::V4(a) => {
                let first = a.octets()[0];
                // 0/8: "this network"; 224/4 multicast; 240/4 reserved,
                // 255.255.255.255 included.
                first == 0
                    || first >= 224
                    || (a.is_loopback() && !on_loopback)
                    || self.broadcasts.binary_search(&a).is_ok()
            }
            IpAddr::V6(a) => {
                a.is_multicast() || a.is_unspecified() || (a.is_loopback() && !on_loopback)
            }
        }
    }

    /// A destination that is not one host's unicast address: broadcast
    /// (limited or a local subnet's), multicast, or no address at all
    /// (`None`: not known, taken as unicast).
    pub(crate) fn is_not_for_us(&self, dst: Option<IpAddr>) -> bool {
        match dst.map(|d| d.to_canonical()) {
            None => false,
            Some(IpAddr::V4(a)) => {
                let first = a.octets()[0];
                first == 0 || first >= 224 || self.broadcasts.binary_search(&a).is_ok()
            }
            Some(IpAddr::V6(a)) => a.is_multicast() || a == Ipv6Addr::UNSPECIFIED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets() -> LocalNets {
        LocalNets::new(
            [
                ("10.77.0.2".parse().unwrap(), 24, None),
                ("192.0.2.9".parse().unwrap(), 31, None),
                ("198.51.100.1".parse().unwrap(), 32, None),
                ("127.0.0.1".parse().unwrap(), 8, None),
                (
                    "172.16.0.1".parse().unwrap(),
                    16,
                    Some("172.16.0.0".parse().unwrap()),
                ),
                // What glibc reports for an address added without `brd`.
                (
                    "10.9.0.1".parse().unwrap(),
                    24,
                    Some("10.9.0.1".parse().unwrap()),
                ),
                (
                    "10.10.0.1".parse().unwrap(),
                    24,
                    Some("10.11.0.255".parse().unwrap()),
                ),
            ],
            vec![1],
        )
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn sources_no_single_host_can_have_are_bad() {
        let n = nets();
        for bad in [
            "255.255.255.255",
            "224.0.0.1",
            "239.1.2.3",
            "240.0.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "10.77.0.255",
            "172.16.255.255",
            "172.16.0.0",
            "127.255.255.255",
            "ff02::1",
            "ff0e::1",
            "::",
            "::ffff:224.0.0.1",
        ] {
            assert!(n.is_bad_source(ip(bad), Some(3)), "{bad}");
        }
        for good in [
            "10.9.0.1",
            "10.11.0.255",
            "10.77.0.1",
            "10.77.0.254",
            "192.0.2.8",
            "192.0.2.9",
            "198.51.100.2",
            "223.255.255.254",
            "fd77::1",
            "fe80::1",
            "::ffff:10.77.0.1",
        ] {
            assert!(!n.is_bad_source(ip(good), Some(3)), "{good}");
        }
    }

    #[test]
    fn loopback_sources_only_on_loopback() {
        let n = nets();
        for lo in ["127.0.0.1", "127.1.2.3", "::1"] {
            assert!(!n.is_bad_source(ip(lo), Some(1)), "{lo} on lo");
            assert!(!n.is_bad_source(ip(lo), None), "{lo}, interface unknown");
            assert!(n.is_bad_source(ip(lo), Some(3)), "{lo} on eth");
        }
        // Before the interfaces were read, no interface is loopback.
        assert!(LocalNets::default().is_bad_source(ip("127.0.0.1"), Some(1)));
    }

    #[test]
    fn broadcast_and_multicast_destinations_are_not_for_us() {
        let n = nets();
        for not in [
            "255.255.255.255",
            "10.77.0.255",
            "224.0.0.1",
            "239.255.255.250",
            "0.0.0.0",
            "ff02::1",
            "ff05::1:3",
            "::",
        ] {
            assert!(n.is_not_for_us(Some(ip(not))), "{not}");
        }
        for ours in [
            "10.77.0.2",
            "10.9.0.1",
            "127.0.0.1",
            "192.0.2.9",
            "fd77::2",
            "::1",
        ] {
            assert!(!n.is_not_for_us(Some(ip(ours))), "{ours}");
        }
        assert!(!n.is_not_for_us(None));
    }

    #[test]
    fn this_hosts_interfaces_are_read() {
        let n = LocalNets::read().unwrap();
        // Its own addresses are never a broadcast (glibc's quirk above).
        for a in nix::ifaddrs::getifaddrs().unwrap() {
            if let Some(v4) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
                assert!(!n.is_not_for_us(Some(v4.ip().into())), "{n:?} {}", v4.ip());
            }
        }
        // Every namespace has lo, and 127.0.0.1 comes from it.
        assert!(!n.loopback_ifindex.is_empty(), "{n:?}");
        assert!(!n.is_bad_source(ip("127.0.0.1"), Some(n.loopback_ifindex[0])));
    }
}
