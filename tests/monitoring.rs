//! The monitoring rtprobe ships names only metrics that exist: every
//! metric selected by the Grafana dashboard (deploy/grafana/), by the
//! queries of the docs (docs/*.md, README.md) and by the rules
//! (deploy/prometheus/rules/) is a family the exporter registers (read
//! from its own exposition, not from a list kept here), a series a
//! recording rule writes, or one Prometheus makes itself. No root, no
//! network: `cargo xtask test` parses the same expressions with promtool
//! (xtask/src/deploy.rs), whose extraction this test shares.

#[path = "../xtask/src/monitoring.rs"]
mod monitoring;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use monitoring::Expr;

/// The series Prometheus writes itself.
const PROMETHEUS_OWN: [&str; 6] = [
    "up",
    "ALERTS",
    "ALERTS_FOR_STATE",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_series_added",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The expositions of a probing process with one flow that measured
/// everything once (a family shows in a scrape once it has a series) and
/// of a reflector that answered.
fn exposition() -> String {
    use rtprobe::export::metrics::{FlowLabels, Metrics};
    let m = std::sync::Arc::new(Metrics::new());
    let mut flow = m.flow(FlowLabels::new("b", 0, 0, 64), false);
    flow.observe(&rtprobe::model::record::ProbeRecord {
        one_way_ns: Some(20_000),
        rtt_ns: Some(40_000),
        path_ns: Some(10_000),
        ..Default::default()
    });
    flow.update(&Default::default(), "software");
    m.set_xdp_mode("off", "off");
    // A reflector's process exports its own families only.
    let r = Metrics::for_reflector();
    r.reflector_update(&mut Default::default(), &Default::default());
    m.openmetrics() + &r.openmetrics()
}

/// The sample names of every family in the exporter's exposition, from its
/// `# TYPE` lines: a counter's `_total`, a histogram's `_bucket`, `_sum`
/// and `_count`, a gauge's own name, an info's `_info`.
fn exported_names() -> BTreeSet<String> {
    let text = exposition();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').expect("# TYPE NAME KIND");
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "info" => &["_info"],
            "summary" => &["", "_sum", "_count", "_created"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    assert!(names.contains("rtprobe_rtt_seconds_bucket"), "{text}");
    names
}

fn rule_files() -> Vec<(String, String)> {
    let dir = root().join("deploy/prometheus/rules");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml"))
        .map(|p| {
            let rel = format!(
                "deploy/prometheus/rules/{}",
                p.file_name().unwrap().to_string_lossy()
            );
            (rel.clone(), read(&rel))
        })
        .collect();
    out.sort();
    out
}

/// `record: NAME` of every rule file.
fn recorded_names() -> BTreeSet<String> {
    rule_files()
        .iter()
        .flat_map(|(_, text)| {
            text.lines()
                .filter_map(|l| l.trim().strip_prefix("- record: "))
                .map(|n| n.trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The `expr:` of every rule: one line, or a `|` block of deeper lines.
fn rule_exprs() -> Vec<Expr> {
    let mut out = Vec::new();
    for (file, text) in rule_files() {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(e) = line.trim_start().strip_prefix("expr: ") else {
                continue;
            };
            let promql = if e.trim() == "|" {
                let indent = line.len() - line.trim_start().len();
                lines[i + 1..]
                    .iter()
                    .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                    .map(|l| l.trim())
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                e.to_string()
            };
            out.push(Expr {
                origin: format!("{file}:{}", i + 1),
                promql,
            });
        }
    }
    out
}

fn shipped_exprs() -> Vec<Expr> {
    let mut exprs = monitoring::dashboard_exprs(&read("deploy/grafana/rtprobe-fleet.json"))
        .unwrap_or_else(|e| panic!("deploy/grafana/rtprobe-fleet.json: {e}"));
    let mut docs = vec!["README.md".to_string()];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        if name.ends_with(".md") {
            docs.push(format!("docs/{name}"));
        }
    }
    for d in docs {
        exprs.extend(monitoring::doc_queries(&d, &read(&d)));
    }
    exprs.extend(rule_exprs());
    exprs
}

#[test]
fn every_metric_the_dashboard_docs_and_rules_select_exists() {
    let exported = exported_names();
    let recorded = recorded_names();
    assert!(
        recorded.contains("instance_target:rtprobe_rtt_seconds:p99_1m"),
        "{recorded:?}"
    );
    let exprs = shipped_exprs();
    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    for e in &exprs {
        for name in monitoring::metric_names(&e.promql) {
            if !exported.contains(&name)
                && !recorded.contains(&name)
                && !PROMETHEUS_OWN.contains(&name.as_str())
            {
                unknown.push(format!("{}: {name} in {}", e.origin, e.promql));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics that neither the exporter nor a recording rule nor Prometheus makes:\n{}\n(the exporter's: {exported:?})",
        unknown.join("\n")
    );
    // The check reads real expressions: the dashboard's histograms, the
    // docs' and the rules' counters.
    for must in [
        "rtprobe_rtt_seconds_bucket",
        "rtprobe_probes_lost_total",
        "target:rtprobe_peers_failing:count",
        "up",
    ] {
        assert!(
            used.contains(must),
            "no shipped query selects {must}: {used:?}"
        );
    }
    eprintln!(
        "{} expressions select {} metrics, each exported or recorded",
        exprs.len(),
        used.len()
    );
}
