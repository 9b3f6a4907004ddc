//! The fetch load in report.md: one cell's fetch times, and whether the
//! bufferbloat study's ordering of fetch times (study §5) reappears across
//! a scenario's cells. Kept apart from report.rs's table layout; pure, no
//! kernel.
//!
//! The study (Mininet, one long TCP flow through a switch queue of 20 or
//! 100 packets, a web page fetched repeatedly) measured: reno q=20
//! 3.30 s ± 0.82, q=100 9.96 s ± 3.17; bbr q=20 2.47 s, q=100 1.78 s ± 0.05.
//! Its ordering, as four pairwise relations:
//! - reno: q=20 is faster than q=100 (the big queue's delay, ~3x);
//! - bbr: q=100 is faster than q=20 (bbr keeps the queue short itself, and
//!   loses less to drops in the larger buffer);
//! - bbr is faster than reno at q=20 and at q=100.

use std::fmt::Write as _;

use super::ReportRow;
use crate::tune::{FetchTimes, QueueLimit};

/// ", fetch 0.512 ± 0.101 s (p50 0.490, p99 0.800, n 12, 0 failed)".
pub(crate) fn fetch_cell(t: &FetchTimes) -> String {
    let s3 = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.3}"));
    format!(
        ", fetch {} ± {} s (p50 {}, p99 {}, n {}, {} failed)",
        s3(t.mean_s),
        s3(t.sd_s),
        s3(t.p50_s),
        s3(t.p99_s),
        t.count,
        t.failures
    )
}

/// One cell as the study sees it: the congestion control of its bulk flow
/// (of the fetches if there is none), its queue in packets, its fetch times.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FetchCell {
    pub(crate) cc: String,
    pub(crate) queue_packets: u32,
    pub(crate) times: FetchTimes,
}

/// The study's relations: (cc, queue) of the faster cell, of the slower
/// one, and the study's two means in seconds.
/// A cell of the study: (congestion control, queue in packets).
type StudyCell = (&'static str, u32);

const STUDY: [(StudyCell, StudyCell, f64, f64); 4] = [
    (("reno", 20), ("reno", 100), 3.30, 9.96),
    (("bbr", 100), ("bbr", 20), 1.78, 2.47),
    (("bbr", 20), ("reno", 20), 2.47, 3.30),
    (("bbr", 100), ("reno", 100), 1.78, 9.96),
];

/// The cells of a run that have a fetch load and a queue in packets.
pub(crate) fn fetch_cells(rows: &[ReportRow<'_>]) -> Vec<FetchCell> {
    let mut out = Vec::new();
    for r in rows {
        let (Ok(res), Some(QueueLimit::Packets(q))) = (r.result, r.cell.run.knobs.queue_limit)
        else {
            continue;
        };
        let Some(rep) = &res.summary.report.load else {
            continue;
        };
        let Some(fetch) = rep.flows.iter().find(|f| f.kind == "fetch") else {
            continue;
        };
        let Some(times) = fetch.fetch.clone() else {
            continue;
        };
        let cc = rep
            .flows
            .iter()
            .find(|f| f.kind == "tcp")
            .and_then(|f| f.cc.clone())
            .or_else(|| fetch.cc.clone())
            .unwrap_or_else(|| "?".into());
        out.push(FetchCell {
            cc,
            queue_packets: q,
            times,
        });
    }
    out
}

/// True when two means differ by less than twice their combined standard
/// error: the order between them may be the machine's noise.
fn within_noise(a: &FetchTimes, b: &FetchTimes) -> bool {
    let se2 = |t: &FetchTimes| match (t.sd_s, t.count) {
        (Some(sd), n) if n > 0 => sd * sd / n as f64,
        _ => f64::INFINITY,
    };
    match (a.mean_s, b.mean_s) {
        (Some(x), Some(y)) => (x - y).abs() < 2.0 * (se2(a) + se2(b)).sqrt(),
        _ => true,
    }
}

/// A "## Fetch times vs the study" section, or None without fetch cells.
pub(crate) fn study_section(cells: &[FetchCell]) -> Option<String> {
    if cells.is_empty() {
        return None;
    }
    let (lines, t) = compare_with_study(cells);
    let mut s = String::from("## Fetch times vs the study\n\n");
    let _ = write!(s, "{}", verdict(&t));
    if t.compared > 0 {
        // A drop at a small tail-drop queue costs a fetch a 1 s SYN or
        // retransmission timeout: a few such fetches move the mean, not the
        // median.
        let _ = write!(
            s,
            " Compared by median fetch time, {} of {} hold (a few fetches that \
             lost their SYN or first flight wait a 1 s timeout: they move the mean, not the median).",
            t.held_p50, t.compared
        );
    }
    let _ = writeln!(s, "\n");
    for l in &lines {
        let _ = writeln!(s, "{l}");
    }
    write_others(&mut s, cells);
    s.push('\n');
    Some(s)
}

/// How many of the study's relations could be checked, held (by mean
/// and by median), and were within the noise.
#[derive(Default)]
struct Tally {
    compared: u32,
    held: u32,
    noisy: u32,
    held_p50: u32,
}

/// One line per relation of the study the cells can check, and the tally.
fn compare_with_study(cells: &[FetchCell]) -> (Vec<String>, Tally) {
    let find = |(cc, q): (&str, u32)| {
        cells
            .iter()
            .find(|c| c.cc == cc && c.queue_packets == q && c.times.mean_s.is_some())
    };
    let mut lines = Vec::new();
    let mut t = Tally::default();
    for (fast, slow, sf, ss) in STUDY {
        let (Some(a), Some(b)) = (find(fast), find(slow)) else {
            continue;
        };
        let (ma, mb) = (a.times.mean_s.unwrap_or(0.0), b.times.mean_s.unwrap_or(0.0));
        t.compared += 1;
        let holds = ma < mb;
        t.held += holds as u32;
        let noise = within_noise(&a.times, &b.times);
        t.noisy += noise as u32;
        let p50 = |c: &FetchCell| c.times.p50_s.map_or("–".into(), |v| format!("{v:.3}"));
        t.held_p50 += matches!((a.times.p50_s, b.times.p50_s), (Some(x), Some(y)) if x < y) as u32;
        lines.push(format!(
            "- {} q={} faster than {} q={} (study {sf:.2} vs {ss:.2} s): here {ma:.3} vs {mb:.3} s, \
             **{}**{}; medians {} vs {} s",
            fast.0,
            fast.1,
            slow.0,
            slow.1,
            if holds { "holds" } else { "reversed" },
            if noise {
                " (within twice the standard error: not a clear difference)"
            } else {
                ""
            },
            p50(a),
            p50(b)
        ));
    }
    (lines, t)
}

/// Whether the study's ordering reappears, in one sentence.
fn verdict(t: &Tally) -> String {
    let noisy = t.noisy;
    match (t.compared, t.held) {
        (0, _) => "None of the study's relations can be checked: the run lacks a reno or bbr \
                   pair at queues of 20 and 100 packets."
            .to_string(),
        (n, h) if h == n && noisy == 0 => {
            format!("The study's ordering of fetch times reappears: all {n} of its relations hold.")
        }
        (n, h) if h == n => format!(
            "The study's ordering of fetch times reappears in direction: all {n} of its relations \
             hold, {noisy} of them within the noise."
        ),
        (n, 0) => format!(
            "The study's ordering of fetch times does not reappear: none of its {n} relations hold."
        ),
        (n, h) => format!(
            "The study's ordering of fetch times reappears in part: {h} of its {n} relations hold."
        ),
    }
}

/// The cells of congestion controls the study did not measure.
fn write_others(s: &mut String, cells: &[FetchCell]) {
    let others: Vec<&FetchCell> = cells
        .iter()
        .filter(|c| c.cc != "reno" && c.cc != "bbr")
        .collect();
    if others.is_empty() {
        return;
    }
    let _ = writeln!(s, "\nNot in the study:");
    for c in others {
        let _ = writeln!(
            s,
            "- {} q={}: {}",
            c.cc,
            c.queue_packets,
            fetch_cell(&c.times).trim_start_matches(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(cc: &str, q: u32, mean: f64, sd: f64, n: u64) -> FetchCell {
        FetchCell {
            cc: cc.into(),
            queue_packets: q,
            times: FetchTimes {
                size_bytes: 102_400,
                count: n,
                mean_s: Some(mean),
                sd_s: Some(sd),
                ..Default::default()
            },
        }
    }

    #[test]
    fn the_study_s_own_numbers_reappear() {
        let cells = [
            cell("reno", 20, 3.30, 0.82, 20),
            cell("reno", 100, 9.96, 3.17, 20),
            cell("bbr", 20, 2.47, 0.1, 20),
            cell("bbr", 100, 1.78, 0.05, 20),
            cell("cubic", 100, 1.0, 0.1, 20),
        ];
        let s = study_section(&cells).unwrap();
        assert!(s.contains("reappears: all 4"), "{s}");
        // No medians given: none counted.
        assert!(s.contains("by median fetch time, 0 of 4"), "{s}");
        assert!(s.contains("cubic q=100: fetch 1.000"), "{s}");
    }

    #[test]
    fn a_reversed_pair_and_noise_are_said() {
        let cells = [
            cell("reno", 20, 0.5, 0.1, 20),
            cell("reno", 100, 1.5, 0.1, 20),
            // bbr q100 slower than q20, by less than the noise.
            cell("bbr", 20, 0.40, 0.2, 10),
            cell("bbr", 100, 0.45, 0.2, 10),
        ];
        let mut cells = cells;
        cells[0].times.p50_s = Some(0.3);
        cells[1].times.p50_s = Some(0.5);
        let s = study_section(&cells).unwrap();
        assert!(s.contains("in part: 3 of its 4"), "{s}");
        assert!(s.contains("by median fetch time, 1 of 4"), "{s}");
        assert!(s.contains("medians 0.300 vs 0.500 s"), "{s}");
        assert!(s.contains("**reversed** (within twice"), "{s}");
        let s = study_section(&[cell("cubic", 20, 1.0, 0.1, 5)]).unwrap();
        assert!(s.contains("None of the study's relations"), "{s}");
        assert_eq!(study_section(&[]), None);
    }
}
