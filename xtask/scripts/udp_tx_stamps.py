#!/usr/bin/env python3
"""A UDP sender that timestamps its own datagrams with the kernel's socket
API (SO_TIMESTAMPING: SCHED and SOFTWARE TX stamps, by datagram), for
`cargo xtask bench --only flows`: the sender-queue time a UDP datagram
spends in a queue, from an interface rtprobe did not write, next to the
probe's (rtprobe's probes are UDP) and to a TCP flow's.

  udp_tx_stamps.py HOST PORT SECONDS

Sends a 64-byte datagram every 5 ms for SECONDS, then prints one JSON
line: {"sends": N, "sender_queue_ms": [...]}. Send it to a port that
takes UDP silently (e.g. an `rtprobe reflect`, which drops what is not a
probe): a closed port's ICMP error would end the run.
"""

import json
import socket
import struct
import sys
import time

SO_TIMESTAMPING = 37
FLAGS = (1 << 8) | (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)  # SCHED, TX_SW, SW, OPT_ID, TSONLY
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


def main():
    host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((host, port))
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, FLAGS)
    stamps, sends = {}, 0
    until = time.monotonic() + secs
    while time.monotonic() < until:
        s.send(b"\x00" * 64)
        sends += 1
        time.sleep(0.005)
        drain(s, stamps)
    time.sleep(0.3)
    drain(s, stamps)
    queue = [(k[SCM_TSTAMP_SND] - k[SCM_TSTAMP_SCHED]) / 1e6
             for k in stamps.values()
             if SCM_TSTAMP_SND in k and SCM_TSTAMP_SCHED in k]
    print(json.dumps({"sends": sends, "sender_queue_ms": queue}))


if __name__ == "__main__":
    main()
