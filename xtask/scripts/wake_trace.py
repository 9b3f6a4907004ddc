#!/usr/bin/env python3
"""What ran between each probe's user-space send and its echo's RX stamp.

    wake_trace.py PROBE.csv TRACE.txt

PROBE.csv is an rtprobe CSV (send_ns, echo_ns on CLOCK_REALTIME), TRACE.txt
an ftrace text dump taken with trace_clock=tai (CLOCK_TAI, which is
CLOCK_REALTIME plus the TAI offset; the offset is read here and taken out).
ftrace prints microseconds, so a window is widened by 1 µs at each end.
Prints, per kind of event, the share of probes with one in their window and
the like-for-like RTT p50 of the probes with and without, then the events
around the median probe.
"""
import bisect
import re
import sys
import time

LINE = re.compile(r"^\s*(.+)-(\d+)\s+\[(\d+)\]\s+\S+\s+(\d+\.\d+): (\w+): (.*)$")


def kinds(name, rest):
    """The kinds of an event (one event may be several)."""
    if name == "sched_wakeup":
        comm = re.search(r"comm=(\S+)", rest)
        who = comm.group(1) if comm else "?"
        return ["wakeup of rtprobe" if who.startswith("rtprobe") else "wakeup of another task"]
    if name == "sched_switch":
        return ["context switch"]
    if name in ("call_function_single_entry", "call_function_entry", "reschedule_entry"):
        return ["IPI"]
    if name in ("local_timer_entry", "hrtimer_expire_entry"):
        return ["timer interrupt or hrtimer"]
    if name == "cpu_idle":
        return ["idle exit"] if "state=4294967295" in rest else ["idle entry"]
    return []


def read_csv(path):
    rows = []
    header = None
    for line in open(path):
        if line.startswith("#"):
            continue
        f = line.rstrip("\n").split(",")
        if header is None:
            header = {n: i for i, n in enumerate(f)}
            continue
        send, echo = f[header["send_ns"]], f[header["echo_ns"]]
        if send and echo:
            rows.append((int(f[header["seq"]]), int(send), int(echo)))
    return rows


def read_trace(path, tai_offset_us):
    events = []
    for line in open(path):
        m = LINE.match(line)
        if not m:
            continue
        task, pid, cpu, ts, name, rest = m.groups()
        events.append((float(ts) * 1e6 - tai_offset_us, int(cpu), task.strip(), name, rest))
    events.sort()
    return events


def p50(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def main():
    probes = read_csv(sys.argv[1])
    tai_offset_us = (time.clock_gettime(time.CLOCK_TAI) - time.time()) * 1e6
    tai_offset_us = round(tai_offset_us / 1e6) * 1e6  # whole seconds
    events = read_trace(sys.argv[2], tai_offset_us)
    times = [e[0] for e in events]
    if not probes or not events:
        sys.exit("no answered probe or no trace event")
    if not (times[0] <= probes[0][1] / 1e3 <= times[-1]):
        sys.exit("the trace does not cover the probes (trace_clock not tai?)")
    per_kind = {}
    rtts = []
    windows = []
    for seq, send, echo in probes:
        lo = bisect.bisect_left(times, send / 1e3 - 1)
        hi = bisect.bisect_right(times, echo / 1e3 + 1)
        seen = set()
        for e in events[lo:hi]:
            seen.update(kinds(e[3], e[4]))
        rtt_us = (echo - send) / 1e3
        rtts.append(rtt_us)
        windows.append((rtt_us, seq, send, echo, seen))
    all_kinds = sorted({k for w in windows for k in w[4]})
    print(f"{len(probes)} answered probes, like-for-like RTT p50 {p50(rtts):.1f} µs")
    print(f"{'event in the send -> echo window':<34}{'probes':>8}{'p50 with':>11}{'p50 without':>13}")
    for k in all_kinds:
        w = [x[0] for x in windows if k in x[4]]
        wo = [x[0] for x in windows if k not in x[4]]
        fmt = lambda v: f"{p50(v):.1f} µs" if v else "-"
        print(f"{k:<34}{100 * len(w) / len(windows):>7.1f}%{fmt(w):>11}{fmt(wo):>13}")
    windows.sort()
    rtt_us, seq, send, echo, _ = windows[len(windows) // 2]
    print(f"\nthe median probe (seq {seq}, {rtt_us:.1f} µs), from 120 µs before its send, times from the send:")
    lo = bisect.bisect_left(times, send / 1e3 - 120)
    hi = bisect.bisect_right(times, echo / 1e3 + 2)
    for ts, cpu, task, name, rest in events[lo:hi]:
        mark = " <- echo RX stamp" if abs(ts - echo / 1e3) < 1 else ""
        print(f"  {ts - send / 1e3:+8.1f} µs cpu{cpu} {task[:16]:<16} {name}: {rest[:90]}{mark}")


if __name__ == "__main__":
    main()
