//! `report.md` of a scenario run: one table per (size, interval) group
//! with each variant's one-way p50/p99/p99.9/max, its p50 against the
//! group's baseline (and p50/p99 with 95 % confidence intervals, computed
//! by the caller with `export::compare`), RTT p50, loss, what the
//! competing load achieved, and
//! links to the cell's CSV/JSON and comparison figures. Pure: rendering
//! only.

use std::{fmt::Write, path::Path, time::Duration};

use super::{Cell, CellResult, Scenario};
use crate::{
    export::plot::axis::format_duration_ns,
    model::units,
    stats::{Summary, chain::Stage},
};

pub(crate) use super::ReportRow;

pub(crate) struct ReportInput<'a> {
    pub(crate) scenario: &'a Scenario,
    pub(crate) out_dir: &'a Path,
    pub(crate) rows: &'a [ReportRow<'a>],
    pub(crate) elapsed: Duration,
    pub(crate) figure_errors: &'a [String],
}

/// A latency in the unit that suits it ("5.743 µs", "109 ms"), or "–"
/// when there is no figure.
pub(crate) fn lat(ns: Option<u64>) -> String {
    match ns {
        Some(v) => format_duration_ns(v as f64),
        None => "–".into(),
    }
}

/// A signed difference: "+10 µs", "-1.2 ms", "0 ns".
pub(crate) fn lat_delta(ns: f64) -> String {
    let t = format_duration_ns(ns);
    if ns > 0.0 && !t.starts_with('0') {
        format!("+{t}")
    } else {
        t
    }
}

fn mbit(bps: f64) -> String {
    format!("{:.1} Mbit/s", bps / 1e6)
}

/// The load column: per flow, achieved throughput (and UDP loss).
pub(crate) fn load_cell(s: &Summary) -> String {
    let Some(rep) = &s.report.load else {
        return "–".into();
    };
    let parts: Vec<String> = rep
        .flows
        .iter()
        .map(|f| {
            let mut t = format!("{} ", f.kind);
            if let Some(cc) = &f.cc {
                t += cc;
                t += " ";
            }
            t += &mbit(f.achieved_bps);
            if let Some(o) = f.offered_bps {
                let _ = write!(t, " of {:.1} offered", o / 1e6);
            }
            if let Some(l) = f.loss_pct {
                let _ = write!(t, ", loss {l:.1} %");
                if let Some(e) = f.expected_loss_pct {
                    let _ = write!(t, " (calc. {e:.1} %)");
                }
            }
            if let Some(ft) = &f.fetch {
                t += &super::fetch_study::fetch_cell(ft);
            }
            t
        })
        .collect();
    if parts.is_empty() {
        "–".into()
    } else {
        parts.join("; ")
    }
}

/// Skipped and unsupported knobs of a cell, in words.
fn notes(r: &CellResult) -> String {
    let mut n = Vec::new();
    // The knobs' metadata says what they skipped; the summary what the load did.
    let skipped: Vec<&str> = match &r.knobs.skipped {
        a if !a.is_empty() => a.iter().map(String::as_str).collect(),
        _ => r
            .summary
            .report
            .skipped
            .iter()
            .map(String::as_str)
            .collect(),
    };
    for s in skipped {
        n.push(format!("**SKIPPED** {s}"));
    }
    for (k, v) in &r.knobs.unsupported {
        n.push(format!("{k} unsupported: {v}"));
    }
    n.join("<br>")
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Link target relative to the output dir (figures may be in a subfolder).
fn rel(out_dir: &Path, p: &Path) -> String {
    p.strip_prefix(out_dir)
        .unwrap_or(p)
        .to_string_lossy()
        .replace(' ', "%20")
}

pub(crate) fn render(input: &ReportInput<'_>) -> String {
    let mut s = String::new();
    header(&mut s, input);
    let _ = writeln!(s, "## Knob sets\n\n| set | knobs |\n|---|---|");
    for set in &input.scenario.sets {
        let _ = writeln!(
            s,
            "| {} | {} |",
            md_escape(&set.name),
            md_escape(&set.knobs.describe())
        );
    }
    s.push('\n');

    let _ = writeln!(s, "## Results\n");
    let mut i = 0;
    while i < input.rows.len() {
        let c0 = input.rows[i].cell;
        let group: Vec<&ReportRow<'_>> = input.rows[i..]
            .iter()
            .take_while(|r| {
                r.cell.run.probe.size == c0.run.probe.size
                    && r.cell.run.probe.interval == c0.run.probe.interval
            })
            .collect();
        i += group.len();
        group_table(&mut s, input.out_dir, &group);
        stage_table(&mut s, &group);
    }

    flows_section(&mut s, input.rows);
    if let Some(t) = super::fetch_study::study_section(&super::fetch_study::fetch_cells(input.rows))
    {
        s += &t;
    }
    figures_section(&mut s, input);
    s
}

/// The scenario, its cells, the probes, the baseline and what the
/// latencies mean.
fn header(s: &mut String, input: &ReportInput<'_>) {
    let sc = input.scenario;
    let _ = writeln!(s, "# rtprobe scenario: {}\n", sc.name);
    if let Some(d) = &sc.description {
        let _ = writeln!(s, "{d}\n");
    }
    let failed = input.rows.iter().filter(|r| r.result.is_err()).count();
    let _ = writeln!(
        s,
        "- scenario file: `{}` (copied to `scenario.toml`)",
        sc.path.display()
    );
    let _ = writeln!(
        s,
        "- cells: {}{}; time: {}",
        input.rows.len(),
        if failed > 0 {
            format!(" (**{failed} failed**)")
        } else {
            String::new()
        },
        humantime::format_duration(Duration::from_secs(input.elapsed.as_secs()))
    );
    host_line(s, input.rows);
    let common = sc.common();
    let p = &common.probe;
    let _ = writeln!(
        s,
        "- probes per cell: {}; TOS 0x{:02X}; port {}; XDP action {}",
        match (p.count, p.duration) {
            (_, Some(d)) => format!("for {}", units::fmt_duration(d)),
            (Some(n), None) => format!("{n}"),
            (None, None) => "?".into(),
        },
        p.tos,
        p.port,
        format!("{:?}", common.xdp_action).to_lowercase()
    );
    let base = input
        .rows
        .first()
        .map(|r| r.cell.label().to_string())
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "- baseline: **{base}**; every other variant is compared with it at the same size and interval"
    );
    let _ = writeln!(
        s,
        "- latencies are one-way unless marked RTT: from the probe entering the sender's stack \
         (the kernel's SCHED stamp at the qdisc, or the user-space send where the kernel gives none) \
         to the receiver's RX stamp, so the sender's qdisc and every queue on the path are inside it; \
         the stage tables say where the time went\n"
    );
}

/// The host the cells ran on, as their summaries name it (each distinct
/// one, should a fact have changed between cells).
fn host_line(s: &mut String, rows: &[ReportRow<'_>]) {
    let mut hosts: Vec<String> = Vec::new();
    for h in rows
        .iter()
        .filter_map(|r| r.result.ok()?.summary.report.host.as_ref())
    {
        let line = h.line();
        if !hosts.contains(&line) {
            hosts.push(line);
        }
    }
    let _ = match hosts.as_slice() {
        [] => writeln!(s, "- host: not known (no cell's summary names it)"),
        [one] => writeln!(s, "- host: {}", md_escape(one)),
        many => writeln!(
            s,
            "- hosts (they differ between cells): {}",
            md_escape(&many.join("; "))
        ),
    };
}

/// One (size, interval) group: a row per variant, its files and figures.
fn group_table(s: &mut String, out_dir: &Path, group: &[&ReportRow<'_>]) {
    let c0 = group[0].cell;
    let _ = writeln!(
        s,
        "### {} B every {}\n",
        c0.run.probe.size,
        units::fmt_duration(c0.run.probe.interval)
    );
    let _ = writeln!(
        s,
        "| variant | p50 | p99 | p99.9 | max | p50 vs baseline | vs baseline, 95 % CI | RTT p50 | loss % | load | notes | files |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|---|"
    );
    let base_p50 = group
        .first()
        .and_then(|r| r.result.ok())
        .and_then(|r| r.summary.one_way_ns.p50);
    for r in group {
        let c = r.cell;
        let mut files = format!(
            "[csv]({}) [json]({})",
            rel(out_dir, c.csv()),
            rel(out_dir, &c.json())
        );
        if let Some(q) = &c.run.queue_csv {
            let _ = write!(files, " [queue]({})", rel(out_dir, q));
        }
        for f in &r.figures {
            let _ = write!(files, " [{}]({})", file_name(f), rel(out_dir, f));
        }
        match r.result {
            Ok(res) => result_row(s, r, res, base_p50, &files),
            Err(e) => {
                let _ = writeln!(
                    s,
                    "| {} | – | – | – | – | – | – | – | – | – | **FAILED**: {} | |",
                    md_escape(c.label()),
                    md_escape(e)
                );
            }
        }
    }
    s.push('\n');
}

/// The table row of a cell that ran.
fn result_row(
    s: &mut String,
    r: &ReportRow<'_>,
    res: &CellResult,
    base_p50: Option<u64>,
    files: &str,
) {
    let c = r.cell;
    let ow = &res.summary.one_way_ns;
    let delta = match (c.variant, ow.p50, base_p50) {
        (0, _, _) => "baseline".to_string(),
        (_, Some(v), Some(b)) => lat_delta(v as f64 - b as f64),
        _ => "–".into(),
    };
    let verdict = match (c.variant, &r.vs_baseline) {
        (0, _) => "baseline".to_string(),
        (_, Some(v)) => md_escape(v),
        (_, None) => "–".into(),
    };
    let _ = writeln!(
        s,
        "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} |",
        md_escape(c.label()),
        lat(ow.p50),
        lat(ow.p99),
        lat(ow.p999),
        lat(ow.max),
        delta,
        verdict,
        lat(res.summary.rtt_ns.p50),
        res.summary.loss_pct,
        md_escape(&load_cell(&res.summary)),
        md_escape(&notes(res)),
        files
    );
}

/// How to draw the comparisons when no figures were drawn, and the
/// figures that failed.
fn figures_section(s: &mut String, input: &ReportInput<'_>) {
    let any_fig = input.rows.iter().any(|r| !r.figures.is_empty());
    if !any_fig
        && input
            .rows
            .iter()
            .any(|r| r.cell.variant > 0 && r.result.is_ok())
    {
        let _ = writeln!(
            s,
            "## Figures\n\nNo figures were drawn in this run. Each comparison, baseline first:\n"
        );
        for r in input.rows {
            if r.cell.variant == 0 || r.result.is_err() {
                continue;
            }
            let b = input.rows[r.cell.index - r.cell.variant].cell;
            let _ = writeln!(
                s,
                "    rtprobe plot {} {} --label {} --label {}",
                file_name(b.csv()),
                file_name(r.cell.csv()),
                shell_word(b.label()),
                shell_word(r.cell.label())
            );
        }
        s.push('\n');
    }
    if !input.figure_errors.is_empty() {
        let _ = writeln!(s, "## Figure errors\n");
        for e in input.figure_errors {
            let _ = writeln!(s, "- {}", md_escape(e));
        }
        s.push('\n');
    }
}

/// p50 (and p99) per stage for each variant of a group, with the stage
/// that holds most of the one-way median. Stages no variant measured are
/// left out (e.g. the driver ring without hardware stamps).
fn stage_table(s: &mut String, group: &[&ReportRow<'_>]) {
    let ok: Vec<(&Cell, &Summary)> = group
        .iter()
        .filter_map(|r| r.result.ok().map(|res| (r.cell, &res.summary)))
        .collect();
    let stages: Vec<Stage> = Stage::ALL
        .into_iter()
        .filter(|&st| ok.iter().any(|(_, sum)| sum.stages_ns.get(st).count > 0))
        .collect();
    if stages.is_empty() {
        return;
    }
    let _ = write!(
        s,
        "Where the time went (p50 / p99 per stage):\n\n| variant |"
    );
    for st in &stages {
        let _ = write!(s, " {} |", st.label());
    }
    let _ = writeln!(s, " one-way p50 is mostly |");
    let _ = writeln!(s, "|---|{}---|", "---:|".repeat(stages.len()));
    for (cell, sum) in ok {
        let _ = write!(s, "| {} |", md_escape(cell.label()));
        for &st in &stages {
            let l = sum.stages_ns.get(st);
            let _ = write!(s, " {} / {} |", lat(l.p50), lat(l.p99));
        }
        let dom = sum
            .one_way_dominant
            .as_ref()
            .map(|d| {
                format!(
                    "{} ({:.0} %)",
                    Stage::ALL
                        .into_iter()
                        .find(|st| st.key() == d.stage)
                        .map_or(d.stage.as_str(), |st| st.label()),
                    d.share_pct
                )
            })
            .unwrap_or_else(|| "–".into());
        let _ = writeln!(s, " {dom} |");
    }
    s.push('\n');
}

/// How much the main flow's p99 may grow from idle to loaded for the
/// priority bound to count as held, in µs. Absolute, not a share of the
/// idle p99: on a veth testbed the idle p99 is ~10 µs, and priority cannot
/// remove the bulk frame already being sent (121 µs at 100 Mbit/s) nor the
/// CPU time the load's forwarding takes on a shared machine, so any load
/// multiplies the idle p99 while the bound still holds. A lost bound grows
/// with the bulk queue (100 frames are 12 ms at 100 Mbit/s), far beyond
/// this.
pub(crate) const BOUND_TOLERANCE_US: f64 = 500.0;

/// One flow of a cell, as the run report's `flows` has it.
struct FlowFigures {
    flow: u8,
    port: u16,
    tos: u8,
    p99: Option<u64>,
    max: Option<u64>,
}

fn flow_figures(sum: &Summary) -> Vec<FlowFigures> {
    sum.report
        .flows
        .iter()
        .map(|f| FlowFigures {
            flow: f.flow,
            port: f.port,
            tos: f.tos,
            p99: f.summary.one_way_ns.p99,
            max: f.summary.one_way_ns.max,
        })
        .collect()
}

/// Per-flow p99 and max of runs with several probe flows (`flows`), one
/// table per (size, interval, knobs other than the load), rows in file
/// order; and whether the main flow's p99 stayed within
/// [`BOUND_TOLERANCE_US`] of its idle value as the load rose (study 4's
/// bound: a high-priority packet's time in the stack does not depend on
/// low-priority load).
fn flows_section(s: &mut String, rows: &[ReportRow<'_>]) {
    let ok: Vec<(&Cell, Vec<FlowFigures>)> = rows
        .iter()
        .filter_map(|r| {
            r.result
                .ok()
                .map(|res| (r.cell, flow_figures(&res.summary)))
        })
        .filter(|(_, f)| !f.is_empty())
        .collect();
    if ok.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Flows side by side\n\n\
         One-way p99 / max per probe flow. Flow 0 is the main probe flow, the one the \
         priority qdiscs (htb-prio, htb, prio, hfsc) classify as high priority by its port; \
         the bound holds when its p99 under load stays within +{BOUND_TOLERANCE_US:.0} µs of \
         its p99 without load (a full frame takes 121 µs at 100 Mbit/s; `BOUND_TOLERANCE_US` \
         in export/report.rs says why the tolerance is absolute).\n"
    );
    let key = |c: &Cell| {
        let mut k = c.run.knobs.clone();
        k.load = None;
        k.load_warmup = None;
        (c.run.probe.size, c.run.probe.interval, k.describe())
    };
    let mut done = vec![false; ok.len()];
    for i in 0..ok.len() {
        if done[i] {
            continue;
        }
        let k0 = key(ok[i].0);
        let group: Vec<usize> = (i..ok.len()).filter(|&j| key(ok[j].0) == k0).collect();
        for &j in &group {
            done[j] = true;
        }
        let group: Vec<&(&Cell, Vec<FlowFigures>)> = group.iter().map(|&j| &ok[j]).collect();
        flows_group(s, &k0, &group);
    }
}

/// A cell's loads in words, "none" without.
fn load_of(c: &Cell) -> String {
    let l = c.run.knobs.loads();
    if l.is_empty() {
        "none".to_string()
    } else {
        l.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One group's cells side by side, and whether the bound held.
fn flows_group(
    s: &mut String,
    k0: &(usize, Duration, String),
    group: &[&(&Cell, Vec<FlowFigures>)],
) {
    let first = group[0];
    let _ = writeln!(
        s,
        "### {} B every {}: {}\n",
        k0.0,
        units::fmt_duration(k0.1),
        md_escape(if k0.2.is_empty() { "no knobs" } else { &k0.2 })
    );
    let _ = write!(s, "| set | load |");
    for f in &first.1 {
        let _ = write!(
            s,
            " flow {} (port {}, TOS 0x{:02X}) |",
            f.flow, f.port, f.tos
        );
    }
    let _ = writeln!(s, "\n|---|---|{}", "---:|".repeat(first.1.len()));
    for (c, flows) in group.iter().map(|g| (g.0, &g.1)) {
        let _ = write!(
            s,
            "| {} | {} |",
            md_escape(c.label()),
            md_escape(&load_of(c))
        );
        for f in flows {
            let _ = write!(s, " {} / {} |", lat(f.p99), lat(f.max));
        }
        s.push('\n');
    }
    s.push('\n');
    bound_verdicts(s, group);
}

/// Per flow: its idle p99 against its worst loaded one; for flow 0,
/// whether the priority bound held.
fn bound_verdicts(s: &mut String, group: &[&(&Cell, Vec<FlowFigures>)]) {
    let Some(idle) = group.iter().position(|g| g.0.run.knobs.loads().is_empty()) else {
        let _ = writeln!(s, "No run without load in this group: no verdict.\n");
        return;
    };
    for (fi, f0) in group[idle].1.iter().enumerate() {
        let Some(base) = f0.p99 else { continue };
        // The worst loaded p99 of this flow.
        let worst = group
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != idle)
            .filter_map(|(_, g)| g.1.get(fi).and_then(|f| f.p99).map(|p| (p, g.0)))
            .max_by_key(|(p, _)| *p);
        let Some((w, wc)) = worst else { continue };
        let pct = (w as f64 - base as f64) / base.max(1) as f64 * 100.0;
        let rise_us = (w as f64 - base as f64) / 1000.0;
        let delta = format!(
            "p99 {} idle, at most {} under load ({}): {}, {:+.0} %",
            lat(Some(base)),
            lat(Some(w)),
            md_escape(&load_of(wc)),
            lat_delta(w as f64 - base as f64),
            pct
        );
        if f0.flow == 0 {
            let verdict = if rise_us <= BOUND_TOLERANCE_US {
                "**bound held**"
            } else {
                "**bound did not hold**"
            };
            let _ = writeln!(
                s,
                "- flow 0: {verdict}: {delta} (tolerance +{BOUND_TOLERANCE_US:.0} µs)"
            );
        } else {
            let _ = writeln!(s, "- flow {}: {delta}", f0.flow);
        }
    }
    s.push('\n');
}

fn shell_word(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}
