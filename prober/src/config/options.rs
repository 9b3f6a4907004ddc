//! Validated options: what rtprobe will do, checked before anything touches
//! the system. Built from the CLI (and from scenario files).

use std::{path::PathBuf, time::Duration};

use anyhow::{Result, bail};

use crate::{
    cli::{ProbeArgs, XdpActionArg, XdpModeArg},
    probe::{ProbeConfig, packet::HEADER_LEN},
    tune::Knobs,
};

/// Largest UDP payload on a 1500-byte MTU path (1500 - 20 IPv4 - 8 UDP).
pub const MAX_PAYLOAD_1500: usize = 1472;
/// Default probe count when neither --count nor --duration is given.
pub const DEFAULT_COUNT: u64 = 1000;

/// Everything one probe run needs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub probe: ProbeConfig,
    pub xdp_mode: XdpModeArg,
    pub xdp_action: XdpActionArg,
    /// NIC-pair mode when both are set.
    pub tx_if: Option<String>,
    pub rx_if: Option<String>,
    pub out: PathBuf,
    pub json: Option<PathBuf>,
    pub label: Option<String>,
    pub quiet: bool,
    /// Kernel knobs applied for the run (probe context already set).
    pub knobs: Knobs,
    /// Where the queue sampler writes, when the knobs ask for one.
    pub queue_csv: Option<PathBuf>,
}

/// `dir/out.csv` + "queue.csv" -> `dir/out-queue.csv`.
pub fn sibling(path: &std::path::Path, suffix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    path.with_file_name(format!("{stem}-{suffix}"))
}

impl RunOptions {
    pub fn from_args(a: &ProbeArgs) -> Result<Self> {
        if a.size < HEADER_LEN || a.size > MAX_PAYLOAD_1500 {
            bail!(
                "--size {} is out of range: use {HEADER_LEN}..{MAX_PAYLOAD_1500} bytes of UDP payload (1472 fills a 1500-byte MTU)",
                a.size
            );
        }
        if a.interval < Duration::from_micros(1) {
            bail!(
                "--interval {:?} is too short: use at least 1us (e.g. 10us, 1ms)",
                a.interval
            );
        }
        if a.interval > Duration::from_secs(3600) {
            bail!("--interval {:?} is too long: use at most 1h", a.interval);
        }
        if a.count == Some(0) {
            bail!("--count 0 sends nothing: give at least 1");
        }
        if a.duration.is_some_and(|d| d.is_zero()) {
            bail!("--duration 0 sends nothing: give e.g. 10s");
        }
        if a.timeout.is_zero() {
            bail!("--timeout must be more than 0 (e.g. 1s)");
        }
        if a.port == 0 {
            bail!("--port 0 is not a usable UDP port: pick 1..65535 (default 5061)");
        }
        if let (Some(t), Some(r)) = (&a.tx_if, &a.rx_if)
            && t == r
        {
            bail!("--tx-if and --rx-if must be two different interfaces (both are {t})");
        }
        check_out_path(&a.out, "--out")?;
        if let Some(j) = &a.json {
            check_out_path(j, "--json")?;
        }
        let mut knobs = Knobs::from_args(&a.knobs).map_err(|e| anyhow::anyhow!("{e}"))?;
        knobs.set_probe(a.port, a.size, a.interval);
        knobs
            .validate_with_probe()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let queue_csv = knobs.queue_sample.map(|_| sibling(&a.out, "queue.csv"));
        let rt = knobs.rt();
        Ok(Self {
            knobs,
            queue_csv,
            probe: ProbeConfig {
                size: a.size,
                interval: a.interval,
                count: if a.duration.is_some() {
                    a.count
                } else {
                    Some(a.count.unwrap_or(DEFAULT_COUNT))
                },
                duration: a.duration,
                tos: a.tos,
                port: a.port,
                timestamps: a.timestamps,
                timeout: a.timeout,
                flow: 0,
                spin: Duration::from_micros(50).min(a.interval / 2),
                rt,
            },
            xdp_mode: a.xdp_mode,
            xdp_action: a.xdp_action,
            tx_if: a.tx_if.clone(),
            rx_if: a.rx_if.clone(),
            out: a.out.clone(),
            json: a.json.clone(),
            label: a.label.clone(),
            quiet: a.quiet,
        })
    }
}

fn check_out_path(p: &std::path::Path, flag: &str) -> Result<()> {
    if p.is_dir() {
        bail!("{flag} {} is a directory: give a file name", p.display());
    }
    let parent = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        bail!(
            "{flag} {}: directory {} does not exist",
            p.display(),
            parent.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn opts(args: &[&str]) -> Result<RunOptions> {
        let mut v = vec!["rtprobe"];
        v.extend_from_slice(args);
        RunOptions::from_args(&Cli::try_parse_from(v).unwrap().probe)
    }

    #[test]
    fn defaults_and_limits() {
        let o = opts(&[]).unwrap();
        assert_eq!(o.probe.count, Some(DEFAULT_COUNT));
        assert_eq!(o.probe.size, 64);
        assert_eq!(o.probe.port, 5061);
        assert!(
            opts(&["--size", "8"])
                .unwrap_err()
                .to_string()
                .contains("--size 8")
        );
        assert!(opts(&["--size", "9000"]).is_err());
        assert!(opts(&["--count", "0"]).is_err());
        assert!(opts(&["--port", "0"]).is_err());
        assert!(
            opts(&["--out", "/nonexistent-dir/x.csv"])
                .unwrap_err()
                .to_string()
                .contains("does not exist")
        );
        assert!(
            opts(&["--out", "/tmp"])
                .unwrap_err()
                .to_string()
                .contains("directory")
        );
        let d = opts(&["--duration", "2s"]).unwrap();
        assert_eq!(d.probe.count, None);
        assert!(opts(&["--tx-if", "a", "--rx-if", "a"]).is_err());
    }
}
