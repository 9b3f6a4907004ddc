//! `cargo xtask test`'s checks of the monitoring rtprobe ships: deploy/
//! prometheus/ (config, the opt-in reflector job, rules, rule tests) and
//! deploy/alertmanager/ as their own tools read them, the Grafana
//! dashboard's shape, and every PromQL expression of the dashboard and of
//! the docs parsed by promtool with windows of at least four scrape
//! intervals. promtool comes with the `prometheus` apt package, amtool
//! with `prometheus-alertmanager` (`cargo xtask setup` installs both).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::monitoring::{self, Expr};

/// The receiver each severity must reach (alertmanager.yml's routes).
const ROUTES: [(&str, &str); 2] = [
    (
        "severity=critical alertname=RtprobeHostUnreachable",
        "rtprobe-oncall",
    ),
    (
        "severity=warning alertname=RtprobePairLoss",
        "rtprobe-tickets",
    ),
];

fn tool(program: &str, dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.current_dir(dir).args(args);
    c
}

/// promtool over deploy/prometheus/, the reflector job uncommented too.
pub fn check_prometheus(root: &Path) -> Result<()> {
    let dir = root.join("deploy/prometheus");
    let rules = ["rules/rtprobe-recording.yml", "rules/rtprobe-alerts.yml"];
    for mut c in [
        tool("promtool", &dir, &["check", "config", "prometheus.yml"]),
        tool(
            "promtool",
            &dir,
            &[&["check", "rules"][..], &rules[..]].concat(),
        ),
        tool(
            "promtool",
            &dir,
            &["test", "rules", "tests/rtprobe-rules.test.yml"],
        ),
    ] {
        crate::run(&mut c).context(
            "deploy/prometheus/ does not pass promtool: fix the file it names (apt-get install \
             prometheus for promtool)",
        )?;
    }
    let with_reflect =
        uncomment_reflect_job(&std::fs::read_to_string(dir.join("prometheus.yml"))?)?;
    let copy = dir.join(format!(".xtask-reflect-job-{}.yml", std::process::id()));
    // Beside the original, so that its rule_files and file_sd paths resolve.
    std::fs::write(&copy, with_reflect)?;
    let checked = crate::run(&mut tool(
        "promtool",
        &dir,
        &["check", "config", copy.to_str().unwrap()],
    ));
    let _ = std::fs::remove_file(&copy);
    checked.context(
        "prometheus.yml's commented-out rtprobe-reflect job is no valid config once uncommented",
    )?;
    check_runbook_urls(root)
}

/// prometheus.yml with the commented `# - job_name: rtprobe-reflect` block
/// (to the end of the file) uncommented, as its comment tells users to.
fn uncomment_reflect_job(yml: &str) -> Result<String> {
    let start = yml
        .find("  # - job_name: rtprobe-reflect")
        .context("prometheus.yml has no commented rtprobe-reflect job")?;
    let job: Vec<String> = yml[start..]
        .lines()
        .map(|l| l.replacen("  # ", "  ", 1))
        .collect();
    Ok(format!("{}{}\n", &yml[..start], job.join("\n")))
}

/// Every alert has a runbook_url whose anchor is a heading of
/// docs/RUNBOOK.md.
fn check_runbook_urls(root: &Path) -> Result<()> {
    let alerts = std::fs::read_to_string(root.join("deploy/prometheus/rules/rtprobe-alerts.yml"))?;
    let runbook = std::fs::read_to_string(root.join("docs/RUNBOOK.md"))?;
    let anchors: Vec<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase().replace(' ', "-"))
        .collect();
    let mut alert = None;
    let mut count = 0;
    for line in alerts.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert: ")
            && let Some(a) = alert.replace(name)
        {
            bail!("alert {a} has no runbook_url annotation");
        }
        if let Some(url) = line.strip_prefix("runbook_url: ") {
            let a = alert.take().context("a runbook_url outside an alert")?;
            let anchor = url.trim_matches('\'').rsplit('#').next().unwrap_or("");
            if !url.contains("docs/RUNBOOK.md#") || !anchors.iter().any(|h| h == anchor) {
                bail!(
                    "alert {a}: runbook_url {url} is no section of docs/RUNBOOK.md (its sections: {anchors:?})"
                );
            }
            count += 1;
        }
    }
    if let Some(a) = alert {
        bail!("alert {a} has no runbook_url annotation");
    }
    eprintln!("xtask: deploy/prometheus: {count} alerts, each with its section in docs/RUNBOOK.md");
    Ok(())
}

/// amtool over deploy/alertmanager/alertmanager.yml: the config loads and
/// each severity reaches its receiver.
pub fn check_alertmanager(root: &Path) -> Result<()> {
    let dir = root.join("deploy/alertmanager");
    crate::run(&mut tool("amtool", &dir, &["check-config", "alertmanager.yml"]))
        .context("deploy/alertmanager/alertmanager.yml does not pass amtool (apt-get install prometheus-alertmanager for amtool)")?;
    for (labels, receiver) in ROUTES {
        let mut c = tool(
            "amtool",
            &dir,
            &["config", "routes", "test", "--config.file=alertmanager.yml"],
        );
        c.arg(format!("--verify.receivers={receiver}"))
            .args(labels.split(' '));
        crate::run(&mut c)
            .with_context(|| format!("alertmanager.yml does not route {labels} to {receiver}"))?;
    }
    Ok(())
}

/// The dashboard's shape, and every PromQL of the dashboard and the docs:
/// windows of at least 4 scrape intervals, and promtool parses them all.
pub fn check_queries(root: &Path) -> Result<()> {
    let dash = std::fs::read_to_string(root.join("deploy/grafana/rtprobe-fleet.json"))?;
    let mut exprs = monitoring::dashboard_exprs(&dash)
        .map_err(|e| anyhow::anyhow!("deploy/grafana/rtprobe-fleet.json: {e}"))?;
    let n_dash = exprs.len();
    for doc in docs(root)? {
        let text = std::fs::read_to_string(&doc)?;
        let rel = doc.strip_prefix(root).unwrap_or(&doc).display().to_string();
        exprs.extend(monitoring::doc_queries(&rel, &text));
    }
    let min_s = monitoring::SCRAPE_INTERVAL_S * monitoring::MIN_SCRAPES_PER_WINDOW;
    for e in &exprs {
        let w = monitoring::windows_s(&e.promql)
            .map_err(|why| anyhow::anyhow!("{}: {why}: {}", e.origin, e.promql))?;
        if let Some(short) = w.iter().find(|&&s| s < min_s) {
            bail!(
                "{}: a {short} s window is less than {} scrape intervals of {} s (rate() may see one sample): {}",
                e.origin,
                monitoring::MIN_SCRAPES_PER_WINDOW,
                monitoring::SCRAPE_INTERVAL_S,
                e.promql
            );
        }
    }
    promtool_parses(&exprs)?;
    eprintln!(
        "xtask: deploy/grafana: dashboard checked; {n_dash} dashboard and {} docs PromQL expressions parse, windows >= {min_s} s",
        exprs.len() - n_dash
    );
    Ok(())
}

/// README.md and docs/*.md.
fn docs(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// The expressions as recording rules of one file, through `promtool
/// check rules`; each rule's comment says where it came from.
fn promtool_parses(exprs: &[Expr]) -> Result<()> {
    let mut yml = String::from("groups:\n  - name: xtask-check\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        // A JSON string is a YAML double-quoted scalar.
        let expr = serde_json::to_string(&e.promql)?;
        yml += &format!(
            "      # {}\n      - record: xtask_check_{i}\n        expr: {expr}\n",
            e.origin.replace('\n', " ")
        );
    }
    let dir = temp_dir("queries")?;
    let file = dir.join("queries.yml");
    std::fs::write(&file, yml)?;
    let checked = crate::run(&mut tool(
        "promtool",
        &dir,
        &["check", "rules", "queries.yml"],
    ));
    if checked.is_err() {
        bail!(
            "a dashboard or docs query does not parse: promtool names rule xtask_check_N in {} (kept), whose comment says where it is",
            file.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn temp_dir(what: &str) -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("xtask-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reflector_job_uncomments_into_a_job() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let yml = std::fs::read_to_string(root.join("deploy/prometheus/prometheus.yml")).unwrap();
        let on = uncomment_reflect_job(&yml).unwrap();
        assert!(!yml.contains("\n  - job_name: rtprobe-reflect"));
        assert!(
            on.contains("\n  - job_name: rtprobe-reflect\n    file_sd_configs:"),
            "{on}"
        );
        assert!(on.contains("replacement: '${1}:9465'"));
    }
}
