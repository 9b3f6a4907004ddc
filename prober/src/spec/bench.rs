//! `rtprobe bench-forward`'s options: one spec for the command line and for
//! a sweep file (`--config FILE`, e.g. configs/xdp-thesis.toml).
//!
//! As with the probe specs, every field is an `Option` so "not given" is
//! visible: the file's values are laid under the command line's with
//! [`super::merge`], and [`crate::bench::forward::Plan::from_args`] fills
//! in the defaults and validates. The TOML key of an option is its long
//! flag in snake case (`--perf-stat` -> `perf_stat`); a key the spec does
//! not know is refused with its line.

use std::{path::Path, path::PathBuf, time::Duration};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::{
    bench::kinds::{BounceHook, ForwardMode, Generator, Sink},
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
pub struct BenchForwardArgs {
    /// Sweep file: the options below as TOML keys (e.g. configs/xdp-thesis.toml); flags given
    /// here override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Forwarding variants to measure, in this order [default: off,skb,native,native-pass].
    #[arg(long, value_parser = bench_choice!(ForwardMode), value_delimiter = ',')]
    pub modes: Option<Vec<ForwardMode>>,

    /// IP packet sizes in bytes (64..1500; 1500 fills the MTU) [default: 64,512,1500].
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,

    /// Load steps: 100 = the generator flat out; below that, percent of what the hop forwarded
    /// flat out in that mode and size; 0 = probes only [default: 0,25,50,100].
    #[arg(long, value_delimiter = ',')]
    pub load: Option<Vec<u32>>,

    /// How long each step lasts [default: 2s].
    #[arg(long, value_parser = units::parse_duration)]
    #[serde(default, with = "humane_duration::option")]
    pub step: Option<Duration>,

    /// Load generator: xdp = frames built in the kernel (BPF_PROG_TEST_RUN live frames, as
    /// xdp-trafficgen does), socket = UDP sendmmsg [default: xdp].
    #[arg(long, value_parser = bench_choice!(Generator))]
    pub generator: Option<Generator>,

    /// Generator threads [default: 1].
    #[arg(long)]
    pub threads: Option<usize>,

    /// What takes the load at the receiver: xdp = a native XDP program drops it (only the
    /// router's cost is measured), stack = the receiver's stack [default: xdp].
    #[arg(long, value_parser = bench_choice!(Sink))]
    pub sink: Option<Sink>,

    /// Per-packet work: memory accesses per packet (1..12800) for a variant of the router that
    /// does them before forwarding; each value adds a run of every skb/native mode with it.
    #[arg(long, value_delimiter = ',')]
    pub work: Option<Vec<u32>>,

    /// Also measure the XDP thesis's baseline, a device that bounces every frame back (MACs
    /// swapped), with these hooks (skb, native: XDP_TX; afxdp: an AF_XDP socket and thread per
    /// queue in user space), flat out, per queue count.
    #[arg(long, value_parser = bench_choice!(BounceHook), value_delimiter = ',')]
    pub bounce: Option<Vec<BounceHook>>,

    /// RX/TX queue counts of the bounce device's veth (1..64), each with threaded NAPI
    /// [default: 1].
    #[arg(long, value_delimiter = ',')]
    pub queues: Option<Vec<u32>>,

    /// Count IPC, branch misses and L1 data-cache misses of the router's (or bounce
    /// device's) threads with `perf stat` during every flat-out step (skipped with a note
    /// where perf or the hardware counters are missing).
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub perf_stat: Option<bool>,

    /// Interval of the latency probe that runs during every step [default: 1ms].
    #[arg(long, value_parser = units::parse_duration)]
    #[serde(default, with = "humane_duration::option")]
    pub probe_interval: Option<Duration>,

    /// Keep the router's NAPI polling in softirq on the generator's core instead of a kernel
    /// thread of its own (the default lets the scheduler put the router on another core).
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub no_threaded_napi: Option<bool>,

    /// Run the generator threads and the router's NAPI thread SCHED_FIFO at this priority (the
    /// probe's threads one above), so other work on the machine does not take the cores.
    #[arg(long)]
    pub rt_priority: Option<u8>,

    /// Write every step's figures as JSON to this path (`rtprobe plot FILE.json` draws them).
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Keep each step's probe CSV in this directory.
    #[arg(long)]
    pub csv_dir: Option<PathBuf>,

    /// Print only the final table.
    #[arg(short, long, num_args = 0, default_missing_value = "true")]
    pub quiet: Option<bool>,
}

impl BenchForwardArgs {
    /// The command line's options over its `--config` file's (if any).
    pub fn with_config_file(&self) -> Result<Self> {
        let Some(path) = &self.config else {
            return Ok(self.clone());
        };
        let file = Self::load(path)?;
        let mut merged = super::merge(&file, self)?;
        merged.config = self.config.clone();
        Ok(merged)
    }

    /// Reads a sweep file; errors name the file, line, column and key.
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::input::read_text(
            path,
            "bench-forward sweep file",
            crate::input::MAX_CONFIG_BYTES,
        )?;
        Self::parse(path, &text)
    }

    /// Parses a sweep file's text (no system access).
    pub fn parse(path: &Path, text: &str) -> Result<Self> {
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
                crate::config::located_toml_error(path, text, &e)
            }
        })
    }
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
        let plan = crate::bench::forward::Plan::from_args(&a.with_config_file().unwrap()).unwrap();
        assert!(plan.variants.iter().any(|v| v.work == Some(12800)));
        assert!(plan.variants.iter().any(|v| v.work == Some(1)));
        assert_eq!(plan.queues, vec![1, 2, 4, 8]);
        assert_eq!(
            plan.bounce,
            vec![BounceHook::Skb, BounceHook::Native, BounceHook::Afxdp]
        );
        assert!(plan.sizes.len() >= 3);
    }
}
