//! The memory and continuous sections: peak RSS after many probes, and
//! RSS that must stay flat in a `--forever` run and over a day of
//! synthetic probes.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{
    run::{Ctx, output_text},
    table::{Row, row},
};

/// The peak RSS target, checked (not asserted) here.
pub(super) const TARGET_RSS_MIB: f64 = 64.0;

pub(super) fn memory_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    // At the fastest rate the rate test sustained (20 µs if none), so the
    // run is as short as it can be without losses skewing it.
    let interval = format!("{}us", ctx.best_interval_us.get().unwrap_or(20).max(10));
    let rss = |name: &str, n: u64| -> Result<(f64, Value)> {
        let s = ctx.probe(name, &["--count", &n.to_string(), "--interval", &interval])?;
        Ok((
            s["extra"]["peak_rss_kib"].as_f64().unwrap_or(f64::NAN) / 1024.0,
            s,
        ))
    };
    let (small, _) = rss("rss-100k", 100_000)?;
    let n = if quick { 1_000_000 } else { 10_000_000 };
    let (big, s) = rss("rss-big", n)?;
    Ok(vec![row(
        &format!("peak RSS after {} M probes", n / 1_000_000),
        format!("{big:.1} MiB"),
        format!(
            "{small:.1} MiB after 100 k; every {interval}: sent {}, lost {}, unaccounted {}",
            s["sent"], s["lost"], s["unaccounted"]
        ),
        "<= 64 MiB",
        Some(big <= TARGET_RSS_MIB),
    )])
}

/// A `--forever` run at the fastest sustained rate with every live output
/// on (rotated CSV, interval lines, HDR log, metrics endpoint), its VmRSS
/// read from /proc while it runs: memory must not grow with the probe
/// count. 1 ms probing for 24 h is 86.4 M probes; the run says how much
/// of that it covered.
pub(super) fn continuous_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let interval_us = ctx.best_interval_us.get().unwrap_or(10).max(10);
    let secs: u64 = if quick { 30 } else { 100 };
    let dir = ctx.out.join("continuous");
    std::fs::create_dir_all(&dir)?;
    let json = dir.join("summary.json");
    let mut child = spawn_forever(ctx, interval_us, &dir, &json)?;
    let pid = child.id();
    let rss = RssFloors::sample(pid, secs);
    stop_forever(&mut child, pid)?;
    let s: Value = serde_json::from_str(
        &std::fs::read_to_string(&json).with_context(|| format!("read {}", json.display()))?,
    )?;
    let (Some(start), Some(end)) = (rss.start, rss.end) else {
        bail!("could not read the run's VmRSS from /proc/{pid}/status");
    };
    let real = forever_rss_row(&s, (start, end, rss.peak), interval_us, secs);
    // The network cannot deliver a day of 1 ms probes in a bench's time:
    // the same per-probe machinery, driven without it, can.
    let synthetic = continuous_synthetic_row(ctx, quick).unwrap_or_else(|e| {
        row(
            "RSS after 24 h at 1 ms equivalent (synthetic events)",
            format!("failed: {e:#}"),
            "-".into(),
            "-",
            Some(false),
        )
    });
    let render = super::metrics::metrics_render_rows().unwrap_or_else(|e| {
        vec![row(
            "/metrics render, 1000 targets",
            format!("failed: {e:#}"),
            "-".into(),
            "<= 200 ms",
            Some(false),
        )]
    });
    Ok([vec![real, synthetic], render].concat())
}

/// Starts the `--forever` run with every live output on, into `dir`,
/// its summary to `json`.
fn spawn_forever(
    ctx: &Ctx,
    interval_us: u64,
    dir: &std::path::Path,
    json: &std::path::Path,
) -> Result<std::process::Child> {
    Command::new(&ctx.bin)
        .args(["--quiet", "--xdp-mode", "off", "--forever"])
        .args(["--interval", &format!("{interval_us}us")])
        .args([
            "--out-rotate",
            "64MiB",
            "--out-keep",
            "1",
            "--report-every",
            "10s",
        ])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--out")
        .arg(dir.join("out.csv"))
        .arg("--hdr-log")
        .arg(dir.join("run.hlog"))
        .arg("--json")
        .arg(json)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start a --forever rtprobe")
}

/// VmRSS of process `pid`, in MiB.
fn rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// The least RSS of the run's middle third and of its last third, and
/// its peak, in MiB.
struct RssFloors {
    start: Option<f64>,
    end: Option<f64>,
    peak: f64,
}

impl RssFloors {
    /// Sampled every 2 s for `secs`. Memory in use rises and falls with
    /// the probes in flight (a stall fills the matcher's window: rate x
    /// timeout slots) and the run trims the heap every 10 s, so a single
    /// sample lands on a peak or a floor by chance: compare floors, the
    /// least RSS of the middle third (past the testbed, the warm-up and
    /// the first rotations) against the least of the last third.
    fn sample(pid: u32, secs: u64) -> Self {
        let mut samples = Vec::new();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(secs) {
            std::thread::sleep(Duration::from_secs(2));
            samples.push((t0.elapsed().as_secs(), rss_mib(pid)));
        }
        let floor = |from: u64, to: u64| {
            samples
                .iter()
                .filter(|(t, _)| (from..to).contains(t))
                .filter_map(|&(_, r)| r)
                .reduce(f64::min)
        };
        let start_at = secs / 3;
        Self {
            start: floor(start_at, 2 * secs / 3),
            end: floor(2 * secs / 3, secs + 1),
            peak: samples.iter().filter_map(|&(_, r)| r).fold(0.0, f64::max),
        }
    }
}

/// SIGINT to the `--forever` run, and up to 30 s for it to stop.
fn stop_forever(child: &mut std::process::Child, pid: u32) -> Result<()> {
    let _ = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    let t = Instant::now();
    while child.try_wait()?.is_none() {
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the --forever run did not stop within 30 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The `--forever` run's row from its summary `s` and its RSS floors
/// and peak.
fn forever_rss_row(
    s: &Value,
    (start, end, peak): (f64, f64, f64),
    interval_us: u64,
    secs: u64,
) -> Row {
    let sent = s["sent"].as_f64().unwrap_or(0.0);
    let growth = end - start;
    row(
        &format!(
            "RSS of --forever after {:.1} M probes (= {:.1} h at 1 ms)",
            sent / 1e6,
            sent / 1e3 / 3600.0
        ),
        format!("{end:.1} MiB"),
        format!(
            "least RSS of the last third; {start:.1} MiB least of the middle third, peak {peak:.1} MiB; \
             every {interval_us} us for {secs} s (sent {:.0}/s), rotated CSV, HDR log, metrics on; \
             lost {}, unaccounted {}",
            s["send_rate_pps"].as_f64().unwrap_or(0.0),
            s["lost"],
            s["unaccounted"]
        ),
        "growth <= 4 MiB",
        Some(growth <= 4.0),
    )
}

/// The continuous_rss bench: a day's worth of 1 ms probes (a tenth with
/// `--quick`) as synthetic events through the matcher, the statistics,
/// the rotated CSV, the interval histograms, the HDR log and the metrics.
pub(super) fn continuous_synthetic_row(ctx: &Ctx, quick: bool) -> Result<Row> {
    let probes: u64 = if quick { 8_640_000 } else { 86_400_000 };
    let json = ctx.out.join("continuous-synthetic.json");
    let mut c = Command::new(crate::cargo());
    c.current_dir(crate::workspace_root())
        .args([
            "bench",
            "-q",
            "-p",
            "rtprobe",
            "--bench",
            "continuous_rss",
            "--",
        ])
        .args(["--probes", &probes.to_string(), "--json"])
        .arg(&json);
    let text = output_text(c, "cargo bench --bench continuous_rss")?;
    std::fs::write(ctx.out.join("continuous-synthetic.txt"), &text)?;
    let j: Value = serde_json::from_str(
        &std::fs::read_to_string(&json).with_context(|| format!("read {}", json.display()))?,
    )?;
    let f = |k: &str| j[k].as_f64().unwrap_or(f64::NAN);
    let hours = f("probes") / 3.6e6;
    Ok(row(
        &format!(
            "RSS after {} at 1 ms equivalent: {:.1} M probes, synthetic events through the real \
             matcher/histograms/outputs",
            if quick {
                format!("{hours:.1} h")
            } else {
                format!("{hours:.0} h")
            },
            f("probes") / 1e6
        ),
        format!("{:.1} MiB", f("rss_end_mib")),
        format!(
            "{:.1} MiB at 1/3, peak from there {:.1} MiB; {:.2} M probes/s for {:.0} s, no network; \
             CSV rotated at 16 MiB keep 2 + HDR log: {} files, {:.0} MiB on disk; \
             sent {} lost {} unaccounted {}",
            f("rss_third_mib"),
            f("rss_peak_after_third_mib"),
            f("rate_pps") / 1e6,
            f("wall_s"),
            j["files"],
            f("bytes") / 1048576.0,
            j["sent"],
            j["lost"],
            j["unaccounted"]
        ),
        &format!("growth after 1/3 < {:.0} MiB", f("max_growth_mib")),
        Some(j["met"].as_bool() == Some(true)),
    ))
}
