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
    collections::VecDeque,
    net::SocketAddr,
    sync::{Arc, Mutex},
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
    model::{observer::SessionObserver, record::ProbeRecord},
    stats::{Counts, RunStats, XdpCounters, chain::Stage, report::ReflectorCounters},
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
    /// A targets file's labels of this target (`site="fra1"`...).
    #[prometheus(flatten)]
    pub extra: Vec<(String, String)>,
}

impl FlowLabels {
    pub fn new(target: impl Into<String>, flow: u8, tos: u8, size: usize) -> Self {
        Self {
            target: target.into(),
            flow: flow.to_string(),
            tos: format!("{tos:#04x}"),
            size: size.to_string(),
            extra: Vec::new(),
        }
    }

    /// With the target's own labels (names checked by the targets file).
    pub fn with_extra(mut self, labels: &std::collections::BTreeMap<String, String>) -> Self {
        self.extra = labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        self
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    target: String,
    flow: String,
    tos: String,
    size: String,
    #[prometheus(flatten)]
    extra: Vec<(String, String)>,
    /// The stage's key (`sender_queue`, `path`...).
    stage: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LostLabels {
    target: String,
    flow: String,
    tos: String,
    size: String,
    #[prometheus(flatten)]
    extra: Vec<(String, String)>,
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
    #[prometheus(flatten)]
    extra: Vec<(String, String)>,
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
    /// `rtprobe reflect --kernel`: frames the XDP reflector saw, by outcome.
    kernel_reflector_frames: Family<OutcomeLabels, Counter>,
}

/// What the reflector did with a datagram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
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
            kernel_reflector_frames: Family::default(),
            registry: Registry::default(),
        };
        // The order of registration is the order of the exposition.
        m.register_reflector(&mut registry);
        m.register_latencies(&mut registry);
        m.register_counts(&mut registry);
        m.register_info(&mut registry);
        Self { registry, ..m }
    }

    /// `rtprobe reflect`'s families.
    fn register_reflector(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "reflector_datagrams",
            "rtprobe reflect: datagrams received, by outcome (reflected, not_for_us, bad_source, \
             malformed, rate_limited, auth_failed; send_error: a reply the kernel refused)",
            m.reflector_datagrams.clone(),
        );
        registry.register(
            "reflector_sessions",
            "rtprobe reflect: client sessions seen",
            m.reflector_sessions.clone(),
        );
        registry.register(
            "kernel_reflector_frames",
            "rtprobe reflect --kernel: frames the in-kernel (XDP) reflector saw, by outcome \
             (reflected_rtprobe, reflected_stamp, not_for_us, bad_source, rate_limited, \
             global_limited, malformed, ...; the rest pass to the kernel)",
            m.kernel_reflector_frames.clone(),
        );
    }

    /// The probes' latency histograms.
    fn register_latencies(&self, registry: &mut Registry) {
        let m = self;
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
    }

    /// The probes' counters.
    fn register_counts(&self, registry: &mut Registry) {
        let m = self;
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
    }

    /// What the run is made of: XDP mode, timestamp source.
    fn register_info(&self, registry: &mut Registry) {
        let m = self;
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
    }

    /// The handles of one probe flow's metrics.
    pub fn flow(self: &Arc<Self>, labels: FlowLabels, kernel_reflector: bool) -> FlowMetrics {
        let stage_labels = |stage: Stage| StageLabels {
            target: labels.target.clone(),
            flow: labels.flow.clone(),
            tos: labels.tos.clone(),
            size: labels.size.clone(),
            extra: labels.extra.clone(),
            stage: stage.key().into(),
        };
        let lost_labels = |direction: &str| LostLabels {
            target: labels.target.clone(),
            flow: labels.flow.clone(),
            tos: labels.tos.clone(),
            size: labels.size.clone(),
            extra: labels.extra.clone(),
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
    pub fn reflector_update(&self, last: &mut ReflectorCounters, now: &ReflectorCounters) {
        let outcomes = [
            ("reflected", last.reflected, now.reflected),
            ("not_for_us", last.not_for_us, now.not_for_us),
            ("bad_source", last.bad_source, now.bad_source),
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
        *last = now.clone();
    }

    /// Brings the in-kernel reflector's frame counters up to `now`
    /// (cumulative, by outcome; `last` is what was published before,
    /// updated in place). Every outcome is published, zero or not, so a
    /// scrape shows which exist.
    pub fn kernel_reflector_update(&self, last: &mut XdpCounters, now: &XdpCounters) {
        for (outcome, c) in now {
            let before = last.get(outcome).map_or(0, |b| b.packets);
            self.kernel_reflector_frames
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.clone(),
                })
                .inc_by(c.packets.saturating_sub(before));
        }
        last.clone_from(now);
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
                extra: self.labels.extra.clone(),
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

/// Serves `GET /metrics` on a thread of its own until dropped.
///
/// HTTP is hyper's (HTTP/1.1, one request per connection) on a
/// single-threaded tokio runtime that lives on that thread, so the probe's
/// own threads never run any of it. Connections are served concurrently;
/// a client gets [`HEADER_TIMEOUT`] to send its request head and
/// [`CONNECTION_TIMEOUT`] in all, and at most [`MAX_CONNECTIONS`] are open
/// at once (see [`Slots`] for what happens over the cap).
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Longest a client may take to send its whole request head: a slowloris
/// client is closed after it, and so is one that connects and says nothing.
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a connection stays open, request and answer together: bounds a
/// client that never reads the answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections open at once; a scraper needs one, so this is room for
/// several Prometheus servers and curl, not for clients that hold them.
const MAX_CONNECTIONS: usize = 256;
/// Connections the kernel holds until they are accepted (the kernel caps
/// it at net.core.somaxconn): above MAX_CONNECTIONS, so a burst that
/// fills the cap does not overflow it.
const LISTEN_BACKLOG: u32 = 1024;
/// Largest request head read (hyper's smallest read buffer); a larger one
/// gets 431.
const MAX_REQUEST: usize = 8192;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

impl MetricsServer {
    /// Binds `addr` (port 0: a free port) and serves `metrics`.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .context("the metrics server's runtime")?;
        let listening = {
            let _in = runtime.enter();
            listen(addr)
        };
        let listener = match listening {
            Ok(l) => l,
            Err(e) => {
                // A runtime dropped the ordinary way panics in an async
                // context, and a caller may be in one.
                runtime.shutdown_background();
                return Err(e).with_context(|| {
                    format!("--metrics-listen {addr}: cannot listen there (is the port in use? pick another, or port 0 for a free one)")
                });
            }
        };
        let addr = listener
            .local_addr()
            .context("the metrics listener's address")?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("rtprobe-metrics".into())
            // Dropping the runtime at the end closes every open connection.
            .spawn(move || runtime.block_on(serve(listener, metrics, stopped)))
            .context("spawn the metrics server thread")?;
        Ok(Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the port picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A listening socket whose backlog holds a burst of connections
/// arriving while this thread is not scheduled: a full backlog drops SYNs,
/// and a dropped SYN costs the client a 1 s retransmit.
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As std's TcpListener::bind: a restart binds while the previous
    // run's connections are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let slots = Slots::new(MAX_CONNECTIONS);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        // One request per connection, as Prometheus is happy with: no
        // connection idles between scrapes holding a slot.
        .keep_alive(false)
        // "Content-Type", as the hand-written server sent it.
        .title_case_headers(true)
        .max_buf_size(MAX_REQUEST);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait for some
                    // to be closed rather than spin on the error.
                    log::debug!("metrics server: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some((slot, evicted)) = slots.admit() else {
            log::debug!(
                "metrics server: {peer}: {MAX_CONNECTIONS} connections are being answered; closed"
            );
            continue;
        };
        let id = slot.id;
        let task = tokio::spawn(connection(
            http.clone(),
            stream,
            peer,
            metrics.clone(),
            slot,
        ));
        slots.wait_for_head(id, task.abort_handle());
        if evicted {
            // Lets the evicted connection's task run its cancellation (and
            // close its socket) before the next accept.
            tokio::task::yield_now().await;
        }
    }
}

/// One connection, from accept to close; it gives its slot back on drop.
async fn connection(
    http: hyper::server::conn::http1::Builder,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    metrics: Arc<Metrics>,
    slot: Slot,
) {
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        slot.head_received();
        // The request body, if any, is never read.
        let response = answer(req.method(), req.uri().path(), &metrics);
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    let conn = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::debug!("metrics server: {peer}: {e}"),
        Err(_) => log::debug!("metrics server: {peer}: open for {CONNECTION_TIMEOUT:?}; closed"),
    }
}

type Body = http_body_util::Full<hyper::body::Bytes>;

fn answer(method: &hyper::Method, path: &str, metrics: &Metrics) -> hyper::Response<Body> {
    use hyper::StatusCode;
    match route(method, path) {
        Route::Metrics => respond(StatusCode::OK, OPENMETRICS, metrics.encode()),
        Route::NotFound => respond(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: rtprobe serves /metrics\n".into(),
        ),
        Route::MethodNotAllowed => {
            let mut r = respond(
                StatusCode::METHOD_NOT_ALLOWED,
                TEXT,
                "only GET /metrics is served\n".into(),
            );
            r.headers_mut().insert(
                hyper::header::ALLOW,
                hyper::header::HeaderValue::from_static("GET, HEAD"),
            );
            r
        }
    }
}

#[derive(Debug, PartialEq)]
enum Route {
    Metrics,
    NotFound,
    MethodNotAllowed,
}

/// What to answer a request with (hyper answers a malformed or oversized
/// request head itself: 400, 431). HEAD is GET without the body, which
/// hyper leaves out.
fn route(method: &hyper::Method, path: &str) -> Route {
    use hyper::Method;
    match (method, path) {
        (&Method::GET | &Method::HEAD, "/metrics") => Route::Metrics,
        (&Method::GET | &Method::HEAD, _) => Route::NotFound,
        _ => Route::MethodNotAllowed,
    }
}

fn respond(
    status: hyper::StatusCode,
    content_type: &'static str,
    body: String,
) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(Body::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

/// The connection cap. Every connection holds a slot from accept to close.
/// When all are taken, the connection that has waited longest without
/// sending a whole request head is closed to make room: a scrape sends its
/// head at once, so clients that connect and wait (idle, slowloris) cannot
/// lock it out, however many they open. When every open connection is
/// being answered, the new one is closed at once. Nothing waits in the
/// listen backlog either way.
#[derive(Clone)]
struct Slots(Arc<Mutex<SlotState>>);

struct SlotState {
    cap: usize,
    open: usize,
    next_id: u64,
    /// Connections still waiting for their request head, oldest first.
    waiting: VecDeque<(u64, tokio::task::AbortHandle)>,
}

/// A connection's place under the cap; dropping it gives the place back.
struct Slot {
    slots: Slots,
    id: u64,
}

impl Slots {
    fn new(cap: usize) -> Self {
        Self(Arc::new(Mutex::new(SlotState {
            cap,
            open: 0,
            next_id: 0,
            waiting: VecDeque::with_capacity(cap),
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // Only this server's one thread takes the lock, and nothing in it
        // can panic halfway: a poisoned state is still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a new connection, and whether an older connection was
    /// closed for it; None: every slot is being answered, close the new one.
    fn admit(&self) -> Option<(Slot, bool)> {
        let mut s = self.state();
        let evicted = if s.open < s.cap {
            false
        } else {
            // Its task ends at its next poll; dropping its slot then
            // lowers `open` again.
            let (_, oldest) = s.waiting.pop_front()?;
            oldest.abort();
            true
        };
        s.open += 1;
        let id = s.next_id;
        s.next_id += 1;
        Some((
            Slot {
                slots: self.clone(),
                id,
            },
            evicted,
        ))
    }

    fn wait_for_head(&self, id: u64, task: tokio::task::AbortHandle) {
        self.state().waiting.push_back((id, task));
    }

    fn forget(&self, id: u64) {
        let mut s = self.state();
        if let Some(i) = s.waiting.iter().position(|(w, _)| *w == id) {
            s.waiting.remove(i);
        }
    }
}

impl Slot {
    /// The request head is in: the connection is answered, not closed to
    /// make room.
    fn head_received(&self) {
        self.slots.forget(self.id);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.forget(self.id);
        self.slots.state().open -= 1;
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read, Write},
        net::TcpStream,
    };

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
        let mut last = ReflectorCounters::default();
        let now = ReflectorCounters {
            sessions: 2,
            reflected: 500,
            not_for_us: 4,
            bad_source: 5,
            malformed: 7,
            rate_limited: 1,
            auth_failed: 3,
            send_errors: 0,
            ..Default::default()
        };
        m.reflector_update(&mut last, &now);
        m.reflector_update(&mut last, &now); // nothing new: unchanged
        m.reflector_update(
            &mut last,
            &ReflectorCounters {
                reflected: 510,
                ..now.clone()
            },
        );
        assert_eq!(last.reflected, 510);
        let text = m.encode();
        for line in [
            "rtprobe_reflector_datagrams_total{outcome=\"reflected\"} 510",
            "rtprobe_reflector_datagrams_total{outcome=\"malformed\"} 7",
            "rtprobe_reflector_datagrams_total{outcome=\"not_for_us\"} 4",
            "rtprobe_reflector_datagrams_total{outcome=\"bad_source\"} 5",
            "rtprobe_reflector_datagrams_total{outcome=\"auth_failed\"} 3",
            "rtprobe_reflector_datagrams_total{outcome=\"send_error\"} 0",
            "rtprobe_reflector_sessions_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn kernel_reflector_frames_are_a_counter_family_by_outcome() {
        use crate::stats::summary::PacketsBytes;
        let m = Metrics::new();
        let counts = |reflected: u64, bad: u64| -> XdpCounters {
            [
                ("reflected_rtprobe", reflected),
                ("bad_source", bad),
                ("global_limited", 0),
            ]
            .into_iter()
            .map(|(k, packets)| {
                (
                    k.to_string(),
                    PacketsBytes {
                        packets,
                        bytes: packets * 64,
                    },
                )
            })
            .collect()
        };
        let mut last = XdpCounters::new();
        m.kernel_reflector_update(&mut last, &counts(100, 3));
        m.kernel_reflector_update(&mut last, &counts(100, 3)); // nothing new
        m.kernel_reflector_update(&mut last, &counts(250, 10));
        let text = m.encode();
        for line in [
            "# TYPE rtprobe_kernel_reflector_frames counter",
            "rtprobe_kernel_reflector_frames_total{outcome=\"reflected_rtprobe\"} 250",
            "rtprobe_kernel_reflector_frames_total{outcome=\"bad_source\"} 10",
            "rtprobe_kernel_reflector_frames_total{outcome=\"global_limited\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        // The user-space reflector's family is there too, and apart.
        m.reflector_update(
            &mut ReflectorCounters::default(),
            &ReflectorCounters {
                reflected: 1,
                ..Default::default()
            },
        );
        let text = m.encode();
        assert!(text.contains("rtprobe_reflector_datagrams_total{outcome=\"reflected\"} 1"));
        assert!(
            text.contains(
                "rtprobe_kernel_reflector_frames_total{outcome=\"reflected_rtprobe\"} 250"
            )
        );
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
    fn a_targets_labels_are_on_every_series_of_it() {
        let m = Arc::new(Metrics::new());
        let extra = std::collections::BTreeMap::from([
            ("rack".to_string(), "r7".to_string()),
            ("site".to_string(), "fra1".to_string()),
        ]);
        let mut f = m.flow(FlowLabels::new("db-1", 0, 0, 64).with_extra(&extra), false);
        f.observe(&record(20));
        f.update(
            &Counts {
                sent: 2,
                received: 1,
                lost: 1,
                ..Default::default()
            },
            "software",
        );
        let text = m.encode();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("target=\"db-1\""))
            .collect();
        assert!(series.len() > 10, "{text}");
        for l in &series {
            assert!(l.contains("rack=\"r7\",site=\"fra1\""), "{l}");
        }
        assert!(series.iter().any(|l| l.contains("direction=")), "{text}");
        assert!(series.iter().any(|l| l.contains("stage=")), "{text}");
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
    fn requests_are_routed() {
        use hyper::Method;
        assert_eq!(route(&Method::GET, "/metrics"), Route::Metrics);
        assert_eq!(route(&Method::HEAD, "/metrics"), Route::Metrics);
        assert_eq!(route(&Method::GET, "/"), Route::NotFound);
        assert_eq!(route(&Method::GET, "/metrics/"), Route::NotFound);
        for m in [Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS] {
            assert_eq!(route(&m, "/metrics"), Route::MethodNotAllowed, "{m}");
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
        // Any other method gets 405 and what is allowed; its body is not read.
        let post = http(
            addr,
            b"POST /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\nabc",
        );
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        assert!(post.contains("Allow: GET, HEAD\r\n"), "{post}");
        let head = http(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "no body: {head}");
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

    /// Connect, send a GET /metrics, read to the end: (time taken, answer).
    /// A server that never answers shows as the read timeout.
    fn timed_scrape(addr: SocketAddr) -> (Duration, String) {
        let t0 = std::time::Instant::now();
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        (t0.elapsed(), String::from_utf8_lossy(&out).into_owned())
    }

    /// Whether the server has closed `c` (EOF or a reset), without waiting.
    fn closed_now(mut c: &TcpStream) -> bool {
        c.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        let closed = loop {
            match c.read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                Err(_) => break true,
            }
        };
        c.set_nonblocking(false).unwrap();
        closed
    }

    /// Whether the server has closed `c` within `wait` (EOF or a reset).
    fn closed_within(mut c: &TcpStream, wait: Duration) -> bool {
        c.set_read_timeout(Some(wait)).unwrap();
        let mut buf = [0u8; 512];
        loop {
            match c.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue, // an error response before the close
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return false;
                }
                Err(_) => return true,
            }
        }
    }

    fn ms(d: Duration) -> f64 {
        d.as_secs_f64() * 1e3
    }

    /// A client that sends a never-finished request head one byte a second
    /// (slowloris); returns how long the server kept it open, or None if
    /// it was still open after `give_up`.
    fn slowloris(addr: SocketAddr, give_up: Duration) -> Option<Duration> {
        let t0 = std::time::Instant::now();
        let mut c = TcpStream::connect(addr).unwrap();
        let head = b"GET /metrics HTTP/1.1\r\nX-Slow: ";
        let mut sent = 0usize;
        while t0.elapsed() < give_up {
            let byte = head.get(sent).copied().unwrap_or(b'a');
            if c.write_all(&[byte]).is_err() {
                return Some(t0.elapsed());
            }
            sent += 1;
            if closed_within(&c, Duration::from_secs(1)) {
                return Some(t0.elapsed());
            }
        }
        None
    }

    /// Issue 18, finding 5: 200 idle connections and 10 slowloris clients
    /// must not delay a scrape (before: each idle connection held the one
    /// thread for 2 s, a slowloris for as long as it ran).
    #[test]
    fn scrapes_are_answered_beside_idle_and_slowloris_connections() {
        let m = Arc::new(Metrics::new());
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), m).unwrap();
        let addr = server.local_addr();
        let t0 = std::time::Instant::now();
        let idle: Vec<TcpStream> = (0..200)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let give_up = HEADER_TIMEOUT + Duration::from_secs(6);
        let slow: Vec<_> = (0..10)
            .map(|_| std::thread::spawn(move || slowloris(addr, give_up)))
            .collect();
        // Scrapes while every attacker is still open (they are closed
        // after HEADER_TIMEOUT): spread over the first second.
        std::thread::sleep(Duration::from_millis(100));
        let mut took = Vec::new();
        for _ in 0..10 {
            let (d, answer) = timed_scrape(addr);
            assert!(
                answer.starts_with("HTTP/1.1 200 OK\r\n"),
                "after {d:?}: {answer:?}"
            );
            assert!(answer.trim_end().ends_with("# EOF"), "{answer}");
            took.push(d);
            std::thread::sleep(Duration::from_millis(50));
        }
        let during = t0.elapsed();
        let max = took.iter().max().copied().unwrap_or_default();
        let mean = took.iter().sum::<Duration>() / took.len() as u32;
        eprintln!(
            "metrics under 200 idle + 10 slowloris connections: {} scrapes in the first {:.0} ms, \
             mean {:.1} ms, max {:.1} ms (all: {:?} ms)",
            took.len(),
            ms(during),
            ms(mean),
            ms(max),
            took.iter()
                .map(|d| (ms(*d) * 10.0).round() / 10.0)
                .collect::<Vec<_>>()
        );
        // The scrapes ran while the attackers were all still open.
        assert!(
            during < HEADER_TIMEOUT,
            "took {during:?}: the scrapes were not beside the attack"
        );
        // 100 ms is the requirement; an answer takes ~1 ms, so it leaves
        // room for a scheduler stall on a loaded 2-vCPU machine, and the
        // hand-written loop it replaces took 2 s or more.
        assert!(max <= Duration::from_millis(100), "slowest scrape {max:?}");
        let lifetimes: Vec<Option<Duration>> =
            slow.into_iter().map(|t| t.join().unwrap()).collect();
        eprintln!(
            "slowloris connections closed after {:?} ms (header timeout {} ms)",
            lifetimes
                .iter()
                .map(|l| l.map(|d| ms(d).round()))
                .collect::<Vec<_>>(),
            HEADER_TIMEOUT.as_millis()
        );
        for l in &lifetimes {
            let l = l.expect("a slowloris connection was never closed");
            // Closed by the header timeout: not before it, and within the
            // 1 s between the client's bytes after it.
            assert!(
                l >= HEADER_TIMEOUT,
                "closed after {l:?}, before the header timeout"
            );
            assert!(
                l <= HEADER_TIMEOUT + Duration::from_millis(1500),
                "closed after {l:?}"
            );
        }
        // The idle connections too are closed by then.
        let still_open = idle.iter().filter(|c| !closed_now(c)).count();
        assert_eq!(
            still_open,
            0,
            "idle connections still open after {:?}",
            t0.elapsed()
        );
    }

    fn scrape_times(addr: SocketAddr, n: usize) -> Vec<Duration> {
        (0..n)
            .map(|_| {
                let (d, answer) = timed_scrape(addr);
                assert!(
                    answer.starts_with("HTTP/1.1 200 OK\r\n"),
                    "after {d:?}: {answer:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
                d
            })
            .collect()
    }

    /// Over the cap, the connections that have sent nothing are closed at
    /// once (oldest first) and scrapes still get through.
    #[test]
    fn over_the_cap_waiting_connections_are_closed_and_scrapes_succeed() {
        let m = Arc::new(Metrics::new());
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), m).unwrap();
        let addr = server.local_addr();
        let t0 = std::time::Instant::now();
        let over = 50;
        let held: Vec<TcpStream> = (0..MAX_CONNECTIONS + over)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let closed: Vec<bool> = held.iter().map(closed_now).collect();
        let early = closed.iter().filter(|&&c| c).count();
        let took = scrape_times(addr, 10);
        let during = t0.elapsed();
        let max = took.iter().max().copied().unwrap_or_default();
        let after: Vec<bool> = held.iter().map(closed_now).collect();
        let closed_after = after.iter().filter(|&&c| c).count();
        eprintln!(
            "cap {MAX_CONNECTIONS}: {} connections opened, {early} closed within 300 ms \
             (the oldest first: {}); 10 scrapes beside them: max {:.1} ms; {closed_after} \
             closed after the scrapes, {:.0} ms in",
            held.len(),
            closed[..over].iter().all(|&c| c),
            ms(max),
            ms(during),
        );
        assert!(
            during < HEADER_TIMEOUT,
            "{during:?}: not all before the header timeout"
        );
        assert_eq!(
            early, over,
            "over the cap: exactly the excess is closed at once"
        );
        assert!(
            closed[..over].iter().all(|&c| c),
            "the oldest waiting ones go first"
        );
        // The first scrape took the slot of the oldest connection still
        // waiting; each scrape gives its slot back when it is answered.
        assert_eq!(closed_after, over + 1);
        assert!(after[..=over].iter().all(|&c| c));
        assert!(max <= Duration::from_millis(100), "slowest scrape {max:?}");
    }

    /// The cap's bookkeeping: the oldest connection waiting for its head
    /// goes first; with every connection being answered a new one is refused.
    #[test]
    fn slots_evict_the_oldest_waiting_and_refuse_when_all_answer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let slots = Slots::new(2);
            let admit = || {
                let (slot, evicted) = slots.admit()?;
                let task = tokio::spawn(std::future::pending::<()>());
                slots.wait_for_head(slot.id, task.abort_handle());
                Some((slot, task, evicted))
            };
            let (a, a_task, a_evicted) = admit().unwrap();
            let (b, b_task, b_evicted) = admit().unwrap();
            assert!(!a_evicted && !b_evicted);
            // Over the cap: a, the oldest waiting, makes room.
            let (c, c_task, c_evicted) = admit().unwrap();
            assert!(c_evicted);
            tokio::task::yield_now().await;
            assert!(a_task.is_finished() && !b_task.is_finished());
            drop(a); // as a's task does when it is cancelled
            assert_eq!(slots.state().open, 2);
            // b and c are being answered: nothing to evict, refused.
            b.head_received();
            c.head_received();
            assert!(admit().is_none());
            assert_eq!(slots.state().open, 2);
            drop(b);
            let (_d, _, d_evicted) = admit().expect("a slot is free again");
            assert!(!d_evicted);
            b_task.abort();
            c_task.abort();
        });
    }
}
