//! `rtprobe plot FILE.json` of a `bench-forward --json` report: the XDP
//! thesis's axes in one figure of up to three panels, each drawn where the
//! report has its steps:
//!
//! - forwarded packets/s by packet size, per mode (flat-out steps of the
//!   router itself);
//! - forwarded packets/s by per-packet work (memory accesses, log axis),
//!   per mode, at the smallest size that has work steps;
//! - the bounce device: bounced packets/s by queue count (log2 axis) per
//!   hook (XDP_TX generic / native, AF_XDP), solid, and the same per core
//!   the device used, dashed.
//!
//! Pure: the report file in, the figure files out. The report is read
//! with a struct of its own (only the fields drawn), so the bench code's
//! types stay where they are.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use plotters::{coord::Shift, element::DashedPathElement, prelude::*};
use serde::Deserialize;

use super::{
    ImageFormat, PlotOptions,
    axis::{format_number, nice_ticks},
    draw::{FAMILY, Ticked, color, font, register_font},
};

/// Whether a file's text is a bench-forward JSON report: a JSON object
/// with its `machine`, `testbed_ids` and `steps` (in any order).
pub(crate) fn sniff(text: &[u8]) -> bool {
    let starts_as_object = text
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{');
    starts_as_object
        && serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(text).is_ok_and(
            |m| {
                ["machine", "testbed_ids", "steps"]
                    .iter()
                    .all(|k| m.contains_key(*k))
            },
        )
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Report {
    pub(crate) machine: Machine,
    pub(crate) steps: Vec<Step>,
    #[serde(default)]
    pub(crate) bounce: Vec<Bounce>,
    #[serde(default)]
    pub(crate) rt_priority: Option<u8>,
    #[serde(default)]
    pub(crate) perf_note: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) cpu_model: String,
    pub(crate) kernel: String,
    pub(crate) loadavg_at_start: f64,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Step {
    pub(crate) mode: String,
    pub(crate) work: Option<u32>,
    pub(crate) size: usize,
    pub(crate) load_pct: u32,
    pub(crate) forwarded_pps: f64,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Bounce {
    pub(crate) hook: String,
    pub(crate) queues: u32,
    pub(crate) bounced_pps: f64,
    pub(crate) bounced_pps_per_core: Option<f64>,
    /// IP packet bytes.
    pub(crate) size: usize,
}

/// Reads a bench-forward JSON report.
pub(crate) fn read(path: &Path) -> Result<Report> {
    let text = crate::input::read_text(
        path,
        "bench-forward JSON report",
        crate::input::MAX_REPORT_BYTES,
    )?;
    serde_json::from_str(&text).map_err(|e| {
        anyhow!(
            "{}:{}:{}: not a bench-forward JSON report ({e}): give the file `rtprobe \
             bench-forward --json FILE` wrote",
            path.display(),
            e.line(),
            e.column()
        )
    })
}

/// One line of a panel: points in axis coordinates.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Line {
    pub(crate) label: String,
    pub(crate) color: usize,
    pub(crate) dashed: bool,
    pub(crate) points: Vec<(f64, f64)>,
}

/// One panel, laid out: axis ranges, ticks with their labels, lines.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) x_desc: String,
    pub(crate) y_desc: String,
    pub(crate) x_range: (f64, f64),
    pub(crate) x_ticks: Vec<(f64, String)>,
    pub(crate) y_max: f64,
    pub(crate) lines: Vec<Line>,
    /// A legend line for the dashed style, when there is one.
    pub(crate) dashed_means: Option<String>,
}

/// The colour of a mode or hook: the same in every panel.
fn color_of(key: &str) -> usize {
    match key {
        "off" => 0,
        "skb" => 1,
        "native" => 2,
        "afxdp" => 3,
        "skb-pass" => 4,
        "native-pass" => 5,
        _ => 7,
    }
}

fn mode_name(mode: &str) -> String {
    match mode {
        "off" => "kernel forwarding".into(),
        "skb" => "XDP generic (skb)".into(),
        "native" => "XDP native".into(),
        "skb-pass" => "XDP generic, XDP_PASS".into(),
        "native-pass" => "XDP native, XDP_PASS".into(),
        m => m.into(),
    }
}

fn hook_name(hook: &str) -> String {
    match hook {
        "skb" => "XDP_TX generic (skb)".into(),
        "native" => "XDP_TX native".into(),
        "afxdp" => "AF_XDP (user space)".into(),
        h => h.into(),
    }
}

const MPPS: f64 = 1e6;

/// Distinct values in first-seen order.
fn distinct<T: PartialEq + Copy>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

/// The y axis top: the largest value with room above it for the legend.
fn y_top(lines: &[Line], legend_entries: usize) -> f64 {
    let max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let max = if max > 0.0 { max } else { 1.0 };
    max * (1.15 + 0.07 * legend_entries as f64)
}

/// Ticks at the values measured on a log axis: (log value, label).
fn log_ticks(values: &[f64], base: f64) -> Vec<(f64, String)> {
    values
        .iter()
        .map(|&v| (v.log(base), format_number(v)))
        .collect()
}

/// One line per mode of `steps`: forwarded Mpps against `x` of each step
/// (steps without an x are left out), sorted by x.
fn mode_lines(steps: &[&Step], x: impl Fn(&Step) -> Option<f64>) -> Vec<Line> {
    distinct(steps.iter().map(|s| s.mode.as_str()))
        .into_iter()
        .map(|m| {
            let mut points: Vec<(f64, f64)> = steps
                .iter()
                .filter(|s| s.mode == m)
                .filter_map(|s| Some((x(s)?, s.forwarded_pps / MPPS)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Line {
                label: mode_name(m),
                color: color_of(m),
                dashed: false,
                points,
            }
        })
        .collect()
}

/// The panels a report has data for, in order: sizes, work, bounce. Pure.
pub(crate) fn panels(r: &Report) -> Vec<Panel> {
    let flat: Vec<&Step> = r.steps.iter().filter(|s| s.load_pct >= 100).collect();
    [
        size_panel(&flat),
        work_panel(&flat),
        bounce_panel(&r.bounce),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Forwarded by packet size, the router itself (None: no such step).
fn size_panel(flat: &[&Step]) -> Option<Panel> {
    let plain: Vec<&Step> = flat.iter().copied().filter(|s| s.work.is_none()).collect();
    if plain.is_empty() {
        return None;
    }
    let mut sizes = distinct(plain.iter().map(|s| s.size));
    sizes.sort_unstable();
    let lines = mode_lines(&plain, |s| Some((s.size as f64).log2()));
    // Log2: the thesis's sizes (64, 128 ... 1500) evenly apart.
    let sizes: Vec<f64> = sizes.into_iter().map(|s| s as f64).collect();
    let (lo, hi) = (sizes[0].log2(), sizes.last().expect("not empty").log2());
    let pad = ((hi - lo) * 0.05).max(0.15);
    Some(Panel {
        title: "Router hop by packet size".into(),
        x_desc: "IP packet size (bytes, log2 scale)".into(),
        y_desc: "Forwarded (million packets/s)".into(),
        x_range: (lo - pad, hi + pad),
        x_ticks: log_ticks(&sizes, 2.0),
        y_max: y_top(&lines, lines.len()),
        lines,
        dashed_means: None,
    })
}

/// Forwarded by per-packet work, at the smallest size with work steps
/// (None: no such step).
fn work_panel(flat: &[&Step]) -> Option<Panel> {
    let worked: Vec<&Step> = flat.iter().copied().filter(|s| s.work.is_some()).collect();
    let size = worked.iter().map(|s| s.size).min()?;
    let at: Vec<&Step> = worked.iter().copied().filter(|s| s.size == size).collect();
    let mut works: Vec<f64> = distinct(at.iter().filter_map(|s| s.work))
        .into_iter()
        .map(f64::from)
        .collect();
    works.sort_by(f64::total_cmp);
    let lines = mode_lines(&at, |s| Some(f64::from(s.work?).log10()));
    let (lo, hi) = (works[0].log10(), works.last().expect("not empty").log10());
    let pad = ((hi - lo) * 0.04).max(0.1);
    Some(Panel {
        title: format!("Per-packet work, {size} B packets"),
        x_desc: "Memory accesses per packet (log scale)".into(),
        y_desc: "Forwarded (million packets/s)".into(),
        x_range: (lo - pad, hi + pad),
        x_ticks: log_ticks(&works, 10.0),
        y_max: y_top(&lines, lines.len()),
        lines,
        dashed_means: None,
    })
}

/// The bounce device by queue count (None: no bounce rows).
fn bounce_panel(bounce: &[Bounce]) -> Option<Panel> {
    if bounce.is_empty() {
        return None;
    }
    let mut queues: Vec<f64> = distinct(bounce.iter().map(|b| b.queues))
        .into_iter()
        .map(f64::from)
        .collect();
    queues.sort_by(f64::total_cmp);
    let mut lines = Vec::new();
    for h in distinct(bounce.iter().map(|b| b.hook.as_str())) {
        let rows: Vec<&Bounce> = bounce.iter().filter(|b| b.hook == h).collect();
        lines.extend(hook_lines(h, &rows));
    }
    let (lo, hi) = (queues[0].log2(), queues.last().expect("not empty").log2());
    let pad = ((hi - lo) * 0.05).max(0.15);
    let any_dashed = lines.iter().any(|l| l.dashed);
    let legend = lines.iter().filter(|l| !l.dashed).count() + any_dashed as usize;
    Some(Panel {
        title: format!("Bounce device, {} B, flat out", bounce[0].size),
        x_desc: "RX/TX queues of the device's veth (log2 scale)".into(),
        y_desc: "Bounced (million packets/s)".into(),
        x_range: (lo - pad, hi + pad),
        x_ticks: log_ticks(&queues, 2.0),
        y_max: y_top(&lines, legend),
        lines,
        dashed_means: any_dashed.then(|| "dashed: per core the device used".to_string()),
    })
}

/// One hook's bounce lines: the total by queue count and, dashed, per
/// core where known.
fn hook_lines(h: &str, rows: &[&Bounce]) -> Vec<Line> {
    let mut total: Vec<(f64, f64)> = rows
        .iter()
        .map(|b| (f64::from(b.queues).log2(), b.bounced_pps / MPPS))
        .collect();
    total.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut per_core: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|b| Some((f64::from(b.queues).log2(), b.bounced_pps_per_core? / MPPS)))
        .collect();
    per_core.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut lines = vec![Line {
        label: hook_name(h),
        color: color_of(h),
        dashed: false,
        points: total,
    }];
    if !per_core.is_empty() {
        lines.push(Line {
            label: String::new(),
            color: color_of(h),
            dashed: true,
            points: per_core,
        });
    }
    lines
}

/// The figure's notes: the machine and what else ran on it.
pub(crate) fn notes(r: &Report) -> Vec<String> {
    let m = &r.machine;
    let mut n = vec![format!(
        "{} CPU(s), {}, kernel {}; load average {:.2} when the run started (other work shares these cores); {}",
        m.cpus,
        m.cpu_model,
        m.kernel,
        m.loadavg_at_start,
        match r.rt_priority {
            Some(p) => format!("generator and device threads SCHED_FIFO {p}"),
            None => "normal scheduling".into(),
        }
    )];
    if let Some(p) = &r.perf_note {
        n.push(if p.contains("no hardware event") {
            "perf stat: this machine counts no hardware event (no PMU in this VM), so IPC, \
             branch and L1 misses are unknown"
                .to_string()
        } else {
            p.chars().take(160).collect()
        });
    }
    n
}

/// Draws `bench-forward --json` reports given to `rtprobe plot`: one
/// figure per report, `PREFIX-forwarding.{svg,png}`.
pub(crate) fn plot(opts: &PlotOptions) -> Result<Vec<PathBuf>> {
    if opts.inputs.len() != 1 {
        bail!(
            "give one bench-forward JSON report at a time ({} given): it is drawn as one figure",
            opts.inputs.len()
        );
    }
    let path = &opts.inputs[0];
    let report = read(path)?;
    let panels = panels(&report);
    if panels.is_empty() {
        bail!(
            "{}: no flat-out step to draw (the figure shows load 100 % steps and bounce steps): \
             run bench-forward with --load 100",
            path.display()
        );
    }
    super::prepare_out_dir(&opts.out_dir)?;
    let title = opts.title.clone().unwrap_or_else(|| {
        "rtprobe bench-forward: the XDP thesis's axes on the veth testbed".into()
    });
    let notes = notes(&report);
    let mut written = Vec::new();
    for &format in &opts.formats {
        let ext = match format {
            ImageFormat::Svg => "svg",
            ImageFormat::Png => "png",
        };
        let out = opts
            .out_dir
            .join(format!("{}-forwarding.{ext}", opts.prefix));
        // Each panel needs room for its axis labels and legend.
        let size = (
            opts.size_px.0.max(PANEL_MIN_PX * panels.len() as u32),
            opts.size_px.1,
        );
        save(&panels, &title, &notes, &out, format, size)?;
        written.push(out);
    }
    Ok(written)
}

/// Narrowest panel: a wider --figure-size is kept, a narrower one widened.
pub(crate) const PANEL_MIN_PX: u32 = 480;

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn save(
    panels: &[Panel],
    title: &str,
    notes: &[String],
    path: &Path,
    format: ImageFormat,
    size: (u32, u32),
) -> Result<()> {
    register_font();
    let fail = |e: String| anyhow!("cannot write {}: {e}", path.display());
    match format {
        ImageFormat::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw_all(panels, title, notes, &root).map_err(|e| fail(e.to_string()))?;
            root.present().map_err(|e| fail(e.to_string()))
        }
        ImageFormat::Png => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw_all(panels, title, notes, &root).map_err(|e| fail(e.to_string()))?;
            root.present().map_err(|e| fail(e.to_string()))
        }
    }
}

/// The figure as an SVG document in memory (for tests).
#[cfg(test)]
pub(crate) fn to_svg_string(
    panels: &[Panel],
    title: &str,
    notes: &[String],
    size: (u32, u32),
) -> Result<String> {
    register_font();
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        draw_all(panels, title, notes, &root).map_err(|e| anyhow!("cannot draw: {e}"))?;
        root.present().map_err(|e| anyhow!("cannot draw: {e}"))?;
    }
    Ok(out)
}

fn draw_all<DB: DrawingBackend>(
    panels: &[Panel],
    title: &str,
    notes: &[String],
    root: &DrawingArea<DB, Shift>,
) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let (_, h) = root.dim_in_pixel();
    let area = root.titled(title, (FAMILY, 20.0).into_font().color(&BLACK))?;
    let notes_px = 8 + 16 * notes.len() as u32;
    let (plots, foot) = area.split_vertically(h.saturating_sub(30 + notes_px).max(100));
    for (i, n) in notes.iter().enumerate() {
        foot.draw(&Text::new(
            n.clone(),
            (10, 4 + 16 * i as i32),
            font(12.0).color(&RGBColor(0x44, 0x44, 0x44)),
        ))?;
    }
    let cells = plots.split_evenly((1, panels.len()));
    for (p, cell) in panels.iter().zip(&cells) {
        draw_panel(p, cell)?;
    }
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(p: &Panel, area: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
    let ticks: Vec<f64> = p.x_ticks.iter().map(|t| t.0).collect();
    let labels = p.x_ticks.clone();
    let y_ticks = nice_ticks(0.0, p.y_max, 6)
        .into_iter()
        .filter(|&y| y <= p.y_max)
        .collect();
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, font(16.0))
        .margin(10)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(
            Ticked::new(p.x_range.0, p.x_range.1, ticks),
            Ticked::new(0.0, p.y_max, y_ticks),
        )?;
    let x_label = move |x: &f64| {
        labels
            .iter()
            .find(|t| (t.0 - x).abs() < 1e-9)
            .map_or_else(String::new, |t| t.1.clone())
    };
    chart
        .configure_mesh()
        .x_desc(p.x_desc.as_str())
        .y_desc(p.y_desc.as_str())
        .x_label_formatter(&x_label)
        .y_label_formatter(&|y: &f64| format_number(*y))
        .label_style(font(13.0))
        .axis_desc_style(font(13.0))
        .draw()?;
    for line in &p.lines {
        let c = color(line.color);
        let style = c.stroke_width(2);
        if line.dashed {
            chart.draw_series(std::iter::once(DashedPathElement::new(
                line.points.clone(),
                6,
                4,
                style,
            )))?;
            chart.draw_series(
                line.points
                    .iter()
                    .map(|&pt| TriangleMarker::new(pt, 4, c.filled())),
            )?;
        } else {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    line.points.clone(),
                    style,
                )))?
                .label(line.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3))
                });
            chart.draw_series(line.points.iter().map(|&pt| Circle::new(pt, 4, c.filled())))?;
        }
    }
    if let Some(text) = &p.dashed_means {
        let grey = RGBColor(0x55, 0x55, 0x55);
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label(text.as_str())
            .legend(move |(x, y)| {
                DashedPathElement::new(vec![(x, y), (x + 18, y)], 4, 3, grey.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .label_font(font(12.0))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let step = |mode: &str, work: Option<u32>, size, pps| Step {
            mode: mode.into(),
            work,
            size,
            load_pct: 100,
            forwarded_pps: pps,
        };
        let bounce = |hook: &str, queues, pps, per_core| Bounce {
            hook: hook.into(),
            queues,
            bounced_pps: pps,
            bounced_pps_per_core: Some(per_core),
            size: 64,
        };
        Report {
            machine: Machine {
                cpus: 2,
                cpu_model: "Test CPU".into(),
                kernel: "6.18".into(),
                loadavg_at_start: 3.5,
            },
            rt_priority: Some(50),
            perf_note: Some("perf stat ran, but this machine counts no hardware event (x)".into()),
            steps: vec![
                step("off", None, 64, 300e3),
                step("native", None, 64, 700e3),
                step("native", None, 1500, 600e3),
                step("off", None, 1500, 250e3),
                step("native", Some(12800), 64, 40e3),
                step("native", Some(1), 64, 650e3),
                step("native", Some(1), 1500, 500e3),
                Step {
                    load_pct: 50,
                    ..step("native", Some(100), 64, 1.0)
                },
            ],
            bounce: vec![
                bounce("native", 2, 2.9e6, 3.4e6),
                bounce("native", 1, 2.1e6, 2.4e6),
                bounce("afxdp", 1, 0.45e6, 0.3e6),
            ],
        }
    }

    #[test]
    fn sniffs_bench_reports_only() {
        assert!(sniff(
            b" {\"steps\": [], \"machine\": {\"cpus\": 2}, \"testbed_ids\": []}"
        ));
        assert!(!sniff(
            b"{\"machine\": {}, \"testbed_ids\": [], \"steps\": "
        ));
        assert!(!sniff(b"# rtprobe 0.1\nseq,flow\n"));
        assert!(!sniff(b"{\"sent\": 10, \"received\": 9}"));
    }

    #[test]
    fn panels_follow_the_data() {
        let p = panels(&report());
        assert_eq!(p.len(), 3);
        // Sizes: flat-out steps of the router itself, per mode, by size.
        assert_eq!(p[0].lines.len(), 2);
        assert_eq!(p[0].lines[1].label, "XDP native");
        assert_eq!(
            p[0].lines[1].points,
            vec![(6.0, 0.7), (1500f64.log2(), 0.6)]
        );
        assert_eq!(p[0].x_ticks[0], (6.0, "64".into()));
        assert_eq!(p[0].x_ticks.len(), 2);
        // Work: the smallest size with work steps, log10 x, paced steps left out.
        assert_eq!(p[1].title, "Per-packet work, 64 B packets");
        let w = &p[1].lines[0].points;
        assert_eq!(w.len(), 2);
        assert_eq!(w[0], (0.0, 0.65));
        assert!((w[1].0 - 12800f64.log10()).abs() < 1e-12);
        assert_eq!(p[1].x_ticks[1].1, "12800");
        // Bounce: log2 queues, solid total and dashed per core per hook.
        let b = &p[2];
        assert_eq!(b.lines.len(), 4);
        assert_eq!(b.lines[0].points, vec![(0.0, 2.1), (1.0, 2.9)]);
        assert!(b.lines[1].dashed);
        assert_eq!(b.lines[2].label, "AF_XDP (user space)");
        assert_eq!(b.x_ticks, vec![(0.0, "1".into()), (1.0, "2".into())]);
        for panel in &p {
            let top = panel
                .lines
                .iter()
                .flat_map(|l| l.points.iter().map(|q| q.1))
                .fold(0.0, f64::max);
            assert!(panel.y_max > top, "{}: data under the top", panel.title);
        }
    }

    #[test]
    fn figure_has_titles_legends_and_notes() {
        let r = report();
        let svg = to_svg_string(&panels(&r), "T", &notes(&r), (1500, 500)).unwrap();
        for text in [
            "Per-packet work, 64 B packets",
            "Memory accesses per packet (log scale)",
            "12800",
            "XDP_TX native",
            "AF_XDP (user space)",
            "dashed: per core the device used",
            "load average 3.50",
            "no hardware event (no PMU in this VM)",
            "Forwarded (million packets/s)",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        // Only the sizes panel when the report has nothing else.
        let mut r = report();
        r.bounce.clear();
        r.steps.retain(|s| s.work.is_none());
        assert_eq!(panels(&r).len(), 1);
        r.steps.clear();
        assert!(panels(&r).is_empty());
    }
}
