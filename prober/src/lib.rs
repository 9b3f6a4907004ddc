//! rtprobe: per-packet latency prober with its own XDP router.
//!
//! Dependencies point down this list, never up (`cargo xtask graph`
//! checks that no module imports one that imports it back):
//! - `app`: one module per subcommand (what `main()` runs): it turns the
//!   parsed `cli` (clap definitions only) into a plan through `options`
//!   (options and the one validator) and `scenario` (scenario files), calls
//!   the domain once, prints, and picks the exit code; `signals` turns
//!   Ctrl-C into the stop levels the domain watches;
//! - `run` (one probe run from its validated options to its outcome) and
//!   `bench_forward` (the router hop's throughput) drive the domain:
//!   `testbed` (namespaces, veths, NIC pairs), `tune` (knobs), `ebpf` (load and attach the router and the
//!   reflector) and `probe` (timestamped UDP probes, the reflector);
//! - `stats` (histograms, loss, reorder, jitter) and `export` (CSV, JSON,
//!   metrics, plots) take plain result types;
//! - `model` is the leaf every layer shares: the probe record, the session
//!   observer, the run's metadata and outcome, durations.
//!
//! The network set-up of `testbed`, `tune` and `ebpf` reaches the kernel
//! through `sys` (a trait with a recording fake, so its orchestration is
//! unit-tested without root); `probe` talks to its own sockets and `app`
//! to the terminal; everything else is pure.

#![warn(unreachable_pub)]

pub(crate) mod bench_forward;
pub mod cli;
pub(crate) mod ebpf;
pub(crate) mod error;
pub mod export;
pub(crate) mod heap;
pub(crate) mod input;
pub mod model;
pub(crate) mod options;
pub mod probe;
pub mod scenario;
pub mod stats;
pub mod sys;
pub mod testbed;
pub(crate) mod tune;

mod app;
pub(crate) mod run;
mod signals;

pub use app::main_entry;
