//! Prometheus/OpenMetrics: the registry of a probe run's metrics and a
//! small HTTP server for `GET /metrics` (`--metrics-listen`).
//!
//! Any command that probes (the testbed run, `--target` runs, `rtprobe
//! reflect`) uses it the same way: [`Metrics::new`], one [`FlowMetrics`]
//! per probe flow ([`Metrics::flow`]) fed every finalized record and the
//! running counts, the info gauges once known, and [`MetricsServer::start`]
//! to serve them. Histograms are classic ones with exponential buckets
//! from 1 µs to about 12 s (factor √2), which `histogram_quantile` reads
//! to within ±20 % at every scale from a veth hop to a congested WAN.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::AsFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

use crate::{
    export::ProbeRecord,
    probe::SessionObserver,
    stats::{Counts, RunStats, chain::Stage},
};

/// The smallest bucket bound, in seconds (1 µs).
const BUCKET_START_S: f64 = 1e-6;
/// Bound-to-bound factor: √2, i.e. two buckets per doubling.
const BUCKET_FACTOR: f64 = std::f64::consts::SQRT_2;
/// 48 bounds: 1 µs .. 2^23.5 µs ≈ 11.9 s (then +Inf).
const BUCKET_COUNT: u16 = 48;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        BUCKET_START_S,
        BUCKET_FACTOR,
        BUCKET_COUNT,
    ))
}

/// What tells one probe flow from another.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowLabels {
    /// Where the probes go, e.g. "10.99.2.2:5061".
    pub target: String,
    /// Flow id (0 = the main flow).
    pub flow: String,
    /// IP TOS byte, e.g. "0xc0".
    pub tos: String,
    /// UDP payload bytes.
    pub size: String,
}

impl FlowLabels {
    pub fn new(target: impl Into<String>, flow: u8, tos: u8, size: usize) -> Self {
        Self {
            target: target.into(),
            flow: flow.to_string(),
            tos: format!("{tos:#04x}"),
            size: size.to_string(),
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    target: String,
    flow: String,
    tos: String,
    size: String,
    /// The stage's key (`sender_queue`, `path`...).
    stage: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LostLabels {
    target: String,
    flow: String,
    tos: String,
    size: String,
    /// "forward" (never reached the receiver), "return" (the echo did
    /// not come back) or "unknown" (the in-kernel reflector answers: an
    /// echo that did not come back could have been lost either way).
    direction: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XdpLabels {
    requested: String,
    attached: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    target: String,
    flow: String,
    tos: String,
    size: String,
    /// "hardware", "software", "mixed" or "none" (nothing received yet).
    source: String,
}

/// The metrics of a probing process, and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    one_way: Family<FlowLabels, Histogram, fn() -> Histogram>,
    rtt: Family<FlowLabels, Histogram, fn() -> Histogram>,
    stage: Family<StageLabels, Histogram, fn() -> Histogram>,
    sent: Family<FlowLabels, Counter>,
    received: Family<FlowLabels, Counter>,
    lost: Family<LostLabels, Counter>,
    reordered: Family<FlowLabels, Counter>,
    duplicates: Family<FlowLabels, Counter>,
    foreign: Family<FlowLabels, Counter>,
    never_sent: Family<FlowLabels, Counter>,
    late_echoes: Family<FlowLabels, Counter>,
    unaccounted: Family<FlowLabels, Counter>,
    xdp_mode: Family<XdpLabels, Gauge>,
    timestamp_source: Family<SourceLabels, Gauge>,
    /// `rtprobe reflect`: datagrams by what the reflector did with them.
    reflector_datagrams: Family<OutcomeLabels, Counter>,
    reflector_sessions: Counter,
}

/// What the reflector did with a datagram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// The reflector's cumulative counts, as `rtprobe reflect` keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReflectorCounts {
    pub sessions: u64,
    pub reflected: u64,
    pub malformed: u64,
    pub rate_limited: u64,
    pub auth_failed: u64,
    pub send_errors: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("rtprobe");
        let hist = || {
            Family::<_, _, fn() -> Histogram>::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            )
        };
        let m = Self {
            one_way: hist(),
            rtt: hist(),
            stage: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            sent: Family::default(),
            received: Family::default(),
            lost: Family::default(),
            reordered: Family::default(),
            duplicates: Family::default(),
            foreign: Family::default(),
            never_sent: Family::default(),
            late_echoes: Family::default(),
            unaccounted: Family::default(),
            xdp_mode: Family::default(),
            timestamp_source: Family::default(),
            reflector_datagrams: Family::default(),
            reflector_sessions: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "reflector_datagrams",
            "rtprobe reflect: datagrams received, by outcome (reflected, malformed, rate_limited, \
             auth_failed; send_error: a reply the kernel refused)",
            m.reflector_datagrams.clone(),
        );
        registry.register(
            "reflector_sessions",
            "rtprobe reflect: client sessions seen",
            m.reflector_sessions.clone(),
        );
        registry.register_with_unit(
            "one_way",
            "One-way delay: the receiver's RX stamp minus the probe's entry into the sender's stack",
            Unit::Seconds,
            m.one_way.clone(),
        );
        registry.register_with_unit(
            "rtt",
            "Round-trip time: the echo's RX stamp minus the probe's entry into the sender's stack",
            Unit::Seconds,
            m.rtt.clone(),
        );
        registry.register_with_unit(
            "stage",
            "Each stage of the probe's timestamp chain (stack, sender_queue, driver, path, receiver, reflector, return)",
            Unit::Seconds,
            m.stage.clone(),
        );
        registry.register(
            "probes_sent",
            "Probes sent and finalized (received or lost; a probe is finalized up to one timeout after its send)",
            m.sent.clone(),
        );
        registry.register(
            "probes_received",
            "Probes that reached the receiver",
            m.received.clone(),
        );
        registry.register(
            "probes_lost",
            "Probes lost, by direction where it is known",
            m.lost.clone(),
        );
        registry.register(
            "probes_reordered",
            "Probes that arrived after a later one",
            m.reordered.clone(),
        );
        registry.register(
            "probes_duplicated",
            "Extra copies of probes that arrived",
            m.duplicates.clone(),
        );
        registry.register(
            "foreign_packets",
            "Datagrams on the probe port that were not this run's: another session, undecodable, \
             or an echo from an address other than the target",
            m.foreign.clone(),
        );
        registry.register(
            "echoes_never_sent",
            "Datagrams of this session whose seq was never sent (forged), refused",
            m.never_sent.clone(),
        );
        registry.register(
            "echoes_late",
            "Echoes that came after their probe was given up as lost, refused",
            m.late_echoes.clone(),
        );
        registry.register(
            "probes_unaccounted",
            "Probes in no other count (must stay 0)",
            m.unaccounted.clone(),
        );
        registry.register(
            "xdp_mode_info",
            "The XDP router's attach mode: 1 for the mode requested and attached",
            m.xdp_mode.clone(),
        );
        registry.register(
            "timestamp_source_info",
            "Where the flow's one-way figures come from: 1 for the current source",
            m.timestamp_source.clone(),
        );
        Self { registry, ..m }
    }

    /// The handles of one probe flow's metrics.
    pub fn flow(self: &Arc<Self>, labels: FlowLabels, kernel_reflector: bool) -> FlowMetrics {
        let stage_labels = |stage: Stage| StageLabels {
            target: labels.target.clone(),
            flow: labels.flow.clone(),
            tos: labels.tos.clone(),
            size: labels.size.clone(),
            stage: stage.key().into(),
        };
        let lost_labels = |direction: &str| LostLabels {
            target: labels.target.clone(),
            flow: labels.flow.clone(),
            tos: labels.tos.clone(),
            size: labels.size.clone(),
            direction: direction.into(),
        };
        let (forward, back) = if kernel_reflector {
            ("unknown", None)
        } else {
            ("forward", Some("return"))
        };
        // One statement per handle: get_or_create holds the family's read
        // lock until the end of the statement, and creating a second label
        // set of the same family in that statement would wait for it forever.
        let lost = self.lost.get_or_create(&lost_labels(forward)).clone();
        let echo_lost = back.map(|d| self.lost.get_or_create(&lost_labels(d)).clone());
        FlowMetrics {
            metrics: self.clone(),
            one_way: self.one_way.get_or_create(&labels).clone(),
            rtt: self.rtt.get_or_create(&labels).clone(),
            stages: Stage::ALL.map(|s| self.stage.get_or_create(&stage_labels(s)).clone()),
            sent: self.sent.get_or_create(&labels).clone(),
            received: self.received.get_or_create(&labels).clone(),
            lost,
            echo_lost,
            reordered: self.reordered.get_or_create(&labels).clone(),
            duplicates: self.duplicates.get_or_create(&labels).clone(),
            foreign: self.foreign.get_or_create(&labels).clone(),
            never_sent: self.never_sent.get_or_create(&labels).clone(),
            late_echoes: self.late_echoes.get_or_create(&labels).clone(),
            unaccounted: self.unaccounted.get_or_create(&labels).clone(),
            labels,
            counted: Counts::default(),
            source: String::new(),
        }
    }

    /// The XDP mode asked for and the one the kernel attached ("off",
    /// "skb", "native"...).
    pub fn set_xdp_mode(&self, requested: &str, attached: &str) {
        self.xdp_mode.clear();
        self.xdp_mode
            .get_or_create(&XdpLabels {
                requested: requested.into(),
                attached: attached.into(),
            })
            .set(1);
    }

    /// Brings the reflector's counters up to `now` (cumulative counts; `last`
    /// is what was published before, updated in place).
    pub fn reflector_update(&self, last: &mut ReflectorCounts, now: ReflectorCounts) {
        let outcomes = [
            ("reflected", last.reflected, now.reflected),
            ("malformed", last.malformed, now.malformed),
            ("rate_limited", last.rate_limited, now.rate_limited),
            ("auth_failed", last.auth_failed, now.auth_failed),
            ("send_error", last.send_errors, now.send_errors),
        ];
        for (outcome, before, after) in outcomes {
            let c = self.reflector_datagrams.get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            });
            c.inc_by(after.saturating_sub(before));
        }
        self.reflector_sessions
            .inc_by(now.sessions.saturating_sub(last.sessions));
        *last = now;
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut s, &self.registry);
        s
    }
}

/// One probe flow's metrics: give it every finalized record and the
/// running counts (it is a [`SessionObserver`]).
pub struct FlowMetrics {
    metrics: Arc<Metrics>,
    labels: FlowLabels,
    one_way: Histogram,
    rtt: Histogram,
    stages: [Histogram; 7],
    sent: Counter,
    received: Counter,
    lost: Counter,
    echo_lost: Option<Counter>,
    reordered: Counter,
    duplicates: Counter,
    foreign: Counter,
    never_sent: Counter,
    late_echoes: Counter,
    unaccounted: Counter,
    /// The counts already added to the counters.
    counted: Counts,
    source: String,
}

fn seconds(ns: i64) -> f64 {
    ns.max(0) as f64 * 1e-9
}

impl FlowMetrics {
    /// A finalized probe's latencies.
    pub fn observe(&self, r: &ProbeRecord) {
        if let Some(v) = r.one_way_ns {
            self.one_way.observe(seconds(v));
        }
        if let Some(v) = r.rtt_ns {
            self.rtt.observe(seconds(v));
        }
        for (h, stage) in self.stages.iter().zip(Stage::ALL) {
            if let Some(v) = stage.of(r) {
                h.observe(seconds(v));
            }
        }
    }

    /// Brings the counters up to the run's counts (counters only grow:
    /// a count that went down is left where it was).
    pub fn update(&mut self, c: &Counts, timestamp_source: &str) {
        let add = |counter: &Counter, now: u64, before: u64| {
            if now > before {
                counter.inc_by(now - before);
            }
        };
        let was = self.counted;
        add(&self.sent, c.sent, was.sent);
        add(&self.received, c.received, was.received);
        add(&self.lost, c.lost, was.lost);
        if let Some(e) = &self.echo_lost {
            add(e, c.echo_lost, was.echo_lost);
        }
        add(&self.reordered, c.reordered, was.reordered);
        add(&self.duplicates, c.duplicates, was.duplicates);
        add(&self.foreign, c.foreign, was.foreign);
        add(&self.never_sent, c.never_sent, was.never_sent);
        add(&self.late_echoes, c.late_echoes, was.late_echoes);
        add(&self.unaccounted, c.unaccounted, was.unaccounted);
        self.counted = Counts {
            sent: c.sent.max(was.sent),
            received: c.received.max(was.received),
            lost: c.lost.max(was.lost),
            echo_lost: c.echo_lost.max(was.echo_lost),
            reordered: c.reordered.max(was.reordered),
            duplicates: c.duplicates.max(was.duplicates),
            foreign: c.foreign.max(was.foreign),
            never_sent: c.never_sent.max(was.never_sent),
            late_echoes: c.late_echoes.max(was.late_echoes),
            unaccounted: c.unaccounted.max(was.unaccounted),
        };
        if self.source != timestamp_source {
            let family = &self.metrics.timestamp_source;
            let labels = |source: &str| SourceLabels {
                target: self.labels.target.clone(),
                flow: self.labels.flow.clone(),
                tos: self.labels.tos.clone(),
                size: self.labels.size.clone(),
                source: source.into(),
            };
            if !self.source.is_empty() {
                family.remove(&labels(&self.source));
            }
            family.get_or_create(&labels(timestamp_source)).set(1);
            self.source = timestamp_source.into();
        }
    }
}

impl SessionObserver for FlowMetrics {
    fn on_record(&mut self, r: &ProbeRecord) {
        self.observe(r);
    }

    fn on_tick(&mut self, stats: &RunStats, _last: bool) -> Result<(), String> {
        self.update(&stats.counts(), stats.timestamp_source());
        Ok(())
    }
}

/// Serves `GET /metrics` on its own thread until dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Longest a client may take to send its request or read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest request head read.
const MAX_REQUEST: usize = 8192;

impl MetricsServer {
    /// Binds `addr` (port 0: a free port) and serves `metrics`.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<Self> {
        let listener = TcpListener::bind(addr).with_context(|| {
            format!("--metrics-listen {addr}: cannot listen there (is the port in use? pick another, or port 0 for a free one)")
        })?;
        let addr = listener
            .local_addr()
            .context("the metrics listener's address")?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rtprobe-metrics".into())
            .spawn(move || serve(&listener, &metrics, &s))
            .context("spawn the metrics server thread")?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the port picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: &TcpListener, metrics: &Metrics, stop: &AtomicBool) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    while !stop.load(Ordering::SeqCst) {
        // Two wake-ups a second while idle: the probe's own threads share
        // the CPUs, and every wake-up can show in their latency.
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(500u16)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                log::warn!("metrics server: poll: {e}; no more scrapes are served");
                return;
            }
        }
        match listener.accept() {
            Ok((conn, peer)) => {
                if let Err(e) = answer(conn, metrics) {
                    log::debug!("metrics server: {peer}: {e}");
                }
            }
            Err(e) => log::debug!("metrics server: accept: {e}"),
        }
    }
}

/// Reads one request head and answers it; the connection is then closed.
fn answer(mut conn: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    conn.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    conn.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST {
            return respond(
                &mut conn,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"request too large\n",
            );
        }
    }
    let (status, body) = route(&head);
    match status {
        Route::Metrics => {
            let body = metrics.encode();
            respond(
                &mut conn,
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                body.as_bytes(),
            )
        }
        Route::Other(status) => respond(
            &mut conn,
            status,
            "text/plain; charset=utf-8",
            body.as_bytes(),
        ),
    }
}

#[derive(Debug, PartialEq)]
enum Route {
    Metrics,
    Other(&'static str),
}

/// What to answer a request head with. Anything that is not a well-formed
/// `GET /metrics` gets a status and a one-line body, never a panic.
fn route(head: &[u8]) -> (Route, String) {
    let line = head
        .split(|&b| b == b'\n')
        .next()
        .map(|l| {
            String::from_utf8_lossy(l)
                .trim_end_matches('\r')
                .to_string()
        })
        .unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let (Some(method), Some(target), Some(version)) = (method, target, version) else {
        return (Route::Other("400 Bad Request"), "bad request\n".into());
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return (Route::Other("400 Bad Request"), "bad request\n".into());
    }
    let path = target.split('?').next().unwrap_or_default();
    match (method, path) {
        ("GET", "/metrics") => (Route::Metrics, String::new()),
        ("GET", _) => (
            Route::Other("404 Not Found"),
            "not found: rtprobe serves /metrics\n".into(),
        ),
        _ => (
            Route::Other("405 Method Not Allowed"),
            "only GET /metrics is served\n".into(),
        ),
    }
}

fn respond(
    conn: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)?;
    conn.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(one_way_us: i64) -> ProbeRecord {
        ProbeRecord {
            one_way_ns: Some(one_way_us * 1000),
            rtt_ns: Some(2 * one_way_us * 1000),
            path_ns: Some(one_way_us * 500),
            ..Default::default()
        }
    }

    #[test]
    fn reflector_counts_are_published_as_deltas_of_cumulative_counts() {
        let m = Metrics::new();
        let mut last = ReflectorCounts::default();
        let now = ReflectorCounts {
            sessions: 2,
            reflected: 500,
            malformed: 7,
            rate_limited: 1,
            auth_failed: 3,
            send_errors: 0,
        };
        m.reflector_update(&mut last, now);
        m.reflector_update(&mut last, now); // nothing new: unchanged
        m.reflector_update(
            &mut last,
            ReflectorCounts {
                reflected: 510,
                ..now
            },
        );
        assert_eq!(last.reflected, 510);
        let text = m.encode();
        for line in [
            "rtprobe_reflector_datagrams_total{outcome=\"reflected\"} 510",
            "rtprobe_reflector_datagrams_total{outcome=\"malformed\"} 7",
            "rtprobe_reflector_datagrams_total{outcome=\"auth_failed\"} 3",
            "rtprobe_reflector_datagrams_total{outcome=\"send_error\"} 0",
            "rtprobe_reflector_sessions_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn exposition_has_histograms_counters_and_info() {
        let m = Arc::new(Metrics::new());
        m.set_xdp_mode("auto", "native");
        let mut f = m.flow(FlowLabels::new("10.0.0.2:5061", 0, 0xc0, 64), false);
        for us in [10, 20, 40, 3_000_000] {
            f.observe(&record(us));
        }
        f.update(
            &Counts {
                sent: 5,
                received: 4,
                lost: 1,
                echo_lost: 2,
                reordered: 1,
                ..Default::default()
            },
            "software",
        );
        // Counters only grow, and only by the difference.
        f.update(
            &Counts {
                sent: 7,
                received: 6,
                lost: 1,
                echo_lost: 2,
                reordered: 1,
                foreign: 3,
                never_sent: 2,
                late_echoes: 1,
                ..Default::default()
            },
            "hardware",
        );
        let text = m.encode();
        let labels = r#"target="10.0.0.2:5061",flow="0",tos="0xc0",size="64""#;
        for want in [
            "# TYPE rtprobe_one_way_seconds histogram".to_string(),
            "# UNIT rtprobe_one_way_seconds seconds".into(),
            format!("rtprobe_one_way_seconds_count{{{labels}}} 4"),
            format!("rtprobe_rtt_seconds_bucket{{le=\"+Inf\",{labels}}} 4"),
            format!("rtprobe_probes_sent_total{{{labels}}} 7"),
            format!("rtprobe_probes_received_total{{{labels}}} 6"),
            format!("rtprobe_probes_lost_total{{{labels},direction=\"forward\"}} 1"),
            format!("rtprobe_probes_lost_total{{{labels},direction=\"return\"}} 2"),
            format!("rtprobe_probes_reordered_total{{{labels}}} 1"),
            format!("rtprobe_probes_unaccounted_total{{{labels}}} 0"),
            format!("rtprobe_foreign_packets_total{{{labels}}} 3"),
            format!("rtprobe_echoes_never_sent_total{{{labels}}} 2"),
            format!("rtprobe_echoes_late_total{{{labels}}} 1"),
            format!("rtprobe_timestamp_source_info{{{labels},source=\"hardware\"}} 1"),
            "rtprobe_xdp_mode_info{requested=\"auto\",attached=\"native\"} 1".into(),
            format!("rtprobe_stage_seconds_count{{{labels},stage=\"path\"}} 4"),
            "# EOF".into(),
        ] {
            assert!(text.contains(&want), "missing {want:?} in\n{text}");
        }
        assert!(
            !text.contains("source=\"software\""),
            "the old source is gone"
        );
        // Cumulative buckets: 10 µs lies in (8 µs, 11.3 µs], 3 s above 2.9 s.
        let prefix = "rtprobe_one_way_seconds_bucket{le=\"";
        let buckets: Vec<(f64, u64)> = text
            .lines()
            .filter(|l| l.starts_with(prefix) && l.contains(labels))
            .map(|l| {
                let le = &l[prefix.len()..l[prefix.len()..].find('"').unwrap() + prefix.len()];
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, l.rsplit(' ').next().unwrap().parse().unwrap())
            })
            .collect();
        assert_eq!(buckets.len(), BUCKET_COUNT as usize + 1);
        let at = |v: f64| buckets.iter().find(|b| b.0 >= v * 0.999_999).unwrap().1;
        assert_eq!(at(8e-6), 0);
        assert_eq!(at(11.3e-6), 1);
        assert_eq!(at(40e-6), 3);
        assert_eq!(at(2.9), 3);
        assert_eq!(at(f64::INFINITY), 4);
    }

    #[test]
    fn buckets_span_a_microsecond_to_seconds() {
        let b: Vec<f64> =
            exponential_buckets(BUCKET_START_S, BUCKET_FACTOR, BUCKET_COUNT).collect();
        assert_eq!(b[0], 1e-6);
        assert!(
            b[b.len() - 1] > 10.0 && b[b.len() - 1] < 13.0,
            "{}",
            b[b.len() - 1]
        );
    }

    #[test]
    fn kernel_reflector_loss_has_no_direction() {
        let m = Arc::new(Metrics::new());
        let mut f = m.flow(FlowLabels::new("t", 1, 0, 64), true);
        f.update(
            &Counts {
                sent: 3,
                lost: 1,
                ..Default::default()
            },
            "software",
        );
        let text = m.encode();
        assert!(text.contains("direction=\"unknown\"} 1"), "{text}");
        assert!(!text.contains("direction=\"return\""));
    }

    #[test]
    fn requests_are_routed_and_garbage_is_refused() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").0,
            Route::Metrics
        );
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").0,
            Route::Metrics
        );
        assert_eq!(
            route(b"GET / HTTP/1.1\r\n\r\n").0,
            Route::Other("404 Not Found")
        );
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n").0,
            Route::Other("405 Method Not Allowed")
        );
        for bad in [
            &b""[..],
            b"\xff\xfe\x00",
            b"GET",
            b"GET /metrics",
            b"GET /metrics SPDY/3\r\n\r\n",
            b"GET  /metrics HTTP/1.1 extra\r\n",
        ] {
            assert_eq!(route(bad).0, Route::Other("400 Bad Request"), "{bad:?}");
        }
    }

    fn http(addr: SocketAddr, request: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(request).unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    }

    #[test]
    fn the_server_answers_scrapes_and_survives_garbage() {
        let m = Arc::new(Metrics::new());
        let f = m.flow(FlowLabels::new("t", 0, 0, 64), false);
        f.observe(&record(50));
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), m.clone()).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        // A client that connects and says nothing, one that sends binary,
        // one that sends a huge head: none stops the server.
        drop(TcpStream::connect(addr).unwrap());
        assert!(http(addr, b"\x00\x01\x02garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(http(addr, &vec![b'A'; 9000]).starts_with("HTTP/1.1 431"));
        assert!(http(addr, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        let ok = http(
            addr,
            b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n",
        );
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("Content-Type: application/openmetrics-text; version=1.0.0"));
        assert!(ok.contains(
            "rtprobe_one_way_seconds_count{target=\"t\",flow=\"0\",tos=\"0x00\",size=\"64\"} 1"
        ));
        assert!(ok.trim_end().ends_with("# EOF"));
        drop(server);
        assert!(TcpStream::connect(addr).is_err(), "stopped on drop");
    }
}
