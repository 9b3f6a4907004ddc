//! What the live outputs are asked to do, validated: CSV rotation, the
//! interval reports, the metrics endpoint and its histograms, the HDR
//! log. Plain types the option model builds (its flags and TOML keys are
//! in `options::continuous`) and the outputs read.

use std::{fmt, net::SocketAddr, path::PathBuf, str::FromStr, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How long each interval histogram covers when `--report-every` is not
/// given (the progress bar, the HDR log and nothing else use it).
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Bucket bounds per histogram when `--metrics-buckets` is not given.
pub(crate) const DEFAULT_METRICS_BUCKETS: u16 = 48;

/// The latency histograms' bucket bounds, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsBuckets {
    /// This many bounds, spaced by one factor from 1 µs to 11.9 s.
    Count(u16),
    /// These bounds, in ns, increasing.
    Bounds(std::sync::Arc<[u64]>),
}

impl MetricsBuckets {
    /// How many bounds (series per histogram, less +Inf, sum and count).
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        match self {
            MetricsBuckets::Count(n) => usize::from(*n),
            MetricsBuckets::Bounds(b) => b.len(),
        }
    }
}

/// The series `/metrics` spends per flow (target) on latency histograms:
/// which histograms, and their buckets. The counters (sent, received,
/// lost, foreign, late...) are always there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSeries {
    pub rtt: bool,
    pub one_way: bool,
    pub stages: bool,
    /// The bucket bounds of each histogram (the +Inf bucket besides).
    pub buckets: MetricsBuckets,
}

impl Default for MetricsSeries {
    fn default() -> Self {
        Self {
            rtt: true,
            one_way: true,
            stages: true,
            buckets: MetricsBuckets::Count(DEFAULT_METRICS_BUCKETS),
        }
    }
}

/// When the CSV starts a new file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotate {
    /// When the current file reaches this many bytes.
    Bytes(u64),
    /// When the current file is this old.
    Every(Duration),
}

impl FromStr for Rotate {
    type Err = String;

    /// "100MiB", "500MB", "1GiB", "65536" (bytes), or a duration ("1h", "10min").
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let digits = t
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(digits);
        let scale: Option<f64> = match unit.trim() {
            "" | "B" => Some(1.0),
            "k" | "K" | "kB" | "KB" => Some(1e3),
            "KiB" | "Ki" => Some(1024.0),
            "M" | "MB" => Some(1e6),
            "MiB" | "Mi" => Some(1024.0 * 1024.0),
            "G" | "GB" => Some(1e9),
            "GiB" | "Gi" => Some(1024.0 * 1024.0 * 1024.0),
            _ => None,
        };
        if let (Some(scale), Ok(n)) = (scale, num.parse::<f64>())
            && n.is_finite()
        {
            let bytes = n * scale;
            if bytes >= 1.0 && bytes < 2f64.powi(62) {
                return Ok(Rotate::Bytes(bytes as u64));
            }
            return Err(format!("rotation size {s:?} is out of range"));
        }
        match crate::model::units::parse_duration(t) {
            Ok(d) => Ok(Rotate::Every(d)),
            Err(_) => Err(format!(
                "invalid rotation {s:?}: give a size (e.g. 100MiB, 500MB) or a time (e.g. 1h, 10min)"
            )),
        }
    }
}

impl fmt::Display for Rotate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rotate::Bytes(b) if b % (1 << 30) == 0 => write!(f, "{}GiB", b >> 30),
            Rotate::Bytes(b) if b % (1 << 20) == 0 => write!(f, "{}MiB", b >> 20),
            Rotate::Bytes(b) if b % (1 << 10) == 0 => write!(f, "{}KiB", b >> 10),
            Rotate::Bytes(b) => write!(f, "{b} bytes"),
            Rotate::Every(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

/// Written as it is read: "65536" (bytes) or a humantime duration ("1h").
impl Serialize for Rotate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Rotate::Bytes(b) => s.serialize_str(&b.to_string()),
            Rotate::Every(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Rotate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// CSV rotation, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    pub when: Rotate,
    /// Rotated files kept besides the current one.
    pub keep: u32,
}

/// What a run does besides probing a fixed count, validated.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContinuousPlan {
    /// Probe until stopped.
    pub forever: bool,
    pub rotation: Option<Rotation>,
    /// Print an interval line this often.
    pub report_every: Option<Duration>,
    pub metrics_listen: Option<SocketAddr>,
    /// The bearer token's file (read when the server starts).
    pub metrics_token_file: Option<PathBuf>,
    /// What the metrics carry per flow.
    pub metrics_series: MetricsSeries,
    pub hdr_log: Option<PathBuf>,
}

impl ContinuousPlan {
    /// The span of one interval histogram.
    pub(crate) fn interval(&self) -> Duration {
        self.report_every.unwrap_or(DEFAULT_INTERVAL)
    }
}
