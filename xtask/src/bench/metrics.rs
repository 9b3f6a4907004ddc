//! The `/metrics` render time of 1000 targets at each series budget, from
//! the metrics_render criterion bench (part of the continuous section).

use std::process::Command;

use anyhow::{Result, bail};

use super::{
    run::output_text,
    table::{Row, row},
};

/// The metrics_render bench: `/metrics` of 1000 targets rendered at each
/// series budget, in the Prometheus text format (what a scrape without an
/// OpenMetrics Accept header gets), against issue 20's 200 ms.
pub(super) fn metrics_render_rows() -> Result<Vec<Row>> {
    let mut c = Command::new(crate::cargo());
    c.current_dir(crate::workspace_root()).args([
        "bench",
        "-q",
        "-p",
        "rtprobe",
        "--bench",
        "metrics_render",
    ]);
    let text = output_text(c, "cargo bench --bench metrics_render")?;
    let rows: Vec<Row> = text.lines().filter_map(render_row).collect();
    if rows.is_empty() {
        bail!("no render lines in its output: {text}");
    }
    Ok(rows)
}

/// "render rtt-24 Prometheus 29.9 ms 4.0 MB 38001 series (38 per target)
/// met" -> a row; None for any other line (criterion's own, OpenMetrics).
fn render_row(line: &str) -> Option<Row> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let ["render", budget, "Prometheus", ms, ..] = w[..] else {
        return None;
    };
    let series = w.iter().position(|t| *t == "series")?;
    let ms: f64 = ms.parse().ok()?;
    Some(row(
        &format!("/metrics render, 1000 targets, budget {budget}"),
        format!("{ms:.1} ms ({} series)", w[series - 1]),
        "-".into(),
        "<= 200 ms",
        Some(ms <= 200.0),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lines_become_rows() {
        let r = render_row(
            "render rtt-24 Prometheus     29.9 ms     4.0 MB    38001 series (38 per target)  met",
        )
        .unwrap();
        assert_eq!(r.rtprobe, "29.9 ms (38001 series)");
        assert_eq!(r.met, Some(true));
        assert!(r.metric.ends_with("budget rtt-24"));
        let slow = render_row(
            "render full   Prometheus    340.9 ms    58.3 MB   470001 series (470 per target)  NOT MET",
        )
        .unwrap();
        assert_eq!(slow.met, Some(false));
        assert!(render_row("render full OpenMetrics 368.3 ms 58.3 MB 470001 series").is_none());
        assert!(render_row("metrics_render_1000_targets/Prometheus/full").is_none());
    }
}
