//! Continuous probing and live outputs: `--forever`, CSV rotation, interval
//! reports, the Prometheus endpoint and the HdrHistogram interval log.
//!
//! One option group, usable from the command line (flattened into the
//! probe's arguments) and from a TOML table (same keys, snake_case); the
//! validator [`ContinuousArgs::plan`] turns it into a [`ContinuousPlan`]
//! (the plan's types are the outputs' own, in `export::plan`).

use std::{fmt, net::SocketAddr, path::PathBuf, str::FromStr, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::SpecError;
pub(crate) use crate::export::plan::{
    ContinuousPlan, DEFAULT_METRICS_BUCKETS, MetricsBuckets, MetricsSeries, Rotate, Rotation,
};

/// Rotated files kept besides the current one when `--out-keep` is not given.
pub(crate) const DEFAULT_KEEP: u32 = 5;
/// Smallest rotation size: a file must hold its metadata and a few rows.
pub(crate) const MIN_ROTATE_BYTES: u64 = 16 * 1024;
/// Shortest rotation period.
pub(crate) const MIN_ROTATE_PERIOD: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[command(next_help_heading = "Continuous probing and live outputs")]
pub(crate) struct ContinuousArgs {
    /// Probe until Ctrl-C or SIGTERM (the same as --duration 0). Memory stays flat; bound the
    /// disk with --out-rotate.
    #[arg(
        long,
        num_args = 0,
        default_missing_value = "true",
        conflicts_with = "count"
    )]
    pub(crate) forever: Option<bool>,

    /// Start a new CSV when the current one reaches this size (e.g. 100MiB, 500MB) or age (e.g.
    /// 1h, 10min): out.csv is the newest, out.csv.1 the one before, and so on. Every file starts
    /// with the metadata and header, so `rtprobe plot` reads any of them.
    #[arg(long, value_name = "SIZE|TIME")]
    pub(crate) out_rotate: Option<Rotate>,

    /// Rotated CSVs kept besides the current one; older ones are deleted [default: 5].
    #[arg(long, value_name = "N", requires = "out_rotate")]
    pub(crate) out_keep: Option<u32>,

    /// Print an interval line every D (like iperf): probes sent and lost, one-way and RTT p50,
    /// p99 and max of the probes sent in that interval. Also the period of the HDR log's
    /// histograms [default: no lines; histograms per 1s].
    #[arg(long, value_name = "DURATION", value_parser = crate::model::units::parse_duration)]
    #[serde(default, with = "crate::model::units::humane_duration::option")]
    pub(crate) report_every: Option<Duration>,

    /// Serve Prometheus metrics at http://ADDR:PORT/metrics while probing (histograms of one-way,
    /// RTT and each stage; probe counters; XDP mode and timestamp source; build and process
    /// metrics), in the Prometheus text format, or OpenMetrics to a scraper whose Accept header
    /// asks for it; GET /-/healthy answers OK. Port 0 picks a free one (printed). Anyone who
    /// reaches ADDR may scrape: bind a management address, or add --metrics-token-file. One
    /// request per connection, at most 256 open at once; a client that does not read its answer
    /// for 5 s is closed.
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) metrics_listen: Option<SocketAddr>,

    /// Answer /metrics only to requests with the header `Authorization: Bearer TOKEN`, TOKEN
    /// being this file's content (at least 16 visible ASCII characters, e.g. from `openssl rand
    /// -hex 32`; a final newline is ignored); others get 401. Prometheus sends it with
    /// `authorization: {credentials_file: FILE}`. The file must not be readable by every user.
    #[arg(long, value_name = "FILE")]
    pub(crate) metrics_token_file: Option<PathBuf>,

    /// The latency histograms /metrics carries per flow: any of rtt, one-way (only where the
    /// run shows one-way delay: testbed runs, and --target runs whose two clocks are
    /// synchronised) and stages (one per stage of the timestamp chain the run stamps, up to 7). Fewer histograms, fewer series per target: see
    /// docs/CONTINUOUS.md for the budget [default: rtt,one-way,stages; with several targets
    /// rtt,one-way].
    #[arg(long, value_name = "LIST", value_enum, value_delimiter = ',')]
    pub(crate) metrics_histograms: Option<Vec<MetricsHistogram>>,

    /// The latency histograms' bucket bounds: N (2..96) spaced evenly on a log scale from 1 µs
    /// to 11.9 s (48 is a factor of √2: histogram_quantile within about ±20 %; 24 a factor of
    /// 2.03, about ±50 %), or the bounds themselves, increasing (e.g.
    /// 250us,500us,1ms,2ms,5ms,10ms,50ms,100ms,1s). Each histogram costs as many series as
    /// bounds, plus 3 [default: 48].
    #[arg(long, value_name = "N|LIST")]
    pub(crate) metrics_buckets: Option<BucketsArg>,

    /// Write an HdrHistogram interval log (V2, deflate) here: one one-way and one RTT histogram
    /// (tags one-way, rtt; values in ns) per report interval, readable by HdrHistogram's tools
    /// and `rtprobe plot`.
    #[arg(long, value_name = "FILE")]
    pub(crate) hdr_log: Option<PathBuf>,
}

/// A latency histogram of `/metrics` (`--metrics-histograms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum MetricsHistogram {
    Rtt,
    OneWay,
    Stages,
}

/// Fewest and most bucket bounds: 2 spans the range at all, 96 is a factor
/// of 1.19, finer than a scrape's worth of probes can fill.
const METRICS_BUCKETS: std::ops::RangeInclusive<u16> = 2..=96;
/// The range a listed bound must lie in: a histogram of latencies, from a
/// microsecond to an hour.
const METRICS_BOUND: std::ops::RangeInclusive<Duration> =
    Duration::from_micros(1)..=Duration::from_secs(3600);

/// `--metrics-buckets` as given: a count, or the bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BucketsArg {
    Count(u16),
    Bounds(Vec<Duration>),
}

impl FromStr for BucketsArg {
    type Err = String;

    /// "24" or "100us,1ms,10ms".
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            return t
                .parse()
                .map(BucketsArg::Count)
                .map_err(|_| format!("{t} bucket bounds is out of range: give 2..96"));
        }
        t.split(',')
            .map(crate::model::units::parse_duration)
            .collect::<Result<_, _>>()
            .map(BucketsArg::Bounds)
            .map_err(|e| {
                format!("{e}; give a count of bounds (e.g. 24) or the bounds (e.g. 100us,1ms,10ms)")
            })
    }
}

impl fmt::Display for BucketsArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BucketsArg::Count(n) => write!(f, "{n}"),
            BucketsArg::Bounds(b) => {
                let list: Vec<String> = b
                    .iter()
                    .map(|d| humantime::format_duration(*d).to_string())
                    .collect();
                write!(f, "{}", list.join(","))
            }
        }
    }
}

/// Written as it is read: a count as a number, bounds as "100us,1ms".
impl Serialize for BucketsArg {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            BucketsArg::Count(n) => s.serialize_u16(*n),
            BucketsArg::Bounds(_) => s.serialize_str(&self.to_string()),
        }
    }
}

/// A TOML scenario's `metrics_buckets = 24`, `= "1ms,10ms"` or
/// `= ["1ms", "10ms"]`.
impl<'de> Deserialize<'de> for BucketsArg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u16),
            Text(String),
            List(Vec<String>),
        }
        match Raw::deserialize(d)? {
            Raw::Count(n) => Ok(BucketsArg::Count(n)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
            Raw::List(l) => l.join(",").parse().map_err(serde::de::Error::custom),
        }
    }
}

impl MetricsSeries {
    /// The default with several targets (a fleet's prober): RTT and
    /// one-way histograms and the counters, no stage histograms (up to 7
    /// more per target) unless `--metrics-histograms` asks for them; this
    /// keeps 1000 targets' `/metrics` within its render budget.
    pub const fn for_fleet() -> Self {
        Self {
            rtt: true,
            one_way: true,
            stages: false,
            buckets: MetricsBuckets::Count(DEFAULT_METRICS_BUCKETS),
        }
    }
}

impl ContinuousArgs {
    /// Checks the options against the probe's `--duration` (0 means forever)
    /// and turns them into a plan. Errors name the flag and what to do.
    pub(crate) fn plan(&self, duration: Option<Duration>) -> Result<ContinuousPlan, SpecError> {
        macro_rules! bail {
            ($key:literal, $($m:tt)*) => {
                return Err(SpecError::new($key, format!($($m)*)))
            };
        }
        let forever = self.forever == Some(true) || duration.is_some_and(|d| d.is_zero());
        if self.forever == Some(true) && duration.is_some_and(|d| !d.is_zero()) {
            bail!(
                "forever",
                "probes until stopped: drop --duration (or use --duration 0)"
            );
        }
        let rotation = match self.out_rotate {
            None => None,
            Some(when) => {
                match when {
                    Rotate::Bytes(b) if b < MIN_ROTATE_BYTES => bail!(
                        "out_rotate",
                        "{when} is too small: give at least 16KiB (e.g. 100MiB)"
                    ),
                    Rotate::Every(d) if d < MIN_ROTATE_PERIOD => bail!(
                        "out_rotate",
                        "{when} is too short: give at least 1s (e.g. 1h)"
                    ),
                    _ => {}
                }
                let keep = self.out_keep.unwrap_or(DEFAULT_KEEP);
                if !(1..=10_000).contains(&keep) {
                    bail!(
                        "out_keep",
                        "{keep} is out of range: keep 1..10000 rotated files"
                    );
                }
                Some(Rotation { when, keep })
            }
        };
        if let Some(d) = self.report_every {
            if d < Duration::from_millis(100) {
                bail!(
                    "report_every",
                    "{d:?} is too short: use at least 100ms (e.g. 1s, 10s)"
                );
            }
            if d > Duration::from_secs(24 * 3600) {
                bail!("report_every", "{d:?} is too long: use at most 24h");
            }
        }
        if let Some(p) = &self.hdr_log {
            check_out_path(p).map_err(|m| SpecError::new("hdr_log", m))?;
        }
        Ok(ContinuousPlan {
            forever,
            rotation,
            report_every: self.report_every,
            metrics_listen: self.metrics_listen,
            metrics_token_file: self.metrics_token_file.clone(),
            metrics_series: self.metrics_series()?,
            hdr_log: self.hdr_log.clone(),
        })
    }
}

impl ContinuousArgs {
    fn metrics_series(&self) -> Result<MetricsSeries, SpecError> {
        let given = if self.metrics_histograms.is_some() {
            Some(("metrics_histograms", "shapes the metrics"))
        } else if self.metrics_buckets.is_some() {
            Some(("metrics_buckets", "shapes the metrics"))
        } else if self.metrics_token_file.is_some() {
            Some(("metrics_token_file", "guards the metrics"))
        } else {
            None
        };
        if let (Some((key, what)), None) = (given, self.metrics_listen) {
            return Err(SpecError::new(
                key,
                format!("{what}: give --metrics-listen ADDR:PORT too, or drop it"),
            ));
        }
        let buckets = match &self.metrics_buckets {
            None => MetricsBuckets::Count(DEFAULT_METRICS_BUCKETS),
            Some(b) => metrics_buckets(b).map_err(|m| SpecError::new("metrics_buckets", m))?,
        };
        let mut series = MetricsSeries {
            buckets,
            ..MetricsSeries::default()
        };
        if let Some(list) = &self.metrics_histograms {
            series.rtt = list.contains(&MetricsHistogram::Rtt);
            series.one_way = list.contains(&MetricsHistogram::OneWay);
            series.stages = list.contains(&MetricsHistogram::Stages);
        }
        Ok(series)
    }
}

/// `--metrics-buckets`, checked: 2..96 bounds, listed ones increasing and
/// within 1 µs..1 h.
fn metrics_buckets(arg: &BucketsArg) -> Result<MetricsBuckets, String> {
    let (lo, hi) = (METRICS_BUCKETS.start(), METRICS_BUCKETS.end());
    match arg {
        BucketsArg::Count(n) if METRICS_BUCKETS.contains(n) => Ok(MetricsBuckets::Count(*n)),
        BucketsArg::Count(n) => Err(format!(
            "{n} is out of range: give {lo}..{hi} bucket bounds (48: a factor of √2)"
        )),
        BucketsArg::Bounds(b) => {
            if b.len() > usize::from(*hi) {
                return Err(format!("{arg} lists {} bounds: give at most {hi}", b.len()));
            }
            if let Some(d) = b.iter().find(|d| !METRICS_BOUND.contains(d)) {
                return Err(format!(
                    "{arg}: the bound {} is out of range: give bounds from 1us to 1h",
                    humantime::format_duration(*d)
                ));
            }
            if let Some(w) = b.windows(2).find(|w| w[0] >= w[1]) {
                return Err(format!(
                    "{arg}: {} does not follow {}: give the bounds in increasing order, each once",
                    humantime::format_duration(w[1]),
                    humantime::format_duration(w[0])
                ));
            }
            Ok(MetricsBuckets::Bounds(
                b.iter().map(|d| d.as_nanos() as u64).collect(),
            ))
        }
    }
}

fn check_out_path(p: &std::path::Path) -> Result<(), String> {
    if p.is_dir() {
        return Err(format!("{} is a directory: give a file name", p.display()));
    }
    let parent = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        return Err(format!(
            "{}: directory {} does not exist",
            p.display(),
            parent.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::plan::DEFAULT_INTERVAL;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[arg(long)]
        count: Option<u64>,
        #[command(flatten)]
        c: ContinuousArgs,
    }

    fn parse(args: &[&str]) -> Result<ContinuousArgs, clap::Error> {
        T::try_parse_from(std::iter::once("t").chain(args.iter().copied())).map(|t| t.c)
    }

    #[test]
    fn rotation_parses_sizes_and_times() {
        assert_eq!("100MiB".parse(), Ok(Rotate::Bytes(100 << 20)));
        assert_eq!("500MB".parse(), Ok(Rotate::Bytes(500_000_000)));
        assert_eq!("1.5GiB".parse(), Ok(Rotate::Bytes(3 << 29)));
        assert_eq!("65536".parse(), Ok(Rotate::Bytes(65536)));
        assert_eq!("1h".parse(), Ok(Rotate::Every(Duration::from_secs(3600))));
        assert_eq!("10min".parse(), Ok(Rotate::Every(Duration::from_secs(600))));
        for bad in [
            "",
            "lots",
            "-5MiB",
            "1e400MB",
            "99999999999999999999GiB",
            "5 parsecs",
        ] {
            assert!(bad.parse::<Rotate>().is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_parse_and_validate() {
        let c = parse(&["--forever", "--out-rotate", "1MiB", "--out-keep", "3"]).unwrap();
        assert_eq!(c.forever, Some(true));
        let p = c.plan(None).unwrap();
        assert!(p.forever);
        assert_eq!(
            p.rotation,
            Some(Rotation {
                when: Rotate::Bytes(1 << 20),
                keep: 3
            })
        );
        assert_eq!(p.interval(), DEFAULT_INTERVAL);
        let c = parse(&[]).unwrap();
        assert_eq!(c, ContinuousArgs::default());
        assert!(!c.plan(Some(Duration::from_secs(3))).unwrap().forever);
        assert!(
            c.plan(Some(Duration::ZERO)).unwrap().forever,
            "--duration 0"
        );
        assert!(parse(&["--out-keep", "3"]).is_err(), "needs --out-rotate");
        assert!(parse(&["--forever", "--count", "3"]).is_err());
        let err =
            |a: &[&str], d: Option<Duration>| parse(a).unwrap().plan(d).unwrap_err().for_cli();
        assert!(err(&["--out-rotate", "1KiB"], None).contains("--out-rotate 1KiB is too small"));
        assert_eq!(Rotate::Bytes(100 << 20).to_string(), "100MiB");
        assert_eq!(Rotate::Bytes(1000).to_string(), "1000 bytes");
        assert!(err(&["--out-rotate", "10ms"], None).contains("at least 1s"));
        assert!(err(&["--out-rotate", "1h", "--out-keep", "0"], None).contains("--out-keep 0"));
        assert!(err(&["--report-every", "1ms"], None).contains("at least 100ms"));
        assert!(err(&["--forever"], Some(Duration::from_secs(5))).contains("drop --duration"));
        assert!(err(&["--hdr-log", "/nonexistent-dir/x.hlog"], None).contains("--hdr-log"));
        let c = parse(&["--metrics-listen", "127.0.0.1:0", "--report-every", "2s"]).unwrap();
        let p = c.plan(None).unwrap();
        assert_eq!(p.metrics_listen, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(p.interval(), Duration::from_secs(2));
        assert!(parse(&["--metrics-listen", "localhost"]).is_err());
        assert_eq!(p.metrics_series, MetricsSeries::default());
    }

    #[test]
    fn the_metrics_series_budget_is_chosen_and_checked() {
        let plan = |a: &[&str]| parse(a).unwrap().plan(None);
        let p = plan(&[
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-histograms",
            "rtt,one-way",
            "--metrics-buckets",
            "24",
        ])
        .unwrap();
        assert_eq!(
            p.metrics_series,
            MetricsSeries {
                rtt: true,
                one_way: true,
                stages: false,
                buckets: MetricsBuckets::Count(24)
            }
        );
        let err = |a: &[&str]| plan(a).unwrap_err().for_cli();
        assert!(err(&["--metrics-buckets", "24"]).contains("give --metrics-listen"));
        assert!(err(&["--metrics-histograms", "rtt"]).contains("give --metrics-listen"));
        let e = err(&["--metrics-listen", "127.0.0.1:0", "--metrics-buckets", "1"]);
        assert!(e.contains("--metrics-buckets 1 is out of range"), "{e}");
        assert!(
            err(&["--metrics-listen", "127.0.0.1:0", "--metrics-buckets", "97"]).contains("2..96")
        );
        assert!(parse(&["--metrics-histograms", "rtt,p99"]).is_err());
        let c: ContinuousArgs = toml::from_str(
            "metrics_listen = \"0.0.0.0:9464\"\nmetrics_histograms = [\"rtt\"]\nmetrics_buckets = 12",
        )
        .unwrap();
        let s = c.plan(None).unwrap().metrics_series;
        assert!(s.rtt && !s.one_way && !s.stages && s.buckets == MetricsBuckets::Count(12));
        // The bounds themselves, from the command line and from TOML.
        let p = plan(&[
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-buckets",
            "250us,1ms,2.5ms,1s",
        ])
        .unwrap();
        let want =
            MetricsBuckets::Bounds(vec![250_000, 1_000_000, 2_500_000, 1_000_000_000].into());
        assert_eq!(p.metrics_series.buckets, want);
        for toml in [
            "metrics_buckets = \"250us,1ms,2.5ms,1s\"",
            "metrics_buckets = [\"250us\", \"1ms\", \"2.5ms\", \"1s\"]",
        ] {
            let c: ContinuousArgs =
                toml::from_str(&format!("metrics_listen = \"0.0.0.0:9464\"\n{toml}")).unwrap();
            assert_eq!(c.plan(None).unwrap().metrics_series.buckets, want, "{toml}");
        }
        let listen = ["--metrics-listen", "127.0.0.1:0", "--metrics-buckets"];
        for (bad, says) in [
            ("1ms,1ms", "1ms does not follow 1ms"),
            ("10ms,1ms", "1ms does not follow 10ms"),
            ("0ns,1ms", "out of range: give bounds from 1us to 1h"),
            ("1ms,2h", "the bound 2h is out of range"),
        ] {
            let e = err(&[&listen[..], &[bad]].concat());
            assert!(
                e.starts_with("--metrics-buckets ") && e.contains(says),
                "{bad}: {e}"
            );
        }
        let many = (1..=97)
            .map(|i| format!("{i}ms"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(err(&[&listen[..], &[many.as_str()]].concat()).contains("at most 96"));
        let e = parse(&["--metrics-buckets", "1ms,soon"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("(e.g. 100us,1ms,10ms)"), "{e}");
        // Written back as it was read.
        assert_eq!(
            "250us,1ms".parse::<BucketsArg>().unwrap().to_string(),
            "250us,1ms"
        );
    }

    #[test]
    fn the_token_file_needs_the_endpoint() {
        let e = parse(&["--metrics-token-file", "/etc/t"])
            .unwrap()
            .plan(None)
            .unwrap_err()
            .for_cli();
        assert!(e.contains("give --metrics-listen"), "{e}");
        let p = parse(&[
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-token-file",
            "/etc/t",
        ])
        .unwrap()
        .plan(None)
        .unwrap();
        assert_eq!(p.metrics_token_file, Some(PathBuf::from("/etc/t")));
    }

    #[test]
    fn the_same_options_come_from_toml() {
        let c: ContinuousArgs = toml::from_str(
            "forever = true\nout_rotate = \"100MiB\"\nout_keep = 2\nreport_every = \"10s\"\n\
             metrics_listen = \"0.0.0.0:9464\"\nhdr_log = \"x.hlog\"",
        )
        .unwrap();
        assert_eq!(c.out_rotate, Some(Rotate::Bytes(100 << 20)));
        assert_eq!(c.report_every, Some(Duration::from_secs(10)));
        let e = toml::from_str::<ContinuousArgs>("out_rotate = \"huge\"").unwrap_err();
        assert!(e.to_string().contains("invalid rotation"), "{e}");
        // Unknown keys are refused where the group is flattened (a scenario's [probe]).
        let keys = crate::options::keys_of::<crate::options::RunSpec>();
        for k in [
            "forever",
            "out_rotate",
            "out_keep",
            "report_every",
            "metrics_listen",
            "metrics_histograms",
            "metrics_buckets",
            "metrics_token_file",
            "hdr_log",
        ] {
            assert!(keys.iter().any(|x| x == k), "{k} in {keys:?}");
        }
    }
}
