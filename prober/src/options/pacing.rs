//! How the probe sender keeps its schedule. The schedule is absolute
//! (probe n goes at start + n x interval), so lateness never accumulates.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::units::{self, humane_duration};

#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[command(next_help_heading = "Pacing")]
#[serde(deny_unknown_fields)]
pub(crate) struct PacingSpec {
    /// Spin on the clock for the whole interval instead of sleeping: the lowest send error,
    /// at the price of one busy core (on a 2-core machine that slows the receive side).
    #[arg(
        long,
        conflicts_with = "spin",
        num_args = 0,
        default_missing_value = "true"
    )]
    pub(crate) busy_poll: Option<bool>,

    /// Sleep until this long before each send, then spin on the clock [default: adaptive: the
    /// p99.5 of this machine's timer wake-up latency, learned while sending, at most half the
    /// interval; with several targets 0: no spin].
    #[arg(long, value_parser = units::parse_duration)]
    #[serde(default, with = "humane_duration::option")]
    pub(crate) spin: Option<Duration>,

    /// Do not rehearse the send path on loopback after each wake-up. By default a sender that
    /// sleeps before a send warms the caches its sleep cooled, in the spin's place, so the probe
    /// measures the path rather than rtprobe's own wake-up; with this flag the probe pays it.
    #[arg(
        long,
        conflicts_with = "busy_poll",
        num_args = 0,
        default_missing_value = "true"
    )]
    pub(crate) no_warm_up: Option<bool>,
}
