//! `rtprobe compare BASE OTHER...`: how each run's p50/p99/p99.9 differ
//! from the baseline's, with bootstrap confidence intervals
//! ([`crate::stats::bootstrap`]) and the verdict in words.
//!
//! The JSON summary holds percentiles only, so the intervals come from the
//! per-probe CSVs. A `.json` argument stands for the CSV of the same stem
//! next to it (`out.json` -> `out.csv`, as `rtprobe run` names its cells).
//! CSVs are streamed: each run keeps a reservoir sample of at most
//! `--sample` values, so memory is bounded whatever the run length.
//!
//! Each run's host is read from its JSON summary (`extra.host`: the
//! argument itself, or the `.json` next to the CSV); a run from another
//! host than the baseline's gets a one-line warning naming the facts that
//! differ, and one whose summary names no host (none next to the CSV, or
//! written before rtprobe said) is "host unknown".

use std::{
    fmt::Write as _,
    fs::File,
    io::BufReader,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::{
    export::plot::axis::{Unit, format_duration_ns, format_number, split_duration_ns},
    model::host::HostFacts,
    stats::bootstrap::{QuantileDiff, Reservoir, quantile_diffs},
};

/// The largest JSON summary read for its host (1000 targets' summaries
/// take a few MiB).
const MAX_SUMMARY_BYTES: u64 = 256 << 20;

/// The percentiles compared.
pub(crate) const PERCENTILES: [f64; 3] = [0.5, 0.99, 0.999];

/// Which latency column is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum CompareMetric {
    /// The packet's one-way latency (CSV column one_way_ns).
    OneWay,
    /// The round trip (CSV column rtt_ns).
    Rtt,
}

impl CompareMetric {
    pub(crate) fn column(self) -> &'static str {
        match self {
            CompareMetric::OneWay => "one_way_ns",
            CompareMetric::Rtt => "rtt_ns",
        }
    }

    fn words(self) -> &'static str {
        match self {
            CompareMetric::OneWay => "one-way latency",
            CompareMetric::Rtt => "RTT",
        }
    }
}

/// How a comparison is made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Settings {
    pub(crate) metric: CompareMetric,
    pub(crate) resamples: usize,
    /// Most values kept per run.
    pub(crate) sample_cap: usize,
    pub(crate) seed: u64,
    pub(crate) confidence: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            metric: CompareMetric::OneWay,
            resamples: 1000,
            sample_cap: 100_000,
            seed: 1,
            confidence: 0.95,
        }
    }
}

/// One run's sample.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunSample {
    /// The CSV read.
    pub(crate) csv: PathBuf,
    /// Rows of the main flow with a value in the metric's column.
    pub(crate) values_seen: u64,
    /// Values kept for the bootstrap (at most the sample cap).
    pub(crate) values_used: usize,
    /// The host its JSON summary names; absent when none does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) host: Option<HostFacts>,
    #[serde(skip)]
    pub(crate) sorted: Vec<i64>,
}

fn is_json(arg: &Path) -> bool {
    arg.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// The host a run's JSON summary names (`extra.host`): the argument
/// itself, or the `.json` of the same stem next to a CSV. None when there
/// is no such summary or it names no host (written before rtprobe did).
pub(crate) fn host_of(arg: &Path) -> Option<HostFacts> {
    let json = if is_json(arg) {
        arg.to_path_buf()
    } else {
        arg.with_extension("json")
    };
    let text = crate::input::read_text(&json, "JSON summary", MAX_SUMMARY_BYTES).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    serde_json::from_value(v.get("extra")?.get("host")?.clone()).ok()
}

/// The CSV an argument stands for: itself, or for a `.json` summary the
/// `.csv` of the same stem next to it.
pub(crate) fn csv_for(arg: &Path) -> Result<PathBuf> {
    if !is_json(arg) {
        return Ok(arg.to_path_buf());
    }
    if !arg.exists() {
        bail!("{}: no such file: check the path", arg.display());
    }
    let csv = arg.with_extension("csv");
    if csv.is_file() {
        Ok(csv)
    } else {
        bail!(
            "{}: a JSON summary holds percentiles only and there is no {} next to it: pass the \
             per-probe CSV the run wrote with --out",
            arg.display(),
            csv.display()
        )
    }
}

/// Streams one rtprobe CSV into a reservoir sample of the metric's column,
/// main flow (0) only. The `# rtprobe-meta` line and other `#` lines are
/// skipped; a cut-short last line (a killed run) is left out.
pub(crate) fn read_sample(arg: &Path, s: &Settings) -> Result<RunSample> {
    let csv = csv_for(arg)?;
    let name = csv.display().to_string();
    if csv.is_dir() {
        bail!("{name}: is a directory: pass the run's CSV file");
    }
    let mut rdr = open_csv(&csv, &name)?;
    let header = rdr
        .byte_headers()
        .with_context(|| format!("{name}: cannot read the CSV header"))?
        .clone();
    let col = metric_column(&header, &name, s.metric)?;
    let flow = header.iter().position(|h| h == b"flow");
    // Each run's reservoir draws from its own stream of the seed.
    let mut res = Reservoir::new(s.sample_cap, s.seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut rec = csv::ByteRecord::new();
    let mut short_rows = 0u64;
    loop {
        match rdr.read_byte_record(&mut rec) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => bail!("{name}: {e}"),
        }
        if rec.len() != header.len() {
            short_rows += 1;
            continue;
        }
        if let Some(f) = flow
            && !matches!(rec.get(f), Some(b"0") | Some(b""))
        {
            continue;
        }
        let field = rec.get(col).unwrap_or_default();
        if field.is_empty() {
            continue; // lost probe
        }
        let v = std::str::from_utf8(field)
            .ok()
            .and_then(|t| t.trim().parse::<i64>().ok())
            .with_context(|| {
                format!(
                    "{name}: line {}: {} is not a whole number of nanoseconds",
                    rec.position().map_or(0, |p| p.line()),
                    s.metric.column()
                )
            })?;
        res.push(v);
    }
    // Only a cut-short last line is expected; more says the file is not ours.
    if short_rows > 1 {
        bail!(
            "{name}: {short_rows} rows do not have the header's column count: is this an rtprobe CSV?"
        );
    }
    if res.seen() == 0 {
        bail!(
            "{name}: no probe with a {} value (all lost?): nothing to compare",
            s.metric.column()
        );
    }
    let values_seen = res.seen();
    let sorted = res.into_sorted();
    Ok(RunSample {
        csv,
        values_seen,
        values_used: sorted.len(),
        host: host_of(arg),
        sorted,
    })
}

/// A reader of the CSV `csv` (called `name` in errors): `#` lines skipped,
/// rows of any length, lines capped.
fn open_csv(
    csv: &Path,
    name: &str,
) -> Result<csv::Reader<BufReader<crate::input::LineCapped<File>>>> {
    let file = File::open(csv).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow::anyhow!("{name}: no such file: check the path"),
        _ => anyhow::anyhow!("{name}: cannot open: {e}"),
    })?;
    Ok(csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .comment(Some(b'#'))
        .from_reader(BufReader::with_capacity(
            64 * 1024,
            crate::input::LineCapped::new(file, crate::input::MAX_CSV_LINE_BYTES),
        )))
}

/// The index of `metric`'s column in `header`, or an error that says
/// which CSV to pass (or which metric the file has).
fn metric_column(header: &csv::ByteRecord, name: &str, metric: CompareMetric) -> Result<usize> {
    let find = |col: &str| header.iter().position(|h| h == col.as_bytes());
    if let Some(col) = find(metric.column()) {
        return Ok(col);
    }
    let (other, other_col) = match metric {
        CompareMetric::OneWay => ("rtt", "rtt_ns"),
        CompareMetric::Rtt => ("one-way", "one_way_ns"),
    };
    if find(other_col).is_some() {
        bail!(
            "{name}: no {} column: compare the other latency with --metric {other}",
            metric.column()
        );
    }
    bail!(
        "{name}: no {} column, so not an rtprobe CSV: pass the per-probe CSV written with --out",
        metric.column()
    );
}

/// One other run against the baseline.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunComparison {
    #[serde(flatten)]
    pub(crate) run: RunSample,
    /// The host facts in which this run's host differs from the
    /// baseline's ("cores 2 vs 16"); empty: the same host; null: one of
    /// the two names no host.
    pub(crate) host_differences: Option<Vec<String>>,
    pub(crate) percentiles: Vec<PercentileChange>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct PercentileChange {
    /// "p50", "p99", "p99.9".
    pub(crate) name: String,
    #[serde(flatten)]
    pub(crate) diff: QuantileDiff,
    pub(crate) significant: bool,
    pub(crate) verdict: String,
}

/// Everything `compare` found, as written by `--json`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Comparison {
    pub(crate) metric: CompareMetric,
    pub(crate) confidence: f64,
    pub(crate) resamples: usize,
    pub(crate) sample_cap: usize,
    pub(crate) seed: u64,
    pub(crate) baseline: RunSample,
    pub(crate) runs: Vec<RunComparison>,
}

pub(crate) fn percentile_name(p: f64) -> String {
    format!("p{}", format_number(p * 100.0))
}

/// "p99 lower by 41 µs, 95 % CI 35-47 µs", or "p50: no significant change
/// (+0.3 µs, 95 % CI -1.2 to 1.8 µs)".
pub(crate) fn verdict(name: &str, d: &QuantileDiff, confidence: f64) -> String {
    let conf = format_number(confidence * 100.0);
    let (lo, hi) = (d.ci_low_ns, d.ci_high_ns);
    if !d.significant() {
        let unit = split_duration_ns(lo.abs().max(hi.abs())).1;
        return format!(
            "{name}: no significant change ({}, {conf} % CI {} to {} {})",
            signed(d.diff_ns),
            in_unit(lo, unit),
            in_unit(hi, unit),
            unit.symbol()
        );
    }
    let (word, a, b) = if d.diff_ns < 0.0 || hi < 0.0 {
        ("lower", -hi, -lo)
    } else {
        ("higher", lo, hi)
    };
    let unit = split_duration_ns(b).1;
    format!(
        "{name} {word} by {}, {conf} % CI {}-{} {}",
        duration(d.diff_ns.abs()),
        in_unit(a, unit),
        in_unit(b, unit),
        unit.symbol()
    )
}

// Interpolated percentiles have fractions of a nanosecond that the
// stamps never had: the words round them away (the JSON keeps them).

fn in_unit(ns: f64, unit: Unit) -> String {
    format_number(ns.round() / unit.ns_per_unit())
}

fn duration(ns: f64) -> String {
    format_duration_ns(ns.round())
}

fn signed(ns: f64) -> String {
    if ns.round() > 0.0 {
        format!("+{}", duration(ns))
    } else {
        duration(ns)
    }
}

/// Compares each of `others` with `base`.
pub(crate) fn compare(base: &Path, others: &[PathBuf], s: &Settings) -> Result<Comparison> {
    // Open every file before the slow part, so a typo fails at once.
    for p in std::iter::once(base).chain(others.iter().map(PathBuf::as_path)) {
        let csv = csv_for(p)?;
        if !csv.is_file() {
            bail!("{}: no such file: check the path", csv.display());
        }
    }
    let baseline = read_sample(base, s)?;
    let mut runs = Vec::new();
    for (i, o) in others.iter().enumerate() {
        let run = read_sample(o, s)?;
        let diffs = quantile_diffs(
            &baseline.sorted,
            &run.sorted,
            &PERCENTILES,
            s.resamples,
            s.confidence,
            s.seed.wrapping_add(i as u64),
        )
        .context("empty sample")?;
        let percentiles = diffs
            .into_iter()
            .map(|d| {
                let name = percentile_name(d.p);
                PercentileChange {
                    verdict: verdict(&name, &d, s.confidence),
                    significant: d.significant(),
                    name,
                    diff: d,
                }
            })
            .collect();
        let host_differences = match (&baseline.host, &run.host) {
            (Some(b), Some(o)) => Some(b.differences(o)),
            _ => None,
        };
        runs.push(RunComparison {
            run,
            host_differences,
            percentiles,
        });
    }
    Ok(Comparison {
        metric: s.metric,
        confidence: s.confidence,
        resamples: s.resamples,
        sample_cap: s.sample_cap,
        seed: s.seed,
        baseline,
        runs,
    })
}

fn describe_sample(r: &RunSample) -> String {
    if r.values_used as u64 == r.values_seen {
        format!("{} probes", r.values_seen)
    } else {
        format!(
            "{} probes, a random {} of them used",
            r.values_seen, r.values_used
        )
    }
}

/// The warning when a run's host is not the baseline's, or that a host
/// is unknown; None for the same host.
fn host_line(baseline: &RunSample, r: &RunComparison) -> Option<String> {
    match &r.host_differences {
        Some(d) if d.is_empty() => None,
        Some(d) => Some(format!(
            "warning: another host than the baseline's ({}): a change may be the host's, not the path's",
            d.join(", ")
        )),
        None => {
            let unknown: Vec<String> = [baseline, &r.run]
                .into_iter()
                .filter(|s| s.host.is_none())
                .map(|s| s.csv.with_extension("json").display().to_string())
                .collect();
            Some(format!(
                "host unknown: no host section in {} (no JSON summary next to the CSV, or one \
                 written before rtprobe named hosts): whether both ran on the same host is not known",
                unknown.join(" and ")
            ))
        }
    }
}

/// The text `compare` prints: per other run a table and the verdicts.
pub(crate) fn render(c: &Comparison) -> String {
    let mut o = String::new();
    let conf = format_number(c.confidence * 100.0);
    let _ = writeln!(
        o,
        "rtprobe compare: {}, baseline {} ({})",
        c.metric.words(),
        c.baseline.csv.display(),
        describe_sample(&c.baseline)
    );
    let _ = writeln!(
        o,
        "  {conf} % confidence intervals by bootstrap: {} resamples of at most {} values per run \
         (a reservoir sample of each CSV), seed {}",
        c.resamples, c.sample_cap, c.seed
    );
    for r in &c.runs {
        let _ = writeln!(
            o,
            "\n{} ({}) vs baseline",
            r.run.csv.display(),
            describe_sample(&r.run)
        );
        if let Some(line) = host_line(&c.baseline, r) {
            let _ = writeln!(o, "  {line}");
        }
        let _ = writeln!(
            o,
            "  {:<7}{:>12}{:>12}{:>12}   {conf} % CI of the change",
            "", "baseline", "this run", "change"
        );
        for p in &r.percentiles {
            let d = &p.diff;
            let unit = split_duration_ns(d.ci_low_ns.abs().max(d.ci_high_ns.abs())).1;
            let _ = writeln!(
                o,
                "  {:<7}{:>12}{:>12}{:>12}   {} to {} {}",
                p.name,
                duration(d.base_ns),
                duration(d.other_ns),
                signed(d.diff_ns),
                in_unit(d.ci_low_ns, unit),
                in_unit(d.ci_high_ns, unit),
                unit.symbol()
            );
        }
        for p in &r.percentiles {
            let _ = writeln!(o, "  {}", p.verdict);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(diff: f64, lo: f64, hi: f64) -> QuantileDiff {
        QuantileDiff {
            p: 0.99,
            base_ns: 100_000.0,
            other_ns: 100_000.0 + diff,
            diff_ns: diff,
            ci_low_ns: lo,
            ci_high_ns: hi,
        }
    }

    #[test]
    fn verdicts_in_words() {
        assert_eq!(
            verdict("p99", &d(-41_000.0, -47_000.0, -35_000.0), 0.95),
            "p99 lower by 41 µs, 95 % CI 35-47 µs"
        );
        assert_eq!(
            verdict("p50", &d(2_500_000.0, 1_200_000.0, 3_000_000.0), 0.95),
            "p50 higher by 2.5 ms, 95 % CI 1.2-3 ms"
        );
        assert_eq!(
            verdict("p99.9", &d(300.0, -1_200.0, 1_800.0), 0.95),
            "p99.9: no significant change (+300 ns, 95 % CI -1.2 to 1.8 µs)"
        );
        assert_eq!(percentile_name(0.999), "p99.9");
        assert_eq!(percentile_name(0.5), "p50");
    }

    fn write_csv(dir: &Path, name: &str, shift_ns: i64, n: usize) -> PathBuf {
        let mut t = String::from(
            "# rtprobe-meta: {\"version\":\"0.1.0\"}\nseq,flow,size,one_way_ns,rtt_ns,lost\n",
        );
        for i in 0..n {
            // A spread of 20..80 µs; every tenth probe lost; a second flow
            // far off that must not count.
            let v = 20_000 + ((i * 7919) % 60_000) as i64 + shift_ns;
            if i % 10 == 9 {
                let _ = writeln!(t, "{i},0,64,,,1");
            } else {
                let _ = writeln!(t, "{i},0,64,{v},{},0", 2 * v);
            }
            let _ = writeln!(t, "{i},1,64,9999999999,9999999999,0");
        }
        t.push_str("99999,0,64,12"); // cut short
        let p = dir.join(name);
        std::fs::write(&p, t).unwrap();
        p
    }

    #[test]
    fn compares_csvs_and_finds_them_from_json_summaries() {
        let dir = tempfile::tempdir().unwrap();
        let base = write_csv(dir.path(), "base.csv", 0, 3000);
        let same = write_csv(dir.path(), "same.csv", 0, 3000);
        let slow = write_csv(dir.path(), "slow.csv", 50_000, 3000);
        std::fs::write(dir.path().join("slow.json"), "{}").unwrap();
        let s = Settings {
            resamples: 300,
            sample_cap: 2000,
            ..Settings::default()
        };
        let c = compare(&base, &[same, dir.path().join("slow.json")], &s).unwrap();
        assert_eq!(c.baseline.values_seen, 2700);
        assert_eq!(c.baseline.values_used, 2000);
        assert_eq!(c.runs[1].run.csv, slow);
        assert!(c.runs[0].percentiles.iter().all(|p| !p.significant));
        let p50 = &c.runs[1].percentiles[0];
        assert!(
            p50.significant && p50.verdict.starts_with("p50 higher by"),
            "{p50:?}"
        );
        assert!(p50.diff.ci_low_ns <= 50_000.0 && 50_000.0 <= p50.diff.ci_high_ns);
        let text = render(&c);
        for needle in [
            "baseline",
            "2700 probes, a random 2000 of them used",
            "300 resamples",
            "p99.9",
            "no significant change",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in\n{text}");
        }
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["runs"][1]["percentiles"][0]["name"], "p50");
        assert!(json["runs"][1]["percentiles"][0]["ci_low_ns"].is_number());
        assert_eq!(json["metric"], "one-way");
    }

    /// Runs name their hosts in their JSON summaries: another host is one
    /// line of warning naming the facts, a summary without a host (older,
    /// or none next to the CSV) is "host unknown", neither fails.
    #[test]
    fn warns_when_the_hosts_differ_or_are_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let host = |cores: u32, idle: &str| {
            serde_json::json!({"sent": 1, "extra": {"host": {
                "cores": cores, "cpuidle_driver": idle, "cpuidle_governor": idle,
                "kernel": "6.18", "preemption": "none", "preemption_source": "x"}}})
            .to_string()
        };
        let base = write_csv(dir.path(), "base.csv", 0, 500);
        std::fs::write(dir.path().join("base.json"), host(2, "haltpoll")).unwrap();
        let same = write_csv(dir.path(), "same.csv", 0, 500);
        std::fs::write(dir.path().join("same.json"), host(2, "haltpoll")).unwrap();
        write_csv(dir.path(), "big.csv", 0, 500);
        std::fs::write(dir.path().join("big.json"), host(16, "none")).unwrap();
        let old = write_csv(dir.path(), "old.csv", 0, 500);
        std::fs::write(dir.path().join("old.json"), "{\"sent\": 1}").unwrap();
        let bare = write_csv(dir.path(), "bare.csv", 0, 500);
        let s = Settings {
            resamples: 50,
            ..Settings::default()
        };
        let c = compare(&base, &[same, dir.path().join("big.json"), old, bare], &s).unwrap();
        assert_eq!(c.baseline.host.as_ref().unwrap().cores, Some(2));
        let diffs: Vec<_> = c.runs.iter().map(|r| r.host_differences.clone()).collect();
        assert_eq!(diffs[0], Some(vec![]));
        assert_eq!(
            diffs[1],
            Some(vec![
                "cores 2 vs 16".to_string(),
                "cpuidle haltpoll/haltpoll vs none/none".to_string()
            ])
        );
        assert_eq!((diffs[2].clone(), diffs[3].clone()), (None, None));
        let text = render(&c);
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("host")).collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(
            lines[0],
            "  warning: another host than the baseline's (cores 2 vs 16, cpuidle haltpoll/haltpoll \
             vs none/none): a change may be the host's, not the path's"
        );
        assert!(
            lines[1].starts_with("  host unknown: no host section in ")
                && lines[1].contains("old.json")
        );
        assert!(lines[2].contains("bare.json"), "{}", lines[2]);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["runs"][1]["host"]["cores"], 16);
        assert!(json["runs"][2]["host_differences"].is_null());
    }

    #[test]
    fn unusable_inputs_are_one_line_errors_that_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let base = write_csv(dir.path(), "base.csv", 0, 10);
        let s = Settings::default();
        let err = |others: &[PathBuf], s: &Settings| {
            format!("{:#}", compare(&base, others, s).unwrap_err())
        };
        let lonely = dir.path().join("lonely.json");
        std::fs::write(&lonely, "{}").unwrap();
        let e = err(&[lonely], &s);
        assert!(e.contains("lonely.csv") && e.contains("--out"), "{e}");
        let e = err(&[dir.path().join("nope.csv")], &s);
        assert!(e.contains("no such file"), "{e}");
        let old = dir.path().join("old.csv");
        std::fs::write(&old, "seq,one_way_ns\n0,5\n").unwrap();
        let rtt = Settings {
            metric: CompareMetric::Rtt,
            ..s
        };
        let e = format!("{:#}", read_sample(&old, &rtt).unwrap_err());
        assert!(
            e.contains("no rtt_ns column") && e.contains("--metric one-way"),
            "{e}"
        );
        let other = dir.path().join("other.csv");
        std::fs::write(&other, "a,b\n1,2\n").unwrap();
        let e = format!("{:#}", read_sample(&other, &s).unwrap_err());
        assert!(
            e.contains("not an rtprobe CSV") && e.contains("--out"),
            "{e}"
        );
        let e = err(&[dir.path().join("gone.json")], &s);
        assert!(e.contains("gone.json: no such file"), "{e}");
        let lost = dir.path().join("lost.csv");
        std::fs::write(&lost, "seq,one_way_ns\n0,\n1,\n").unwrap();
        let e = format!("{:#}", read_sample(&lost, &s).unwrap_err());
        assert!(e.contains("nothing to compare"), "{e}");
        let bad = dir.path().join("bad.csv");
        std::fs::write(&bad, "seq,one_way_ns\n0,fast\n1,5\n").unwrap();
        let e = format!("{:#}", read_sample(&bad, &s).unwrap_err());
        assert!(e.contains("line 2") && e.contains("nanoseconds"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
