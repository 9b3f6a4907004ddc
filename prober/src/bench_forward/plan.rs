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
    pub(crate) mode: ForwardMode,
    pub(crate) work: Option<u32>,
}

/// What `bench-forward` runs: its options with every default `--help`
/// states filled in, validated.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The modes, then each skb/native mode once per `--work` value.
    pub(crate) variants: Vec<Variant>,
    pub(crate) bounce: Vec<BounceHook>,
    pub(crate) queues: Vec<u32>,
    pub(crate) perf_stat: bool,
    pub(crate) sizes: Vec<usize>,
    /// Percent of full speed, ascending, without duplicates.
    pub(crate) loads: Vec<u32>,
    pub(crate) step: Duration,
    pub(crate) generator: Generator,
    pub(crate) threads: usize,
    pub(crate) sink: Sink,
    pub(crate) probe_interval: Duration,
    pub(crate) threaded_napi: bool,
    pub(crate) rt_priority: Option<u8>,
    pub(crate) json: Option<PathBuf>,
    pub(crate) csv_dir: Option<PathBuf>,
    pub(crate) quiet: bool,
}
