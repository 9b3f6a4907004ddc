//! End-to-end: `promtool check metrics` (Debian's `prometheus` package,
//! installed by `cargo xtask setup`) on real scrapes: of `rtprobe --target
//! --metrics-listen` probing `rtprobe reflect` across a veth pair, and of
//! that reflector's own `--metrics-listen`. A scrape without an OpenMetrics
//! `Accept` header must be the Prometheus text format, promtool finding
//! nothing to say; one that asks for OpenMetrics gets it under its own
//! content type (promtool 2.x reads only the text format, so its shape is
//! checked here, and a real Prometheus ingests it in metrics_e2e.rs).
//! Needs root; run by `cargo xtask test` with `--ignored --test-threads=1`.

mod common;

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::{pair::*, *};

const PROMTOOL: &str = "/usr/bin/promtool";
/// What Prometheus 2.x sends: OpenMetrics first, the text format as a fallback.
const ACCEPT_OPENMETRICS: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROBER_METRICS: &str = "10.77.0.1:9464";
const REFLECTOR_METRICS: &str = "10.77.0.2:9465";

fn promtool_present() {
    assert!(
        Path::new(PROMTOOL).exists(),
        "{PROMTOOL} missing: run `cargo xtask setup` (or apt-get install prometheus)"
    );
}

/// One scrape from inside namespace `ns`: (content type, body, time taken).
fn scrape(ns: &str, addr: &str, accept: Option<&str>) -> (String, String, Duration) {
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        ns,
        "curl",
        "-sS",
        "--max-time",
        "5",
        "-D",
        "-",
    ]);
    if let Some(a) = accept {
        c.args(["-H", &format!("Accept: {a}")]);
    }
    let t0 = Instant::now();
    let o = c
        .arg(format!("http://{addr}/metrics"))
        .output()
        .expect("run curl");
    let took = t0.elapsed();
    assert!(
        o.status.success(),
        "scrape of {addr}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (head, body) = out
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {out:?}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let content_type = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        })
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    (content_type, body.to_string(), took)
}

/// promtool's verdict on a Prometheus text exposition: its exit code and
/// everything it printed (nothing when the exposition is clean).
fn promtool_check_metrics(body: &str) -> (i32, String) {
    use std::io::Write;
    let mut child = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap_or(-1), said)
}

fn series_lines(body: &str) -> usize {
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count()
}

/// The value of the first sample whose line starts with `prefix`.
fn sample(body: &str, prefix: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Checks a text-format scrape with promtool and returns its series count.
fn assert_clean_text(what: &str, content_type: &str, body: &str) -> usize {
    assert_eq!(content_type, PROMETHEUS_TEXT, "{what}");
    assert!(
        !body.contains("# EOF") && !body.contains("# UNIT"),
        "{what}: OpenMetrics lines in the text format:\n{body}"
    );
    let (code, said) = promtool_check_metrics(body);
    eprintln!(
        "{what}: text format, {} bytes, {} series; promtool check metrics: exit {code}, {} lines of findings",
        body.len(),
        series_lines(body),
        said.lines().count()
    );
    assert!(
        code == 0 && said.trim().is_empty(),
        "{what}: promtool check metrics (exit {code}):\n{said}\non:\n{body}"
    );
    series_lines(body)
}

/// The OpenMetrics shape promtool 2.x cannot check: its content type, a
/// family described once per name (counters without `_total`, samples
/// with), units for the `_seconds` histograms, and `# EOF` last.
fn assert_openmetrics(what: &str, content_type: &str, body: &str) {
    assert_eq!(content_type, OPENMETRICS, "{what}");
    assert_eq!(body.lines().last(), Some("# EOF"), "{what}");
    for l in body.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut w = l.split(' ').skip(2);
        let (name, kind) = (w.next().unwrap(), w.next().unwrap());
        if kind == "counter" {
            assert!(!name.ends_with("_total"), "{what}: {l}");
            assert!(
                body.lines()
                    .any(|s| s.starts_with(&format!("{name}_total"))),
                "{what}: no {name}_total sample"
            );
        }
        if name.ends_with("_seconds") {
            assert!(body.contains(&format!("# UNIT {name} seconds")), "{what}");
        }
    }
}

/// `rtprobe --target` in namespace A, serving metrics until its run ends.
struct Prober {
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Prober {
    fn start(p: &Pair, args: &[&str]) -> Prober {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &p.a])
            .arg(bin())
            .args([
                "--quiet",
                "--target",
                B_IP,
                "--metrics-listen",
                PROBER_METRICS,
            ])
            .arg("--out")
            .arg(dir.path().join("out.csv"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rtprobe --target");
        Prober {
            child: Some(child),
            _dir: dir,
        }
    }

    /// Waits for the run to end; panics with its output if it failed.
    fn finish(mut self) {
        let o = self.child.take().unwrap().wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "rtprobe --target failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Scrapes until the RTT histogram has counted `want` probes (or 10 s pass).
fn wait_for_rtt_count(ns: &str, want: f64) -> String {
    let t0 = Instant::now();
    loop {
        let (_, body, _) = scrape(ns, PROBER_METRICS, None);
        let n = sample(&body, "rtprobe_rtt_seconds_count{").unwrap_or(0.0);
        if n >= want {
            return body;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "RTT count {n} < {want} after 10 s:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The port is bound before the first probe: wait for answers.
fn wait_for_metrics_server(ns: &str) {
    let t0 = Instant::now();
    while sh(&format!(
        "ip netns exec {} curl -s -o /dev/null http://{PROBER_METRICS}/metrics",
        ns
    ))
    .status
    .code()
        != Some(0)
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "no metrics server");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The same series either way: scraped in both formats until a pair
/// agrees (a family's first series, such as a stage histogram, may
/// appear between the two scrapes).
fn check_both_formats_agree(ns: &str) {
    let t0 = Instant::now();
    loop {
        let (_, text, _) = scrape(ns, PROBER_METRICS, None);
        let (ct, om, took) = scrape(ns, PROBER_METRICS, Some(ACCEPT_OPENMETRICS));
        assert_openmetrics("prober", &ct, &om);
        if series_lines(&om) == series_lines(&text) {
            eprintln!(
                "prober scrape with Prometheus' Accept: {took:?}, {} bytes, {} series as the text format",
                om.len(),
                series_lines(&om)
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "OpenMetrics and text series differ for 10 s:\n{om}\n---\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What the reflector has answered so far depends on timing: wait
/// (10 s at most) until it has counted the probes the prober saw come back.
/// Returns its text-format scrape.
fn wait_for_reflected(ns: &str) -> String {
    let reflected = "rtprobe_reflector_datagrams_total{outcome=\"reflected\"}";
    let t0 = Instant::now();
    loop {
        let (ct, text, _) = scrape(ns, REFLECTOR_METRICS, None);
        let n = sample(&text, reflected).unwrap_or(0.0);
        if n >= 100.0 {
            assert_clean_text("reflector", &ct, &text);
            eprintln!(
                "reflector: {n} datagrams reflected after {:?}",
                t0.elapsed()
            );
            break text;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the reflector counted {n} < 100 reflected after 10 s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A `--target` run's and its reflector's scrapes: the text format passes
/// promtool with nothing to say, OpenMetrics only when asked for.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn promtool_finds_nothing_in_a_target_run_and_a_reflector_scrape() {
    if !is_root("promtool_finds_nothing_in_a_target_run_and_a_reflector_scrape") {
        return;
    }
    promtool_present();
    let p = Pair::new();
    let reflector = Reflector::start(&p, &["--metrics-listen", REFLECTOR_METRICS]);
    let prober = Prober::start(&p, &["--duration", "4s", "--interval", "5ms"]);
    wait_for_metrics_server(&p.a);
    wait_for_rtt_count(&p.a, 100.0);

    let (ct, text, took) = scrape(&p.a, PROBER_METRICS, None);
    eprintln!("prober scrape without Accept: {took:?}");
    assert_clean_text("prober", &ct, &text);
    for family in [
        "rtprobe_rtt_seconds",
        "rtprobe_probes_sent_total",
        "rtprobe_probes_lost_total",
        "rtprobe_foreign_packets_total",
        "rtprobe_echoes_late_total",
    ] {
        assert!(text.contains(&format!("# HELP {family} ")), "{family}");
        assert!(text.contains(&format!("# TYPE {family} ")), "{family}");
    }
    check_both_formats_agree(&p.a);
    let (ct, _, _) = scrape(&p.a, PROBER_METRICS, Some("text/plain;version=0.0.4"));
    assert_eq!(ct, PROMETHEUS_TEXT);

    let text = wait_for_reflected(&p.b);
    assert!(
        !text.contains("rtprobe_probes_"),
        "a reflector shows no probe families"
    );
    let (ct, om, _) = scrape(&p.b, REFLECTOR_METRICS, Some(ACCEPT_OPENMETRICS));
    assert_openmetrics("reflector", &ct, &om);
    prober.finish();
    reflector.stop();
}

/// `--metrics-histograms rtt --metrics-buckets 24`: one target costs the
/// stated 38 series (RTT: 24 bounds + +Inf + sum + count; 10 counters and
/// the timestamp source), against the default's hundreds, and the
/// exposition still passes promtool.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn the_series_budget_flags_shrink_a_targets_scrape() {
    if !is_root("the_series_budget_flags_shrink_a_targets_scrape") {
        return;
    }
    promtool_present();
    let p = Pair::new();
    let reflector = Reflector::start(&p, &[]);
    let mut per_target = Vec::new();
    for budget in [
        &[][..],
        &["--metrics-histograms", "rtt", "--metrics-buckets", "24"][..],
    ] {
        let args = [&["--duration", "8s", "--interval", "5ms"][..], budget].concat();
        let prober = Prober::start(&p, &args);
        let t0 = Instant::now();
        while sh(&format!(
            "ip netns exec {} curl -s -o /dev/null http://{PROBER_METRICS}/metrics",
            p.a
        ))
        .status
        .code()
            != Some(0)
        {
            assert!(t0.elapsed() < Duration::from_secs(10), "no metrics server");
            std::thread::sleep(Duration::from_millis(100));
        }
        wait_for_rtt_count(&p.a, 50.0);
        // A histogram appears with its first figure, the timestamp
        // source with the run's first tick: scrape until the stages every
        // --target run stamps (stack, sender_queue; path and return only
        // between synchronised clocks) and the source are there, 5 s at most.
        let t0 = Instant::now();
        let (ct, text) = loop {
            let (ct, text, _) = scrape(&p.a, PROBER_METRICS, None);
            let histograms = text
                .lines()
                .filter(|l| l.starts_with("rtprobe_stage_seconds_count{"))
                .count();
            let incomplete = (budget.is_empty() && histograms < 2)
                || !text.contains("rtprobe_timestamp_source_info{");
            if incomplete && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            break (ct, text);
        };
        assert_clean_text(&format!("budget {budget:?}"), &ct, &text);
        // The target's series, not the process's own (build, process_*).
        let n = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains(&format!("target=\"{B_IP}:")))
            .count();
        eprintln!("budget {budget:?}: {n} series for the one target");
        per_target.push((n, text));
        prober.finish();
    }
    let (full, full_text) = &per_target[0];
    let (lean, lean_text) = &per_target[1];
    assert_eq!(*lean, 27 + 11, "{lean_text}");
    assert!(!lean_text.contains("rtprobe_stage_seconds_bucket"));
    assert!(!lean_text.contains("rtprobe_one_way_seconds_bucket"));
    // The default has RTT, the stages the run stamps and (on one clock)
    // one-way, 51 series each.
    assert!(*full >= 51 * 3 + 11, "{full_text}");
    assert_eq!((full - 11) % 51, 0, "{full_text}");
    reflector.stop();
}
