//! `rtprobe bench-forward`'s options: one spec for the command line and for
//! a sweep file (`--config FILE`, e.g. configs/xdp-thesis.toml).
//!
//! As with the probe specs, every field is an `Option` so "not given" is
//! visible: the file's values are laid under the command line's with
//! [`super::merge`], and [`Plan::from_args`] fills in the defaults and
//! validates: the plan the bench runs. The TOML key of an option is its long
//! flag in snake case (`--perf-stat` -> `perf_stat`); a key the spec does
//! not know is refused with its line.

use std::{path::Path, path::PathBuf, time::Duration};

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

pub(crate) use crate::bench_forward::plan::{Plan, Variant};
use crate::{
    bench_forward::{
        frame::MAX_IP_SIZE,
        kinds::{BounceHook, ForwardMode, Generator, Sink},
    },
    model::units::{self, humane_duration},
};

/// A clap parser for a bench choice: the possible values show in --help,
/// the value becomes the domain type.
macro_rules! bench_choice {
    ($ty:ty) => {{
        use clap::builder::TypedValueParser as _;
        clap::builder::PossibleValuesParser::new(<$ty>::NAMES)
            .map(|s| s.parse::<$ty>().expect("a listed name parses"))
    }};
}

#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[command(after_help = "Examples:\n  \
    sudo rtprobe bench-forward --modes off,native --sizes 64 --load 0,50,100\n  \
    sudo rtprobe bench-forward --config configs/xdp-thesis.toml --json thesis.json\n  \
    sudo rtprobe bench-forward --config configs/xdp-thesis.toml --sizes 64 --step 1s\n  \
    rtprobe plot thesis.json --format svg,png\n\n\
    A --config file takes every option below as a TOML key, the long flag in snake case \
    (perf_stat = true, work = [1, 100], step = \"2s\"); flags on the command line override it.")]
pub(crate) struct BenchForwardArgs {
    /// Sweep file: the options below as TOML keys (e.g. configs/xdp-thesis.toml); flags given
    /// here override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub(crate) config: Option<PathBuf>,

    /// Forwarding variants to measure, in this order [default: off,skb,native,native-pass].
    #[arg(long, value_parser = bench_choice!(ForwardMode), value_delimiter = ',')]
    pub(crate) modes: Option<Vec<ForwardMode>>,

    /// IP packet sizes in bytes (64..1500; 1500 fills the MTU) [default: 64,512,1500].
    #[arg(long, value_delimiter = ',')]
    pub(crate) sizes: Option<Vec<usize>>,

    /// Load steps: 100 = the generator flat out; below that, percent of what the hop forwarded
    /// flat out in that mode and size; 0 = probes only [default: 0,25,50,100].
    #[arg(long, value_delimiter = ',')]
    pub(crate) load: Option<Vec<u32>>,

    /// How long each step lasts [default: 2s].
    #[arg(long, value_parser = units::parse_duration)]
    #[serde(default, with = "humane_duration::option")]
    pub(crate) step: Option<Duration>,

    /// Load generator: xdp = frames built in the kernel (BPF_PROG_TEST_RUN live frames, as
    /// xdp-trafficgen does), socket = UDP sendmmsg [default: xdp].
    #[arg(long, value_parser = bench_choice!(Generator))]
    pub(crate) generator: Option<Generator>,

    /// Generator threads [default: 1].
    #[arg(long)]
    pub(crate) threads: Option<usize>,

    /// What takes the load at the receiver: xdp = a native XDP program drops it (only the
    /// router's cost is measured), stack = the receiver's stack [default: xdp].
    #[arg(long, value_parser = bench_choice!(Sink))]
    pub(crate) sink: Option<Sink>,

    /// Per-packet work: memory accesses per packet (1..12800) for a variant of the router that
    /// does them before forwarding; each value adds a run of every skb/native mode with it.
    #[arg(long, value_delimiter = ',')]
    pub(crate) work: Option<Vec<u32>>,

    /// Also measure the XDP thesis's baseline, a device that bounces every frame back (MACs
    /// swapped), with these hooks (skb, native: XDP_TX; afxdp: an AF_XDP socket and thread per
    /// queue in user space), flat out, per queue count.
    #[arg(long, value_parser = bench_choice!(BounceHook), value_delimiter = ',')]
    pub(crate) bounce: Option<Vec<BounceHook>>,

    /// RX/TX queue counts of the bounce device's veth (1..64), each with threaded NAPI
    /// [default: 1].
    #[arg(long, value_delimiter = ',')]
    pub(crate) queues: Option<Vec<u32>>,

    /// Count IPC, branch misses and L1 data-cache misses of the router's (or bounce
    /// device's) threads with `perf stat` during every flat-out step (skipped with a note
    /// where perf or the hardware counters are missing).
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub(crate) perf_stat: Option<bool>,

    /// Interval of the latency probe that runs during every step [default: 1ms].
    #[arg(long, value_parser = units::parse_duration)]
    #[serde(default, with = "humane_duration::option")]
    pub(crate) probe_interval: Option<Duration>,

    /// Keep the router's NAPI polling in softirq on the generator's core instead of a kernel
    /// thread of its own (the default lets the scheduler put the router on another core).
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub(crate) no_threaded_napi: Option<bool>,

    /// Run the generator threads and the router's NAPI thread SCHED_FIFO at this priority (the
    /// probe's threads one above), so other work on the machine does not take the cores.
    #[arg(long)]
    pub(crate) rt_priority: Option<u8>,

    /// Write every step's figures as JSON to this path (`rtprobe plot FILE.json` draws them).
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,

    /// Keep each step's probe CSV in this directory.
    #[arg(long)]
    pub(crate) csv_dir: Option<PathBuf>,

    /// Print only the final table.
    #[arg(short, long, num_args = 0, default_missing_value = "true")]
    pub(crate) quiet: Option<bool>,
}

impl BenchForwardArgs {
    /// The command line's options over its `--config` file's (if any).
    pub(crate) fn with_config_file(&self) -> Result<Self> {
        let Some(path) = &self.config else {
            return Ok(self.clone());
        };
        let file = Self::load(path)?;
        let mut merged = super::merge(&file, self)?;
        merged.config = self.config.clone();
        Ok(merged)
    }

    /// Reads a sweep file; errors name the file, line, column and key.
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let text = crate::input::read_text(
            path,
            "bench-forward sweep file",
            crate::input::MAX_CONFIG_BYTES,
        )?;
        Self::parse(path, &text)
    }

    /// Parses a sweep file's text (no system access).
    pub(crate) fn parse(path: &Path, text: &str) -> Result<Self> {
        toml::from_str::<Self>(text).map_err(|e| {
            let scenario = toml::from_str::<toml::Table>(text)
                .is_ok_and(|t| ["probe", "knobs", "set"].iter().any(|k| t.contains_key(*k)));
            if scenario {
                anyhow::anyhow!(
                    "{} is a scenario file, not a bench-forward sweep: run `rtprobe run {}`",
                    path.display(),
                    path.display()
                )
            } else {
                super::located::located_toml_error(path, text, &e)
            }
        })
    }
}

impl Plan {
    /// Fills in the defaults of what `a` leaves unset and validates. `a`
    /// is the command line with its `--config` file already under it
    /// ([`BenchForwardArgs::with_config_file`]).
    pub(crate) fn from_args(a: &BenchForwardArgs) -> Result<Self> {
        use ForwardMode::{Native, NativePass, Off, Skb};
        let modes = a
            .modes
            .clone()
            .unwrap_or_else(|| vec![Off, Skb, Native, NativePass]);
        if modes.is_empty() {
            bail!("--modes is empty: give e.g. off,skb,native");
        }
        let sizes = a.sizes.clone().unwrap_or_else(|| vec![64, 512, 1500]);
        let loads = a.load.clone().unwrap_or_else(|| vec![0, 25, 50, 100]);
        check_sizes_and_loads(&sizes, &loads)?;
        let step = a.step.unwrap_or(Duration::from_secs(2));
        if step < Duration::from_millis(300) {
            bail!("--step {step:?} is too short to measure: use at least 300ms");
        }
        let threads = a.threads.unwrap_or(1);
        if threads == 0 || threads > 64 {
            bail!("--threads {threads} is out of range: use 1..64");
        }
        let probe_interval = a.probe_interval.unwrap_or(Duration::from_millis(1));
        if probe_interval < Duration::from_micros(10) {
            bail!("--probe-interval must be at least 10us");
        }
        if let Some(p) = a.rt_priority
            && !(1..=98).contains(&p)
        {
            bail!("--rt-priority {p} is out of range: use 1 to 98 (the probe runs one above)");
        }
        if let Some(d) = &a.csv_dir
            && !d.is_dir()
        {
            bail!("--csv-dir {}: no such directory", d.display());
        }
        let modes = first_of_each(&modes);
        let variants = variants(&modes, a.work.as_deref().unwrap_or_default())?;
        let mut queues = a.queues.clone().unwrap_or_else(|| vec![1]);
        if let Some(q) = queues.iter().find(|&&q| q == 0 || q > 64) {
            bail!("--queues {q} is out of range: use 1..64");
        }
        if queues.is_empty() {
            bail!("--queues is empty: give e.g. 1,2,4,8");
        }
        queues.dedup();
        let mut loads = loads;
        loads.sort_unstable();
        loads.dedup();
        Ok(Self {
            variants,
            bounce: first_of_each(a.bounce.as_deref().unwrap_or_default()),
            queues,
            perf_stat: a.perf_stat.unwrap_or(false),
            sizes,
            loads,
            step,
            generator: a.generator.unwrap_or(Generator::Xdp),
            threads,
            sink: a.sink.unwrap_or(Sink::Xdp),
            probe_interval,
            threaded_napi: !a.no_threaded_napi.unwrap_or(false),
            rt_priority: a.rt_priority,
            json: a.json.clone(),
            csv_dir: a.csv_dir.clone(),
            quiet: a.quiet.unwrap_or(false),
        })
    }
}

/// IP packet sizes 64..1500, load steps 0..100 %, neither list empty.
fn check_sizes_and_loads(sizes: &[usize], loads: &[u32]) -> Result<()> {
    for &s in sizes {
        if !(64..=MAX_IP_SIZE).contains(&s) {
            bail!("--sizes {s} is out of range: IP packet sizes are 64..1500 bytes");
        }
    }
    if sizes.is_empty() {
        bail!("--sizes is empty: give e.g. 64,512,1500");
    }
    if let Some(l) = loads.iter().find(|&&l| l > 100) {
        bail!("--load {l} is above 100 %: 100 is the generator flat out");
    }
    if loads.is_empty() {
        bail!("--load is empty: give e.g. 0,25,50,100");
    }
    Ok(())
}

/// The modes, then each mode that redirects in XDP once per `--work`
/// value (memory accesses per packet).
fn variants(modes: &[ForwardMode], work: &[u32]) -> Result<Vec<Variant>> {
    let max = xdp_common::bench::MAX_WORK_ACCESSES;
    if let Some(w) = work.iter().find(|&&w| w == 0 || w > max) {
        bail!("--work {w} is out of range: use 1..{max} memory accesses per packet");
    }
    if !work.is_empty() && !modes.iter().any(|m| m.redirects_in_xdp()) {
        bail!("--work applies to the skb and native modes: add one of them to --modes");
    }
    let mut variants: Vec<Variant> = modes
        .iter()
        .map(|&mode| Variant { mode, work: None })
        .collect();
    for &w in work {
        for &mode in modes.iter().filter(|m| m.redirects_in_xdp()) {
            let v = Variant {
                mode,
                work: Some(w),
            };
            if !variants.contains(&v) {
                variants.push(v);
            }
        }
    }
    Ok(variants)
}

/// `items` in their order, each once.
fn first_of_each<T: PartialEq + Copy>(items: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for x in items {
        if !out.contains(x) {
            out.push(*x);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn cli(args: &[&str]) -> BenchForwardArgs {
        let mut v = vec!["rtprobe", "bench-forward"];
        v.extend_from_slice(args);
        match Cli::try_parse_from(v).unwrap().command {
            Some(Command::BenchForward(a)) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn file_keys_are_the_flags_and_the_command_line_wins() {
        let f = BenchForwardArgs::parse(
            Path::new("x.toml"),
            "modes = [\"skb\", \"native\"]\nwork = [1, 12800]\nstep = \"3s\"\n\
             perf_stat = true\nbounce = [\"native\", \"afxdp\"]\nqueues = [1, 2, 4, 8]\n",
        )
        .unwrap();
        assert_eq!(f.modes, Some(vec![ForwardMode::Skb, ForwardMode::Native]));
        assert_eq!(f.step, Some(Duration::from_secs(3)));
        assert_eq!(f.perf_stat, Some(true));
        let top = cli(&["--step", "500ms", "--queues", "1"]);
        let m = super::super::merge(&f, &top).unwrap();
        assert_eq!(m.step, Some(Duration::from_millis(500)));
        assert_eq!(m.queues, Some(vec![1]));
        assert_eq!(m.work, Some(vec![1, 12800]));
        assert_eq!(m.bounce, Some(vec![BounceHook::Native, BounceHook::Afxdp]));
        // Flags not given stay unset, so the file's (or the default) applies.
        assert_eq!(cli(&[]), BenchForwardArgs::default());
        assert_eq!(cli(&["--perf-stat", "-q"]).quiet, Some(true));
    }

    #[test]
    fn bad_keys_and_values_name_the_key_and_line() {
        let e = BenchForwardArgs::parse(Path::new("t.toml"), "step = \"2s\"\nperf_stats = true\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("t.toml:2:1: perf_stats: unknown field"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        let e = BenchForwardArgs::parse(Path::new("t.toml"), "modes = [\"skb\", \"turbo\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.toml:1:"), "{e}");
        assert!(e.contains("modes") && e.contains("turbo"), "{e}");
        let e = BenchForwardArgs::parse(Path::new("t.toml"), "\nstep = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.toml:2:") && e.contains("step"), "{e}");
        let e = BenchForwardArgs::parse(Path::new("s.toml"), "[probe]\nsizes = [64]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("scenario file") && e.contains("rtprobe run s.toml"),
            "{e}"
        );
        // The config flag is not a key of the file.
        assert!(BenchForwardArgs::parse(Path::new("t.toml"), "config = \"x\"\n").is_err());
    }

    #[test]
    fn shipped_thesis_config_parses_and_validates() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/xdp-thesis.toml");
        let a = cli(&["--config", path.to_str().unwrap()]);
        let plan = Plan::from_args(&a.with_config_file().unwrap()).unwrap();
        assert!(plan.variants.iter().any(|v| v.work == Some(12800)));
        assert!(plan.variants.iter().any(|v| v.work == Some(1)));
        assert_eq!(plan.queues, vec![1, 2, 4, 8]);
        assert_eq!(
            plan.bounce,
            vec![BounceHook::Skb, BounceHook::Native, BounceHook::Afxdp]
        );
        assert!(plan.sizes.len() >= 3);
    }

    #[test]
    fn plan_validation() {
        let plan = |args: &[&str]| Plan::from_args(&cli(args));
        let p = plan(&[]).unwrap();
        assert_eq!(p.loads, vec![0, 25, 50, 100]);
        assert_eq!(p.sizes, vec![64, 512, 1500]);
        assert!(p.threaded_napi);
        let p = plan(&["--load", "100,50,50,0", "--modes", "native,off,native"]).unwrap();
        assert_eq!(p.loads, vec![0, 50, 100]);
        let modes: Vec<_> = p.variants.iter().map(|v| v.mode).collect();
        assert_eq!(modes, vec![ForwardMode::Native, ForwardMode::Off]);
        assert!(plan(&["--sizes", "63"]).is_err());
        assert!(plan(&["--sizes", "1501"]).is_err());
        assert!(plan(&["--load", "150"]).is_err());
        assert!(plan(&["--step", "10ms"]).is_err());
        assert!(plan(&["--threads", "0"]).is_err());
        assert!(plan(&["--csv-dir", "/nonexistent-rtprobe-dir"]).is_err());
        // --work adds the work variant of each redirecting mode, after the modes.
        let p = plan(&["--modes", "off,native,native-pass", "--work", "1,100"]).unwrap();
        let v: Vec<(ForwardMode, Option<u32>)> =
            p.variants.iter().map(|v| (v.mode, v.work)).collect();
        assert_eq!(
            v,
            vec![
                (ForwardMode::Off, None),
                (ForwardMode::Native, None),
                (ForwardMode::NativePass, None),
                (ForwardMode::Native, Some(1)),
                (ForwardMode::Native, Some(100)),
            ]
        );
        assert!(plan(&["--work", "0"]).is_err());
        assert!(plan(&["--work", "12801"]).is_err());
        assert!(plan(&["--modes", "off", "--work", "10"]).is_err());
        assert!(plan(&["--queues", "0"]).is_err());
        assert!(plan(&["--queues", "65"]).is_err());
        let p = plan(&["--bounce", "native,skb,native", "--queues", "1,2,4,8"]).unwrap();
        assert_eq!(p.bounce, vec![BounceHook::Native, BounceHook::Skb]);
        assert_eq!(p.queues, vec![1, 2, 4, 8]);
        assert!(Cli::try_parse_from(["rtprobe", "bench-forward", "--bounce", "offload"]).is_err());
    }
}
