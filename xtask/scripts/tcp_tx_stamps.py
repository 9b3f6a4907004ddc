#!/usr/bin/env python3
"""A bulk TCP sender that timestamps its own sends with the kernel's socket
API (SO_TIMESTAMPING: SCHED and SOFTWARE TX stamps keyed by byte, as any
application may ask for), for `cargo xtask bench --only flows`: the same
connection's sender-queue time (qdisc entry -> driver) as rtprobe flows
reads it through its sock_ops program, from an independent interface.

  tcp_tx_stamps.py HOST PORT SECONDS

Writes 64 KiB at a time for SECONDS, then prints one JSON line:
{"local_port": N, "sends": N, "sender_queue_ms": [...]} (one value per
send whose two stamps came back).
"""

import json
import select
import socket
import struct
import sys
import time

SO_TIMESTAMPING = 37
SCM_TIMESTAMPING = SO_TIMESTAMPING
IP_RECVERR = 11
SOL_IP, SOL_IPV6 = 0, 41
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_TX_SCHED = 1 << 8
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
SO_EE_ORIGIN_TIMESTAMPING = 4
SCM_TSTAMP_SND, SCM_TSTAMP_SCHED = 0, 1


def read_stamps(s, stamps):
    """Drains the error queue: {key: {kind: ns}}."""
    while True:
        try:
            _, anc, _, _ = s.recvmsg(0, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        ts, key, kind = None, None, None
        for level, typ, data in anc:
            if level == socket.SOL_SOCKET and typ == SCM_TIMESTAMPING:
                sec, nsec = struct.unpack_from("qq", data, 0)
                ts = sec * 1_000_000_000 + nsec
            elif level in (SOL_IP, SOL_IPV6) and len(data) >= 16:
                _errno, origin, _t, _c, _pad, info, dat = struct.unpack_from("IBBBBII", data, 0)
                if origin == SO_EE_ORIGIN_TIMESTAMPING:
                    key, kind = dat, info
        if ts is not None and key is not None:
            stamps.setdefault(key, {})[kind] = ts


def main():
    host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    s = socket.create_connection((host, port))
    flags = (SOF_TIMESTAMPING_TX_SCHED | SOF_TIMESTAMPING_TX_SOFTWARE
             | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID
             | SOF_TIMESTAMPING_OPT_TSONLY)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, flags)
    chunk = b"\x00" * 65536
    stamps, sends = {}, 0
    until = time.monotonic() + secs
    while time.monotonic() < until:
        _, w, _ = select.select([s], [s], [], 0.1)
        read_stamps(s, stamps)
        if w:
            try:
                s.send(chunk, socket.MSG_DONTWAIT)
                sends += 1
            except BlockingIOError:
                pass
    time.sleep(0.3)
    read_stamps(s, stamps)
    port_local = s.getsockname()[1]
    s.close()
    queue = [(k[SCM_TSTAMP_SND] - k[SCM_TSTAMP_SCHED]) / 1e6
             for k in stamps.values()
             if SCM_TSTAMP_SND in k and SCM_TSTAMP_SCHED in k]
    print(json.dumps({"local_port": port_local, "sends": sends, "sender_queue_ms": queue}))


if __name__ == "__main__":
    main()
