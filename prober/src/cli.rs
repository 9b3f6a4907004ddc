//! What the user typed: clap derive only. The probe options are the specs
//! of [`crate::options`], flattened; validation lives there too.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{
    ebpf::{XdpAction, XdpMode},
    export::plot::{FigureKind, ImageFormat, parse_figure_size, parse_latency},
    options,
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
        echoes back, and writes one CSV row per probe plus a summary. Needs root, except \
        `--target HOST` (probe a remote `rtprobe reflect` or STAMP reflector: no testbed).",
    after_help = "Examples:\n  \
        sudo rtprobe --xdp-mode native --size 64 --interval 1ms --count 2000\n  \
        sudo rtprobe --xdp-mode off --duration 30s --out baseline.csv --json baseline.json\n  \
        sudo rtprobe --tx-if enp1s0 --rx-if enp2s0 --xdp-mode off --tos 0xC0\n  \
        rtprobe plot baseline.csv out.csv\n\n\
        Exit status: 0 done; 1 the run failed (an output, the network, no target could be \
        opened); 2 a usage error; 78 a configuration error (a targets or key file that fails its \
        checks, more targets than the open-file limit allows: RestartPreventExitStatus=78 keeps \
        systemd from restarting it); 130 stopped by Ctrl-C or SIGTERM (the summary is complete).",
    args_conflicts_with_subcommands = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,

    #[command(flatten)]
    pub(crate) probe: ProbeArgs,

    /// More log output (-v info, -vv debug and the eBPF programs' log of
    /// their rare paths: malformed frames, TTL expiry...). RUST_LOG overrides
    /// the level.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, help_heading = "Global options")]
    pub(crate) verbose: u8,
}

#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per process; boxing buys nothing"
)]
pub(crate) enum Command {
    /// Draw SVG/PNG boxplots, CDFs, time series, percentile distributions and stage breakdowns
    /// from rtprobe CSV files or HdrHistogram interval logs (and `rtprobe flows` CSVs' stages).
    Plot(PlotArgs),
    /// Run a scenario file: sizes x intervals x knob sets, then report.md.
    Run(RunArgs),
    /// Blast packets through the router hop and report forwarded packets/s, drops, CPU per
    /// core and probe latency, for kernel forwarding and each XDP mode.
    BenchForward(options::bench_forward::BenchForwardArgs),
    /// Tell whether runs differ from a baseline: p50/p99/p99.9 changes with 95 % confidence
    /// intervals, in words.
    Compare(CompareArgs),
    /// Print a shell completion script for bash, zsh or fish.
    Completions(CompletionsArgs),
    /// Build the veth testbed (with the XDP router as asked), or with --pair two namespaces
    /// joined by one veth, print it as one JSON line and keep it until stdin closes or a signal
    /// comes (for running other tools on the same path).
    #[command(hide = true)]
    Testbed(TestbedArgs),
    /// Remove the testbeds of runs that died (SIGKILL, crash): their namespaces, and give
    /// NIC-pair interfaces back as they were.
    Cleanup(CleanupArgs),
    /// Watch the host's own TCP traffic, with no probe sent: per flow, process and cgroup, where
    /// a sample of its sends spends its time (stack, sender queue, NIC, round trip to the ACK).
    Flows(crate::options::passive::FlowsArgs),
    /// Answer probes from other hosts (rtprobe's protocol or STAMP) in this network namespace,
    /// until Ctrl-C; `rtprobe --target` on the other host sends them.
    Reflect(crate::options::remote::ReflectArgs),
    /// Write each host's peers file (the --targets format) and Prometheus' file_sd list of the
    /// hosts from one fleet inventory, so that every host probes all the others under the names
    /// Prometheus gives them.
    Targets(TargetsArgs),
    /// Write the man pages (rtprobe.1 and one per subcommand) and print their paths; `cargo
    /// xtask man` runs it.
    #[command(hide = true)]
    Man(ManArgs),
    /// Print the facts about this host that every run's summary names (cores, cpuidle,
    /// preemption, VM, clock source, CPU, kernel): one line, or the JSON of `extra.host` with
    /// --json; `cargo xtask bench` heads its table with it.
    #[command(hide = true)]
    Host(HostArgs),
}

/// The probe command's options: one spec per concept (see [`crate::options`]).
#[derive(Debug, Clone, Args)]
pub(crate) struct ProbeArgs {
    #[command(flatten)]
    pub(crate) run: options::RunSpec,

    #[command(flatten)]
    pub(crate) output: options::OutputSpec,

    #[command(flatten)]
    pub(crate) knobs: options::KnobArgs,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct TestbedArgs {
    /// XDP router attach mode on the router's interfaces.
    #[arg(long, value_enum, default_value_t = XdpMode::Off)]
    pub(crate) xdp_mode: XdpMode,

    /// XDP router behaviour.
    #[arg(long, value_enum, default_value_t = XdpAction::Redirect)]
    pub(crate) xdp_action: XdpAction,

    /// Build two namespaces A and B joined by one veth pair (no router, no XDP) with the
    /// addresses given, wait until both families answer across it, and print it as one JSON
    /// line (namespaces, interfaces, addresses).
    #[arg(long, conflicts_with_all = ["xdp_mode", "xdp_action"])]
    pub(crate) pair: bool,

    /// With --pair: part of both namespace names (rtprobe-ID-NAME-a, -b), to tell whose a
    /// leftover is.
    #[arg(long, requires = "pair", value_name = "NAME")]
    pub(crate) name: Option<String>,

    /// With --pair: an address of A's veth, ADDR/LEN (repeat for more: IPv4 and IPv6).
    #[arg(long = "a-addr", requires = "pair", value_name = "ADDR/LEN",
          value_parser = crate::testbed::pair::parse_addr)]
    pub(crate) a_addrs: Vec<crate::sys::Addr>,

    /// With --pair: an address of B's veth, ADDR/LEN (repeat for more).
    #[arg(long = "b-addr", requires = "pair", value_name = "ADDR/LEN",
          value_parser = crate::testbed::pair::parse_addr)]
    pub(crate) b_addrs: Vec<crate::sys::Addr>,

    /// With --pair: more addresses of B's veth, one ADDR/LEN a line (# comments), after the
    /// --b-addr ones (a fleet of targets).
    #[arg(long, requires = "pair", value_name = "FILE")]
    pub(crate) b_addrs_file: Option<PathBuf>,

    /// With --pair: prepare A's veth as the peer of a native XDP program on B (GRO requested,
    /// TX checksumming off).
    #[arg(long, requires = "pair")]
    pub(crate) xdp_peer: bool,
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
pub(crate) struct CompareArgs {
    /// The baseline run: its per-probe CSV (--out), or its JSON summary with that CSV beside it.
    #[arg(value_name = "BASE")]
    pub(crate) base: PathBuf,

    /// The runs to compare with the baseline, each a CSV or a JSON summary as BASE.
    #[arg(required = true, value_name = "OTHER")]
    pub(crate) others: Vec<PathBuf>,

    /// Latency to compare.
    #[arg(long, value_enum, default_value_t = crate::export::compare::CompareMetric::OneWay)]
    pub(crate) metric: crate::export::compare::CompareMetric,

    /// Also write the comparison as JSON to this path.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,

    /// Bootstrap resamples (100..100000).
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(100..=100_000))]
    pub(crate) resamples: u32,

    /// Most values per run the bootstrap uses (1000..10000000); a longer run is reduced to a
    /// uniform random sample of this many (reservoir sampling), which bounds memory and time.
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1000..=10_000_000))]
    pub(crate) sample: u32,

    /// Seed of the random sampling: the same files and seed give the same intervals.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) seed: u64,
}

/// Which latency `rtprobe plot` draws (`--metric`): one, or a figure set
/// for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MetricChoice {
    /// Receiver RX - sender TX timestamp (one_way_ns).
    #[value(name = "one-way")]
    OneWay,
    /// Echo RX - sender TX timestamp (rtt_ns).
    Rtt,
    /// One figure set per metric.
    Both,
}

/// A shell `rtprobe completions` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ShellArg {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = "Install, then open a new shell:\n  \
    rtprobe completions bash | sudo tee /etc/bash_completion.d/rtprobe >/dev/null\n  \
    rtprobe completions zsh > ~/.zfunc/_rtprobe    # with fpath+=~/.zfunc before compinit\n  \
    rtprobe completions fish > ~/.config/fish/completions/rtprobe.fish")]
pub(crate) struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub(crate) shell: ShellArg,
}

/// `rtprobe cleanup`.
#[derive(Debug, Args)]
pub(crate) struct CleanupArgs {
    /// Only list the testbeds of dead runs, change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// `rtprobe targets INVENTORY`.
#[derive(Debug, Clone, Args)]
#[command(
    group(clap::ArgGroup::new("output").required(true).multiple(true)
        .args(["host", "out_dir", "prometheus_sd"])),
    after_help = "The inventory (TOML): [defaults] is every peers file's [defaults], as --targets \
    reads it (interval, size, port, protocol, tos, labels); one [[host]] per host:\n  \
    [[host]]\n  \
    name = \"h1\"                 # its peers' `target` label, Prometheus' `instance`\n  \
    address = \"10.79.0.1:8620\"  # where its reflector answers, HOST[:PORT]\n  \
    metrics = \"10.81.0.1:9464\"  # where Prometheus scrapes it [default: address's host, port 9464]\n  \
    labels = { site = \"fra1\", rack = \"r1\" }\n\n\
    A host's labels go to its own series through Prometheus (file_sd: site, rack) and to the \
    series of the pairs towards it through its peers' files (target_site, target_rack). Every \
    peers file is checked as --targets checks it before anything is written.\n\n\
    Examples:\n  \
    rtprobe targets fleet.toml --host h1 > /etc/rtprobe/targets.toml\n  \
    rtprobe targets fleet.toml --out-dir peers/ --prometheus-sd /etc/prometheus/targets/rtprobe.yml"
)]
pub(crate) struct TargetsArgs {
    /// The fleet's inventory: [defaults] and one [[host]] per host (at most 1 MiB).
    #[arg(value_name = "INVENTORY")]
    pub(crate) inventory: PathBuf,

    /// Print this host's peers file (every other host of the inventory) on stdout.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["out_dir", "prometheus_sd"])]
    pub(crate) host: Option<String>,

    /// Write every host's peers file as DIR/NAME.toml (DIR created if missing) and print the
    /// paths.
    #[arg(long, value_name = "DIR")]
    pub(crate) out_dir: Option<PathBuf>,

    /// Write Prometheus' file_sd list of the hosts (JSON, which YAML reads too: name it .yml or
    /// .json): each host's metrics address, with its labels and `host` = its name, which
    /// deploy/prometheus/prometheus.yml turns into `instance`.
    #[arg(long, value_name = "FILE")]
    pub(crate) prometheus_sd: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct HostArgs {
    /// Print the facts as the JSON object a run's summary holds in `extra.host`.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct ManArgs {
    /// Directory for the pages, created if missing.
    #[arg(long, value_name = "DIR", default_value = "target/man")]
    pub(crate) out_dir: PathBuf,
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
        rtprobe plot out.csv --format svg,png --out-dir figures --y-max 2ms\n  \
        rtprobe plot results/xdp-thesis.json --format svg,png\n  \
        rtprobe plot flows.csv --format png"
)]
pub struct PlotArgs {
    /// rtprobe CSV files, or HdrHistogram interval logs (told apart by their content); several
    /// are drawn on the same axes (first red, second blue). A `bench-forward --json` report is
    /// drawn on its own as PREFIX-forwarding: packets/s by size, by per-packet work and by
    /// queue count (panels at least 480 px wide each). `rtprobe flows` CSVs (one row per
    /// sampled TCP send) are drawn together, apart from probe CSVs, as PREFIX-flows-stages (a
    /// stacked bar per flow, the 10 most sampled: each stage's p50 in µs) and PREFIX-flows-time
    /// (each stage over time, every send a point, log µs axis).
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

    /// Skip a cut-short last line of a CSV or an HDR log (run killed while writing) instead of
    /// failing.
    #[arg(long)]
    pub ignore_truncated: bool,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:\n  \
    sudo rtprobe run configs/system-tests.toml\n  \
    rtprobe run --check configs/qdisc-fq_codel.toml\n  \
    sudo rtprobe run configs/bql.toml --set baseline --set bql-3000 --out-dir /tmp/bql\n  \
    sudo rtprobe run configs/system-tests.toml --count 50 --missing skip\n\n\
    Every option of the probe command can be given in the file ([probe], [knobs], [set.NAME]) \
    and on this command line, which overrides the file for every cell.")]
pub(crate) struct RunArgs {
    /// Scenario file (see configs/): UTF-8, at most 1 MiB, a matrix of at most 10000 cells
    /// (sizes x intervals x XDP modes x sets).
    pub(crate) config: PathBuf,

    /// Output folder [default: the file's `output`, else results/NAME].
    #[arg(long)]
    pub(crate) out_dir: Option<PathBuf>,

    /// Validate the file (and, as root, the kernel's support), print the matrix, run nothing.
    #[arg(long)]
    pub(crate) check: bool,

    /// Run only this knob set (repeatable); the baseline is the first of them in file order.
    #[arg(long = "set", value_name = "NAME")]
    pub(crate) sets: Vec<String>,

    /// No progress bar.
    #[arg(short, long)]
    pub(crate) quiet: bool,

    /// Probe options over the file's `[probe]` (for every cell): e.g. --count 50.
    #[command(flatten, next_help_heading = "Over the file's [probe]")]
    pub(crate) run: options::RunSpec,

    /// Knobs over the file's `[knobs]` and every `[set.NAME]` (e.g. --missing skip).
    #[command(flatten)]
    pub(crate) knobs: options::KnobArgs,
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(c.probe.run.xdp.xdp_mode, Some(XdpMode::Native));
        assert!(Cli::try_parse_from(["rtprobe", "--xdp-mode", "turbo"]).is_err());
        assert!(Cli::try_parse_from(["rtprobe", "--tx-if", "a"]).is_err());
        assert!(Cli::try_parse_from(["rtprobe", "--count", "1", "--duration", "1s"]).is_err());
    }
}
