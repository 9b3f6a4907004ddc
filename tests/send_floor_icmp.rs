//! The send floor's ICMP echo (prober/benches/send_floor/icmp.rs): what it
//! sends is a valid echo request, and of what a raw socket hands it, only
//! echo replies with its identifier count, filed under the probe they
//! answer. (The bench harness runs no tests, so they live here.)

#[path = "../prober/benches/send_floor/icmp.rs"]
mod icmp;

use icmp::*;

#[test]
fn echo_requests_and_replies() {
    let mut buf = [0u8; ICMP_HEADER_LEN + 5];
    encode_echo(&mut buf, 0x1_0005, true, 0xbeef);
    assert_eq!(&buf[..2], &[ICMP_ECHO, 0]);
    assert_eq!(&buf[4..8], &[0xbe, 0xef, 0, 5]);
    assert_eq!(inet_checksum(&buf), 0, "a checksummed message sums to 0");
    // A datagram socket's kernel fills the identifier and checksum.
    let mut dgram = [0u8; ICMP_HEADER_LEN];
    encode_echo(&mut dgram, 7, false, 0);
    assert_eq!(dgram, [ICMP_ECHO, 0, 0, 0, 0, 0, 0, 7]);
    // The reply as a raw socket sees it: a 20-byte IP header first.
    let mut reply = vec![0x45u8; 20];
    reply.extend_from_slice(&buf);
    reply[20] = ICMP_ECHO_REPLY;
    assert_eq!(decode_reply(&reply, true, 0xbeef), Some(5));
    assert_eq!(decode_reply(&reply, true, 0xbeee), None, "another ping's");
    assert_eq!(decode_reply(&reply[20..], false, 0), Some(5));
    assert_eq!(decode_reply(&reply[..24], true, 0xbeef), None, "cut short");
    reply[20] = ICMP_ECHO;
    assert_eq!(decode_reply(&reply, true, 0xbeef), None, "a request");
}

#[test]
fn sixteen_bit_sequences_stand_for_the_latest_probe() {
    assert_eq!(unwrap_seq(5, 6), Some(5));
    assert_eq!(unwrap_seq(5, 0x1_0006), Some(0x1_0005));
    assert_eq!(unwrap_seq(0xffff, 0x1_0001), Some(0xffff));
    assert_eq!(unwrap_seq(7, 6), None, "not sent yet");
    assert_eq!(unwrap_seq(0, 0), None);
}
