//! The label sets of the metric families, and the one list of the label
//! names they use ([`RESERVED`]). Every probe series carries
//! [`FlowLabels`] first (flattened into the families that add a label of
//! their own), so a label that every series of a target carries is added
//! in that one struct.

use prometheus_client::encoding::EncodeLabelSet;

/// Every label name rtprobe's own series carry, and those Prometheus adds
/// itself (`instance`, `job` at the scrape, `le` and `quantile` in its
/// histograms and summaries). A targets file's labels are added to every
/// series of their target, so one of these there would give a series the
/// same label twice, which Prometheus refuses (the whole scrape fails). A
/// unit test checks that every label of a full exposition is listed here.
pub(crate) const RESERVED: [&str; 20] = [
    // FlowLabels, on every probe series.
    "target",
    "flow",
    "tos",
    "size",
    // The probe families' own.
    "stage",
    "direction",
    "source",
    // The process's: XDP mode, reflector outcomes, a target's failed
    // step, build info.
    "requested",
    "attached",
    "outcome",
    "step",
    "version",
    "command",
    // rtprobe flows': a process's name, a cgroup, a program counter.
    "comm",
    "cgroup",
    "counter",
    // Prometheus's.
    "le",
    "quantile",
    "instance",
    "job",
];

/// Refuses a user's label name that one of rtprobe's own series carries,
/// or that Prometheus keeps for itself (`__*`): the one-line error names it.
pub(crate) fn check_user_label(name: &str) -> Result<(), String> {
    if name.starts_with("__") {
        return Err(format!(
            "{name:?} is reserved (names starting with __ are Prometheus's): rename it"
        ));
    }
    if RESERVED.contains(&name) {
        return Err(format!(
            "{name:?} is reserved (rtprobe's own series carry {}): rename it",
            RESERVED.join(", ")
        ));
    }
    Ok(())
}

/// What tells one probe flow from another.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowLabels {
    /// Where the probes go, e.g. "10.99.2.2:5061".
    pub(crate) target: String,
    /// Flow id (0 = the main flow).
    pub(crate) flow: String,
    /// IP TOS byte, e.g. "0xc0".
    pub(crate) tos: String,
    /// UDP payload bytes.
    pub(crate) size: String,
    /// A targets file's labels of this target (`site="fra1"`...).
    #[prometheus(flatten)]
    pub(crate) extra: Vec<(String, String)>,
}

impl FlowLabels {
    pub fn new(target: impl Into<String>, flow: u8, tos: u8, size: usize) -> Self {
        Self {
            target: target.into(),
            flow: flow.to_string(),
            tos: format!("{tos:#04x}"),
            size: size.to_string(),
            extra: Vec::new(),
        }
    }

    /// With the target's own labels (names checked by the targets file).
    pub(crate) fn with_extra(
        mut self,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Self {
        self.extra = labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        self
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StageLabels {
    #[prometheus(flatten)]
    pub(super) flow: FlowLabels,
    /// The stage's key (`sender_queue`, `path`...).
    pub(super) stage: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LostLabels {
    #[prometheus(flatten)]
    pub(super) flow: FlowLabels,
    /// "forward" (never reached the receiver), "return" (the echo did
    /// not come back) or "unknown" (the in-kernel reflector answers: an
    /// echo that did not come back could have been lost either way).
    pub(super) direction: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct XdpLabels {
    pub(super) requested: String,
    pub(super) attached: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SourceLabels {
    #[prometheus(flatten)]
    pub(super) flow: FlowLabels,
    /// "hardware", "software", "mixed" or "none" (nothing received yet).
    pub(super) source: String,
}

/// `rtprobe flows`: a group of sampled sends (a process name in a cgroup).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PassiveLabels {
    pub(super) comm: String,
    pub(super) cgroup: String,
}

/// `rtprobe flows`: one stage of a group's sends.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PassiveStageLabels {
    #[prometheus(flatten)]
    pub(super) group: PassiveLabels,
    pub(super) stage: String,
}

/// `rtprobe flows`: one of the sock_ops program's counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CounterLabels {
    pub(super) counter: String,
}

/// What the reflector did with a datagram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabels {
    pub(super) outcome: String,
}

/// A target that failed to open, and at which step.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StepLabels {
    #[prometheus(flatten)]
    pub(super) flow: FlowLabels,
    /// "resolve", "socket" or "connect".
    pub(super) step: String,
}

/// `rtprobe_build_info`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BuildLabels {
    pub(super) version: String,
    /// "probe" or "reflect".
    pub(super) command: String,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        export::metrics::{Format, Metrics},
        model::record::ProbeRecord,
        stats::{Counts, report::ReflectorCounters},
    };

    /// The label names of every sample line of an exposition.
    fn label_names(text: &str) -> std::collections::BTreeSet<String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                l.split_once('{')?
                    .1
                    .split_once('}')
                    .map(|(ls, _)| ls.to_string())
            })
            .flat_map(|ls| {
                ls.split(',')
                    .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// [`RESERVED`] holds every label a probe run and a reflector emit,
    /// with every family filled: a new label must join the list.
    #[test]
    fn every_label_rtprobe_emits_is_reserved() {
        let probe = Arc::new(Metrics::new());
        probe.set_xdp_mode("auto", "native");
        let mut f = probe.flow(FlowLabels::new("t", 0, 0, 64), false);
        f.observe(&ProbeRecord {
            one_way_ns: Some(1_000),
            rtt_ns: Some(2_000),
            path_ns: Some(500),
            ..Default::default()
        });
        f.update(&Counts::default(), "software");
        let mut k = probe.flow(FlowLabels::new("k", 0, 0, 64), true);
        k.update(&Counts::default(), "software");
        let reflector = Metrics::for_reflector();
        reflector.reflector_update(
            &mut ReflectorCounters::default(),
            &ReflectorCounters::default(),
        );
        let mut names = label_names(&probe.encode(Format::Prometheus));
        names.extend(label_names(&reflector.encode(Format::OpenMetrics)));
        for must in [
            "target",
            "stage",
            "direction",
            "source",
            "le",
            "outcome",
            "version",
        ] {
            assert!(names.contains(must), "{must} in {names:?}");
        }
        for n in &names {
            assert!(
                RESERVED.contains(&n.as_str()),
                "{n} is emitted but not reserved"
            );
        }
    }

    #[test]
    fn a_users_label_is_refused_in_one_line_naming_it() {
        let e = check_user_label("source").unwrap_err();
        assert!(
            e.starts_with("\"source\" is reserved (rtprobe's own series carry target, "),
            "{e}"
        );
        assert!(
            check_user_label("__meta")
                .unwrap_err()
                .contains("Prometheus's")
        );
        assert!(check_user_label("site").is_ok());
    }
}
