//! The Ethernet/IPv4/UDP frames the load generator injects. Pure.

use std::net::Ipv4Addr;

/// Ethernet + IPv4 + UDP header bytes.
pub(crate) const ETH_LEN: usize = 14;
pub(crate) const IP_LEN: usize = 20;
pub(crate) const UDP_LEN: usize = 8;
/// Smallest and largest IP packet the bench sends (1500 fills the MTU).
pub(crate) const MIN_IP_SIZE: usize = IP_LEN + UDP_LEN + 18;
pub(crate) const MAX_IP_SIZE: usize = 1500;

/// Addresses of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameSpec {
    pub(crate) dst_mac: [u8; 6],
    pub(crate) src_mac: [u8; 6],
    pub(crate) src: Ipv4Addr,
    pub(crate) dst: Ipv4Addr,
    pub(crate) src_port: u16,
    pub(crate) dst_port: u16,
    /// Total IP packet length (what `--sizes` means).
    pub(crate) ip_size: usize,
}

/// The RFC 1071 ones' complement sum, folded and inverted.
pub(crate) fn inet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from_be_bytes([c[0], 0])
        };
        sum += u32::from(w);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Builds the frame (without FCS). The UDP checksum is left 0 (allowed
/// for IPv4), so only the IP header checksum has to be right.
pub(crate) fn build(spec: &FrameSpec) -> Vec<u8> {
    let ip_size = spec.ip_size.clamp(MIN_IP_SIZE, MAX_IP_SIZE);
    let mut f = vec![0u8; ETH_LEN + ip_size];
    f[0..6].copy_from_slice(&spec.dst_mac);
    f[6..12].copy_from_slice(&spec.src_mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[ETH_LEN..ETH_LEN + IP_LEN];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&(ip_size as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&0u16.to_be_bytes());
    // Don't fragment.
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = libc::IPPROTO_UDP as u8;
    ip[12..16].copy_from_slice(&spec.src.octets());
    ip[16..20].copy_from_slice(&spec.dst.octets());
    let c = inet_checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let udp = &mut f[ETH_LEN + IP_LEN..];
    udp[0..2].copy_from_slice(&spec.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&spec.dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&((ip_size - IP_LEN) as u16).to_be_bytes());
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ip_size: usize) -> FrameSpec {
        FrameSpec {
            dst_mac: [2, 0, 0, 0, 0, 1],
            src_mac: [2, 0, 0, 0, 0, 2],
            src: Ipv4Addr::new(10, 71, 1, 2),
            dst: Ipv4Addr::new(10, 71, 2, 2),
            src_port: 4000,
            dst_port: 9,
            ip_size,
        }
    }

    #[test]
    fn checksum_of_rfc1071_example() {
        // RFC 1071 section 3 example words 0001 f203 f4f5 f6f7 sum to ddf2.
        assert_eq!(
            inet_checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
        assert_eq!(inet_checksum(&[0xff]), !0xff00);
    }

    #[test]
    fn frame_layout_and_valid_ip_checksum() {
        let f = build(&spec(64));
        assert_eq!(f.len(), 14 + 64);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        // A correct header checksums to zero.
        assert_eq!(inet_checksum(&f[14..34]), 0);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 64);
        assert_eq!(f[22], 64, "TTL");
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 9, "dst port");
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 44, "UDP length");
        // Sizes are clamped to what fits an Ethernet MTU.
        assert_eq!(build(&spec(9000)).len(), 14 + 1500);
        assert_eq!(build(&spec(10)).len(), 14 + MIN_IP_SIZE);
    }
}
