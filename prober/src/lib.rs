//! rtprobe: per-packet latency prober with its own XDP router.
//!
//! The data flows left to right: `cli` (what the user typed) -> `config`
//! (validated options) -> `testbed` (namespaces, veths, NIC pairs) ->
//! `ebpf` (load and attach the router) -> `probe` (timestamped UDP probes)
//! -> `stats` (histograms, loss, reorder, jitter) -> `export` (CSV, JSON,
//! plots). The network set-up of `testbed`, `tune` and `ebpf` reaches the
//! kernel through `sys` (a trait with a recording fake, so its
//! orchestration is unit-tested without root); `probe` talks to its own
//! sockets; everything else is pure.

pub mod bench;
pub mod cli;
pub mod config;
pub mod docs;
pub mod ebpf;
pub mod error;
pub mod export;
pub mod heap;
pub mod input;
pub mod model;
pub mod probe;
pub mod signals;
pub mod spec;
pub mod stats;
pub mod sys;
pub mod testbed;
pub mod tune;

mod app;
pub mod runner;

pub use app::main_entry;
