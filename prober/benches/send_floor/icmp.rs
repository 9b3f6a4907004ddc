//! ICMP echo (RFC 792) as the send floor's `--icmp` sends and reads it:
//! requests with a 16-bit sequence, replies as an ICMP datagram socket
//! gives them (the ICMP message) or a raw socket (with the IP header, and
//! every ICMP packet for the host, so the identifier tells ours).

/// ICMP echo request and reply.
pub const ICMP_ECHO: u8 = 8;
pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_HEADER_LEN: usize = 8;

/// The ones' complement checksum of RFC 1071, over `b`.
pub fn inet_checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An echo request of `seq` in `buf` (header, then the payload): the
/// kernel of an ICMP datagram socket sets the identifier and checksum,
/// a `raw` socket's are ours.
pub fn encode_echo(buf: &mut [u8], seq: u64, raw: bool, ident: u16) {
    buf[0] = ICMP_ECHO;
    buf[1] = 0;
    buf[2..4].fill(0);
    buf[4..6].copy_from_slice(&ident.to_be_bytes());
    buf[6..8].copy_from_slice(&(seq as u16).to_be_bytes());
    if raw {
        let c = inet_checksum(buf);
        buf[2..4].copy_from_slice(&c.to_be_bytes());
    }
}

/// The sequence number of an echo reply for us, None for anything else (a
/// raw socket sees every ICMP packet, with its IP header).
pub fn decode_reply(pkt: &[u8], raw: bool, ident: u16) -> Option<u16> {
    let icmp = if raw {
        let ihl = usize::from(*pkt.first()? & 0x0f) * 4;
        let icmp = pkt.get(ihl..)?;
        (icmp.get(4..6)? == ident.to_be_bytes()).then_some(icmp)?
    } else {
        pkt
    };
    (icmp.len() >= ICMP_HEADER_LEN && icmp[0] == ICMP_ECHO_REPLY)
        .then(|| u16::from_be_bytes([icmp[6], icmp[7]]))
}

/// The probe number a 16-bit echo sequence stands for: the latest sent
/// with those low bits (`sent` probes so far).
pub fn unwrap_seq(seq16: u16, sent: u64) -> Option<u64> {
    let last = sent.checked_sub(1)?;
    let back = (last as u16).wrapping_sub(seq16);
    last.checked_sub(u64::from(back))
}
