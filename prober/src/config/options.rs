//! Validated options: what rtprobe will do, checked before anything touches
//! the system. Built from the CLI (and from scenario files).

use std::{path::PathBuf, time::Duration};

use anyhow::{Result, bail};

use crate::{
    cli::{ProbeArgs, ReflectorArg, XdpActionArg, XdpModeArg},
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
    /// Who echoes the main flow's probes; None: the kernel where it attaches.
    pub reflector: Option<ReflectorArg>,
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
    /// Flows probed at the same time as the main one (flow ids 1..).
    pub extra_flows: Vec<ProbeConfig>,
    /// Forever, CSV rotation, interval reports, metrics, HDR log.
    pub continuous: crate::spec::continuous::ContinuousPlan,
}

/// An extra probe flow: `port=5062,tos=0x00,size=1472,interval=100us`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlowSpec {
    pub port: u16,
    pub tos: Option<u8>,
    pub size: Option<usize>,
    #[serde(default, with = "crate::tune::units::humane_duration::option")]
    pub interval: Option<Duration>,
}

impl FlowSpec {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut port = None;
        let (mut tos, mut size, mut interval) = (None, None, None);
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                format!("flow {s:?}: {part:?} is not key=value (keys: port, tos, size, interval)")
            })?;
            match k {
                "port" => {
                    port = Some(
                        v.parse::<u16>()
                            .map_err(|_| format!("flow {s:?}: bad port {v:?}"))?,
                    )
                }
                "tos" => tos = Some(crate::cli::parse_u8_maybe_hex(v)?),
                "size" => {
                    size = Some(
                        v.parse::<usize>()
                            .map_err(|_| format!("flow {s:?}: bad size {v:?}"))?,
                    )
                }
                "interval" => interval = Some(crate::cli::parse_duration(v)?),
                _ => {
                    return Err(format!(
                        "flow {s:?}: unknown key {k:?} (keys: port, tos, size, interval)"
                    ));
                }
            }
        }
        let port = port.ok_or_else(|| format!("flow {s:?}: give its port, e.g. port=5062"))?;
        if port == 0 {
            return Err(format!("flow {s:?}: port 0 is not usable"));
        }
        Ok(Self {
            port,
            tos,
            size,
            interval,
        })
    }

    /// The flow's probe options, unset fields taken from the main flow.
    pub fn config(&self, main: &ProbeConfig, flow: u8) -> Result<ProbeConfig> {
        let size = self.size.unwrap_or(main.size);
        if !(HEADER_LEN..=MAX_PAYLOAD_1500).contains(&size) {
            bail!(
                "flow port={}: size {size} is out of range {HEADER_LEN}..{MAX_PAYLOAD_1500}",
                self.port
            );
        }
        let interval = self.interval.unwrap_or(main.interval);
        if interval < Duration::from_micros(1) {
            bail!("flow port={}: interval must be at least 1us", self.port);
        }
        let count = match (main.count, main.duration) {
            // Same wall time as the main flow.
            (Some(n), None) => {
                Some(((n as u128 * main.interval.as_nanos()) / interval.as_nanos()).max(1) as u64)
            }
            (c, _) => c,
        };
        Ok(ProbeConfig {
            size,
            interval,
            count,
            tos: self.tos.unwrap_or(main.tos),
            port: self.port,
            flow,
            spin: main.spin.map(|s| s.min(interval)),
            // The in-kernel reflector answers the main flow's port only.
            kernel_reflector: false,
            ..main.clone()
        })
    }
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
        // --duration 0 (or --forever) probes until stopped.
        let continuous = a.continuous.plan(a.duration)?;
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
        if let Some(spin) = a.pacing.spin
            && spin > a.interval
        {
            bail!(
                "--spin {spin:?} is longer than the interval {:?}: use --busy-poll to spin all the time",
                a.interval
            );
        }
        if a.pacing.busy_poll && a.knobs.rt_priority.is_some() && rt_throttling_on() {
            bail!(
                "--busy-poll with --rt-priority: the kernel's real-time throttling \
                 (kernel.sched_rt_runtime_us) would stop the spinning sender for 50 ms every second; \
                 use one of the two"
            );
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
        let nic_pair = a.tx_if.is_some();
        let at_router = knobs.bottleneck() == crate::tune::Bottleneck::Router;
        if nic_pair && at_router {
            bail!("NIC-pair mode has no router: use --bottleneck sender");
        }
        if at_router
            && (knobs.link_rate.is_some() || knobs.qdisc.is_some())
            && a.xdp_mode != XdpModeArg::Off
            && a.xdp_action == XdpActionArg::Redirect
        {
            bail!(
                "XDP_REDIRECT transmits past the router's qdisc, so shaping/qdisc at the router would not act: \
                 use --xdp-mode off, --xdp-action pass, or --bottleneck sender"
            );
        }
        let queue_csv = knobs.queue_sample.map(|_| sibling(&a.out, "queue.csv"));
        let rt = knobs.rt();
        if a.flows.len() > 8 {
            bail!("at most 8 extra --flow (got {})", a.flows.len());
        }
        let mut ports = vec![a.port];
        for f in &a.flows {
            if ports.contains(&f.port) {
                bail!(
                    "--flow port={} is already used by another flow: give each flow its own port",
                    f.port
                );
            }
            ports.push(f.port);
        }
        let mut o = Self {
            knobs,
            queue_csv,
            extra_flows: Vec::new(),
            probe: ProbeConfig {
                size: a.size,
                interval: a.interval,
                count: if a.duration.is_some() || continuous.forever {
                    a.count
                } else {
                    Some(a.count.unwrap_or(DEFAULT_COUNT))
                },
                duration: a.duration.filter(|d| !d.is_zero()),
                tos: a.tos,
                port: a.port,
                timestamps: a.timestamps,
                timeout: a.timeout,
                flow: 0,
                spin: a.pacing.spin,
                busy_poll: a.pacing.busy_poll,
                rt,
                kernel_reflector: false,
            },
            xdp_mode: a.xdp_mode,
            xdp_action: a.xdp_action,
            reflector: a.reflector,
            tx_if: a.tx_if.clone(),
            rx_if: a.rx_if.clone(),
            out: a.out.clone(),
            json: a.json.clone(),
            label: a.label.clone(),
            quiet: a.quiet,
            continuous,
        };
        for (i, f) in a.flows.iter().enumerate() {
            let cfg = f.config(&o.probe, (i + 1) as u8)?;
            o.extra_flows.push(cfg);
        }
        Ok(o)
    }
}

/// Whether the kernel caps real-time tasks' CPU share
/// (/proc/sys/kernel/sched_rt_runtime_us is not -1; Linux >= 2.6.25).
fn rt_throttling_on() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/sched_rt_runtime_us")
        .map(|s| s.trim() != "-1")
        .unwrap_or(true)
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
        let e = opts(&[
            "--xdp-mode",
            "native",
            "--bottleneck",
            "router",
            "--link-rate",
            "100mbit",
        ])
        .unwrap_err();
        assert!(e.to_string().contains("past the router's qdisc"), "{e}");
        assert!(
            opts(&[
                "--xdp-mode",
                "native",
                "--xdp-action",
                "pass",
                "--bottleneck",
                "router",
                "--link-rate",
                "100mbit"
            ])
            .is_ok()
        );
        assert!(opts(&["--tx-if", "a", "--rx-if", "b", "--bottleneck", "router"]).is_err());
        let f = opts(&["--count", "100", "--flow", "port=5062,interval=100us,tos=0"]).unwrap();
        assert_eq!(f.extra_flows.len(), 1);
        assert_eq!(
            f.extra_flows[0].count,
            Some(1000),
            "same wall time as the main flow"
        );
        assert_eq!(
            (
                f.extra_flows[0].flow,
                f.extra_flows[0].port,
                f.extra_flows[0].tos
            ),
            (1, 5062, 0)
        );
        assert!(
            opts(&["--flow", "port=5061"]).is_err(),
            "port clash with the main flow"
        );
    }

    #[test]
    fn pacing_flags() {
        let o = opts(&["--interval", "1ms"]).unwrap();
        assert_eq!(o.probe.spin, None, "adaptive by default");
        assert!(!o.probe.busy_poll);
        let o = opts(&["--interval", "1ms", "--spin", "20us"]).unwrap();
        assert_eq!(o.probe.spin, Some(Duration::from_micros(20)));
        let o = opts(&["--busy-poll"]).unwrap();
        assert!(o.probe.busy_poll);
        let o = opts(&["--rt-priority", "50"]).unwrap();
        assert_eq!(o.probe.rt.fifo_priority, Some(50));
        if rt_throttling_on() {
            assert!(
                opts(&["--busy-poll", "--rt-priority", "50"])
                    .unwrap_err()
                    .to_string()
                    .contains("throttling")
            );
        }
        assert!(opts(&["--interval", "10us", "--spin", "20us"]).is_err());
        assert!(
            Cli::try_parse_from(["rtprobe", "--busy-poll", "--spin", "5us"]).is_err(),
            "busy-poll already spins all the time"
        );
        // An extra flow's fixed spin is at most its interval.
        let f = opts(&["--spin", "50us", "--flow", "port=5062,interval=20us"]).unwrap();
        assert_eq!(f.extra_flows[0].spin, Some(Duration::from_micros(20)));
        let f = opts(&["--flow", "port=5062,interval=20us"]).unwrap();
        assert_eq!(f.extra_flows[0].spin, None);
    }
}
