//! `cargo xtask bench`: rtprobe measured against the tools people would
//! otherwise use, on the same veth testbed, in one run, with the targets
//! printed next to the figures and whether each was met.
//!
//! - RTT median: rtprobe vs `ping` (kernel RX timestamps), `irtt` and
//!   `sockperf ping-pong`, the peers run with `ip netns exec` inside a
//!   testbed that `rtprobe testbed` builds and holds; verdicts from the
//!   same start point as ping's (the user-space send). Then rtprobe / ping
//!   on a bare veth pair with `rtprobe reflect --kernel`, taking turns,
//!   next to the send floor (`cargo bench --bench send_floor`).
//! - Pacing error p50/p99/max and missed ticks at 1 ms and 100 µs, with and
//!   without SCHED_FIFO, next to `cyclictest` (rt-tests) run in the same
//!   minute: the machine's own timer wake-up latency, which the sender's
//!   send error is measured against.
//! - The highest probe rate sustained with 0 unaccounted and 0 lost probes,
//!   and 1 M probes at 100 k/s with the in-kernel reflector per XDP mode:
//!   the rate achieved, loss and its causes from the kernel's counters.
//! - Peak RSS after 10 M probes (1 M with --quick); in the continuous
//!   section, `/metrics` render time for 1000 targets per series budget.
//! - The send error p99 of a 1 ms run under 2000 concurrent `/metrics`
//!   scrapers against the same run quiet (scrapers.rs).
//! - Both reflectors under a flood from 1000 forged sources: a known
//!   peer's loss (target ≤ 1 % at 500 k/s) against the same client's
//!   without `--peer`, the IPv6 client of a dual-stack reflector flooded
//!   on IPv4, and SIGINT to exit under the flood (≤ 100 ms), each with the
//!   flood rate the machine's senders reached.
//! - Forwarded packets per second by XDP mode vs kernel forwarding
//!   (`rtprobe bench-forward`), and vs xdp-tools' `xdp-forward` where
//!   installed.
//! - The study's relations with their original bounds (study.rs): the
//!   shaper's delivered rate under CBR UDP (>= 85 %), the 100-packet
//!   queue's 12.3 ms, the priority class's p99 under TCP (<= 1 ms rise),
//!   TCP's share of a shaped link. The root tests check the mechanisms
//!   behind them at whatever rate the machine gives.
//!
//! Needs root (namespaces, XDP). Everything runs in namespaces the
//! testbed creates; nothing touches the host's interfaces.
//!
//! One file per section (rtt with the veth pair in pair.rs, pacing, rate,
//! memory with continuous, forward with the thesis axes; metrics.rs the
//! continuous section's `/metrics` render rows); peers.rs runs and reads the tools
//! rtprobe is compared with, run.rs starts rtprobe and holds testbeds,
//! host.rs names the host (through `rtprobe host`) and reads what else it
//! was doing, table.rs prints the rows.

mod bed;
mod fleet;
mod flood;
mod flows;
mod forward;
mod host;
mod memory;
mod metrics;
mod pacing;
mod pair;
mod peers;
mod rate;
mod rtt;
mod run;
mod scrapers;
mod study;
mod table;

use std::{io::Write, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context, Result, bail};

use self::{
    run::Ctx,
    table::{Row, format_table, row},
};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// A shorter run (about 2 minutes): fewer probes, 1 M instead of 10 M for RSS,
    /// 200 k instead of 1 M at 100 k/s, 64-byte packets only for forwarding.
    #[arg(long)]
    pub quick: bool,

    /// Where the raw outputs (JSON summaries, tool outputs) go.
    #[arg(long, default_value = "target/bench")]
    pub out_dir: PathBuf,

    /// Run the probe's threads SCHED_FIFO at this priority (shields the figures from other
    /// work on the machine; the default is what a plain run gets).
    #[arg(long)]
    pub rt_priority: Option<u8>,

    /// Run only these sections (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Section>,
}

/// The parts of the bench, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Section {
    /// RTT vs ping, irtt, sockperf.
    Rtt,
    /// Send error and missed ticks next to cyclictest.
    Pacing,
    /// Highest probe rate held.
    Rate,
    /// Peak RSS after many probes.
    Memory,
    /// XDP vs kernel forwarding.
    Forward,
    /// RSS of a `--forever` run at a high rate, and of a day's worth of 1 ms
    /// probes driven as synthetic events through the same per-probe code;
    /// `/metrics` render time for 1000 targets at each series budget.
    Continuous,
    /// The XDP thesis's other axes: per-packet work, queues, XDP_TX bounce, perf counters.
    Thesis,
    /// 1000 targets at 10 probes/s from one process; in-kernel vs user-space reflector capacity.
    Fleet,
    /// The study's relations with their original bounds: the shaper's rate under CBR UDP, the
    /// queue's drain time, the priority class's p99 under TCP, TCP's share of a shaped link.
    Study,
    /// A 1 ms run's send error under 2000 concurrent /metrics scrapers, against the same run quiet.
    Scrapers,
    /// Both reflectors under a flood from 1000 forged sources: known peers, the other family,
    /// SIGINT.
    Flood,
    /// `rtprobe flows` with an iperf3 flow: its sender queue against a probe's and the shaper's
    /// counters, its round trip against ss and a capture, the idle stages, its throughput cost.
    Flows,
}

/// One section's rows.
type Rows = fn(&Ctx, bool) -> Result<Vec<Row>>;

/// Every section in the order it runs, with its name and its rows.
const SECTIONS: [(Section, &str, Rows); 12] = [
    (Section::Rtt, "RTT vs ping/irtt/sockperf", rtt::rtt_rows),
    (Section::Pacing, "pacing", pacing::pacing_rows),
    (Section::Rate, "max probe rate", rate::rate_rows),
    (Section::Memory, "memory", memory::memory_rows),
    (Section::Forward, "XDP forwarding", forward::forward_rows),
    (
        Section::Continuous,
        "continuous probing",
        memory::continuous_rows,
    ),
    (Section::Thesis, "XDP thesis axes", forward::thesis_rows),
    (
        Section::Fleet,
        "1000 targets, reflector capacity",
        fleet::fleet_section,
    ),
    (Section::Study, "the study's relations", study::study_rows),
    (
        Section::Scrapers,
        "2000 concurrent /metrics scrapers",
        scrapers::scrapers_rows,
    ),
    (
        Section::Flood,
        "reflectors under a flood",
        flood::flood_section,
    ),
    (
        Section::Flows,
        "rtprobe flows against iperf3, ss, tcpdump and the shaper",
        flows::flows_rows,
    ),
];

pub fn bench(args: &BenchArgs) -> Result<()> {
    if !crate::is_root() {
        bail!(
            "the bench builds network namespaces and loads XDP: run it as root (sudo -E cargo xtask bench)"
        );
    }
    let root = crate::workspace_root();
    crate::run(Command::new(crate::cargo()).current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "rtprobe",
    ]))?;
    let out = if args.out_dir.is_absolute() {
        args.out_dir.clone()
    } else {
        root.join(&args.out_dir)
    };
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let ctx = Ctx {
        bin: root.join("target/release/rtprobe"),
        out: out.clone(),
        rt_priority: args.rt_priority,
        best_interval_us: std::cell::Cell::new(None),
    };
    let started = Instant::now();
    let header = header(args, &ctx);
    eprintln!("{header}");
    let rows = run_sections(args, &ctx, started);
    let table = format_table(&rows);
    let text = format!(
        "{header}\n{table}(raw outputs in {}; {:.0} s)\n",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    print!("{text}");
    let mut f = std::fs::File::create(out.join("bench.txt"))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// The run's first lines: its flags, the load at the start, the host.
fn header(args: &BenchArgs, ctx: &Ctx) -> String {
    format!(
        "rtprobe bench{}{}, {} at the start\n{}",
        if args.quick { " --quick" } else { "" },
        if args.only.is_empty() {
            String::new()
        } else {
            format!(" --only {:?}", args.only).to_lowercase()
        },
        host::load_average(),
        host::host_line(&ctx.bin)
    )
}

/// The rows of the chosen sections; a section that fails is one row
/// saying why.
fn run_sections(args: &BenchArgs, ctx: &Ctx, started: Instant) -> Vec<Row> {
    let mut rows = Vec::new();
    for (_, name, f) in SECTIONS
        .into_iter()
        .filter(|(s, _, _)| args.only.is_empty() || args.only.contains(s))
    {
        eprintln!(
            "bench: {name} ... ({:.0} s so far)",
            started.elapsed().as_secs_f64()
        );
        match f(ctx, args.quick) {
            Ok(r) => rows.extend(r),
            Err(e) => rows.push(row(
                name,
                format!("failed: {e:#}"),
                "-".into(),
                "-",
                Some(false),
            )),
        }
    }
    rows
}
