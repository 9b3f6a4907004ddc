//! The like-for-like RTT on a bare veth pair: two namespaces, `rtprobe
//! reflect --kernel` in one with its peer prepared as the reflector asks
//! (GRO requested, TX checksums off), and in the other, taking turns round
//! by round: `ping`, `rtprobe --target` (default and `--busy-poll`) and
//! the send-path floor (`cargo bench --bench send_floor`: one thread with
//! rtprobe's socket options and datagram) with its variants: without TX
//! stamps, with a second thread in poll(2), and sending ICMP echo as ping
//! does (with and without TX stamps), which B's kernel answers instead of
//! the XDP reflector. Each is
//! measured from the user-space send to the echo's kernel RX stamp; a
//! figure is the median of its rounds' medians, a ratio the median of
//! the ratios taken round by round; the verdict is rtprobe's over ping's.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{
    bed::Bed,
    peers::{median, parse_ping_rtts_us},
    run::{Ctx, have, in_ns, output_text, user_start_rtts_us},
    table::{Row, row},
};

/// The goal: rtprobe's user send -> echo RX median at most ping's.
pub(super) const TARGET_RATIO_VS_PING: f64 = 1.0;

const A_IP: &str = "10.78.0.1";
const B_IP: &str = "10.78.0.2";
const PORT: &str = "5061";
/// What `rtprobe reflect` prints once it answers.
const READY_LINE: &str = "rtprobe reflect: answering ";

/// The pair section's bed: A and B over IPv4, A's veth prepared as
/// `rtprobe reflect --kernel` asks of a veth's peer.
fn pair_bed(ctx: &Ctx) -> Result<Bed> {
    Bed::new(
        ctx,
        "bench-pair",
        &[
            "--a-addr",
            &format!("{A_IP}/24"),
            "--b-addr",
            &format!("{B_IP}/24"),
            "--xdp-peer",
        ],
    )
}

/// `rtprobe reflect --kernel` in namespace B; SIGTERM when dropped.
struct KernelReflector(Child);

impl KernelReflector {
    fn start(ctx: &Ctx, p: &Bed) -> Result<Self> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &p.b])
            .arg(&ctx.bin)
            .args(["reflect", "--kernel", "--listen", &format!("{B_IP}:{PORT}")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("start rtprobe reflect --kernel")?;
        let stderr = child.stderr.take().context("reflector stderr")?;
        let (tx, rx) = mpsc::channel();
        // Drains its stderr to the end, so it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.starts_with(READY_LINE) {
                    let _ = tx.send(Ok(()));
                } else if line.starts_with("Error") {
                    let _ = tx.send(Err(line));
                }
            }
        });
        let r = KernelReflector(child);
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(r),
            Ok(Err(e)) => bail!("rtprobe reflect --kernel: {e}"),
            Err(_) => bail!("rtprobe reflect --kernel did not answer within 10 s"),
        }
    }
}

impl Drop for KernelReflector {
    fn drop(&mut self) {
        // SIGTERM lets it detach its XDP program and exit.
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Builds the floor sender (`cargo bench --bench send_floor`) and returns
/// its executable.
fn build_floor() -> Result<std::path::PathBuf> {
    let mut c = Command::new(crate::cargo());
    c.current_dir(crate::workspace_root()).args([
        "bench",
        "-q",
        "-p",
        "rtprobe",
        "--bench",
        "send_floor",
        "--no-run",
        "--message-format",
        "json",
    ]);
    let out = output_text(c, "cargo bench --bench send_floor --no-run")?;
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|j| j["target"]["name"] == "send_floor" && j["executable"].is_string())
        .and_then(|j| j["executable"].as_str().map(Into::into))
        .context("cargo built no send_floor executable")
}

/// The senders that take turns on the pair, in the order of a round (odd
/// rounds run them in reverse, so that none always follows the same one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sender {
    Ping,
    Rtprobe,
    BusyPoll,
    NoWarmUp,
    Floor,
    FloorNoTx,
    FloorPoller,
    FloorSpin,
    FloorIcmp,
    FloorIcmpNoTx,
    FloorIcmpPing,
}

const SENDERS: [Sender; 11] = [
    Sender::Ping,
    Sender::Rtprobe,
    Sender::BusyPoll,
    Sender::NoWarmUp,
    Sender::Floor,
    Sender::FloorNoTx,
    Sender::FloorPoller,
    Sender::FloorSpin,
    Sender::FloorIcmp,
    Sender::FloorIcmpNoTx,
    Sender::FloorIcmpPing,
];

impl Sender {
    /// The send floor's flags for this variant; None: not the floor.
    fn floor_flags(self) -> Option<&'static [&'static str]> {
        match self {
            Sender::Floor => Some(&[]),
            Sender::FloorNoTx => Some(&["--no-tx-stamps"]),
            Sender::FloorPoller => Some(&["--poller"]),
            Sender::FloorIcmp => Some(&["--icmp"]),
            Sender::FloorSpin => Some(&["--spin"]),
            Sender::FloorIcmpNoTx => Some(&["--icmp", "--no-tx-stamps"]),
            Sender::FloorIcmpPing => Some(&["--icmp", "--no-tx-stamps", "--spin"]),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Sender::Ping => "ping",
            Sender::Rtprobe => "rtprobe",
            Sender::BusyPoll => "rtprobe --busy-poll",
            Sender::NoWarmUp => "rtprobe --no-warm-up",
            Sender::Floor => "send floor",
            Sender::FloorNoTx => "send floor --no-tx-stamps",
            Sender::FloorPoller => "send floor --poller",
            Sender::FloorIcmp => "send floor --icmp",
            Sender::FloorSpin => "send floor --spin",
            Sender::FloorIcmpNoTx => "send floor --icmp --no-tx-stamps",
            Sender::FloorIcmpPing => "send floor --icmp --no-tx-stamps --spin",
        }
    }
}

/// One sender's round: its median from the user-space send to the echo's
/// kernel RX stamp, and its stack stage's (user send -> SCHED), µs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Round {
    p50_us: f64,
    stack_us: Option<f64>,
}

/// One sender over the rounds: a round it did not run is None.
#[derive(Debug, Default, Clone)]
struct Series {
    rounds: Vec<Option<Round>>,
    /// Why it stopped, if it failed.
    error: Option<String>,
    /// What it sent by, when it says (the ICMP floor's socket).
    send: Option<String>,
}

impl Series {
    fn p50s(&self) -> impl Iterator<Item = f64> + '_ {
        self.rounds.iter().flatten().map(|r| r.p50_us)
    }

    /// The median of its round medians.
    fn p50_us(&self) -> Option<f64> {
        median(&mut self.p50s().collect::<Vec<_>>())
    }

    fn stack_us(&self) -> Option<f64> {
        median(
            &mut self
                .rounds
                .iter()
                .flatten()
                .filter_map(|r| r.stack_us)
                .collect::<Vec<_>>(),
        )
    }

    /// Its round medians over `other`'s of the same rounds.
    fn ratios(&self, other: &Series) -> Vec<f64> {
        self.rounds
            .iter()
            .zip(&other.rounds)
            .filter_map(|(a, b)| Some(a.as_ref()?.p50_us / b.as_ref()?.p50_us))
            .collect()
    }
}

fn rtprobe_round(ctx: &Ctx, p: &Bed, name: &str, n: &str, s: Sender) -> Result<Round> {
    let (csv, json) = (
        ctx.out.join(format!("{name}.csv")),
        ctx.out.join(format!("{name}.json")),
    );
    let mut c = in_ns(&p.a, &ctx.bin.to_string_lossy());
    c.args([
        "--quiet",
        "--target",
        B_IP,
        "--count",
        n,
        "--interval",
        "1ms",
    ])
    .arg("--out")
    .arg(&csv)
    .arg("--json")
    .arg(&json);
    if s == Sender::BusyPoll {
        // Refused with --rt-priority: RT throttling would stop the spin.
        c.arg("--busy-poll");
    } else if let Some(prio) = ctx.rt_priority {
        c.args(["--rt-priority", &prio.to_string(), "--mlockall"]);
    }
    if s == Sender::NoWarmUp {
        c.arg("--no-warm-up");
    }
    output_text(c, "rtprobe --target")?;
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    let mut v = user_start_rtts_us(&std::fs::read_to_string(&csv)?, false);
    Ok(Round {
        p50_us: median(&mut v).context("rtprobe's CSV has no answered probe")?,
        stack_us: summary["stages_ns"]["stack"]["p50"]
            .as_f64()
            .map(|ns| ns / 1000.0),
    })
}

fn ping_round(ctx: &Ctx, p: &Bed, name: &str, n: &str) -> Result<Round> {
    let mut c = chrt(ctx, &p.a, "ping");
    c.args(["-n", "-i", "0.001", "-s", "64", "-W", "1", "-c", n, B_IP]);
    let t = output_text(c, "ping")?;
    std::fs::write(ctx.out.join(format!("{name}.txt")), &t)?;
    let mut v = parse_ping_rtts_us(&t);
    Ok(Round {
        p50_us: median(&mut v).context("ping printed no replies")?,
        stack_us: None,
    })
}

/// The floor with `flags`; also what it sent by.
fn floor_round(ctx: &Ctx, p: &Bed, exe: &str, n: &str, flags: &[&str]) -> Result<(Round, String)> {
    let mut c = chrt(ctx, &p.a, exe);
    c.args(["--target", &format!("{B_IP}:{PORT}"), "--count", n])
        .args(flags);
    let t = output_text(c, "send_floor")?;
    let j: Value = serde_json::from_str(t.trim()).context("send_floor printed no JSON")?;
    let p50 = j["rtt_user_start_p50_ns"]
        .as_f64()
        .context("send_floor measured no round trip")?;
    Ok((
        Round {
            p50_us: p50 / 1000.0,
            stack_us: j["stack_p50_ns"].as_f64().map(|ns| ns / 1000.0),
        },
        j["send"].as_str().unwrap_or("udp").to_string(),
    ))
}

/// `prog` in namespace `ns`, SCHED_FIFO as rtprobe's runs when the bench
/// has --rt-priority.
fn chrt(ctx: &Ctx, ns: &str, prog: &str) -> Command {
    match ctx.rt_priority {
        Some(prio) if have("chrt") => {
            let mut c = in_ns(ns, "chrt");
            c.args(["-f", &prio.to_string(), prog]);
            c
        }
        _ => in_ns(ns, prog),
    }
}

/// One sender's run in round `round`.
fn run_sender(
    ctx: &Ctx,
    p: &Bed,
    s: Sender,
    round: usize,
    n: &str,
    floor: &Result<std::path::PathBuf, String>,
) -> Result<(Round, Option<String>)> {
    let name = format!("pair-{}-{round}", s.name().replace([' ', '-'], "_"));
    match (s, s.floor_flags()) {
        (Sender::Ping, _) => Ok((ping_round(ctx, p, &name, n)?, None)),
        (Sender::Rtprobe | Sender::BusyPoll | Sender::NoWarmUp, _) => {
            Ok((rtprobe_round(ctx, p, &name, n, s)?, None))
        }
        (_, Some(flags)) => {
            let exe = floor
                .as_ref()
                .map_err(|e| anyhow::anyhow!("not built: {e}"))?;
            let (r, send) = floor_round(ctx, p, &exe.to_string_lossy(), n, flags)?;
            Ok((r, Some(send)))
        }
        (_, None) => unreachable!("every sender is ping, rtprobe or a floor"),
    }
}

fn measure(ctx: &Ctx, quick: bool) -> Result<Vec<Series>> {
    if !have("ping") {
        bail!("ping is not installed (apt-get install iputils-ping)");
    }
    let floor = build_floor().map_err(|e| format!("{e:#}"));
    let pair = pair_bed(ctx)?;
    let _reflector = KernelReflector::start(ctx, &pair)?;
    let (rounds, n) = if quick { (3, "1000") } else { (5, "2000") };
    let mut series = vec![Series::default(); SENDERS.len()];
    // Taking turns, so that what else the machine does weighs on each alike.
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..SENDERS.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let s = &mut series[i];
            s.rounds.push(None);
            if s.error.is_some() {
                continue;
            }
            match run_sender(ctx, &pair, SENDERS[i], round, n, &floor) {
                Ok((r, send)) => {
                    *s.rounds.last_mut().expect("pushed") = Some(r);
                    s.send = send;
                }
                Err(e) => s.error = Some(format!("{e:#}")),
            }
        }
    }
    Ok(series)
}

/// "4.6 µs = 1.54x ping (rounds 1.46..8.88x)": a median, then the median
/// of its rounds' ratios to `of` and their spread.
fn ratio_text(p50_us: f64, ratios: &[f64], of: &str) -> String {
    let mut r = ratios.to_vec();
    let Some(mid) = median(&mut r) else {
        return format!("{p50_us:.1} µs");
    };
    let (lo, hi) = spread(ratios);
    format!("{p50_us:.1} µs = {mid:.2}x {of} (rounds {lo:.2}..{hi:.2}x)")
}

/// The least and the greatest of `v`.
fn spread(v: &[f64]) -> (f64, f64) {
    (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(0.0, f64::max),
    )
}

fn stack_text(s: &Series) -> String {
    s.stack_us().map_or("-".into(), |m| format!("{m:.1} µs"))
}

/// The figure of `s` against ping, or why it has none.
fn figure(s: &Series, ping: &Series) -> String {
    match (s.p50_us(), &s.error) {
        (Some(p50), _) => ratio_text(p50, &s.ratios(ping), "ping"),
        (None, Some(e)) => format!("failed: {e}"),
        (None, None) => "-".into(),
    }
}

pub(super) fn pair_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let metric =
        "RTT median, user send -> echo RX, bare veth pair, reflect --kernel: rtprobe / ping";
    let target = format!("<= {TARGET_RATIO_VS_PING:.1}x ping");
    let series = match measure(ctx, quick) {
        Ok(s) => s,
        Err(e) => {
            return Ok(vec![row(
                metric,
                format!("failed: {e:#}"),
                "-".into(),
                &target,
                Some(false),
            )]);
        }
    };
    let get = |s: Sender| &series[SENDERS.iter().position(|&x| x == s).expect("listed")];
    let (ping, rtprobe, busy) = (
        get(Sender::Ping),
        get(Sender::Rtprobe),
        get(Sender::BusyPoll),
    );
    let Some(ping_us) = ping.p50_us() else {
        bail!(
            "ping measured nothing on the veth pair: {}",
            ping.error.as_deref().unwrap_or("no round ran")
        );
    };
    let mut ratios = rtprobe.ratios(ping);
    let ratio = median(&mut ratios);
    let floor_ratio = median(&mut get(Sender::Floor).ratios(ping));
    let mut rows = vec![
        row(
            metric,
            figure(rtprobe, ping),
            format!(
                "ping {ping_us:.1} µs (median of {} rounds taking turns); rtprobe's stack (user \
                 send -> SCHED) p50 {}",
                ping.p50s().count(),
                stack_text(rtprobe)
            ),
            &target,
            Some(ratio.is_some_and(|r| r <= TARGET_RATIO_VS_PING)),
        )
        .because(short_of_ping(
            ratio,
            rtprobe.p50_us(),
            FloorFigures {
                ratio: floor_ratio,
                spin_ratio: median(&mut get(Sender::FloorSpin).ratios(ping)),
                us: get(Sender::Floor).p50_us(),
            },
        )),
        busy_row(rtprobe, busy, ping),
        cold_row(rtprobe, get(Sender::NoWarmUp), ping),
    ];
    rows.extend(floor_rows(&get, ping));
    Ok(rows)
}

/// The target of issue 25: the default sender within 10 % of --busy-poll.
pub(super) const TARGET_RATIO_VS_BUSY_POLL: f64 = 1.10;

/// rtprobe --busy-poll, and the default's ratio to it.
fn busy_row(rtprobe: &Series, busy: &Series, ping: &Series) -> Row {
    let mut r = rtprobe.ratios(busy);
    let ratio = median(&mut r);
    let target = format!("default <= {TARGET_RATIO_VS_BUSY_POLL:.2}x --busy-poll");
    let met = ratio.map(|x| x <= TARGET_RATIO_VS_BUSY_POLL);
    let why = match (
        rtprobe.p50_us(),
        busy.p50_us(),
        rtprobe.stack_us(),
        busy.stack_us(),
    ) {
        (Some(d), Some(b), Some(ds), Some(bs)) => format!(
            "the default is {:+.1} µs from --busy-poll, {:+.1} µs of it in the stack stage (user \
             send -> SCHED) and {:+.1} µs after the qdisc",
            d - b,
            ds - bs,
            (d - ds) - (b - bs)
        ),
        _ => "a run failed, so the gap is not split".into(),
    };
    row(
        "RTT median, user send -> echo RX, bare veth pair: rtprobe --busy-poll",
        figure(busy, ping),
        match ratio {
            Some(x) => {
                let (lo, hi) = spread(&r);
                format!(
                    "default / --busy-poll {x:.2}x (rounds {lo:.2}..{hi:.2}x); its stack p50 {}",
                    stack_text(busy)
                )
            }
            None => "-".into(),
        },
        &target,
        met,
    )
    .because(why)
}

/// rtprobe --no-warm-up: the probe pays the sender's wake from idle (the
/// caches its sleep cooled), which the default's loopback warm-up takes.
fn cold_row(rtprobe: &Series, cold: &Series, ping: &Series) -> Row {
    row(
        "RTT median, user send -> echo RX, bare veth pair: rtprobe --no-warm-up",
        figure(cold, ping),
        format!(
            "default / --no-warm-up {}, what the loopback warm-up after waking saves the probe; \
             its stack p50 {}",
            over(rtprobe, cold).unwrap_or_else(|| "-".into()),
            stack_text(cold)
        ),
        "-",
        None,
    )
}

/// `a`'s round medians over `b`'s in words: "0.82 (rounds 0.76..0.91)".
fn over(a: &Series, b: &Series) -> Option<String> {
    let mut r = a.ratios(b);
    let m = median(&mut r)?;
    let (lo, hi) = spread(&r);
    Some(format!("{m:.2} (rounds {lo:.2}..{hi:.2})"))
}

/// A floor row: the variant, its metric, and the variant its ratio is
/// taken against (over this one), in words.
type FloorRow<'w> = (Sender, String, Option<(Sender, &'w str)>);

/// The floor's rows: each variant against ping, and the ratio that
/// isolates what the variant changes (the one before it over it).
fn floor_rows<'a>(get: &dyn Fn(Sender) -> &'a Series, ping: &Series) -> Vec<Row> {
    let icmp = get(Sender::FloorIcmp);
    let socket = icmp.send.as_deref().unwrap_or("no");
    let rows: [FloorRow<'_>; 7] = [
        (
            Sender::Floor,
            "send floor (one thread, rtprobe's socket options), user send -> echo RX".into(),
            None,
        ),
        (
            Sender::FloorNoTx,
            "send floor without TX stamps (RX stamps only, as ping)".into(),
            None,
        ),
        (
            Sender::FloorPoller,
            "send floor with a second thread waiting in poll(2) on its socket".into(),
            None,
        ),
        (
            Sender::FloorSpin,
            "send floor --spin: never sleeps, as ping does at 1 ms".into(),
            Some((
                Sender::Floor,
                "floor / floor --spin, what sending from a CPU woken from idle costs:",
            )),
        ),
        (
            Sender::FloorIcmp,
            format!("send floor --icmp: ICMP echo ({socket} socket), answered by B's kernel"),
            Some((
                Sender::Floor,
                "UDP floor / ICMP floor, the XDP reflector's reply (XDP_TX on veth) against the \
                 kernel's ICMP echo reply from the same sender:",
            )),
        ),
        (
            Sender::FloorIcmpNoTx,
            "send floor --icmp --no-tx-stamps: ping's packets and stamps".into(),
            Some((
                Sender::FloorIcmp,
                "ICMP floor with / without TX stamps, the SCHED and driver stamps' cost:",
            )),
        ),
        (
            Sender::FloorIcmpPing,
            "send floor --icmp --no-tx-stamps --spin: ping's packets, stamps and wait".into(),
            Some((
                Sender::FloorIcmpNoTx,
                "sleeping / spinning, the wake from idle:",
            )),
        ),
    ];
    rows.into_iter()
        .map(|(s, what, vs)| {
            let ratio = vs.map(|(base, words)| {
                let r = over(get(base), get(s)).unwrap_or_else(|| "-".into());
                format!("{words} {r}; ")
            });
            row(
                &what,
                figure(get(s), ping),
                format!(
                    "{}its stack (user send -> SCHED) p50 {}",
                    ratio.unwrap_or_default(),
                    stack_text(get(s))
                ),
                "-",
                None,
            )
        })
        .collect()
}

/// The send floor's medians of the rounds' ratios to ping, sleeping and
/// spinning, and its µs.
#[derive(Debug, Clone, Copy)]
struct FloorFigures {
    ratio: Option<f64>,
    spin_ratio: Option<f64>,
    us: Option<f64>,
}

/// Why rtprobe's round trip is above ping's, from the send floor's ratios
/// in the same rounds (medians of the rounds' ratios; µs for the gap).
fn short_of_ping(ratio: Option<f64>, rtprobe_us: Option<f64>, floor: FloorFigures) -> String {
    match (ratio, floor.ratio, rtprobe_us, floor.us) {
        (Some(_), Some(f), Some(r), Some(fu)) if f > TARGET_RATIO_VS_PING => match floor.spin_ratio
        {
            Some(sp) if sp <= TARGET_RATIO_VS_PING => format!(
                "ping at 1 ms never sleeps (it spins between sends): in the same rounds the send \
                 floor was {f:.2}x ping sleeping and {sp:.2}x spinning, so the gap is sending from \
                 a CPU woken from idle, not the path; rtprobe is {:+.1} µs from the sleeping floor",
                r - fu
            ),
            _ => format!(
                "the send floor (one thread, rtprobe's socket options) was {f:.2}x ping in the \
                 same rounds, so the kernel's UDP send path with TX stamps is above ping's here; \
                 rtprobe is {:+.1} µs from the floor",
                r - fu
            ),
        },
        (Some(_), Some(f), Some(r), Some(fu)) => format!(
            "the send floor was {f:.2}x ping in the same rounds; rtprobe's own send path adds \
             {:+.1} µs to it",
            r - fu
        ),
        (None, ..) => "rtprobe measured nothing on the pair".into(),
        _ => "the send floor did not run, so the gap is not split".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_splits_the_gap_at_the_floor() {
        let why = |r, f, sp, ru, fu| {
            short_of_ping(
                Some(r),
                Some(ru),
                FloorFigures {
                    ratio: Some(f),
                    spin_ratio: sp,
                    us: Some(fu),
                },
            )
        };
        let slow = why(2.0, 1.6, None, 10.0, 8.0);
        assert!(slow.starts_with("the send floor (one thread"), "{slow}");
        assert!(slow.ends_with("+2.0 µs from the floor"));
        let woken = why(2.0, 1.6, Some(0.8), 10.0, 8.0);
        assert!(woken.starts_with("ping at 1 ms never sleeps"), "{woken}");
        assert!(woken.contains("1.60x ping sleeping and 0.80x spinning"));
        assert!(why(1.2, 0.9, None, 6.0, 4.5).ends_with("adds +1.5 µs to it"));
        let none = FloorFigures {
            ratio: None,
            spin_ratio: None,
            us: None,
        };
        assert_eq!(
            short_of_ping(Some(1.2), Some(6.0), none),
            "the send floor did not run, so the gap is not split"
        );
    }

    #[test]
    fn ratios_are_taken_round_by_round() {
        let s = |v: &[Option<f64>]| Series {
            rounds: v
                .iter()
                .map(|x| {
                    x.map(|p50_us| Round {
                        p50_us,
                        stack_us: None,
                    })
                })
                .collect(),
            ..Series::default()
        };
        let ping = s(&[Some(3.0), Some(4.0), None, Some(3.0), Some(5.0)]);
        let rt = s(&[Some(4.5), Some(4.0), Some(9.0), Some(3.6), Some(5.0)]);
        let r: Vec<f64> = rt
            .ratios(&ping)
            .iter()
            .map(|x| (x * 100.0).round())
            .collect();
        assert_eq!(r, vec![150.0, 100.0, 120.0, 100.0], "only rounds both ran");
        assert_eq!(rt.p50_us(), Some(4.5));
        assert_eq!(
            figure(&rt, &ping),
            "4.5 µs = 1.10x ping (rounds 1.00..1.50x)"
        );
        let failed = Series {
            error: Some("boom".into()),
            ..Series::default()
        };
        assert_eq!(figure(&failed, &ping), "failed: boom");
    }
}
