//! Test-only: interop with scapy's STAMP layer (`scapy.contrib.stamp`),
//! an independent implementation of RFC 8762 + RFC 8972. It has the
//! unauthenticated packets only (no §4.2.2/§4.3.2 layouts, no HMAC), so
//! authenticated mode is covered by the RFC-derived unit tests of the
//! other files alone. The tests print `SKIPPED: ...` and pass when python3
//! or scapy is missing (`cargo xtask setup` installs scapy).

use super::*;
use serde_json::Value;
use std::{io::Write, path::PathBuf, process::Command};

const SCRIPT: &str = "tests/fixtures/stamp_scapy.py";

/// The helper script, if python3 can import scapy's STAMP layer.
fn scapy(test: &str) -> Option<PathBuf> {
    let ok = Command::new("python3")
        .args(["-c", "import scapy.contrib.stamp"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        // Straight to stderr: println! is captured for passing tests,
        // and a skip must show in a plain `cargo test`.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {test}: python3 with scapy not found (python3 -m pip install scapy, or cargo xtask setup)"
        );
        return None;
    }
    Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(SCRIPT))
}

fn run(script: &PathBuf, args: &[String]) -> Vec<Value> {
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout).expect("JSON from the script") {
        Value::Array(v) => v,
        other => panic!("expected a JSON list, got {other}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// scapy's Error Estimate fields against ours.
fn assert_ee(v: &Value, e: ErrorEstimate, what: &str) {
    assert_eq!(u64_of(&v["S"]), e.synchronized() as u64, "{what}: S");
    assert_eq!(u64_of(&v["Z"]), e.ptp() as u64, "{what}: Z");
    assert_eq!(u64_of(&v["scale"]), e.scale() as u64, "{what}: scale");
    assert_eq!(
        u64_of(&v["multiplier"]),
        e.multiplier() as u64,
        "{what}: multiplier"
    );
}

/// (a) scapy builds session-sender packets; rtprobe decodes them field
/// by field, reflects them, and scapy decodes the replies.
#[test]
fn scapy_sender_packets_decode_and_reflect() {
    let Some(script) = scapy("scapy_sender_packets_decode_and_reflect") else {
        return;
    };
    let cases = run(&script, &["build-sender".into()]);
    assert!(cases.len() >= 6);
    let mut replies = Vec::new();
    let mut expected = Vec::new();
    let mut state = ReflectorState::new();
    for (i, c) in cases.iter().enumerate() {
        let bytes = unhex(c["hex"].as_str().unwrap());
        let p = SenderPacket::decode(&bytes, Mode::Unauthenticated)
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(p.seq as u64, u64_of(&c["seq"]), "case {i}: seq");
        assert_eq!(p.timestamp.to_bits(), u64_of(&c["ts"]), "case {i}: ts");
        assert_ee(&c["ee"], p.error_estimate, &format!("case {i}"));
        assert_eq!(p.ssid as u64, u64_of(&c["ssid"]), "case {i}: ssid");
        // scapy converted these from exact rational seconds since 1900
        // (flooring the fraction): rounding to the nearest nanosecond
        // must give the instant back, epoch offset and era included.
        if let Some(unix_ns) = c["unix_ns"].as_i64() {
            assert_eq!(p.timestamp.to_realtime_ns(0), unix_ns, "case {i}: unix ns");
        }

        // Alternate stateless and stateful replies, NTP and PTP reflector.
        let params = ReflectParams {
            rx_realtime_ns: 1_763_850_000_000_000_000 + i as i64 * 1_000_001,
            tx_realtime_ns: 1_763_850_000_000_050_000 + i as i64 * 1_000_001,
            ttl: 60 + i as u8,
            error_estimate: ErrorEstimate::from_error_ns(i % 2 == 0, 1_000 * i as u64, i % 3 == 0),
            tai_offset_s: 37,
        };
        let seq = if i % 2 == 0 {
            Sequencing::Stateless
        } else {
            Sequencing::Stateful(&mut state)
        };
        let mut reply = Vec::new();
        reflect(&bytes, Mode::Unauthenticated, seq, &params, &mut reply).unwrap();
        assert_eq!(reply.len(), bytes.len());
        let r = ReflectorPacket::decode(&reply, Mode::Unauthenticated).unwrap();
        replies.push(hex(&reply));
        expected.push((c.clone(), r));
    }

    let decoded = run(
        &script,
        &[vec!["decode-reflector".into()], replies].concat(),
    );
    assert_eq!(decoded.len(), expected.len());
    for (i, (d, (c, r))) in decoded.iter().zip(&expected).enumerate() {
        assert_eq!(u64_of(&d["seq"]), r.seq as u64, "reply {i}: seq");
        assert_eq!(u64_of(&d["ts"]), r.timestamp.to_bits(), "reply {i}: ts");
        assert_ee(&d["ee"], r.error_estimate, &format!("reply {i}"));
        assert_eq!(d["ssid"], c["ssid"], "reply {i}: ssid copied");
        assert_eq!(
            u64_of(&d["ts_rx"]),
            r.receive_timestamp.to_bits(),
            "reply {i}: ts_rx"
        );
        assert_eq!(d["seq_sender"], c["seq"], "reply {i}: seq_sender");
        assert_eq!(d["ts_sender"], c["ts"], "reply {i}: ts_sender");
        assert_eq!(d["ee_sender"], c["ee"], "reply {i}: ee_sender");
        assert_eq!(u64_of(&d["ttl_sender"]), 60 + i as u64, "reply {i}: ttl");
        assert_eq!(u64_of(&d["mbz1"]), 0, "reply {i}: mbz1");
        assert_eq!(u64_of(&d["mbz2"]), 0, "reply {i}: mbz2");
        // RFC 8972 TLVs after the base packet come back unchanged.
        assert_eq!(d["tlvs"], c["tlvs"], "reply {i}: tlvs");
    }
    // The TLV case is really there, so the comparison above means something.
    assert!(
        expected
            .iter()
            .any(|(c, _)| c["tlvs"].as_array().is_some_and(|t| !t.is_empty()))
    );
}

/// (b) rtprobe encodes session-sender packets and reflector replies;
/// scapy decodes them field by field.
#[test]
fn rtprobe_packets_decode_in_scapy() {
    let Some(script) = scapy("rtprobe_packets_decode_in_scapy") else {
        return;
    };
    sender_packets_decode_in_scapy(&script);
    reflector_packets_decode_in_scapy(&script);
}

/// An NTP-format timestamp of `ns` since the Unix epoch.
fn ntp(ns: i64) -> Timestamp {
    Timestamp::from_realtime_ns(ns, false, 0).unwrap()
}

/// A PTP-format timestamp of `ns` since the Unix epoch (TAI offset 37 s).
fn ptp(ns: i64) -> Timestamp {
    Timestamp::from_realtime_ns(ns, true, 37).unwrap()
}

/// Session-sender packets of several lengths, seqs, stamps and error
/// estimates, as scapy decodes them.
fn sender_packets_decode_in_scapy(script: &PathBuf) {
    let senders = [
        (
            SenderPacket {
                seq: 0,
                timestamp: ntp(0),
                error_estimate: ErrorEstimate::from_error_ns(false, 0, false),
                ssid: 0,
            },
            44,
        ),
        (
            SenderPacket {
                seq: 123_456,
                timestamp: ntp(1_763_850_000_987_654_321),
                error_estimate: ErrorEstimate::from_error_ns(true, 1_500_000, false),
                ssid: 0xBEEF,
            },
            44 + 64,
        ),
        (
            SenderPacket {
                seq: u32::MAX,
                timestamp: ptp(1_763_850_000_000_000_001),
                error_estimate: ErrorEstimate::from_error_ns(true, 50, true),
                ssid: u16::MAX,
            },
            1472,
        ),
        (
            SenderPacket {
                seq: 77,
                // NTP era 1 (2040).
                timestamp: ntp(2_208_988_800_500_000_000),
                error_estimate: ErrorEstimate::new(false, false, 63, 255).unwrap(),
                ssid: 1,
            },
            48,
        ),
    ];
    let mut args = vec!["decode-sender".to_string()];
    for (p, len) in &senders {
        let mut v = Vec::new();
        p.encode(Mode::Unauthenticated, *len, &mut v).unwrap();
        args.push(hex(&v));
    }
    let decoded = run(script, &args);
    assert_eq!(decoded.len(), senders.len());
    for (i, (d, (p, _))) in decoded.iter().zip(&senders).enumerate() {
        assert_eq!(u64_of(&d["seq"]), p.seq as u64, "sender {i}: seq");
        assert_eq!(u64_of(&d["ts"]), p.timestamp.to_bits(), "sender {i}: ts");
        assert_ee(&d["ee"], p.error_estimate, &format!("sender {i}"));
        assert_eq!(u64_of(&d["ssid"]), p.ssid as u64, "sender {i}: ssid");
        assert_eq!(u64_of(&d["mbz"]), 0, "sender {i}: mbz");
        assert_eq!(d["tlvs"], Value::Array(vec![]), "sender {i}: padding");
    }
}

/// Reflector packets, both timestamp formats, as scapy decodes them.
fn reflector_packets_decode_in_scapy(script: &PathBuf) {
    let reflectors = [
        ReflectorPacket {
            seq: 1,
            timestamp: ntp(1_763_850_000_000_020_000),
            error_estimate: ErrorEstimate::from_error_ns(true, 1_000, false),
            ssid: 0x0102,
            receive_timestamp: ntp(1_763_850_000_000_000_999),
            sender_seq: 0xFFFF_FFFE,
            sender_timestamp: ptp(1_763_849_999_999_999_999),
            sender_error_estimate: ErrorEstimate::from_error_ns(false, 7, true),
            sender_ttl: 255,
        },
        ReflectorPacket {
            seq: 0,
            timestamp: ptp(0),
            error_estimate: ErrorEstimate::new(false, true, 0, 1).unwrap(),
            ssid: 0,
            receive_timestamp: ptp(1),
            sender_seq: 0,
            sender_timestamp: ntp(-1),
            sender_error_estimate: ErrorEstimate::new(true, false, 33, 200).unwrap(),
            sender_ttl: 1,
        },
    ];
    let mut args = vec!["decode-reflector".to_string()];
    for (i, r) in reflectors.iter().enumerate() {
        let mut v = Vec::new();
        r.encode(Mode::Unauthenticated, 44 + 16 * i, &mut v)
            .unwrap();
        args.push(hex(&v));
    }
    let decoded = run(script, &args);
    assert_eq!(decoded.len(), reflectors.len());
    for (i, (d, r)) in decoded.iter().zip(&reflectors).enumerate() {
        assert_eq!(u64_of(&d["seq"]), r.seq as u64, "reflector {i}: seq");
        assert_eq!(u64_of(&d["ts"]), r.timestamp.to_bits(), "reflector {i}: ts");
        assert_ee(&d["ee"], r.error_estimate, &format!("reflector {i}"));
        assert_eq!(u64_of(&d["ssid"]), r.ssid as u64, "reflector {i}: ssid");
        assert_eq!(
            u64_of(&d["ts_rx"]),
            r.receive_timestamp.to_bits(),
            "reflector {i}: ts_rx"
        );
        assert_eq!(
            u64_of(&d["seq_sender"]),
            r.sender_seq as u64,
            "reflector {i}: seq_sender"
        );
        assert_eq!(
            u64_of(&d["ts_sender"]),
            r.sender_timestamp.to_bits(),
            "reflector {i}: ts_sender"
        );
        assert_ee(
            &d["ee_sender"],
            r.sender_error_estimate,
            &format!("reflector {i} sender"),
        );
        assert_eq!(
            u64_of(&d["ttl_sender"]),
            r.sender_ttl as u64,
            "reflector {i}: ttl"
        );
        assert_eq!(u64_of(&d["mbz1"]), 0);
        assert_eq!(u64_of(&d["mbz2"]), 0);
    }
}
