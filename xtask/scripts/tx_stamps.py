#!/usr/bin/env python3
"""A sender that timestamps its own packets with the kernel's socket API
(SO_TIMESTAMPING: the SCHED and SOFTWARE TX stamps, as any application may
ask for), for `cargo xtask bench --only flows`: the time its packets spend
between the qdisc and the driver (the sender queue), read through an
interface rtprobe did not write.

  tx_stamps.py tcp HOST PORT SECONDS   a bulk TCP flow (64 KiB writes; the
                                       stamps are keyed by byte), the same
                                       connection rtprobe flows watches
  tx_stamps.py udp HOST PORT SECONDS   a 64-byte datagram every 5 ms, as a
                                       probe (send it to a port that takes
                                       UDP silently, e.g. rtprobe reflect's:
                                       a closed port's ICMP error ends it)

Prints one JSON line: {"local_port": N, "sends": N, "sender_queue_ms": [...]}
(one value per send whose two stamps came back).
"""

import json
import select
import socket
import struct
import sys
import time

SO_TIMESTAMPING = 37
# TX_SCHED, TX_SOFTWARE, SOFTWARE, OPT_ID, OPT_TSONLY
FLAGS = (1 << 8) | (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)
SOL_IP, SOL_IPV6 = 0, 41
SO_EE_ORIGIN_TIMESTAMPING = 4
SCM_TSTAMP_SND, SCM_TSTAMP_SCHED = 0, 1


def drain(s, stamps):
    """Reads the error queue into {key: {kind: ns}}."""
    while True:
        try:
            _, anc, _, _ = s.recvmsg(0, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        ts = key = kind = None
        for level, typ, data in anc:
            if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPING:
                sec, nsec = struct.unpack_from("qq", data, 0)
                ts = sec * 1_000_000_000 + nsec
            elif level in (SOL_IP, SOL_IPV6) and len(data) >= 16:
                _e, origin, _t, _c, _p, info, dat = struct.unpack_from("IBBBBII", data, 0)
                if origin == SO_EE_ORIGIN_TIMESTAMPING:
                    key, kind = dat, info
        if ts is not None and key is not None:
            stamps.setdefault(key, {})[kind] = ts


def send_tcp(s, stamps, until):
    """Writes 64 KiB whenever the socket takes it."""
    chunk, sends = b"\x00" * 65536, 0
    while time.monotonic() < until:
        _, w, _ = select.select([s], [s], [], 0.1)
        drain(s, stamps)
        if w:
            try:
                s.send(chunk, socket.MSG_DONTWAIT)
                sends += 1
            except BlockingIOError:
                pass
    return sends


def send_udp(s, stamps, until):
    """A 64-byte datagram every 5 ms."""
    sends = 0
    while time.monotonic() < until:
        s.send(b"\x00" * 64)
        sends += 1
        time.sleep(0.005)
        drain(s, stamps)
    return sends


def main():
    kind, host, port, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    if kind == "tcp":
        s = socket.create_connection((host, port))
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect((host, port))
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, FLAGS)
    stamps = {}
    until = time.monotonic() + secs
    sends = (send_tcp if kind == "tcp" else send_udp)(s, stamps, until)
    time.sleep(0.3)
    drain(s, stamps)
    local_port = s.getsockname()[1]
    s.close()
    queue = [(k[SCM_TSTAMP_SND] - k[SCM_TSTAMP_SCHED]) / 1e6
             for k in stamps.values()
             if SCM_TSTAMP_SND in k and SCM_TSTAMP_SCHED in k]
    print(json.dumps({"local_port": local_port, "sends": sends, "sender_queue_ms": queue}))


if __name__ == "__main__":
    main()
