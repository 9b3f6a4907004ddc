//! The one validator: merged specs in, the run plan out, with the same
//! limits for the command line and scenario files. Errors carry the key of
//! the option to blame; [`SpecError::for_cli`] shows it as the flag, the
//! scenario loader as the TOML key with its file and line.

use std::{fmt, path::PathBuf, time::Duration};

use crate::{
    ebpf::{ReflectorKind, XdpAction, XdpMode},
    model::units::fmt_duration,
    probe::{ProbeConfig, TimestampSource, packet::HEADER_LEN, stamp},
    tune::{Bottleneck, Knobs},
};

use super::{
    FlowSpec, KnobSpec, OutputSpec, RunSpec, continuous::MetricsSeries, flag_of,
    remote::ProtocolArg,
};

pub(crate) use crate::probe::wire::{MAX_PAYLOAD_1500, MAX_PAYLOAD_1500_IPV6};
/// Default probe count when neither count nor duration is given.
pub(crate) const DEFAULT_COUNT: u64 = 1000;
/// Most extra flows next to the main one.
pub(crate) const MAX_EXTRA_FLOWS: usize = 8;
pub(crate) const MIN_INTERVAL: Duration = Duration::from_micros(1);
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(3600);
pub(crate) const DEFAULT_SIZE: usize = 64;
pub(crate) const DEFAULT_PORT: u16 = 5061;
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_millis(1);
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Everything one probe run needs.
#[derive(Debug, Clone)]
pub(crate) struct RunOptions {
    pub(crate) probe: ProbeConfig,
    pub(crate) xdp_mode: XdpMode,
    pub(crate) xdp_action: XdpAction,
    /// Who echoes the main flow's probes; None: the kernel where it attaches.
    pub(crate) reflector: Option<ReflectorKind>,
    /// NIC-pair mode when both are set.
    pub(crate) tx_if: Option<String>,
    pub(crate) rx_if: Option<String>,
    /// NIC-pair mode may take an interface with a default route or the SSH session's address.
    pub(crate) force: bool,
    pub(crate) out: PathBuf,
    pub(crate) json: Option<PathBuf>,
    pub(crate) label: Option<String>,
    pub(crate) quiet: bool,
    /// Kernel knobs applied for the run (probe context already set).
    pub(crate) knobs: Knobs,
    /// Where the queue sampler writes, when the knobs ask for one.
    pub(crate) queue_csv: Option<PathBuf>,
    /// Flows probed at the same time as the main one (flow ids 1..).
    pub(crate) extra_flows: Vec<ProbeConfig>,
    /// Forever, CSV rotation, interval reports, metrics, HDR log.
    pub(crate) continuous: super::continuous::ContinuousPlan,
    /// Probe protocol, remote target (no testbed), STAMP key.
    pub(crate) remote: super::remote::RemoteOptions,
    /// The probes' address family on a testbed run (`--ip`).
    pub(crate) ip: crate::testbed::IpVersion,
}

/// An option that cannot work: its spec key (`size`, `link_rate`) and why.
/// The message reads after the flag or key: "--size 8 is out of range ...",
/// "probe.sizes: 8 is out of range ...".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpecError {
    pub(crate) key: &'static str,
    pub(crate) message: String,
}

impl SpecError {
    pub(crate) fn new(key: &'static str, message: impl Into<String>) -> Self {
        Self {
            key,
            message: message.into(),
        }
    }

    /// One line naming the flag: "--size 8 is out of range: ...".
    pub(crate) fn for_cli(&self) -> String {
        format!("{} {}", flag_of(self.key), self.message)
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

impl std::error::Error for SpecError {}

/// Longest interface name Linux takes: IFNAMSIZ (16) less the NUL.
pub(crate) const MAX_IFNAME_BYTES: usize = 15;

/// Why the kernel would refuse `name` as an interface name (its
/// `dev_valid_name`), said before anything is built; None if it is valid.
pub(crate) fn bad_interface_name(name: &str) -> Option<String> {
    let shown = name.escape_debug();
    if name.is_empty() {
        return Some("is empty: name an existing interface (see `ip link`)".into());
    }
    if name.len() > MAX_IFNAME_BYTES {
        return Some(format!(
            "{shown} is {} bytes: Linux interface names are at most {MAX_IFNAME_BYTES} bytes \
             (IFNAMSIZ - 1); check the name with `ip link`",
            name.len()
        ));
    }
    if name == "."
        || name == ".."
        || name.contains(['/', ':'])
        || name.contains(char::is_whitespace)
    {
        return Some(format!(
            "{shown} is not an interface name (no '/', ':' or spaces, not . or ..): check the \
             name with `ip link`"
        ));
    }
    None
}

/// The merged specs of one run -> its plan. No system access except
/// reading whether real-time throttling is on (busy-poll with
/// rt-priority); output paths are checked by [`check_output_paths`].
pub(crate) fn validate(
    run: &RunSpec,
    knobs: &KnobSpec,
    out: &OutputSpec,
) -> Result<RunOptions, SpecError> {
    let p = &run.probe;
    let (size, interval, count) = probe_amount(run)?;
    let mut continuous = run.continuous.plan(p.duration)?;
    let many_targets = run.remote.target.len() > 1 || run.remote.targets.is_some();
    if many_targets && run.continuous.metrics_histograms.is_none() {
        continuous.metrics_series = MetricsSeries {
            buckets: continuous.metrics_series.buckets,
            ..MetricsSeries::for_fleet()
        };
    }
    let timeout = p.timeout.unwrap_or(DEFAULT_TIMEOUT);
    if timeout.is_zero() {
        return Err(SpecError::new("timeout", "must be more than 0 (e.g. 1s)"));
    }
    let port = p.port.unwrap_or(DEFAULT_PORT);
    if port == 0 {
        return Err(SpecError::new(
            "port",
            "0 is not a usable UDP port: pick 1..65535 (default 5061)",
        ));
    }
    check_interfaces(p.tx_if.as_deref(), p.rx_if.as_deref())?;
    let busy_poll = run.pacing.busy_poll.unwrap_or(false);
    check_pacing(run, knobs, interval)?;
    let mut k = Knobs::from(knobs.clone());
    k.set_probe(port, size, interval);
    k.probe.ipv6 = p.ip == Some(crate::testbed::IpVersion::V6);
    k.validate_with_probe()
        .map_err(|ke| SpecError::new(ke.key, ke.message))?;
    let xdp_mode = run.xdp.xdp_mode.unwrap_or_default();
    let xdp_action = run.xdp.xdp_action.unwrap_or_default();
    check_bottleneck(&k, p.tx_if.is_some(), xdp_mode, xdp_action)?;
    let flows: &[FlowSpec] = run.flows.flows.as_deref().unwrap_or_default();
    check_flow_ports(port, flows)?;
    let out_csv = out.out.clone().unwrap_or_else(|| PathBuf::from("out.csv"));
    let queue_csv = k.queue_sample.map(|_| sibling(&out_csv, "queue.csv"));
    let probe = ProbeConfig {
        size,
        interval,
        count,
        duration: p.duration.filter(|d| !d.is_zero()),
        tos: p.tos.unwrap_or(0),
        port,
        timestamps: p.timestamps.unwrap_or_default(),
        timeout,
        flow: 0,
        spin: run.pacing.spin,
        busy_poll,
        no_warm_up: run.pacing.no_warm_up.unwrap_or(false),
        rt: k.rt(),
        kernel_reflector: false,
    };
    let extra_flows = flows
        .iter()
        .enumerate()
        .map(|(i, f)| flow_config(f, &probe, (i + 1) as u8))
        .collect::<Result<Vec<_>, _>>()?;
    let ip = p.ip.unwrap_or_default();
    check_family(run, ip, &probe, &extra_flows)?;
    let plan = RunOptions {
        probe,
        xdp_mode,
        xdp_action,
        reflector: run.xdp.reflector,
        tx_if: p.tx_if.clone(),
        rx_if: p.rx_if.clone(),
        force: p.force.unwrap_or(false),
        out: out_csv,
        json: out.json.clone(),
        label: out.label.clone(),
        quiet: out.quiet.unwrap_or(false),
        knobs: k,
        queue_csv,
        extra_flows,
        continuous,
        remote: run.remote.clone(),
        ip,
    };
    check_remote(&plan)?;
    Ok(plan)
}

/// Size, interval and how many probes (None: until the duration ends or
/// forever).
fn probe_amount(run: &RunSpec) -> Result<(usize, Duration, Option<u64>), SpecError> {
    let e = |key, m: String| Err(SpecError::new(key, m));
    let p = &run.probe;
    let size = p.size.unwrap_or(DEFAULT_SIZE);
    if !(HEADER_LEN..=MAX_PAYLOAD_1500).contains(&size) {
        return e(
            "size",
            format!(
                "{size} is out of range: use {HEADER_LEN}..{MAX_PAYLOAD_1500} bytes of UDP payload \
                 (1472 fills a 1500-byte MTU)"
            ),
        );
    }
    let interval = p.interval.unwrap_or(DEFAULT_INTERVAL);
    if interval < MIN_INTERVAL {
        return e(
            "interval",
            format!(
                "{} is too short: use at least 1us (e.g. 10us, 1ms)",
                fmt_duration(interval)
            ),
        );
    }
    if interval > MAX_INTERVAL {
        return e(
            "interval",
            format!("{} is too long: use at most 1h", fmt_duration(interval)),
        );
    }
    let forever = run.continuous.forever == Some(true);
    if forever && p.count.is_some() {
        return e(
            "forever",
            "and count: give one (forever probes until stopped)".into(),
        );
    }
    let count = match (p.count, p.duration) {
        (Some(_), Some(_)) => {
            return e(
                "duration",
                "and count: give count or duration, not both".into(),
            );
        }
        (Some(0), None) => return e("count", "0 sends nothing: give at least 1".into()),
        // --duration 0 is --forever (run.continuous): no count, no end.
        (_, Some(d)) if d.is_zero() => None,
        (Some(n), None) => Some(n),
        (None, Some(_)) => None,
        (None, None) if forever => None,
        (None, None) => Some(DEFAULT_COUNT),
    };
    Ok((size, interval, count))
}

/// NIC-pair mode: two valid, different interface names, or none.
fn check_interfaces(tx_if: Option<&str>, rx_if: Option<&str>) -> Result<(), SpecError> {
    for (key, name) in [("tx_if", tx_if), ("rx_if", rx_if)] {
        if let Some(why) = name.and_then(bad_interface_name) {
            return Err(SpecError::new(key, why));
        }
    }
    match (tx_if, rx_if) {
        (Some(t), Some(r)) if t == r => Err(SpecError::new(
            "rx_if",
            format!("must name another interface than tx_if (both are {t})"),
        )),
        (Some(_), None) => Err(SpecError::new(
            "rx_if",
            "is missing: NIC-pair mode needs both tx_if and rx_if",
        )),
        (None, Some(_)) => Err(SpecError::new(
            "tx_if",
            "is missing: NIC-pair mode needs both tx_if and rx_if",
        )),
        _ => Ok(()),
    }
}

/// How the sender waits between probes: spin or busy-poll, and busy-poll
/// only where real-time throttling would not stop it.
fn check_pacing(run: &RunSpec, knobs: &KnobSpec, interval: Duration) -> Result<(), SpecError> {
    let busy_poll = run.pacing.busy_poll.unwrap_or(false);
    if let Some(spin) = run.pacing.spin {
        if busy_poll {
            return Err(SpecError::new(
                "spin",
                "and busy_poll: busy-poll already spins all the time",
            ));
        }
        if spin > interval {
            return Err(SpecError::new(
                "spin",
                format!(
                    "{} is longer than the interval {}: use busy-poll to spin all the time",
                    fmt_duration(spin),
                    fmt_duration(interval)
                ),
            ));
        }
    }
    if busy_poll && knobs.rt_priority.is_some() && rt_throttling_on() {
        return Err(SpecError::new(
            "busy_poll",
            "with rt-priority: the kernel's real-time throttling (kernel.sched_rt_runtime_us) \
             would stop the spinning sender for 50 ms every second; use one of the two",
        ));
    }
    Ok(())
}

/// Where the link is shaped and what that needs: a router to shape at, a
/// rate for loads given as a share of it, a queue to sample.
fn check_bottleneck(
    k: &Knobs,
    nic_pair: bool,
    xdp_mode: XdpMode,
    xdp_action: XdpAction,
) -> Result<(), SpecError> {
    let at_router = k.bottleneck() == Bottleneck::Router;
    if nic_pair && at_router {
        return Err(SpecError::new(
            "bottleneck",
            "router: NIC-pair mode has no router; use bottleneck sender",
        ));
    }
    if at_router
        && (k.link_rate.is_some() || k.qdisc.is_some())
        && xdp_mode != XdpMode::Off
        && xdp_action == XdpAction::Redirect
    {
        return Err(SpecError::new(
            "bottleneck",
            "router: XDP_REDIRECT transmits past the router's qdisc, so shaping/qdisc at the \
             router would not act; use xdp mode off, xdp action pass, or bottleneck sender",
        ));
    }
    if !nic_pair
        && k.link_rate.is_none()
        && let Some(l) = k.loads().iter().find(|l| l.needs_link_rate())
    {
        return Err(SpecError::new(
            "load",
            format!(
                "{l} is a share of the link, but a veth has no rate: set link_rate (shaping) \
                 or give a rate such as tcp:50mbit"
            ),
        ));
    }
    if k.queue_sample.is_some() && k.link_rate.is_none() && k.qdisc.is_none() {
        return Err(SpecError::new(
            "queue_sample",
            "has no queue to sample: shape the link or set a qdisc",
        ));
    }
    Ok(())
}

/// At most [`MAX_EXTRA_FLOWS`] extra flows, each on a port of its own.
fn check_flow_ports(port: u16, flows: &[FlowSpec]) -> Result<(), SpecError> {
    if flows.len() > MAX_EXTRA_FLOWS {
        return Err(SpecError::new(
            "flows",
            format!(
                "gives {} extra flows; at most {MAX_EXTRA_FLOWS}",
                flows.len()
            ),
        ));
    }
    let mut ports = vec![port];
    for f in flows {
        if ports.contains(&f.port) {
            return Err(SpecError::new(
                "flows",
                format!(
                    "port={} is already used by another flow: give each flow its own port",
                    f.port
                ),
            ));
        }
        ports.push(f.port);
    }
    Ok(())
}

/// `--ip` is the testbed's; over IPv6 every flow's probes must fit the MTU.
fn check_family(
    run: &RunSpec,
    ip: crate::testbed::IpVersion,
    probe: &ProbeConfig,
    extra_flows: &[ProbeConfig],
) -> Result<(), SpecError> {
    if run.probe.ip.is_some() && run.remote.is_remote() {
        return Err(SpecError::new(
            "ip",
            "is for testbed runs: with --target the address gives the family (an IPv6 target \
             is written [2001:db8::2]:862)",
        ));
    }
    if ip == crate::testbed::IpVersion::V6
        && let Some(big) = std::iter::once(probe)
            .chain(extra_flows)
            .map(|c| c.size)
            .find(|&s| s > MAX_PAYLOAD_1500_IPV6)
    {
        return Err(SpecError::new(
            "size",
            format!(
                "{big} does not fit a 1500-byte MTU over IPv6 (40-byte header): use at most \
                 {MAX_PAYLOAD_1500_IPV6} bytes with ip 6"
            ),
        ));
    }
    Ok(())
}

/// The probe protocol, STAMP authentication and a remote target against
/// the rest of the plan: what a `--target` run cannot use (it builds no
/// testbed), what STAMP cannot carry. Checked here so that `run --check`
/// refuses such a cell before anything runs.
fn check_remote(o: &RunOptions) -> Result<(), SpecError> {
    let remote = &o.remote;
    let stamp = remote.protocol() == ProtocolArg::Stamp;
    if remote.auth_key.is_some() && !stamp {
        return Err(SpecError::new(
            "auth_key",
            "is STAMP's authenticated mode: add --protocol stamp",
        ));
    }
    let min_size = match (stamp, remote.auth_key.is_some()) {
        (false, _) => HEADER_LEN,
        (true, false) => stamp::UNAUTH_LEN_BYTES,
        (true, true) => stamp::AUTH_LEN_BYTES,
    };
    if o.probe.size < min_size {
        return Err(SpecError::new(
            "size",
            format!(
                "{} is too small for {} probes: use at least {min_size} bytes",
                o.probe.size,
                remote.protocol().name()
            ),
        ));
    }
    if remote.is_remote() {
        return check_target(o);
    }
    if stamp && !o.extra_flows.is_empty() {
        return Err(SpecError::new(
            "flows",
            "works with the rtprobe protocol only: drop --flow or --protocol stamp",
        ));
    }
    if remote.auth_key.is_some() && o.reflector == Some(ReflectorKind::Kernel) {
        return Err(SpecError::new(
            "reflector",
            "kernel answers unauthenticated STAMP only: drop --auth-key or use --reflector user",
        ));
    }
    Ok(())
}

/// A `--target` run probes a remote reflector: the options that set up a
/// testbed have nothing to act on.
fn check_target(o: &RunOptions) -> Result<(), SpecError> {
    let refuse = |key, message: &str| Err(SpecError::new(key, message));
    if o.tx_if.is_some() {
        return refuse(
            "target",
            "probes a remote reflector: --tx-if/--rx-if build a testbed; use one or the other",
        );
    }
    if !o.extra_flows.is_empty() {
        return refuse(
            "flows",
            "is for testbed runs; with --target run one rtprobe per flow",
        );
    }
    if o.reflector.is_some() {
        return refuse(
            "reflector",
            "chooses the testbed's reflector; with --target the remote host's answers",
        );
    }
    if o.xdp_mode != XdpMode::Auto {
        return refuse(
            "xdp_mode",
            "sets the testbed's router; with --target there is none",
        );
    }
    if o.probe.timestamps == TimestampSource::Hardware {
        return refuse(
            "timestamps",
            "hardware is for testbed runs; with --target use software or auto",
        );
    }
    let many = o.remote.target.len() > 1 || o.remote.targets.is_some();
    if many && o.continuous.hdr_log.is_some() {
        return refuse(
            "hdr_log",
            "writes one target's histograms; with several targets use --metrics-listen (a series per target) or one rtprobe per --target",
        );
    }
    if many && o.continuous.report_every.is_some() {
        return refuse(
            "report_every",
            "prints one target's intervals; with several targets use --metrics-listen (a series per target) or one rtprobe per --target",
        );
    }
    let mut k = o.knobs.clone();
    (k.rt_priority, k.mlockall, k.pin_cpu, k.cpu_dma_latency) = (None, None, None, None);
    if !k.is_empty() {
        return refuse(
            "target",
            "takes only the sender's real-time knobs (--rt-priority, --mlockall, --pin-cpu, \
             --cpu-dma-latency); the other knobs change a testbed's interfaces",
        );
    }
    Ok(())
}

/// An extra flow's probe options, unset fields taken from the main flow.
fn flow_config(f: &FlowSpec, main: &ProbeConfig, flow: u8) -> Result<ProbeConfig, SpecError> {
    let size = f.size.unwrap_or(main.size);
    if !(HEADER_LEN..=MAX_PAYLOAD_1500).contains(&size) {
        return Err(SpecError::new(
            "flows",
            format!(
                "port={}: size {size} is out of range {HEADER_LEN}..{MAX_PAYLOAD_1500}",
                f.port
            ),
        ));
    }
    let interval = f.interval.unwrap_or(main.interval);
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
        return Err(SpecError::new(
            "flows",
            format!("port={}: interval must be 1us to 1h", f.port),
        ));
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
        tos: f.tos.unwrap_or(main.tos),
        port: f.port,
        flow,
        spin: main.spin.map(|s| s.min(interval)),
        // The in-kernel reflector answers the main flow's port only.
        kernel_reflector: false,
        ..main.clone()
    })
}

/// `dir/out.csv` + "queue.csv" -> `dir/out-queue.csv`.
pub(crate) fn sibling(path: &std::path::Path, suffix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    path.with_file_name(format!("{stem}-{suffix}"))
}

/// Whether the kernel caps real-time tasks' CPU share (read by
/// [`crate::sys::host::rt_throttling_on`]).
pub(crate) fn rt_throttling_on() -> bool {
    crate::sys::host::rt_throttling_on()
}

/// The command line's output files: not a directory, in a directory that
/// exists. (A scenario makes its output folder itself.)
pub(crate) fn check_output_paths(o: &RunOptions) -> Result<(), SpecError> {
    check_out_path(&o.out, "out")?;
    if let Some(j) = &o.json {
        check_out_path(j, "json")?;
    }
    Ok(())
}

pub(crate) fn check_out_path(p: &std::path::Path, key: &'static str) -> Result<(), SpecError> {
    if p.is_dir() {
        return Err(SpecError::new(
            key,
            format!("{} is a directory: give a file name", p.display()),
        ));
    }
    let parent = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        return Err(SpecError::new(
            key,
            format!(
                "{}: directory {} does not exist",
                p.display(),
                parent.display()
            ),
        ));
    }
    Ok(())
}
