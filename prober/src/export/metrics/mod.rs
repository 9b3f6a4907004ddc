//! Prometheus/OpenMetrics: the registry of a probe run's metrics and a
//! small HTTP server for `GET /metrics` (`--metrics-listen`).
//!
//! Any command that probes (the testbed run, `--target` runs, `rtprobe
//! reflect`) uses it the same way: [`Metrics::new`], one [`FlowMetrics`]
//! per probe flow ([`Metrics::flow`]) fed every finalized record and the
//! running counts, the info gauges once known, and [`MetricsServer::start`]
//! to serve them: in the Prometheus text format, or OpenMetrics to a
//! scraper that asks for it. Histograms are classic ones with exponential
//! buckets from 1 µs to about 12 s (by default factor √2), which
//! `histogram_quantile` reads to within ±20 % at every scale from a veth
//! hop to a congested WAN; `--metrics-histograms` and `--metrics-buckets`
//! set how many series a flow costs (docs/CONTINUOUS.md).
//!
//! - `labels`: the label sets of every family, and the names a user's
//!   labels may not take;
//! - `format`: the Prometheus text and OpenMetrics expositions, and
//!   which one a scrape's `Accept` header gets;
//! - `registry`: [`Metrics`], its families and their encoding;
//! - `process`: the `process_*` metrics, read from procfs;
//! - `flow`: [`FlowMetrics`], one probe flow's handles, fed by the session;
//! - `reflector`: the reflectors' counters (`rtprobe reflect`);
//! - `server`: [`MetricsServer`], hyper on a thread of its own, and what a
//!   client can cost it;
//! - `access`: the optional bearer token (`--metrics-token-file`);
//! - `pages`: the rendered pages every reader shares;
//! - `slots`: the server's connection cap;
//! - `watch`: a connection's write timeout.

mod access;
mod flow;
mod format;
pub(crate) mod labels;
mod pages;
mod passive;
mod process;
mod reflector;
mod registry;
mod server;
mod slots;
mod watch;

pub(crate) use self::{
    access::Access,
    flow::FlowMetrics,
    passive::{GroupBudget, OTHER},
    server::MetricsServer,
};
pub use self::{format::Format, labels::FlowLabels, registry::Metrics};
