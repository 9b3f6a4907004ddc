//! What `bench-forward` runs, validated: the variants (mode and router
//! work), sizes, load steps, generator, sink and outputs. Plain types; the
//! option model builds them from the command line and a sweep file
//! (`options::bench_forward`, `Plan::from_args`).

use std::{path::PathBuf, time::Duration};

use super::kinds::{BounceHook, ForwardMode, Generator, Sink};

/// One run of the router hop: a mode, and for the router's work variant
/// the memory accesses per packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Variant {
    pub mode: ForwardMode,
    pub work: Option<u32>,
}

/// What `bench-forward` runs: its options with every default `--help`
/// states filled in, validated.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The modes, then each skb/native mode once per `--work` value.
    pub variants: Vec<Variant>,
    pub bounce: Vec<BounceHook>,
    pub queues: Vec<u32>,
    pub perf_stat: bool,
    pub sizes: Vec<usize>,
    /// Percent of full speed, ascending, without duplicates.
    pub loads: Vec<u32>,
    pub step: Duration,
    pub generator: Generator,
    pub threads: usize,
    pub sink: Sink,
    pub probe_interval: Duration,
    pub threaded_napi: bool,
    pub rt_priority: Option<u8>,
    pub json: Option<PathBuf>,
    pub csv_dir: Option<PathBuf>,
    pub quiet: bool,
}
