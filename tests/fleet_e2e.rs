//! A fleet on one machine: eight network namespaces on one Linux bridge
//! stand for eight hosts. Each runs `rtprobe reflect --kernel` and
//! `rtprobe --targets peers.toml --metrics-listen`, probing its seven
//! peers; one real Prometheus (Debian's) scrapes all eight with the
//! shipped recording and alerting rules (deploy/prometheus/). The test
//! reads the 8 x 7 RTT p99 matrix with PromQL, takes one host's bridge
//! port down and waits for loss on exactly its 14 pairs and for the
//! pair-loss alert. Then, from each prober's own CSV and JSON, the
//! mechanism probe by probe: no pair without the downed host lost a probe
//! or refused a late echo; a pair with it lost every probe sent after the
//! cut and none before.
//!
//! Scrapes go over a separate management bridge (as they would over a
//! management network), so a host whose data port is down is still
//! scraped and reports the loss on its own seven pairs.
//!
//! docs/FLEET.md walks through the same set-up by hand.

mod common;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::*;

const HOSTS: usize = 8;
/// Prometheus' scrape and rule evaluation interval in this test.
const SCRAPE: Duration = Duration::from_secs(2);
/// The probers' --timeout: a probe not echoed this long after it left is lost.
const PROBE_TIMEOUT_MS: u64 = 500;
const REFLECT_PORT: u16 = 8620;
const METRICS_PORT: u16 = 9464;
const PROM_ADDR: &str = "127.0.0.1:9090";
const AM_ADDR: &str = "127.0.0.1:9093";

/// Host i's (1-based) address on the data bridge.
fn data_ip(i: usize) -> String {
    format!("10.79.0.{i}")
}

/// Host i's address on the management bridge (Prometheus is .254).
fn mgmt_ip(i: usize) -> String {
    format!("10.81.0.{i}")
}

fn host_name(i: usize) -> String {
    format!("h{i}")
}

/// The namespaces, links and processes of the fleet; all of it is removed
/// on drop, also when the test fails.
struct Fleet {
    /// The data switch (a bridge) and the monitoring station (Prometheus
    /// and the management bridge).
    sw: String,
    mon: String,
    /// Host i's namespace is `hosts[i - 1]`, its bridge port `ports[i - 1]`.
    hosts: Vec<String>,
    ports: Vec<String>,
    procs: Vec<(String, Child)>,
    dir: tempfile::TempDir,
}

impl Fleet {
    fn new() -> Fleet {
        let mut f = Fleet {
            sw: unique("fsw"),
            mon: unique("fmon"),
            hosts: (1..=HOSTS).map(|_| unique("fh")).collect(),
            ports: Vec::new(),
            procs: Vec::new(),
            dir: tempfile::Builder::new()
                .disable_cleanup(true)
                .tempdir()
                .unwrap(),
        };
        sh_ok(&format!(
            "chmod 755 {d} && ip netns add {sw} && ip netns add {mon} \
             && ip -n {sw} link add br0 type bridge && ip -n {sw} link set br0 up \
             && ip -n {mon} link add br0 type bridge && ip -n {mon} addr add 10.81.0.254/24 dev br0 \
             && ip -n {mon} link set br0 up && ip -n {mon} link set lo up",
            d = f.dir.path().display(),
            sw = f.sw,
            mon = f.mon
        ));
        for i in 1..=HOSTS {
            let port = f.wire_host(i);
            f.ports.push(port);
        }
        f
    }

    /// Host i: a data veth into the switch's bridge and a management veth
    /// into the monitoring bridge.
    fn wire_host(&self, i: usize) -> String {
        let (h, sw, mon) = (&self.hosts[i - 1], &self.sw, &self.mon);
        let (port, mport) = (unique("fp"), unique("fm"));
        sh_ok(&format!(
            "ip netns add {h} \
             && ip link add data0 netns {h} type veth peer name {port} netns {sw} \
             && ip link add mgmt0 netns {h} type veth peer name {mport} netns {mon} \
             && ip -n {sw} link set {port} master br0 up \
             && ip -n {mon} link set {mport} master br0 up \
             && ip -n {h} addr add {dip}/24 dev data0 && ip -n {h} link set data0 up \
             && ip -n {h} addr add {mip}/24 dev mgmt0 && ip -n {h} link set mgmt0 up \
             && ip -n {h} link set lo up \
             && ip netns exec {h} ethtool -K data0 tx off >/dev/null \
             && ip netns exec {sw} ethtool -K {port} gro on >/dev/null",
            dip = data_ip(i),
            mip = mgmt_ip(i),
        ));
        port
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts `cmd` in host/namespace `ns`; its stderr goes to a file
    /// named after `what` (printed if the test fails).
    fn spawn(&mut self, ns: &str, what: &str, program: &Path, args: &[String]) {
        let log = std::fs::File::create(self.path(&format!("{what}.log"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        self.procs.push((what.to_string(), child));
    }

    /// Every process' log, for a failure message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for (what, _) in &self.procs {
            let text =
                std::fs::read_to_string(self.path(&format!("{what}.log"))).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(8).collect();
            out += &format!(
                "--- {what}:\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        // What each host's kernel knows of its peers, and what its data
        // port dropped: a probe that never reached the qdisc waited for
        // (or was dropped by) neighbour resolution.
        for (i, h) in self.hosts.iter().enumerate() {
            out += &format!(
                "--- h{} neighbours and data0:\n{}{}",
                i + 1,
                sh(&format!("ip -n {h} neigh show dev data0")).stdout_text(),
                sh(&format!("ip -n {h} -s link show data0; ip netns exec {h} ethtool -S data0 | grep -v ': 0$'")).stdout_text()
            );
        }
        out
    }

    /// The pid of the process started as `what`.
    fn pid_of(&self, what: &str) -> u32 {
        self.procs
            .iter()
            .find(|(w, _)| w == what)
            .map(|(_, c)| c.id())
            .unwrap_or_else(|| panic!("no {what}"))
    }

    /// SIGINT to every prober, then waits (60 s at most in all: each asks
    /// every target for its final count, the dead one for 3 s, on a machine
    /// that may be busy) for each to write its summary and end.
    fn stop_probers(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for (what, c) in self
            .procs
            .iter_mut()
            .filter(|(w, _)| w.starts_with("probe-"))
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGINT,
            );
            loop {
                match c.try_wait().unwrap() {
                    Some(s) => {
                        assert_eq!(s.code(), Some(130), "{what} ended with {s}");
                        break;
                    }
                    None if Instant::now() > deadline => panic!("{what} did not stop"),
                    None => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }

    /// Panics (with the logs) if a process has ended.
    fn assert_all_running(&mut self) {
        let mut dead = Vec::new();
        for (what, c) in &mut self.procs {
            if let Some(s) = c.try_wait().unwrap() {
                dead.push(format!("{what} ended: {s}"));
            }
        }
        assert!(dead.is_empty(), "{dead:?}\n{}", self.logs());
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            // One that has ended (and was reaped) is left alone: its pid
            // may be another process's now.
            if c.try_wait().ok().flatten().is_some() {
                continue;
            }
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (_, c) in &mut self.procs {
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.hosts.iter().chain([&self.sw, &self.mon]) {
            let _ = sh(&format!("ip netns del {ns} 2>/dev/null"));
        }
    }
}

/// Host i's targets file: its seven peers, named after them, with a label.
fn peers_toml(i: usize) -> String {
    let mut s = format!(
        "# the peers of {me}\n[defaults]\ninterval = \"100ms\"\nsize = 64\n\n",
        me = host_name(i)
    );
    for j in (1..=HOSTS).filter(|&j| j != i) {
        s += &format!(
            "[[target]]\nname = \"{n}\"\naddress = \"{ip}:{REFLECT_PORT}\"\nlabels = {{ rack = \"r{r}\" }}\n\n",
            n = host_name(j),
            ip = data_ip(j),
            r = (j - 1) / 4 + 1
        );
    }
    s
}

/// The Prometheus configuration: every host's metrics over the management
/// bridge, `instance` naming the prober (as the shipped rules expect), the
/// shipped rules.
fn prometheus_yml(rules: &[PathBuf]) -> String {
    let mut s = format!(
        "global:\n  scrape_interval: {s}s\n  evaluation_interval: {s}s\n  scrape_timeout: 1s\nrule_files:\n",
        s = SCRAPE.as_secs()
    );
    for r in rules {
        s += &format!("  - {}\n", r.display());
    }
    s += &format!(
        "alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{AM_ADDR}']\n"
    );
    s += "scrape_configs:\n  - job_name: rtprobe\n    static_configs:\n";
    for i in 1..=HOSTS {
        s += &format!(
            "      - targets: ['{ip}:{METRICS_PORT}']\n        labels: {{ instance: {h} }}\n",
            ip = mgmt_ip(i),
            h = host_name(i)
        );
    }
    s
}

/// One instant PromQL query through promtool (from the monitoring
/// namespace): each sample's labels and value, or what went wrong
/// (Prometheus answers 503 until it has started).
fn query(f: &Fleet, expr: &str) -> Result<Vec<(serde_json::Value, f64)>, String> {
    let o = Command::new("ip")
        .args([
            "netns", "exec", &f.mon, "promtool", "query", "instant", "-o", "json",
        ])
        .arg(format!("http://{PROM_ADDR}"))
        .arg(expr)
        .output()
        .expect("run promtool");
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| {
        format!(
            "promtool output {e}: {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    let val = s["value"][1].as_str().unwrap().parse().unwrap();
                    (s["metric"].clone(), val)
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The (instance, target) pairs of a query's samples.
fn pairs(samples: &[(serde_json::Value, f64)]) -> BTreeSet<(String, String)> {
    samples
        .iter()
        .map(|(m, _)| {
            (
                m["instance"].as_str().unwrap_or("?").to_string(),
                m["target"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect()
}

/// Every ordered pair of hosts, or those that involve host `down`.
fn all_pairs(down: Option<usize>) -> BTreeSet<(String, String)> {
    let mut s = BTreeSet::new();
    for i in 1..=HOSTS {
        for j in (1..=HOSTS).filter(|&j| j != i) {
            if down.is_none_or(|d| d == i || d == j) {
                s.insert((host_name(i), host_name(j)));
            }
        }
    }
    s
}

/// Polls `expr` every 200 ms until `done` holds for its samples (then the
/// time it took), or panics after `within`.
fn wait_for(
    f: &mut Fleet,
    what: &str,
    within: Duration,
    expr: &str,
    mut done: impl FnMut(&[(serde_json::Value, f64)]) -> bool,
) -> (Duration, Vec<(serde_json::Value, f64)>) {
    let t0 = Instant::now();
    loop {
        let s = query(f, expr);
        if let Ok(s) = &s
            && done(s)
        {
            return (t0.elapsed(), s.clone());
        }
        if t0.elapsed() > within {
            let got = match &s {
                Ok(s) => format!("{} samples: {:?}", s.len(), pairs(s)),
                Err(e) => e.clone(),
            };
            panic!(
                "{what}: not within {within:?}; `{expr}` gave {got}\n{}",
                f.logs()
            );
        }
        f.assert_all_running();
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What `rtprobe reflect` prints once it answers.
const READY_LINE: &str = "rtprobe reflect: answering ";

fn start_reflectors(f: &mut Fleet) {
    for i in 1..=HOSTS {
        let args = [
            "reflect",
            "--kernel",
            "--listen",
            &format!("{}:{REFLECT_PORT}", data_ip(i)),
            "-q",
        ]
        .map(String::from);
        let ns = f.hosts[i - 1].clone();
        f.spawn(&ns, &format!("reflect-{}", host_name(i)), &bin(), &args);
    }
    let t0 = Instant::now();
    for i in 1..=HOSTS {
        let log = f.path(&format!("reflect-{}.log", host_name(i)));
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(READY_LINE)
        {
            f.assert_all_running();
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "reflectors not ready\n{}",
                f.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    eprintln!("8 in-kernel reflectors answering after {:?}", t0.elapsed());
}

fn start_probers(f: &mut Fleet) {
    for i in 1..=HOSTS {
        let targets = f.path(&format!("peers-{}.toml", host_name(i)));
        std::fs::write(&targets, peers_toml(i)).unwrap();
        let args = [
            "--targets".into(),
            targets.display().to_string(),
            "--forever".into(),
            "--timeout".into(),
            format!("{PROBE_TIMEOUT_MS}ms"),
            "--metrics-listen".into(),
            format!("{}:{METRICS_PORT}", mgmt_ip(i)),
            "--quiet".into(),
            "--out".into(),
            f.path(&format!("{}.csv", host_name(i)))
                .display()
                .to_string(),
            "--json".into(),
            f.path(&format!("{}.json", host_name(i)))
                .display()
                .to_string(),
        ];
        let ns = f.hosts[i - 1].clone();
        f.spawn(&ns, &format!("probe-{}", host_name(i)), &bin(), &args);
    }
}

fn start_prometheus(f: &mut Fleet) {
    let rules = shipped_rules(f);
    let yml = f.path("prometheus.yml");
    std::fs::write(&yml, prometheus_yml(&rules)).unwrap();
    sh_ok(&format!(
        "promtool check config {} >/dev/null",
        yml.display()
    ));
    let args = [
        format!("--config.file={}", yml.display()),
        format!("--storage.tsdb.path={}", f.path("tsdb").display()),
        format!("--web.listen-address={PROM_ADDR}"),
        "--log.level=warn".into(),
    ];
    let mon = f.mon.clone();
    f.spawn(&mon, "prometheus", Path::new("prometheus"), &args);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn eight_hosts_scraped_by_prometheus_show_a_downed_port_as_loss_on_its_14_pairs() {
    if !is_root("eight_hosts_scraped_by_prometheus_show_a_downed_port_as_loss_on_its_14_pairs") {
        return;
    }
    let mut f = Fleet::new();
    start_reflectors(&mut f);
    start_probers(&mut f);
    start_alertmanager(&mut f);
    start_prometheus(&mut f);

    // The full 8 x 7 RTT p99 matrix, one PromQL query.
    // The shipped recording rule (its window shortened, see shorten_windows).
    let matrix = "instance_target:rtprobe_rtt_seconds:p99_1m";
    let (took, m) = wait_for(
        &mut f,
        "the 8 x 7 p99 matrix",
        Duration::from_secs(60),
        matrix,
        |s| pairs(s) == all_pairs(None) && s.iter().all(|(_, v)| v.is_finite() && *v > 0.0),
    );
    eprintln!("the 56-pair RTT p99 matrix after {took:?} (µs; row = prober, column = target):");
    print_matrix(&m);

    // Host 3's bridge port goes down.
    let down = 3;
    let cut = cut_and_see_loss(&mut f, down);
    let expected = all_pairs(Some(down));

    // The in-kernel reflector's echoes carry no count, and a dead host
    // answers nothing: /metrics, like the summary, says the direction is
    // unknown, never forward or return.
    let told = query(
        &f,
        "sum by (instance, target, direction) (rtprobe_probes_lost_total{direction!=\"unknown\"}) > 0",
    )
    .unwrap();
    assert!(told.is_empty(), "a direction claimed: {:?}", pairs(&told));
    one_page_for_the_dead_host(&mut f, down, &expected);
    f.assert_all_running();
    f.stop_probers();
    for i in 1..=HOSTS {
        assert_pairs_of(&f, i, down, cut);
    }
}

/// The shipped Alertmanager configuration (deploy/alertmanager/), its
/// receivers' URLs unreachable from here (a page's delivery is not what is
/// tested: which alerts are active and which inhibited is).
fn start_alertmanager(f: &mut Fleet) {
    let yml = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/alertmanager/alertmanager.yml");
    let args = [
        format!("--config.file={}", yml.display()),
        format!("--storage.path={}", f.path("alertmanager").display()),
        format!("--web.listen-address={AM_ADDR}"),
        // One instance, no gossip with peers.
        "--cluster.listen-address=".into(),
        "--log.level=warn".into(),
    ];
    let mon = f.mon.clone();
    f.spawn(
        &mon,
        "alertmanager",
        Path::new("prometheus-alertmanager"),
        &args,
    );
}

/// An alert as (alertname, target, instance).
type AlertKey = [String; 3];

/// Alertmanager's alerts now: those active and not inhibited, and those
/// inhibited.
fn alertmanager_alerts(f: &Fleet) -> Option<(Vec<AlertKey>, Vec<AlertKey>)> {
    let get = |inhibited: bool| -> Option<Vec<AlertKey>> {
        let url = format!(
            "http://{AM_ADDR}/api/v2/alerts?active=true&silenced=false&unprocessed=false&inhibited={inhibited}"
        );
        let o = Command::new("ip")
            .args(["netns", "exec", &f.mon, "curl", "-sf", &url])
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        let label =
            |a: &serde_json::Value, k: &str| a["labels"][k].as_str().unwrap_or("").to_string();
        Some(
            v.as_array()?
                .iter()
                .filter(|a| {
                    inhibited
                        || a["status"]["inhibitedBy"]
                            .as_array()
                            .is_none_or(|i| i.is_empty())
                })
                .map(|a| {
                    [
                        label(a, "alertname"),
                        label(a, "target"),
                        label(a, "instance"),
                    ]
                })
                .collect(),
        )
    };
    Some((get(false)?, get(true)?))
}

/// One host down is one page: Prometheus fires one critical alert, for
/// that host, and never one for another; the pair alerts that follow are
/// its peers' (and its own prober's) view of the same cause, and
/// Alertmanager, with the shipped inhibit rules, holds them back, so the
/// one alert it has active is the page.
fn one_page_for_the_dead_host(f: &mut Fleet, down: usize, expected: &BTreeSet<(String, String)>) {
    let host = host_name(down);
    let critical = "ALERTS{severity=\"critical\", alertstate=\"firing\"}";
    let (took, _) = wait_for(
        f,
        "the page for the dead host",
        Duration::from_secs(60),
        critical,
        |s| {
            let named: BTreeSet<_> = s
                .iter()
                .map(|(m, _)| m["target"].as_str().unwrap_or("?").to_string())
                .collect();
            assert!(
                named.iter().all(|t| *t == host),
                "a page for another host: {named:?}"
            );
            s.len() == 1 && s[0].0["alertname"] == "RtprobeHostUnreachable"
        },
    );
    eprintln!("RtprobeHostUnreachable for {host} firing {took:?} after the loss showed");
    let silent = "ALERTS{alertname=\"RtprobeTargetSilent\", alertstate=\"firing\"}";
    let (took, _) = wait_for(f, "the pair alerts", Duration::from_secs(60), silent, |s| {
        let p = pairs(s);
        assert!(
            p.is_subset(expected),
            "a silent pair not involving {host}: {:?}",
            p.difference(expected).collect::<Vec<_>>()
        );
        p == *expected
    });
    eprintln!("RtprobeTargetSilent for its 14 pairs {took:?} later");
    let t0 = Instant::now();
    loop {
        let got = alertmanager_alerts(f);
        if let Some((active, inhibited)) = &got
            && active.len() == 1
            && active[0]
                == [
                    "RtprobeHostUnreachable".to_string(),
                    host.clone(),
                    host.clone(),
                ]
            && inhibited
                .iter()
                .filter(|a| a[0] == "RtprobeTargetSilent")
                .count()
                == expected.len()
        {
            eprintln!(
                "Alertmanager: 1 active alert (the page), {} inhibited, after {:?}",
                inhibited.len(),
                t0.elapsed()
            );
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "Alertmanager does not show one page with the pair alerts inhibited: {got:?}\n{}",
            f.logs()
        );
        f.assert_all_running();
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Takes host `down`'s bridge port down (and h1's reader, its sender
/// thread, off a CPU for two probe timeouts) and waits for loss on
/// exactly its 14 pairs in Prometheus, never on another. Returns between
/// which two times (ns) the port went down.
fn cut_and_see_loss(f: &mut Fleet, down: usize) -> (i64, i64) {
    // The port goes down somewhere between the two times: a busy machine
    // takes tens of ms to start `ip`.
    let cut_from_ns = realtime_ns();
    sh_ok(&format!(
        "ip -n {} link set {} down",
        f.sw,
        f.ports[down - 1]
    ));
    let cut_ns = (cut_from_ns, realtime_ns());
    // The run lost probes of h1 to its live peers when h1's I/O
    // thread waited 764 ms for a CPU: the same stall, made certain here
    // (h1's reader, now its sender thread, stopped alone for two probe
    // timeouts), must cost no probe of a live pair.
    let h1 = f.pid_of("probe-h1");
    stop_thread_for(
        thread_named(h1, "rtprobe-sender"),
        Duration::from_millis(2 * PROBE_TIMEOUT_MS),
    );
    let expected = all_pairs(Some(down));
    let lossy = format!(
        "sum by (instance, target) (increase(rtprobe_probes_lost_total[{}s])) > 0",
        3 * SCRAPE.as_secs()
    );
    let (took, s) = wait_for(
        f,
        "loss on the downed host's 14 pairs",
        Duration::from_secs(60),
        &lossy,
        |s| {
            let p = pairs(s);
            assert!(
                p.is_subset(&expected),
                "loss on a pair not involving h{down}: {:?}",
                p.difference(&expected).collect::<Vec<_>>()
            );
            p == expected
        },
    );
    eprintln!(
        "port of h{down} down: loss on exactly its {} pairs after {took:?} (scrape interval {SCRAPE:?}, probe timeout {PROBE_TIMEOUT_MS} ms)",
        s.len()
    );
    cut_ns
}

fn realtime_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// Probes of a pair with the downed host sent this long after the cut
/// are all lost; those sent this long before it all came back.
const CUT_MARGIN_NS: i64 = 50_000_000;

/// The mechanism, probe by probe, from host `i`'s CSV and JSON: a pair
/// without the downed host lost no probe and refused no echo as late; a
/// pair with it lost every probe sent after the cut and none before.
/// Prints how long host `i`'s echoes waited to be read.
fn assert_pairs_of(f: &Fleet, i: usize, down: usize, cut_ns: (i64, i64)) {
    let me = host_name(i);
    let json_path = f.path(&format!("{me}.json"));
    let text = std::fs::read_to_string(&json_path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}
{}",
            json_path.display(),
            f.logs()
        )
    });
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    let reader = &j["pacing"]["reader"];
    eprintln!(
        "{me}: echoes read up to {} µs after the kernel had them (p99 {} µs); the reader waited {} ms for a CPU",
        reader["read_delay_ns"]["max"].as_u64().unwrap_or(0) / 1000,
        reader["read_delay_ns"]["p99"].as_u64().unwrap_or(0) / 1000,
        reader["waits"]["runq_wait_ns"].as_u64().unwrap_or(0) / 1_000_000
    );
    let csv = std::fs::read_to_string(f.path(&format!("{me}.csv"))).unwrap();
    let mut lines = csv.lines().skip(1);
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |n: &str| header.iter().position(|c| *c == n).unwrap();
    let (tc, sc, lc) = (col("target"), col("sched_ns"), col("lost"));
    for t in j["extra"]["targets"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let s = &t["summary"];
        let dead = i == down || name == host_name(down);
        if dead {
            let split = &s["extra"]["loss_split"];
            // Nothing came back after the cut: no direction is claimed.
            let claimed =
                split["forward"].as_u64().unwrap_or(0) + split["return"].as_u64().unwrap_or(0);
            assert_eq!(claimed, 0, "{me} -> {name}: {split}");
        } else {
            assert_eq!(
                (s["lost"].as_u64(), s["late_echoes"].as_u64()),
                (Some(0), Some(0)),
                "{me} -> {name}, a pair without h{down}, lost probes: {s}"
            );
            continue;
        }
        let (mut before, mut after) = ((0, 0), (0, 0));
        for row in lines.clone().map(|l| l.split(',').collect::<Vec<_>>()) {
            if row[tc] != name {
                continue;
            }
            let sched: i64 = row[sc].parse().unwrap();
            let lost = row[lc] == "1";
            if sched < cut_ns.0 - CUT_MARGIN_NS {
                before.0 += 1;
                before.1 += u64::from(lost);
            } else if sched > cut_ns.1 + CUT_MARGIN_NS {
                after.0 += 1;
                after.1 += u64::from(lost);
            }
        }
        assert!(
            before.0 > 0 && after.0 > 0,
            "{me} -> {name}: {before:?} {after:?}"
        );
        assert_eq!(before.1, 0, "{me} -> {name}: lost before the cut");
        assert_eq!(
            after.1, after.0,
            "{me} -> {name}: probes after the cut came back"
        );
    }
}

/// The matrix as a table in µs.
fn print_matrix(m: &[(serde_json::Value, f64)]) {
    let mut row = String::from("      ");
    for j in 1..=HOSTS {
        row += &format!("{:>8}", host_name(j));
    }
    eprintln!("{row}");
    for i in 1..=HOSTS {
        let mut row = format!("{:<6}", host_name(i));
        for j in 1..=HOSTS {
            let v = m.iter().find(|(l, _)| {
                l["instance"] == host_name(i).as_str() && l["target"] == host_name(j).as_str()
            });
            row += &match v {
                Some((_, s)) => format!("{:>8.1}", s * 1e6),
                None => format!("{:>8}", "-"),
            };
        }
        eprintln!("{row}");
    }
}

/// The shipped rule files (deploy/prometheus/), copied with their time
/// windows shortened for a test that lasts seconds, not hours.
fn shipped_rules(f: &Fleet) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/rules");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".yml") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let short = shorten_windows(&text);
        let copy = f.path(&name);
        std::fs::write(&copy, short).unwrap();
        out.push(copy);
    }
    assert!(!out.is_empty(), "no rule file in {}", dir.display());
    out
}

/// `[5m]`-style windows and `for:` durations scaled to this test's
/// scrape interval.
fn shorten_windows(rules: &str) -> String {
    let window = format!("[{}s]", 3 * SCRAPE.as_secs());
    rules
        .lines()
        .map(|l| {
            let l = l.replace("[1m]", &window).replace("[1h]", "[60s]");
            match l.trim_start().strip_prefix("for: ") {
                Some(_) => format!(
                    "{}for: {}s",
                    &l[..l.len() - l.trim_start().len()],
                    SCRAPE.as_secs()
                ),
                None => l,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}
