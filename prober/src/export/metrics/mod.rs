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
//! - `labels`: the label sets of every family;
//! - `format`: the Prometheus text and OpenMetrics expositions, and
//!   which one a scrape's `Accept` header gets;
//! - `registry`: [`Metrics`], its families and their encoding;
//! - `flow`: [`FlowMetrics`], one probe flow's handles, fed by the session;
//! - `reflector`: the reflectors' counters (`rtprobe reflect`);
//! - `server`: [`MetricsServer`], hyper on a thread of its own;
//! - `slots`: the server's connection cap.

mod flow;
mod format;
mod labels;
mod reflector;
mod registry;
mod server;
mod slots;

pub use self::{
    flow::FlowMetrics, format::Format, labels::FlowLabels, registry::Metrics, server::MetricsServer,
};
