//! What each probe is and how many are sent.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::{
    model::units::{self, humane_duration},
    probe::TimestampSource,
};

#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProbeSpec {
    /// UDP payload bytes per probe, 32..1472 (the study used 64, 200 and 1472) [default: 64].
    #[arg(long)]
    pub(crate) size: Option<usize>,

    /// Time between probes, e.g. 100us, 1ms, 10ms (1us..1h) [default: 1ms].
    #[arg(long, value_parser = units::parse_duration)]
    #[serde(default, with = "humane_duration::option")]
    pub(crate) interval: Option<Duration>,

    /// Number of probes to send [default: 1000 unless --duration is given].
    #[arg(long, conflicts_with = "duration")]
    pub(crate) count: Option<u64>,

    /// Send probes for this long instead of a fixed count, e.g. 30s, 5min; 0 probes until stopped
    /// (--forever).
    #[arg(long, value_parser = units::parse_duration)]
    #[serde(default, with = "humane_duration::option")]
    pub(crate) duration: Option<Duration>,

    /// IP TOS byte of the probes (0xC0 = the study's DSCP CS6) [default: 0].
    #[arg(long, value_parser = units::parse_u8_maybe_hex)]
    #[serde(default, deserialize_with = "de_tos")]
    pub(crate) tos: Option<u8>,

    /// UDP port of the probe flow [default: 5061].
    #[arg(long)]
    pub(crate) port: Option<u16>,

    /// Address family of the probes on a testbed run, 4 or 6: the testbed carries both (IPv4
    /// and unique-local IPv6 on every link) [default: 4]. With --target its address decides.
    #[arg(long, value_enum)]
    pub(crate) ip: Option<crate::testbed::IpVersion>,

    /// Timestamp source to ask for [default: auto].
    #[arg(long, value_enum)]
    pub(crate) timestamps: Option<TimestampSource>,

    /// A probe not echoed back this long after it was sent counts as lost [default: 1s].
    #[arg(long, value_parser = units::parse_duration)]
    #[serde(default, with = "humane_duration::option")]
    pub(crate) timeout: Option<Duration>,

    /// Existing interface to send from (NIC-pair mode; needs --rx-if; at most 15 bytes). It is
    /// moved into the sender namespace for the run and given back afterwards.
    #[arg(long, requires = "rx_if")]
    pub(crate) tx_if: Option<String>,

    /// Existing interface to receive on (NIC-pair mode; needs --tx-if).
    #[arg(long, requires = "tx_if")]
    pub(crate) rx_if: Option<String>,

    /// NIC-pair mode: move the interfaces even if one carries this machine's default route
    /// or the address of the current SSH session (refused without it).
    #[arg(long, requires = "tx_if", num_args = 0, default_missing_value = "true")]
    pub(crate) force: Option<bool>,
}

/// TOS as 192 or "0xC0", with the command line's parser and words.
fn de_tos<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u8>, D::Error> {
    use serde::de;
    struct V;
    impl de::Visitor<'_> for V {
        type Value = u8;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a TOS byte: 192 or \"0xC0\"")
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u8, E> {
            u8::try_from(v).map_err(|_| E::custom(format!("TOS {v} is out of range 0..255")))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u8, E> {
            self.visit_i64(v.min(i64::MAX as u64) as i64)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u8, E> {
            units::parse_u8_maybe_hex(v).map_err(E::custom)
        }
    }
    d.deserialize_any(V).map(Some)
}
