//! The two exposition formats and which one a scrape gets.
//!
//! prometheus-client writes OpenMetrics text. A scraper that does not ask
//! for OpenMetrics in its `Accept` header (curl, older Prometheus,
//! `promtool check metrics`) reads the Prometheus text format 0.0.4, whose
//! counters are described under their sample name (`x_total`, where
//! OpenMetrics says `x`) and which has no `# UNIT` or `# EOF`: the
//! OpenMetrics body is rewritten to it line by line, the samples copied
//! as they are.

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format, version 0.0.4.
    Prometheus,
    /// OpenMetrics text 1.0.0.
    OpenMetrics,
}

impl Format {
    /// The `Content-Type` the body is served under.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The format for a request's `Accept` header: OpenMetrics when it
    /// names `application/openmetrics-text` with a quality at least that
    /// of any text type it also accepts, the Prometheus text format
    /// otherwise (no header, `*/*`, `text/plain`, or OpenMetrics refused
    /// with q=0).
    pub(crate) fn negotiate(accept: Option<&str>) -> Format {
        let (mut openmetrics_q, mut text_q) = (0.0f32, 0.0f32);
        for range in accept.unwrap_or("").split(',') {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or("").to_ascii_lowercase();
            let q = params
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, v)| v.trim().parse().unwrap_or(0.0));
            match media.as_str() {
                "application/openmetrics-text" => openmetrics_q = openmetrics_q.max(q),
                "text/plain" | "text/*" | "*/*" => text_q = text_q.max(q),
                _ => {}
            }
        }
        if openmetrics_q > 0.0 && openmetrics_q >= text_q {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition as
/// prometheus-client writes it: every family's `# HELP` just before its
/// `# TYPE`. Counters are described under `name_total`, `# UNIT` and
/// `# EOF` go; every sample line is copied unchanged.
pub(super) fn prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.split_inclusive('\n') {
        if !line.starts_with('#') {
            out.push_str(line);
            continue;
        }
        let body = line.trim_end_matches('\n');
        if let Some(rest) = body.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
        } else if let Some(rest) = body.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" if !name.ends_with("_total") => (format!("{name}_total"), kind),
                "unknown" => (name.to_string(), "untyped"),
                _ => (name.to_string(), kind),
            };
            if let Some((_, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
        } else if !(body.starts_with("# UNIT ") || body == "# EOF") {
            out.push_str(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for() {
        use Format::*;
        // What Prometheus 2.x sends by default.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        for (accept, want) in [
            (None, Prometheus),
            (Some(""), Prometheus),
            (Some("*/*"), Prometheus),
            (Some("text/plain"), Prometheus),
            (Some("text/plain;version=0.0.4"), Prometheus),
            (Some("application/json"), Prometheus),
            (Some(prometheus), OpenMetrics),
            (Some("application/openmetrics-text"), OpenMetrics),
            (
                Some("Application/OpenMetrics-Text; version=1.0.0"),
                OpenMetrics,
            ),
            (
                Some("text/plain;q=0.9, application/openmetrics-text;q=0.5"),
                Prometheus,
            ),
            (Some("application/openmetrics-text;q=0, */*"), Prometheus),
            (
                Some("application/openmetrics-text; q=1, text/plain; q=1"),
                OpenMetrics,
            ),
            (Some("application/openmetrics-text;q=bogus"), Prometheus),
        ] {
            assert_eq!(Format::negotiate(accept), want, "{accept:?}");
        }
        assert!(
            Prometheus
                .content_type()
                .starts_with("text/plain; version=0.0.4")
        );
        assert!(
            OpenMetrics
                .content_type()
                .starts_with("application/openmetrics-text")
        );
    }

    #[test]
    fn counters_are_described_under_their_sample_name() {
        let om = "# HELP rtprobe_probes_sent Probes sent.\n\
                  # TYPE rtprobe_probes_sent counter\n\
                  rtprobe_probes_sent_total{target=\"t\"} 7\n\
                  # HELP rtprobe_rtt_seconds Round-trip time.\n\
                  # TYPE rtprobe_rtt_seconds histogram\n\
                  # UNIT rtprobe_rtt_seconds seconds\n\
                  rtprobe_rtt_seconds_sum{target=\"t\"} 0.5\n\
                  # HELP rtprobe_xdp_mode_info The mode.\n\
                  # TYPE rtprobe_xdp_mode_info gauge\n\
                  rtprobe_xdp_mode_info{requested=\"auto\"} 1\n\
                  # EOF\n";
        assert_eq!(
            prometheus_text(om),
            "# HELP rtprobe_probes_sent_total Probes sent.\n\
             # TYPE rtprobe_probes_sent_total counter\n\
             rtprobe_probes_sent_total{target=\"t\"} 7\n\
             # HELP rtprobe_rtt_seconds Round-trip time.\n\
             # TYPE rtprobe_rtt_seconds histogram\n\
             rtprobe_rtt_seconds_sum{target=\"t\"} 0.5\n\
             # HELP rtprobe_xdp_mode_info The mode.\n\
             # TYPE rtprobe_xdp_mode_info gauge\n\
             rtprobe_xdp_mode_info{requested=\"auto\"} 1\n"
        );
    }
}
