//! rtprobe: per-packet latency prober with its own XDP router.
//!
//! The data flows left to right: `cli` (what the user typed) -> `config`
//! (validated options) -> `testbed` (namespaces, veths, NIC pairs) ->
//! `ebpf` (load and attach the router) -> `probe` (timestamped UDP probes)
//! -> `stats` (histograms, loss, reorder, jitter) -> `export` (CSV, JSON,
//! plots). Only `testbed`, `tune`, `ebpf` and `probe::socket` talk to the
//! kernel; everything else is pure and unit-tested without root.

pub mod bench;
pub mod cli;
pub mod config;
pub mod docs;
pub mod ebpf;
pub mod error;
pub mod export;
pub mod probe;
pub mod stats;
pub mod testbed;
pub mod tune;

mod app;
pub mod runner;
pub mod spec;

pub use app::main_entry;
