//! What the user typed: clap derive only. Validation lives in `config`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::export::plot::{
    FigureKind, ImageFormat, MetricChoice, parse_figure_size, parse_latency,
};

#[derive(Debug, Parser)]
#[command(
    name = "rtprobe",
    version,
    about = "Measure per-packet latency across a path, through rtprobe's own XDP router",
    long_about = "Measure per-packet latency across a path, through rtprobe's own XDP router.\n\n\
        Without a subcommand rtprobe builds a testbed (network namespaces sender -> router -> \
        receiver joined by veth pairs, or two existing interfaces with --tx-if/--rx-if), attaches \
        its XDP router in the requested mode, sends timestamped UDP probes that the receiver \
        echoes back, and writes one CSV row per probe plus a summary. Needs root.",
    after_help = "Examples:\n  \
        sudo rtprobe --xdp-mode native --size 64 --interval 1ms --count 2000\n  \
        sudo rtprobe --xdp-mode off --duration 30s --out baseline.csv --json baseline.json\n  \
        sudo rtprobe --tx-if enp1s0 --rx-if enp2s0 --xdp-mode off --tos 0xC0\n  \
        rtprobe plot baseline.csv out.csv",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub probe: ProbeArgs,

    /// More log output (-v info, -vv debug). RUST_LOG overrides it.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, help_heading = "Global options")]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Draw SVG/PNG boxplots, CDFs, time series, percentile distributions and stage breakdowns
    /// from rtprobe CSV files.
    Plot(PlotArgs),
    /// Run a scenario file: sizes x intervals x knob sets, then report.md.
    Run(RunArgs),
    /// Blast packets through the router hop and report forwarded packets/s, drops, CPU per
    /// core and probe latency, for kernel forwarding and each XDP mode.
    BenchForward(BenchForwardArgs),
    /// Tell whether runs differ from a baseline: p50/p99/p99.9 changes with 95 % confidence
    /// intervals, in words.
    Compare(CompareArgs),
    /// Print a shell completion script for bash, zsh or fish.
    Completions(CompletionsArgs),
    /// Build the veth testbed (with the XDP router as asked), print it as one JSON line and
    /// keep it until stdin closes or a signal comes (for running other tools on the same path).
    #[command(hide = true)]
    Testbed(TestbedArgs),
    /// Answer probes from other hosts (rtprobe's protocol or STAMP) in this network namespace,
    /// until Ctrl-C; `rtprobe --target` on the other host sends them.
    Reflect(crate::spec::remote::ReflectArgs),
    /// Write the man pages (rtprobe.1 and one per subcommand) and print their paths; `cargo
    /// xtask man` runs it.
    #[command(hide = true)]
    Man(ManArgs),
}

/// How the XDP router is attached on the router's interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpModeArg {
    /// No XDP program: the kernel forwards (the baseline).
    Off,
    /// Generic XDP (XDP_FLAGS_SKB_MODE), works on any driver.
    Skb,
    /// Driver XDP (XDP_FLAGS_DRV_MODE); fails if the driver lacks it.
    Native,
    /// Let the kernel choose (native if the driver has it, else generic); the attached mode is reported.
    Auto,
}

/// What the XDP router does with IPv4 it could forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpActionArg {
    /// bpf_fib_lookup + MAC rewrite + XDP_REDIRECT (the router).
    Redirect,
    /// XDP_PASS every packet to the kernel stack (the study's "pass by default" variant).
    Pass,
}

/// Who answers the probes at the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReflectorArg {
    /// rtprobe's XDP program on the receiver's interface replies with
    /// XDP_TX and writes its receive/transmit times into the echo.
    Kernel,
    /// A user-space thread reads each probe and sends the echo.
    User,
}

/// Which timestamps to ask the kernel for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimestampArg {
    /// Hardware where the NIC has it (SIOCSHWTSTAMP), software otherwise.
    Auto,
    /// Hardware only: fail if the NIC cannot timestamp in hardware.
    Hardware,
    /// Kernel software timestamps only.
    Software,
}

#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// XDP router attach mode on the router's interfaces.
    #[arg(long, value_enum, default_value_t = XdpModeArg::Auto)]
    pub xdp_mode: XdpModeArg,

    /// XDP router behaviour: forward in XDP (redirect) or hand every packet to the kernel (pass).
    #[arg(long, value_enum, default_value_t = XdpActionArg::Redirect)]
    pub xdp_action: XdpActionArg,

    /// Who echoes the probes [default: kernel where it attaches, else user, with a note].
    #[arg(long, value_enum)]
    pub reflector: Option<ReflectorArg>,

    /// UDP payload bytes per probe (the study used 64, 200 and 1472).
    #[arg(long, default_value_t = 64)]
    pub size: usize,

    /// Time between probes, e.g. 100us, 1ms, 10ms.
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    pub interval: std::time::Duration,

    /// Number of probes to send [default: 1000 unless --duration is given].
    #[arg(long, conflicts_with = "duration")]
    pub count: Option<u64>,

    /// Send probes for this long instead of a fixed count, e.g. 30s, 5min.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<std::time::Duration>,

    /// IP TOS byte of the probes (0xC0 = the study's DSCP CS6).
    #[arg(long, default_value = "0", value_parser = parse_u8_maybe_hex)]
    pub tos: u8,

    /// UDP port of the probe flow.
    #[arg(long, default_value_t = 5061)]
    pub port: u16,

    /// Timestamp source to ask for.
    #[arg(long, value_enum, default_value_t = TimestampArg::Auto)]
    pub timestamps: TimestampArg,

    /// A probe not echoed back this long after it was sent counts as lost.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub timeout: std::time::Duration,

    /// Per-probe CSV, streamed as the run goes.
    #[arg(long, default_value = "out.csv")]
    pub out: PathBuf,

    /// Also write the summary as JSON to this path.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Existing interface to send from (NIC-pair mode; needs --rx-if). It is moved into the
    /// sender namespace for the run and given back afterwards.
    #[arg(long, requires = "rx_if")]
    pub tx_if: Option<String>,

    /// Existing interface to receive on (NIC-pair mode; needs --tx-if).
    #[arg(long, requires = "tx_if")]
    pub rx_if: Option<String>,

    /// Another probe flow at the same time (repeatable), e.g. a low-priority flow:
    /// port=5062[,tos=0x00][,size=1472][,interval=100us]. Unset fields follow the main flow;
    /// rows carry the flow id (main = 0) and the summary has per-flow statistics.
    #[arg(long = "flow", value_name = "SPEC", value_parser = crate::config::FlowSpec::parse)]
    pub flows: Vec<crate::config::FlowSpec>,

    /// Label stored in the CSV metadata and used as the legend by `rtprobe plot`.
    #[arg(long)]
    pub label: Option<String>,

    /// Print no progress, only the summary.
    #[arg(short, long)]
    pub quiet: bool,

    #[command(flatten)]
    pub pacing: PacingArgs,

    #[command(flatten)]
    pub remote: crate::spec::remote::RemoteOptions,

    #[command(flatten)]
    pub knobs: crate::tune::KnobArgs,
}

/// How the probe sender keeps its schedule. The schedule is absolute (probe
/// n goes at start + n x interval), so lateness never accumulates.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Pacing")]
pub struct PacingArgs {
    /// Spin on the clock for the whole interval instead of sleeping: the lowest send error,
    /// at the price of one busy core (on a 2-core machine that slows the receive side).
    #[arg(long, conflicts_with = "spin")]
    pub busy_poll: bool,

    /// Sleep until this long before each send, then spin on the clock [default: adaptive: the
    /// p99.5 of this machine's timer wake-up latency, learned while sending, at most half the
    /// interval].
    #[arg(long, value_parser = parse_duration)]
    pub spin: Option<std::time::Duration>,
}

/// One forwarding variant of `bench-forward`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardModeArg {
    /// Kernel IP forwarding, no XDP program.
    Off,
    /// rtprobe's router in generic (skb) XDP, redirecting.
    Skb,
    /// rtprobe's router in native (driver) XDP, redirecting.
    Native,
    /// rtprobe's router in generic XDP, passing every packet to the kernel.
    SkbPass,
    /// rtprobe's router in native XDP, passing every packet to the kernel.
    NativePass,
}

/// How `bench-forward` makes its load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GeneratorArg {
    /// Frames built in the kernel and redirected into the sender's veth (BPF_PROG_TEST_RUN live
    /// frames, as xdp-trafficgen does): no socket or skb cost on the generating side.
    Xdp,
    /// UDP sendmmsg from sockets in the sender namespace.
    Socket,
}

/// What takes the load at the receiver in `bench-forward`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkArg {
    /// A native XDP program on the receiver's veth drops the load (probes pass): only the
    /// router's cost is measured.
    Xdp,
    /// The receiver's stack takes the load (no socket: UDP drops it after the lookup).
    Stack,
}

#[derive(Debug, Clone, Args)]
pub struct BenchForwardArgs {
    /// Forwarding variants to measure, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [ForwardModeArg::Off, ForwardModeArg::Skb, ForwardModeArg::Native, ForwardModeArg::NativePass])]
    pub modes: Vec<ForwardModeArg>,

    /// IP packet sizes in bytes (64..1500; 1500 fills the MTU).
    #[arg(long, value_delimiter = ',', default_values_t = [64, 512, 1500])]
    pub sizes: Vec<usize>,

    /// Load steps: 100 = the generator flat out; below that, percent of what the hop forwarded
    /// flat out in that mode and size; 0 = probes only.
    #[arg(long, value_delimiter = ',', default_values_t = [0, 25, 50, 100])]
    pub load: Vec<u32>,

    /// How long each step lasts.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub step: std::time::Duration,

    /// Load generator.
    #[arg(long, value_enum, default_value_t = GeneratorArg::Xdp)]
    pub generator: GeneratorArg,

    /// Generator threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,

    /// What takes the load at the receiver.
    #[arg(long, value_enum, default_value_t = SinkArg::Xdp)]
    pub sink: SinkArg,

    /// Interval of the latency probe that runs during every step.
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    pub probe_interval: std::time::Duration,

    /// Keep the router's NAPI polling in softirq on the generator's core instead of a kernel
    /// thread of its own (the default lets the scheduler put the router on another core).
    #[arg(long)]
    pub no_threaded_napi: bool,

    /// Run the generator threads and the router's NAPI thread SCHED_FIFO at this priority (the
    /// probe's threads one above), so other work on the machine does not take the cores.
    #[arg(long)]
    pub rt_priority: Option<u8>,

    /// Write every step's figures as JSON to this path.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Keep each step's probe CSV in this directory.
    #[arg(long)]
    pub csv_dir: Option<PathBuf>,

    /// Print only the final table.
    #[arg(short, long)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Args)]
pub struct TestbedArgs {
    /// XDP router attach mode on the router's interfaces.
    #[arg(long, value_enum, default_value_t = XdpModeArg::Off)]
    pub xdp_mode: XdpModeArg,

    /// XDP router behaviour.
    #[arg(long, value_enum, default_value_t = XdpActionArg::Redirect)]
    pub xdp_action: XdpActionArg,
}

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "A JSON summary (--json) holds percentiles only: for a .json argument the \
    CSV of the same name next to it is read (out.json -> out.csv), as `rtprobe --out X.csv --json \
    X.json` and `rtprobe run` write them. Only the main flow (flow 0) is compared; lost probes \
    are left out.\n\n\
    A change is significant when its 95 % interval excludes 0. Percentiles interpolate between \
    order statistics; the intervals are bootstrap percentile intervals, the same for the same \
    files and --seed.\n\n\
    Examples:\n  \
    rtprobe compare baseline.csv xdp.csv\n  \
    rtprobe compare /tmp/bql/s64-i1ms-off-baseline.json /tmp/bql/s64-i1ms-off-bql-3000.json\n  \
    rtprobe compare off.csv native.csv --metric rtt --json verdict.json"
)]
pub struct CompareArgs {
    /// The baseline run: its per-probe CSV (--out), or its JSON summary with that CSV beside it.
    #[arg(value_name = "BASE")]
    pub base: PathBuf,

    /// The runs to compare with the baseline, each a CSV or a JSON summary as BASE.
    #[arg(required = true, value_name = "OTHER")]
    pub others: Vec<PathBuf>,

    /// Latency to compare.
    #[arg(long, value_enum, default_value_t = crate::export::compare::CompareMetric::OneWay)]
    pub metric: crate::export::compare::CompareMetric,

    /// Also write the comparison as JSON to this path.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Bootstrap resamples (100..100000).
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(100..=100_000))]
    pub resamples: u32,

    /// Most values per run the bootstrap uses (1000..10000000); a longer run is reduced to a
    /// uniform random sample of this many (reservoir sampling), which bounds memory and time.
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1000..=10_000_000))]
    pub sample: u32,

    /// Seed of the random sampling: the same files and seed give the same intervals.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
}

/// A shell `rtprobe completions` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShellArg {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = "Install, then open a new shell:\n  \
    rtprobe completions bash | sudo tee /etc/bash_completion.d/rtprobe >/dev/null\n  \
    rtprobe completions zsh > ~/.zfunc/_rtprobe    # with fpath+=~/.zfunc before compinit\n  \
    rtprobe completions fish > ~/.config/fish/completions/rtprobe.fish")]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: ShellArg,
}

#[derive(Debug, Clone, Args)]
pub struct ManArgs {
    /// Directory for the pages, created if missing.
    #[arg(long, value_name = "DIR", default_value = "target/man")]
    pub out_dir: PathBuf,
}

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Figures are written next to the first CSV (or in --out-dir) as \
        PREFIX-METRIC[-SPLIT][-GROUP]-KIND.svg (the stages figure: PREFIX[-SPLIT][-GROUP]-stages.svg), \
        and their paths printed one per line.\n\n\
        Examples:\n  \
        rtprobe plot out.csv\n  \
        rtprobe plot baseline.csv fq_codel.csv --kind stages,percentiles --format png\n  \
        rtprobe plot baseline.csv xdp.csv --label 'XDP off' --label 'XDP native' --log\n  \
        rtprobe plot runs/*.csv --group-by interval --split-by size --metric rtt --kind box\n  \
        rtprobe plot out.csv --format svg,png --out-dir figures --y-max 2ms"
)]
pub struct PlotArgs {
    /// rtprobe CSV files; several are drawn on the same axes (first red, second blue).
    #[arg(required = true, value_name = "CSV")]
    pub csv: Vec<PathBuf>,

    /// Directory for the figures, created if missing [default: the first CSV's directory].
    #[arg(short, long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,

    /// File name prefix of the figures [default: the CSV's name without .csv; A-vs-B for two or
    /// three CSVs; "compare" for more].
    #[arg(long, value_name = "NAME")]
    pub prefix: Option<String>,

    /// Latency to draw [default: both; a CSV lacking one is then left out of its figures
    /// instead of failing].
    #[arg(long, value_enum)]
    pub metric: Option<MetricChoice>,

    /// Figures to draw, comma-separated [default: box, cdf, time, percentiles, and stages when
    /// the CSV has stage columns].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub kind: Vec<FigureKind>,

    /// Legend label of each CSV, once per CSV in the same order [default: the label stored by
    /// `rtprobe --label`, else what tells the runs apart: XDP mode, size, interval].
    #[arg(long, value_name = "TEXT")]
    pub label: Vec<String>,

    /// One box per group and run on a shared axis: size, interval or mode (XDP mode). CDFs and
    /// time series get one figure per group.
    #[arg(long, value_name = "KEY")]
    pub group_by: Option<String>,

    /// One figure per value of this key: size, interval, mode or none [default with --group-by:
    /// size, or interval when grouping by size, if the runs differ in it; so --group-by interval
    /// gives the study's figures: one per packet size, the intervals side by side].
    #[arg(long, value_name = "KEY")]
    pub split_by: Option<String>,

    /// Logarithmic latency axis (samples <= 0 are left out and counted in a note) [default: log
    /// where the largest value is over 20 times the median (stages: the largest stage median
    /// over 20 times the smallest), else linear].
    #[arg(long, conflicts_with = "linear")]
    pub log: bool,

    /// Linear latency axis, whatever the spread.
    #[arg(long)]
    pub linear: bool,

    /// Lower end of the latency axis, e.g. 0 or 20us [default: fit the data].
    #[arg(long, value_name = "DURATION", value_parser = parse_latency)]
    pub y_min: Option<std::time::Duration>,

    /// Upper end of the latency axis, e.g. 2ms, to zoom past a few huge outliers (they are
    /// counted in a note) [default: fit the data].
    #[arg(long, value_name = "DURATION", value_parser = parse_latency)]
    pub y_max: Option<std::time::Duration>,

    /// Image format(s), comma-separated: svg, png.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [ImageFormat::Svg])]
    pub format: Vec<ImageFormat>,

    /// Figure size in pixels.
    #[arg(long, value_name = "WIDTHxHEIGHT", default_value = "1000x600", value_parser = parse_figure_size)]
    pub figure_size: (u32, u32),

    /// Title after the metric name [default: what was measured: size, interval, XDP mode,
    /// timestamp source, probe count, from the run metadata].
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,

    /// Skip a cut-short last line (run killed while writing) instead of failing.
    #[arg(long)]
    pub ignore_truncated: bool,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:\n  \
    sudo rtprobe run configs/system-tests.toml\n  \
    rtprobe run --check configs/qdisc-fq_codel.toml\n  \
    sudo rtprobe run configs/bql.toml --set baseline --set bql-3000 --out-dir /tmp/bql")]
pub struct RunArgs {
    /// Scenario file (see configs/).
    pub config: PathBuf,

    /// Output folder [default: the file's `output`, else results/NAME].
    #[arg(long)]
    pub out_dir: Option<PathBuf>,

    /// Validate the file (and, as root, the kernel's support), print the matrix, run nothing.
    #[arg(long)]
    pub check: bool,

    /// Run only this knob set (repeatable); the baseline is the first of them in file order.
    #[arg(long = "set", value_name = "NAME")]
    pub sets: Vec<String>,

    /// Override every set's policy for qdiscs the kernel lacks: fail, or skip (reported).
    #[arg(long, value_enum)]
    pub missing: Option<crate::tune::MissingPolicy>,

    /// No progress bar.
    #[arg(short, long)]
    pub quiet: bool,
}

/// The longest duration rtprobe takes. Stamps are i64 nanoseconds since
/// 1970, which end in 2262, so "now + duration" must stay below that; a
/// century is beyond any run and any interval. (humantime's year is 365.25
/// days, so "100years" is exactly this.)
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(3_155_760_000);

/// "100us", "1.5ms", "10s", "2h 30min" (humantime's units). Negative,
/// malformed and over-[`MAX_DURATION`] values are one-line errors; zero is
/// the caller's to refuse where it makes no sense.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| match e {
        humantime::DurationError::NumberOverflow => {
            format!("duration {s:?} is too large: at most 100 years")
        }
        e => format!("invalid duration {s:?}: {e} (use e.g. 100us, 1.5ms, 10s)"),
    })?;
    if d > MAX_DURATION {
        return Err(format!("duration {s:?} is too large: at most 100 years"));
    }
    Ok(d)
}

/// 192, 0xC0 or 0b11000000.
pub fn parse_u8_maybe_hex(s: &str) -> Result<u8, String> {
    let t = s.trim();
    let r = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u8::from_str_radix(h, 16)
    } else if let Some(b) = t.strip_prefix("0b") {
        u8::from_str_radix(b, 2)
    } else {
        t.parse::<u8>()
    };
    r.map_err(|_| format!("invalid TOS {s:?}: expected 0..255, e.g. 0xC0"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    #[test]
    fn durations_parse_with_fractions_and_refuse_what_the_clock_cannot_hold() {
        use std::time::Duration;
        let ok = |t: &str| super::parse_duration(t).unwrap();
        assert_eq!(ok("1.5ms"), Duration::from_micros(1500));
        assert_eq!(ok(" 100us "), Duration::from_micros(100));
        assert_eq!(ok("100years"), super::MAX_DURATION);
        for bad in ["99999999999999999999.5s", "300years", "101years"] {
            let e = super::parse_duration(bad).unwrap_err();
            assert!(e.contains("too large: at most 100 years"), "{bad}: {e}");
        }
        for bad in ["-1s", "soon", "", "1e3s", "5"] {
            let e = super::parse_duration(bad).unwrap_err();
            assert!(e.starts_with("invalid duration"), "{bad}: {e}");
        }
    }

    proptest! {
        #[test]
        fn duration_parser_never_panics(s in "\\PC*") {
            let _ = super::parse_duration(&s);
        }

        #[test]
        fn duration_parser_never_panics_on_number_unit_shapes(
            n in "[0-9]{1,30}(\\.[0-9]{0,12})?",
            unit in "(ns|us|µs|ms|s|sec|min|m|h|d|w|years|y|)",
        ) {
            if let Ok(d) = super::parse_duration(&format!("{n}{unit}")) {
                prop_assert!(d <= super::MAX_DURATION);
            }
        }
    }

    use super::*;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100us").unwrap(), Duration::from_micros(100));
        assert_eq!(parse_duration("1ms").unwrap(), Duration::from_millis(1));
        assert_eq!(
            parse_duration("1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("1.5parsecs").is_err());
    }

    #[test]
    fn tos() {
        assert_eq!(parse_u8_maybe_hex("0xC0").unwrap(), 0xc0);
        assert_eq!(parse_u8_maybe_hex("192").unwrap(), 192);
        assert!(parse_u8_maybe_hex("256").is_err());
        assert!(parse_u8_maybe_hex("0xZZ").is_err());
    }

    #[test]
    fn cli_parses_and_rejects() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let c = Cli::try_parse_from([
            "rtprobe",
            "--xdp-mode",
            "native",
            "--size",
            "64",
            "--interval",
            "1ms",
            "--count",
            "5",
        ])
        .unwrap();
        assert_eq!(c.probe.xdp_mode, XdpModeArg::Native);
        assert!(Cli::try_parse_from(["rtprobe", "--xdp-mode", "turbo"]).is_err());
        assert!(Cli::try_parse_from(["rtprobe", "--tx-if", "a"]).is_err());
        assert!(Cli::try_parse_from(["rtprobe", "--count", "1", "--duration", "1s"]).is_err());
    }
}
