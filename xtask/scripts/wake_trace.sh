#!/bin/bash
# Traces what runs between a probe's user-space send and its echo's RX
# stamp (issue 25 item 1): a bare veth pair, `rtprobe reflect --kernel`
# in one namespace, one rtprobe run from the other with ftrace on (sched
# switch/wakeup, IPIs, timers and hrtimers, cpu_idle, the net
# tracepoints), then wake_trace.py, which reads the CSV and the trace and
# says, per probe, which of those fell inside its send -> echo window.
#
#   sudo xtask/scripts/wake_trace.sh BIN OUTDIR [rtprobe flags...]
#   e.g. sudo xtask/scripts/wake_trace.sh target/release/rtprobe /tmp/wt --busy-poll
#
# INTERVAL=2ms sets the probes' interval (default 1ms). Set NOPOLL=1 to take the cpuidle POLL state away while it runs (idle
# vCPUs then halt at once, as on a host without a polling idle driver).
set -euo pipefail
BIN=$(realpath "$1"); OUT=$2; shift 2
mkdir -p "$OUT"
T=/sys/kernel/tracing
TAG=wt$$
A=${TAG}a; B=${TAG}b
cleanup() {
    echo 0 > $T/tracing_on || true
    echo 0 > $T/events/enable || true
    echo local > $T/trace_clock || true
    [ -n "${REFL:-}" ] && kill "$REFL" 2>/dev/null && wait "$REFL" 2>/dev/null || true
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    if [ "${NOPOLL:-0}" = 1 ]; then
        for f in /sys/devices/system/cpu/cpu*/cpuidle/state0/disable; do echo 0 > "$f"; done
    fi
}
trap cleanup EXIT
ip netns add "$A"; ip netns add "$B"
ip link add ${TAG}va netns "$A" type veth peer name ${TAG}vb netns "$B"
ip -n "$A" addr add 10.251.0.1/24 dev ${TAG}va; ip -n "$A" link set ${TAG}va up; ip -n "$A" link set lo up
ip -n "$B" addr add 10.251.0.2/24 dev ${TAG}vb; ip -n "$B" link set ${TAG}vb up; ip -n "$B" link set lo up
ip netns exec "$A" ethtool -K ${TAG}va gro on >/dev/null
ip netns exec "$A" ethtool -K ${TAG}va tx off >/dev/null
for i in $(seq 50); do ip netns exec "$A" ping -c1 -W1 10.251.0.2 >/dev/null 2>&1 && break; sleep 0.1; done
ip netns exec "$B" "$BIN" reflect --kernel --listen 10.251.0.2:5061 -q > "$OUT/reflector.txt" 2>&1 &
REFL=$!
sleep 2
if [ "${NOPOLL:-0}" = 1 ]; then
    for f in /sys/devices/system/cpu/cpu*/cpuidle/state0/disable; do echo 1 > "$f"; done
fi
echo 0 > $T/tracing_on
echo 0 > $T/events/enable
echo > $T/trace
echo tai > $T/trace_clock
echo 65536 > $T/buffer_size_kb
for e in sched/sched_switch sched/sched_wakeup irq_vectors/call_function_single_entry \
         irq_vectors/call_function_entry irq_vectors/reschedule_entry irq_vectors/local_timer_entry \
         timer/hrtimer_expire_entry power/cpu_idle net/net_dev_queue net/net_dev_start_xmit \
         net/netif_receive_skb napi/napi_poll; do
    echo 1 > $T/events/$e/enable
done
echo 1 > $T/tracing_on
ip netns exec "$A" "$BIN" --target 10.251.0.2 --count 2000 --interval "${INTERVAL:-1ms}" -q \
    --out "$OUT/probe.csv" --json "$OUT/probe.json" "$@"
echo 0 > $T/tracing_on
cat $T/trace > "$OUT/trace.txt"
python3 "$(dirname "$0")/wake_trace.py" "$OUT/probe.csv" "$OUT/trace.txt" | tee "$OUT/report.txt"
