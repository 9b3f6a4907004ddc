//! RSS of a continuous run after a day's worth of 1 ms probes, driven at
//! full speed without the network: synthetic events through the product's
//! matcher, statistics, rotated CSV, interval histograms, HDR log and
//! metrics (see `continuous_rss/driver.rs`). `cargo xtask bench --only
//! continuous` runs it next to a real `--forever` run on the testbed.
//!
//! cargo bench -p rtprobe --bench continuous_rss -- [--probes N] [--dir D] [--json F]
//!
//! Passes when RSS grows by less than 4 MiB from a third of the probes to
//! the end (printed MET / NOT MET; exit code 0 either way, the figure is
//! the result).

#[path = "continuous_rss/driver.rs"]
mod driver;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

/// 24 h at 1 ms.
const DAY_AT_1MS: u64 = 86_400_000;
/// The pass criterion: RSS growth after the first third.
const MAX_GROWTH_MIB: f64 = 4.0;

#[allow(clippy::too_many_lines)]
fn main() -> Result<()> {
    let mut probes = DAY_AT_1MS;
    let mut dir: Option<PathBuf> = None;
    let mut json: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--probes" => {
                let v = args.next().context("--probes needs a count")?;
                probes = v
                    .replace('_', "")
                    .parse()
                    .with_context(|| format!("--probes {v}: not a count"))?;
            }
            "--dir" => dir = Some(args.next().context("--dir needs a path")?.into()),
            "--json" => json = Some(args.next().context("--json needs a path")?.into()),
            // Passed by `cargo bench`.
            "--bench" => {}
            other => bail!("unknown argument {other}: use --probes N, --dir DIR, --json FILE"),
        }
    }
    if probes < 30 {
        bail!("--probes {probes}: drive at least 30 probes (RSS is sampled 30 times)");
    }
    let tmp;
    let dir = match dir {
        Some(d) => d,
        None => {
            tmp = tempfile::tempdir().context("create a temporary directory")?;
            tmp.path().to_path_buf()
        }
    };
    let plan = driver::Plan {
        probes,
        interval_ns: 1_000_000,
        dir: dir.clone(),
        rotate_bytes: 16 << 20,
        keep: 2,
        samples: 30,
    };
    eprintln!(
        "driving {probes} probes ({:.1} h at 1 ms) through the matcher, CSV (rotated at 16 MiB, \
         keep 2), interval histograms, HDR log and metrics in {}",
        probes as f64 / 3.6e6,
        dir.display()
    );
    let o = driver::drive(&plan)?;
    let (Some(third), Some(end)) = (o.rss_at_third(), o.rss_end()) else {
        bail!("could not read VmRSS from /proc/self/status");
    };
    let peak = o.rss_peak_after_third().unwrap_or(end);
    let growth = end - third;
    let met = growth < MAX_GROWTH_MIB;
    let s = &o.summary;
    let rate = o.driven as f64 / o.wall.as_secs_f64();
    println!(
        "probes driven  {} ({:.1} h at 1 ms), synthetic events",
        o.driven,
        o.driven as f64 / 3.6e6
    );
    println!(
        "wall time      {:.1} s ({:.2} M probes/s)",
        o.wall.as_secs_f64(),
        rate / 1e6
    );
    println!(
        "counts         sent {} received {} lost {} echo lost {} reordered {} duplicates {} \
         foreign {} late arrivals {} TX late {} TX duplicates {} unaccounted {}",
        s.sent,
        s.received,
        s.lost,
        s.echo_lost,
        s.reordered,
        s.duplicates,
        s.foreign_packets,
        o.late_arrivals,
        s.tx_timestamp_late,
        s.tx_timestamp_duplicates,
        s.unaccounted
    );
    let i = o.injected;
    println!(
        "injected       send failed {} forward lost {} return lost {} late arrivals {} delayed {} \
         duplicate arrivals {} late TX {} duplicate TX {} early TX {} foreign {}",
        i.send_failed,
        i.forward_lost,
        i.return_lost,
        i.late_arrivals,
        i.delayed,
        i.duplicate_arrivals,
        i.late_tx,
        i.duplicate_tx,
        i.early_tx,
        i.foreign
    );
    println!(
        "outputs        CSV {} rows, {} rotations; on disk {} files, {:.1} MiB (HDR log {:.1} MiB); \
         {} progress updates",
        o.csv_rows,
        o.rotations,
        o.files,
        o.bytes as f64 / 1048576.0,
        o.hdr_log_bytes as f64 / 1048576.0,
        o.progress_calls
    );
    println!(
        "RSS            {third:.1} MiB at 1/3, {end:.1} MiB at the last probe, peak from 1/3 {peak:.1} MiB: \
         growth {growth:+.2} MiB (target < {MAX_GROWTH_MIB} MiB): {}",
        if met { "MET" } else { "NOT MET" }
    );
    if let Some(e) = &o.output_error {
        println!("output error   {e}");
    }
    if let Some(path) = json {
        let v = serde_json::json!({
            "probes": o.driven,
            "wall_s": o.wall.as_secs_f64(),
            "rate_pps": rate,
            "rss_third_mib": third,
            "rss_end_mib": end,
            "rss_peak_after_third_mib": peak,
            "growth_mib": growth,
            "max_growth_mib": MAX_GROWTH_MIB,
            "met": met && o.output_error.is_none(),
            "files": o.files,
            "bytes": o.bytes,
            "hdr_log_bytes": o.hdr_log_bytes,
            "csv_rows": o.csv_rows,
            "rotations": o.rotations,
            "sent": s.sent,
            "received": s.received,
            "lost": s.lost,
            "unaccounted": s.unaccounted,
            "output_error": o.output_error,
            "rss_samples": o.rss,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}
