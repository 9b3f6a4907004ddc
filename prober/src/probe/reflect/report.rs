//! What a run of the user-space reflector reports when it ends
//! ([`ServeReport`]: the counters, the turnaround, the sessions seen and
//! the clock state), the JSON of `rtprobe reflect` and its exit summary.

use serde::Serialize;

use super::Counters;

/// One new session, for the log and the JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SessionInfo {
    pub(crate) source: String,
    /// rtprobe session id (hex) or STAMP SSID.
    pub(crate) id: String,
    pub(crate) first_seen: String,
}

/// What [`super::serve`] reports when it returns.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ServeReport {
    pub(crate) protocol: &'static str,
    pub(crate) listen: Vec<String>,
    pub(crate) authenticated: bool,
    pub(crate) stateful: bool,
    /// Per source (IPv4 address, IPv6 /64); 0: no limit.
    pub(crate) rate_limit_pps: u32,
    /// Over every source but the known peers; null: no limit.
    pub(crate) global_rate_limit_pps: Option<u32>,
    /// Over all known peers together; null: no limit.
    pub(crate) peers_rate_limit_pps: Option<u32>,
    /// The known peers' prefixes (`--peer`, `--peers`).
    pub(crate) peers: Vec<String>,
    pub(crate) duration_s: f64,
    pub(crate) counters: Counters,
    /// From the probe's kernel RX stamp to the echo's kernel TX stamp,
    /// over the replies that were stamped and whose stamp came back.
    pub(crate) turnaround_ns: crate::stats::Latency,
    /// Replies sent with a TX stamp asked for: at most
    /// `turnaround_stamps_per_s` a second, so under a flood a sample.
    pub(crate) turnaround_sampled: u64,
    /// The stamp budget ([`super::budget::TX_STAMPS_PER_S`]).
    pub(crate) turnaround_stamps_per_s: u32,
    /// Sessions seen, first ones first (at most 1000 kept).
    pub(crate) session_list: Vec<SessionInfo>,
    /// The clock state replies carried at the end: unknown (adjtimex
    /// failed) is unsynchronised with `clock_max_error_ns` null, never 0.
    pub(crate) clock_synchronized: bool,
    pub(crate) clock_max_error_ns: Option<u64>,
    /// From the first SIGINT, SIGTERM or SIGHUP (as its handler ran) to
    /// the end of serving, ms; null when it ended otherwise (`--duration`).
    pub(crate) stopped_after_signal_ms: Option<f64>,
}

impl ServeReport {
    /// One line on the clock, for the exit summary.
    pub(crate) fn clock_line(&self) -> String {
        let state = if self.clock_synchronized {
            "synchronised"
        } else {
            "unsynchronised"
        };
        match self.clock_max_error_ns {
            Some(ns) => format!("{state}, max error {:.3} ms", ns as f64 / 1e6),
            None => format!("{state}, max error unknown (adjtimex failed)"),
        }
    }
}
