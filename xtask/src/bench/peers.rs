//! The tools rtprobe is compared with (ping, irtt, sockperf): how they
//! are run in a held testbed and how their outputs are read.

use std::{process::Stdio, time::Duration};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::run::{Ctx, HeldTestbed, Server, have, in_ns, output_text};

/// Median of a sample (mean of the two middle values for an even count).
pub(super) fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Per-reply RTTs in µs from ping's output (`... time=0.045 ms`).
pub(super) fn parse_ping_rtts_us(out: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| {
            let t = l.split("time=").nth(1)?;
            let mut it = t.split_whitespace();
            let v: f64 = it.next()?.parse().ok()?;
            let scale = match it.next() {
                Some("ms") | None => 1000.0,
                Some("us") | Some("µs") => 1.0,
                Some("s") => 1e6,
                Some(_) => return None,
            };
            Some(v * scale)
        })
        .collect()
}

/// sockperf's `---> percentile 50.000 =   12.345` (µs).
pub(super) fn parse_sockperf_percentile_us(out: &str, pct: &str) -> Option<f64> {
    let key = format!("percentile {pct} =");
    out.lines()
        .find_map(|l| l.split(&key).nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// irtt's RTT median in µs from its JSON output: `stats.rtt.median` (ns),
/// else the median of `round_trips[].delay.rtt`.
pub(super) fn irtt_median_us(j: &Value) -> Option<f64> {
    if let Some(m) = j["stats"]["rtt"]["median"].as_f64() {
        return Some(m / 1000.0);
    }
    let mut v: Vec<f64> = j["round_trips"]
        .as_array()?
        .iter()
        .filter_map(|r| r["delay"]["rtt"].as_f64())
        .map(|ns| ns / 1000.0)
        .collect();
    median(&mut v)
}

/// ping's median RTT to `addr` from namespace `ns`, `count` echoes at 1 ms
/// (`ping -6` with `ipv6`); its output saved as ping.txt / ping6.txt. The
/// RTT runs from the user-space send time to the kernel's RX timestamp of
/// the reply (SO_TIMESTAMP); 64 bytes of ICMP payload make the same IP size
/// as a 64-byte rtprobe UDP probe.
pub(super) fn ping_median(ctx: &Ctx, ns: &str, addr: &str, count: u64, ipv6: bool) -> Result<f64> {
    if !have("ping") {
        bail!("not installed (apt-get install iputils-ping)");
    }
    let (name, file) = if ipv6 {
        ("ping -6", "ping6.txt")
    } else {
        ("ping", "ping.txt")
    };
    let mut c = in_ns(ns, "ping");
    if ipv6 {
        c.arg("-6");
    }
    c.args(["-n", "-i", "0.001", "-s", "64", "-W", "1", "-c"])
        .arg(count.to_string())
        .arg(addr);
    let t = output_text(c, name)?;
    std::fs::write(ctx.out.join(file), &t)?;
    median(&mut parse_ping_rtts_us(&t)).with_context(|| format!("{name} printed no replies"))
}

/// RTT medians of the peers, in µs, measured inside a held testbed with
/// the XDP router in `xdp_mode`.
pub(super) fn peer_rtts(
    ctx: &Ctx,
    count: u64,
    xdp_mode: &str,
) -> Result<Vec<(String, Result<f64>)>> {
    let tb = HeldTestbed::start(&ctx.bin, xdp_mode)?;
    let (snd, rcv, addr) = (
        tb.s("sender_ns"),
        tb.s("receiver_ns"),
        tb.s("receiver_addr"),
    );
    let secs = (count / 1000).max(1);
    let mut out = Vec::new();

    // ping: ICMP echo answered by the receiver's kernel, over IPv4 and to
    // the receiver's unique-local IPv6 address.
    out.push((
        "ping".to_string(),
        ping_median(ctx, &snd, &addr, count, false),
    ));
    let addr6 = tb.s("receiver_addr6");
    let ping6 = if addr6.is_empty() {
        Err(anyhow::anyhow!("the testbed has no IPv6 address"))
    } else {
        ping_median(ctx, &snd, &addr6, count, true)
    };
    out.push(("ping -6".to_string(), ping6));
    let ends = Ends {
        snd: &snd,
        rcv: &rcv,
        addr: &addr,
        secs,
    };
    let irtt = if have("irtt") {
        irtt_median(ctx, &ends)
    } else {
        Err(anyhow::anyhow!("not installed"))
    };
    out.push(("irtt".to_string(), irtt));
    let sockperf = if have("sockperf") {
        sockperf_median(ctx, &ends)
    } else {
        Err(anyhow::anyhow!("not installed"))
    };
    out.push(("sockperf".to_string(), sockperf));
    Ok(out)
}

/// Where a peer tool runs: the sender's and receiver's namespaces, the
/// receiver's address, and for how many seconds.
struct Ends<'a> {
    snd: &'a str,
    rcv: &'a str,
    addr: &'a str,
    secs: u64,
}

/// irtt: user-space client and server with the server's processing time
/// taken out of the RTT (dual server timestamps), as rtprobe's `rtt net`.
fn irtt_median(ctx: &Ctx, e: &Ends) -> Result<f64> {
    let (addr, secs) = (e.addr, e.secs);
    let _server = Server(
        in_ns(e.rcv, "irtt")
            .args([
                "server",
                "-b",
                &format!("{addr}:2112"),
                "-i",
                "0",
                "-d",
                "0",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start irtt server")?,
    );
    std::thread::sleep(Duration::from_millis(500));
    let json = ctx.out.join("irtt.json");
    let mut c = in_ns(e.snd, "irtt");
    c.args([
        "client",
        "-i",
        "1ms",
        "-d",
        &format!("{secs}s"),
        "-l",
        "64",
        "-Q",
        "-o",
    ])
    .arg(&json)
    .arg(format!("{addr}:2112"));
    output_text(c, "irtt client")?;
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    irtt_median_us(&j).context("no RTTs in irtt's output")
}

/// sockperf ping-pong: user space to user space on both ends, full RTT.
fn sockperf_median(ctx: &Ctx, e: &Ends) -> Result<f64> {
    let addr = e.addr;
    let _server = Server(
        in_ns(e.rcv, "sockperf")
            .args(["server", "-i", addr, "-p", "11111"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start sockperf server")?,
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut c = in_ns(e.snd, "sockperf");
    c.args([
        "ping-pong",
        "-i",
        addr,
        "-p",
        "11111",
        "-t",
        &e.secs.to_string(),
        "--mps",
        "1000",
        "-m",
        "64",
        "--full-rtt",
    ]);
    let t = output_text(c, "sockperf ping-pong")?;
    std::fs::write(ctx.out.join("sockperf.txt"), &t)?;
    parse_sockperf_percentile_us(&t, "50.000").context("no median in sockperf's output")
}

pub(super) fn fmt_peer(r: &Result<f64>) -> String {
    match r {
        Ok(v) => format!("{v:.1} µs"),
        Err(e) => format!("n/a ({e:#})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn ping_lines() {
        let out = "PING 10.71.2.2 (10.71.2.2) 64(92) bytes of data.\n\
            72 bytes from 10.71.2.2: icmp_seq=1 ttl=63 time=0.045 ms\n\
            72 bytes from 10.71.2.2: icmp_seq=2 ttl=63 time=0.031 ms\n\
            72 bytes from 10.71.2.2: icmp_seq=3 ttl=63 time=1.20 ms\n\
            \n--- 10.71.2.2 ping statistics ---\n\
            rtt min/avg/max/mdev = 0.031/0.425/1.200/0.5 ms\n";
        let v = parse_ping_rtts_us(out);
        assert_eq!(v.len(), 3);
        assert!((v[0] - 45.0).abs() < 1e-9 && (v[2] - 1200.0).abs() < 1e-9);
    }

    #[test]
    fn sockperf_and_irtt() {
        let out = "sockperf: ---> <MAX> observation =   88.123\n\
            sockperf: ---> percentile 99.000 =   40.500\n\
            sockperf: ---> percentile 50.000 =   21.250\n";
        assert_eq!(parse_sockperf_percentile_us(out, "50.000"), Some(21.25));
        assert_eq!(parse_sockperf_percentile_us(out, "90.000"), None);
        let j: Value = serde_json::json!({"stats": {"rtt": {"median": 25_500}}});
        assert_eq!(irtt_median_us(&j), Some(25.5));
        let j: Value = serde_json::json!({"round_trips": [
            {"delay": {"rtt": 30_000}}, {"delay": {"rtt": 10_000}}, {"lost": "true", "delay": {}}
        ]});
        assert_eq!(irtt_median_us(&j), Some(20.0));
    }
}
