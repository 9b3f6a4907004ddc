#!/usr/bin/env python3
"""Writes the packet targets' seeds (fuzz/seeds/sender_echo, reflector):
well-formed datagrams of each protocol and mode, so that the fuzzer starts
past the magic numbers and length checks. Run from anywhere; the output is
committed: rerun it when a target's input layout changes."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
NTP_UNIX_OFFSET_S = 2_208_988_800
NOW_S = 1_763_850_000


def ntp(unix_s):
    return struct.pack(">II", unix_s + NTP_UNIX_OFFSET_S, 0x8000_0000)


def rtpb(flags, session, seq, size):
    p = b"RTPB" + bytes([1, flags, 0, 0]) + struct.pack(">QQq", session, seq, NOW_S * 10**9)
    return p + bytes(size - len(p))


def stamp_sender(seq, ssid, size, auth):
    p = bytearray(size)
    p[0:4] = struct.pack(">I", seq)
    if auth:  # RFC 8762 §4.2.2: timestamp at 16, estimate at 24, SSID at 26
        p[16:24] = ntp(NOW_S)
        p[24:28] = struct.pack(">HH", 0x8105, ssid)
    else:  # §4.2.1: timestamp at 4, estimate at 12, SSID at 14
        p[4:12] = ntp(NOW_S)
        p[12:16] = struct.pack(">HH", 0x8105, ssid)
    return bytes(p)


def stamp_reflector(seq, ssid, auth):
    p = bytearray(112 if auth else 44)
    if auth:  # §4.3.2
        p[0:4] = struct.pack(">I", seq)
        p[16:24] = ntp(NOW_S)
        p[24:28] = struct.pack(">HH", 0x8105, ssid)
        p[32:40] = ntp(NOW_S)
        p[48:52] = struct.pack(">I", seq)
        p[64:72] = ntp(NOW_S - 1)
        p[72:74] = struct.pack(">H", 1)
        p[80] = 64
    else:  # §4.3.1
        p[0:16] = struct.pack(">I", seq) + ntp(NOW_S) + struct.pack(">HH", 0x8105, ssid)
        p[16:24] = ntp(NOW_S)
        p[24:38] = struct.pack(">I", seq) + ntp(NOW_S - 1) + struct.pack(">H", 1)
        p[40] = 64
    return bytes(p)


def write(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# sender_echo: a selector byte (bit 0: sign), then the datagram.
state = struct.pack(">qqQH", NOW_S * 10**9 + 100_000, NOW_S * 10**9 + 120_000, 8, 0x8105)
echo = bytearray(rtpb(1 | 4 | 8, 0x1122334455667788, 7, 64))
echo[32:58] = state
write("sender_echo", "rtprobe-echo-64", bytes([0]) + bytes(echo))
write("sender_echo", "rtprobe-echo-32", bytes([0]) + rtpb(1, 0x1122334455667788, 7, 32))
write("sender_echo", "stamp-unauth-44", bytes([0]) + stamp_reflector(5, 42, False))
write("sender_echo", "stamp-auth-112", bytes([1]) + stamp_reflector(5, 42, True))


# reflector: the layout is in fuzz_targets/reflector.rs.
def policy(keyed=False, stamp=False, stateful=False, rate=0, synced=True):
    bits = keyed | stamp << 1 | stateful << 2 | rate << 3 | synced << 5
    return bytes([bits]) + struct.pack(">Ih", 1000, 37)


def datagram(payload, dt_ms=1, source=0, sign=False, rx_ns=None, ttl=None):
    has = (rx_ns is not None) | (ttl is not None) << 1 | sign << 2
    meta = struct.pack(">HBBqB", dt_ms, source, has, rx_ns or 0, ttl or 0)
    return meta + struct.pack(">H", len(payload)) + payload


rx = NOW_S * 10**9 + 500
write("reflector", "rtprobe", policy() + b"".join([
    datagram(rtpb(2, 0xABCD, 0, 64)),  # a warm-up
    datagram(rtpb(0, 0xABCD, 1, 64), rx_ns=rx),
    datagram(rtpb(0, 0xABCD, 2, 48), source=0x81),
    datagram(rtpb(0, 0xABCD, 3, 32), source=0x09),
    datagram(rtpb(1, 0xABCD, 4, 64)),  # an echo: refused
]))
write("reflector", "rtprobe-rate-limited", policy(rate=1) + b"".join(
    datagram(rtpb(0, 0x77, seq, 64), dt_ms=0) for seq in range(20)))
write("reflector", "stamp-stateful", policy(stamp=True, stateful=True) + b"".join([
    datagram(stamp_sender(0, 42, 44, False), rx_ns=rx, ttl=64),
    datagram(stamp_sender(1, 42, 100, False), ttl=63),
    datagram(stamp_sender(9, 43, 44, False), source=0x82),
]))
write("reflector", "stamp-auth", policy(keyed=True, stamp=True) + b"".join([
    datagram(stamp_sender(0, 42, 112, True), sign=True, ttl=64),
    datagram(stamp_sender(1, 42, 112, True)),  # no HMAC: auth_failed
    datagram(stamp_sender(2, 42, 128, True), sign=True, rx_ns=rx),
]))
