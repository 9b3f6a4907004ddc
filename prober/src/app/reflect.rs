//! `rtprobe reflect`: answers probes from other hosts until Ctrl-C (or
//! `--duration`), optionally with the in-kernel reflector in front and a
//! metrics endpoint beside it, then prints what it did.

use std::{net::SocketAddr, path::Path, process::ExitCode, sync::Arc};

use anyhow::{Context, Result, bail};

use crate::{
    ebpf::reflector::Reflector,
    export::metrics::{Access, Metrics, MetricsServer},
    options::remote::{
        DEFAULT_GLOBAL_RATE_LIMIT_PPS, DEFAULT_PEERS_RATE_LIMIT_PPS, DEFAULT_RATE_LIMIT_PPS,
        ProtocolArg, ReflectArgs, read_key,
    },
    probe::{
        reflect::{self, Counters, Host, Peers, Policy, Prefix, RateLimits, ServeReport, Watch},
        socket::ProbeSocket,
    },
    signals::with_signals,
    stats::XdpCounters,
};

pub(super) fn command(args: &ReflectArgs) -> Result<ExitCode> {
    let protocol = args.protocol.unwrap_or_default();
    check_args(args, protocol)?;
    let key = args.auth_key.as_deref().map(read_key).transpose()?;
    let peers = known_peers(args, protocol, key.is_some())?;
    let bound = if args.listen.is_empty() {
        reflect::bind_both_families(protocol.default_port(), &peers)?
    } else {
        reflect::bind_steered(&args.listen, &peers)?
    };
    if !args.quiet && !bound.peers_not_steered.is_empty() {
        eprintln!(
            "rtprobe reflect: {} known peers are too many to give them a socket of their own on {}: \
             they keep their budgets but share the socket's queue with everyone (give wider prefixes)",
            peers.len(),
            bound
                .peers_not_steered
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let steered = !bound.peers_steered.is_empty();
    let reflect::Bound { socks, listen, .. } = bound;
    let limits = limits(args);
    // Asked for, the in-kernel reflector runs or the command stops: a
    // user-space reflector answering alone would measure something else.
    let kernel = if args.kernel {
        let r = crate::ebpf::host::attach_kernel(
            crate::sys::linux(),
            &listen,
            protocol,
            key.is_some(),
            limits,
            &peers,
            args.quiet,
        )
        .context("--kernel: the in-kernel reflector was not attached")?;
        Some(r)
    } else {
        None
    };
    let policy = Policy {
        protocol,
        key,
        limits,
        peers,
        stateful: !args.stateless,
    };
    let names: Vec<String> = listen.iter().map(|a| a.to_string()).collect();
    let ready = announce(&policy, &names, kernel.is_some(), steered);
    let metrics = match args.metrics_listen {
        Some(addr) => Some(Publisher::start(addr, args.metrics_token_file.as_deref())?),
        None => None,
    };
    let (mut report, kernel) = serve(socks, policy, args, metrics, kernel, ready)?;
    report.listen = names;
    let kcounters = match &kernel {
        Some(r) => Some(
            r.counters()
                .context("read the in-kernel reflector's counters")?,
        ),
        None => None,
    };
    drop(kernel);
    print_report(&report, kcounters.as_ref());
    if let Some(j) = &args.json {
        let mut v = serde_json::to_value(&report)?;
        if let Some(k) = kcounters {
            v["kernel_counters"] = serde_json::to_value(k)?;
        }
        crate::export::json::write_value(j, &v)?;
        println!("  wrote {}", j.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The flag combinations that make no sense, and a `--json` path that
/// could not be written at exit.
fn check_args(args: &ReflectArgs, protocol: ProtocolArg) -> Result<()> {
    if args.auth_key.is_some() && protocol != ProtocolArg::Stamp {
        bail!("--auth-key is STAMP's authenticated mode: add --protocol stamp");
    }
    if args.stateless && protocol != ProtocolArg::Stamp {
        bail!("--stateless is a STAMP reflector mode: add --protocol stamp");
    }
    if args.duration.is_some_and(|d| d.is_zero()) {
        bail!("--duration 0 answers nothing: give e.g. 10min, or leave it out to run until Ctrl-C");
    }
    if let Some(j) = &args.json {
        check_json_path(j)?;
    }
    Ok(())
}

/// `--json FILE` is written only at exit: find out now whether it can be,
/// rather than lose every counter then. Leaves no file behind.
fn check_json_path(path: &Path) -> Result<()> {
    let shown = path.display();
    if path.as_os_str().is_empty() || path.is_dir() {
        bail!("--json {shown:?} is a directory, not a file: give e.g. --json reflector.json");
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        bail!(
            "--json {shown}: directory {} does not exist: create it or give another path",
            dir.display()
        );
    }
    let existed = path.exists();
    let opened = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path);
    if let Err(e) = opened {
        bail!("--json {shown}: cannot write it ({e}): give a writable path");
    }
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// The limits both reflectors enforce, from the flags or their defaults.
fn limits(args: &ReflectArgs) -> RateLimits {
    RateLimits {
        per_source_pps: Some(args.rate_limit.unwrap_or(DEFAULT_RATE_LIMIT_PPS)),
        global_pps: Some(
            args.global_rate_limit
                .unwrap_or(DEFAULT_GLOBAL_RATE_LIMIT_PPS),
        ),
        peers_pps: Some(
            args.peers_rate_limit
                .unwrap_or(DEFAULT_PEERS_RATE_LIMIT_PPS),
        ),
    }
}

/// `--peer` and the addresses of `--peers FILE` (read by the prober's own
/// targets-file reader, with this reflector's protocol as the default).
fn known_peers(args: &ReflectArgs, protocol: ProtocolArg, auth: bool) -> Result<Peers> {
    let mut prefixes: Vec<Prefix> = args.peer.clone();
    if let Some(file) = &args.peers {
        let base = crate::options::targets::Base {
            protocol,
            port: protocol.default_port(),
            tos: 0,
            // The shortest probe of the protocol: only the addresses count.
            size: match (protocol, auth) {
                (ProtocolArg::Rtprobe, _) => crate::probe::packet::HEADER_LEN.max(64),
                (ProtocolArg::Stamp, false) => crate::probe::stamp::UNAUTH_LEN_BYTES,
                (ProtocolArg::Stamp, true) => crate::probe::stamp::AUTH_LEN_BYTES,
            },
            interval: std::time::Duration::from_secs(1),
            auth,
        };
        let targets = crate::options::targets::read_file(file, &base)
            .with_context(|| format!("--peers {}", file.display()))?;
        prefixes.extend(targets.iter().map(|t| Prefix::host(t.addr.ip())));
    }
    Peers::new(prefixes).map_err(|e| anyhow::anyhow!("--peer/--peers: {e}"))
}

/// The line that says what is answered where (said when serving starts:
/// `--duration` counts from there).
fn announce(policy: &Policy, names: &[String], kernel: bool, steered: bool) -> String {
    let own = if steered {
        " with a socket of their own"
    } else {
        ""
    };
    let peers = match policy.peers.len() {
        0 => String::new(),
        1 => format!(", 1 known peer ({}){own}", policy.peers.prefixes()[0]),
        n => format!(", {n} known peers{own}"),
    };
    format!(
        "rtprobe reflect: answering {} on {}{}{}{peers}, {}; Ctrl-C to stop",
        policy.protocol.name(),
        names.join(", "),
        if policy.key.is_some() {
            " (authenticated)"
        } else {
            ""
        },
        if kernel {
            ", in-kernel reflector attached"
        } else {
            ""
        },
        policy.limits.describe(!policy.peers.is_empty()),
    )
}

/// Serves until a signal or `--duration`. The in-kernel reflector goes
/// along into the serving thread, whose tick publishes its counters too,
/// and comes back to be read last.
fn serve(
    socks: Vec<ProbeSocket>,
    policy: Policy,
    args: &ReflectArgs,
    metrics: Option<Publisher>,
    kernel: Option<Reflector>,
    ready: String,
) -> Result<(ServeReport, Option<Reflector>)> {
    let (quiet, duration) = (args.quiet, args.duration);
    with_signals(true, move |stop| {
        let signals = StopOnSignal::register(&stop)?;
        eprintln!("{ready}");
        let watch = Serving {
            quiet,
            metrics,
            kernel,
        };
        let report = Host::start_with(socks, policy, stop, duration, watch)?.join();
        let stopped_ms = signals.since_signal_ms();
        report.map(|(mut r, watch)| {
            let Serving {
                metrics, kernel, ..
            } = watch;
            drop(metrics);
            r.stopped_after_signal_ms = stopped_ms;
            (r, kernel)
        })
    })
}

/// What the command hears while the reflector serves: the session lines
/// (unless `--quiet`), and the counters for `--metrics-listen`, the
/// in-kernel reflector's too.
struct Serving {
    quiet: bool,
    metrics: Option<Publisher>,
    kernel: Option<Reflector>,
}

impl Watch for Serving {
    fn session_line(&mut self, line: &str) {
        if !self.quiet {
            eprintln!("rtprobe reflect: {line}");
        }
    }

    fn tick(&mut self, c: &Counters) {
        if let Some(m) = self.metrics.as_mut() {
            m.tick(c, self.kernel.as_ref());
        }
    }
}

/// Sets the stop flag from the signal handler itself. `with_signals` sets
/// it from its runtime's thread, which the handler wakes: under a flood
/// that keeps both CPUs busy that thread waited tens of ms for one (35 ms
/// in one trace), on top of the handler's own wait. Any signal stops the
/// reflector, so the first is as good as the second here. The handler
/// also notes when the first signal came (CLOCK_MONOTONIC), so that the
/// report can say how soon the reflector stopped after it.
struct StopOnSignal {
    ids: Vec<signal_hook_registry::SigId>,
    at_ns: Arc<std::sync::atomic::AtomicI64>,
}

impl StopOnSignal {
    fn register(stop: &Arc<std::sync::atomic::AtomicU8>) -> Result<Self> {
        use std::sync::atomic::Ordering::SeqCst;
        let at_ns = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let mut ids = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            let (stop, at) = (Arc::clone(stop), Arc::clone(&at_ns));
            // SAFETY: the action is clock_gettime (async-signal-safe, POSIX)
            // and atomic stores: async-signal-safe.
            let id = unsafe {
                signal_hook_registry::register(sig, move || {
                    let _ = at.compare_exchange(0, monotonic_ns(), SeqCst, SeqCst);
                    stop.store(1, SeqCst);
                })
            }
            .context("install a signal handler")?;
            ids.push(id);
        }
        Ok(StopOnSignal { ids, at_ns })
    }

    /// How long ago the first signal came, ms; None if none did.
    fn since_signal_ms(&self) -> Option<f64> {
        let at = self.at_ns.load(std::sync::atomic::Ordering::SeqCst);
        (at != 0).then(|| (monotonic_ns() - at) as f64 / 1e6)
    }
}

impl Drop for StopOnSignal {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook_registry::unregister(id);
        }
    }
}

/// CLOCK_MONOTONIC in ns (async-signal-safe: no allocation, no lock).
fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// `--metrics-listen`: the server and what it last published.
struct Publisher {
    metrics: Arc<Metrics>,
    _server: MetricsServer,
    published: Counters,
    kernel_published: XdpCounters,
    kernel_error_said: bool,
}

impl Publisher {
    fn start(addr: SocketAddr, token_file: Option<&Path>) -> Result<Self> {
        let access = Access::from_token_file(token_file)?;
        let metrics = Arc::new(Metrics::for_reflector());
        let server = MetricsServer::start(addr, metrics.clone(), access)?;
        eprintln!(
            "rtprobe reflect: serving metrics at http://{}/metrics",
            server.local_addr()
        );
        Ok(Self {
            metrics,
            _server: server,
            published: Counters::default(),
            kernel_published: XdpCounters::new(),
            kernel_error_said: false,
        })
    }

    /// Publishes the reflector's counters, and the in-kernel one's.
    fn tick(&mut self, c: &Counters, kernel: Option<&Reflector>) {
        self.metrics.reflector_update(&mut self.published, c);
        if let Some(k) = kernel {
            match k.counters() {
                Ok(now) => self
                    .metrics
                    .kernel_reflector_update(&mut self.kernel_published, &now),
                Err(e) if !self.kernel_error_said => {
                    self.kernel_error_said = true;
                    log::warn!("metrics: the in-kernel reflector's counters: {e:#}");
                }
                Err(_) => {}
            }
        }
    }
}

/// The exit summary on stdout.
fn print_report(report: &ServeReport, kcounters: Option<&XdpCounters>) {
    let c = &report.counters;
    println!(
        "rtprobe reflect: {} datagrams in {:.1} s: sessions {}  reflected {}  not-for-us {}  bad-source {}  malformed {}  rate-limited {}  global-limited {}  auth-failed {}  send errors {}",
        c.datagrams,
        report.duration_s,
        c.sessions,
        c.reflected,
        c.not_for_us,
        c.bad_source,
        c.malformed,
        c.rate_limited,
        c.global_limited,
        c.auth_failed,
        c.send_errors
    );
    if !report.peers.is_empty() {
        println!(
            "  known peers ({} prefixes): reflected {}  rate-limited {}  over the peers' cap {}",
            report.peers.len(),
            c.peer_reflected,
            c.peer_rate_limited,
            c.peer_global_limited
        );
    }
    if c.recv_errors > 0 {
        println!("  receive errors: {} (logged, survived)", c.recv_errors);
    }
    println!("  clock: {}", report.clock_line());
    if let Some(ms) = report.stopped_after_signal_ms {
        println!("  stopped serving {ms:.1} ms after the signal");
    }
    if let (Some(p50), Some(p99)) = (report.turnaround_ns.p50, report.turnaround_ns.p99) {
        println!(
            "  turnaround (kernel RX stamp -> echo's kernel TX stamp): p50 {:.1} µs  p99 {:.1} µs over {} of {} replies stamped (at most {}/s)",
            p50 as f64 / 1e3,
            p99 as f64 / 1e3,
            report.turnaround_ns.count,
            report.turnaround_sampled,
            report.turnaround_stamps_per_s
        );
    } else if c.reflected > 0 && report.turnaround_sampled == 0 {
        println!("  turnaround: not measured (needs per-send TX stamp ids, Linux >= 6.13)");
    }
    if let Some(k) = kcounters {
        println!(
            "  in-kernel reflector: {}",
            serde_json::to_string(k).unwrap_or_default()
        );
        if !report.peers.is_empty() {
            let n = |o: &str| k.get(o).map_or(0, |c| c.packets);
            println!(
                "  in-kernel, known peers: reflected {}  rate-limited {}  over the peers' cap {}; others: global-limited {}",
                n("peer_reflected"),
                n("peer_rate_limited"),
                n("peer_global_limited"),
                n("global_limited")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_is_checked_at_start_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_json_path(std::path::Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        assert_eq!(e.to_string().lines().count(), 1);
        let e = check_json_path(&dir.path().join("no/such/r.json")).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = check_json_path(std::path::Path::new("/proc/rtprobe-reflect.json")).unwrap_err();
        assert!(e.to_string().contains("cannot write it"), "{e}");
        let fresh = dir.path().join("r.json");
        check_json_path(&fresh).unwrap();
        assert!(!fresh.exists(), "a check leaves nothing behind");
        std::fs::write(&fresh, "kept").unwrap();
        check_json_path(&fresh).unwrap();
        assert_eq!(std::fs::read_to_string(&fresh).unwrap(), "kept");
    }
}
