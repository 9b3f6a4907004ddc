//! rtprobe: per-packet latency prober with its own XDP router.
//!
//! The modules form the layers of docs/ARCHITECTURE.md ("The layers"), top
//! to bottom; an import points only to a lower row, and `cargo xtask graph`
//! checks that table and that no files import each other in a loop:
//! - `app` (one module per subcommand: parse, call once, print, exit code),
//!   `signals` (Ctrl-C and SIGTERM -> the stop levels), `cli` (clap
//!   definitions only), `scenario` (scenario files);
//! - `run`: one probe run from its validated options to its outcome
//!   (testbed, NIC pair, remote targets, knobs, XDP, the session, undo);
//! - `options`: the option model (CLI + TOML) and the one validator;
//! - `bench_forward` (the router hop's throughput), `tune` (knobs) and
//!   `ebpf` (the XDP router and reflector), `testbed` (namespaces, veths,
//!   NIC pairs, `--pair` beds), `probe` (sockets, stamps, pacer, matcher,
//!   the engine, reflectors, STAMP);
//! - `export` (CSV, JSON, metrics, plots) and `stats` (histograms, loss,
//!   reorder, jitter, the typed report) take plain result types;
//! - `sys` (every kernel state change: netlink, sysfs/procfs, tc, ethtool,
//!   namespaces, child processes, real-time settings; a recording fake),
//!   `model` (the probe record, the run's metadata, units, typed knobs),
//!   and the leaf utilities `error`, `heap`, `input`.
//!
//! Items are `pub(crate)` unless a crate outside (tests, benches, fuzz)
//! uses them; `unreachable_pub` keeps it so.

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
pub(crate) mod passive;
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
