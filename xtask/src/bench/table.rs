//! The bench's result: one row per figure, printed as an aligned table
//! with the target next to it and whether it was met.

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Row {
    pub metric: String,
    pub rtprobe: String,
    pub peer: String,
    pub target: String,
    pub met: Option<bool>,
    /// Why a target was not met, from the run's own figures (printed on
    /// the line below the row).
    pub why: Option<String>,
}

impl Row {
    /// The row with the reason it is not met.
    pub fn because(mut self, why: String) -> Self {
        self.why = Some(why);
        self
    }
}

pub(super) fn row(
    metric: &str,
    rtprobe: String,
    peer: String,
    target: &str,
    met: Option<bool>,
) -> Row {
    Row {
        metric: metric.into(),
        rtprobe,
        peer,
        target: target.into(),
        met,
        why: None,
    }
}

pub(super) fn us(ns: Option<u64>) -> String {
    ns.map_or("-".into(), |v| format!("{:.1} µs", v as f64 / 1000.0))
}

/// The table, aligned. Pure.
pub(super) fn format_table(rows: &[Row]) -> String {
    let w = |f: &dyn Fn(&Row) -> usize, h: &str| rows.iter().map(f).max().unwrap_or(0).max(h.len());
    let (wm, wr, wp, wt) = (
        w(&|r| r.metric.chars().count(), "metric"),
        w(&|r| r.rtprobe.chars().count(), "rtprobe"),
        w(&|r| r.peer.chars().count(), "peers / reference"),
        w(&|r| r.target.chars().count(), "target"),
    );
    let pad = |s: &str, n: usize| format!("{s}{}", " ".repeat(n.saturating_sub(s.chars().count())));
    let mut o = format!(
        "{}  {}  {}  {}  met\n",
        pad("metric", wm),
        pad("rtprobe", wr),
        pad("peers / reference", wp),
        pad("target", wt)
    );
    for r in rows {
        o += &format!(
            "{}  {}  {}  {}  {}\n",
            pad(&r.metric, wm),
            pad(&r.rtprobe, wr),
            pad(&r.peer, wp),
            pad(&r.target, wt),
            match r.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            }
        );
        if let (Some(false), Some(why)) = (r.met, &r.why) {
            o += &format!("  not met: {why}\n");
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_marks_targets() {
        let t = format_table(&[
            row("a", "1".into(), "2".into(), "<= 2", Some(true)),
            row("bb", "3".into(), "-".into(), "-", None),
            row("c", "9".into(), "2".into(), "<= 2", Some(false)).because("slow".into()),
            row("d", "1".into(), "2".into(), "<= 2", Some(true)).because("unused".into()),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("metric"));
        assert!(lines[1].ends_with("yes") && lines[2].ends_with('-') && lines[3].ends_with("NO"));
        // Columns line up.
        assert_eq!(lines[1].find("<= 2"), lines[3].find("<= 2"));
        // The reason follows a row not met, and only such a row.
        assert_eq!(lines[4], "  not met: slow");
        assert!(lines[5].starts_with('d') && lines.len() == 6);
    }
}
