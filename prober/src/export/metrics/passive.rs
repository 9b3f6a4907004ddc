//! `rtprobe flows`' metrics: each stage of the sampled sends by process
//! name and cgroup, under a series budget, and the sock_ops program's
//! counters as deltas of their cumulative counts.

use std::collections::HashSet;

use super::{
    labels::{CounterLabels, PassiveLabels, PassiveStageLabels},
    registry::Metrics,
};
use crate::model::passive::{STAGE_NAMES, SampledSend};

/// The label every group past the budget shares.
pub(crate) const OTHER: &str = "other";

/// How many (process name, cgroup) groups get series of their own: each
/// costs 4 histograms of 48 buckets and a counter; the sends of any later
/// group go to one `other` group.
#[derive(Debug, Clone)]
pub(crate) struct GroupBudget {
    cap: usize,
    seen: HashSet<(String, String)>,
}

impl GroupBudget {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap,
            seen: HashSet::new(),
        }
    }

    /// Groups with series of their own, at most.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// The labels of (comm, cgroup): its own while the budget lasts.
    fn labels(&mut self, comm: &str, cgroup: &str) -> PassiveLabels {
        let key = (comm.to_string(), cgroup.to_string());
        if self.seen.contains(&key) || self.seen.len() < self.cap {
            self.seen.insert(key.clone());
            PassiveLabels {
                comm: key.0,
                cgroup: key.1,
            }
        } else {
            PassiveLabels {
                comm: OTHER.into(),
                cgroup: OTHER.into(),
            }
        }
    }
}

impl Metrics {
    /// One sampled send of `comm` in `cgroup` (a directory under the
    /// cgroup root).
    pub(crate) fn flows_observe(&self, budget: &mut GroupBudget, cgroup: &str, s: &SampledSend) {
        let group = budget.labels(&s.comm, cgroup);
        self.passive_samples.get_or_create(&group).inc();
        for (stage, v) in STAGE_NAMES.iter().zip(s.stages()) {
            if let Some(ns) = v {
                self.passive_stage
                    .get_or_create(&PassiveStageLabels {
                        group: group.clone(),
                        stage: (*stage).into(),
                    })
                    .observe(ns as f64 * 1e-9);
            }
        }
    }

    /// Brings the program's counters up to `now` (cumulative, in
    /// [`xdp_common::flows::FlowCounter`] order; `last` is what was
    /// published before, updated in place).
    pub(crate) fn flows_counters(&self, last: &mut Vec<u64>, now: &[u64]) {
        last.resize(now.len(), 0);
        for (c, (before, after)) in xdp_common::flows::FlowCounter::ALL
            .iter()
            .zip(last.iter_mut().zip(now))
        {
            self.passive_program
                .get_or_create(&CounterLabels {
                    counter: c.name().into(),
                })
                .inc_by(after.saturating_sub(*before));
            *before = *after;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::metrics::Format;

    fn send(comm: &str) -> SampledSend {
        SampledSend {
            time_ns: 0,
            cookie: 1,
            pid: 7,
            comm: comm.into(),
            cgroup_id: 1,
            local: "10.0.0.1:1000".parse().unwrap(),
            remote: "10.0.1.2:5201".parse().unwrap(),
            bytes: 100,
            stack_ns: Some(5_000),
            sender_queue_ns: Some(2_000_000),
            nic_ns: None,
            round_trip_ns: Some(300_000),
            given_up: false,
            retransmitted: false,
        }
    }

    #[test]
    fn stages_by_group_under_the_budget_and_counters_as_deltas() {
        let m = Metrics::for_flows();
        let mut b = GroupBudget::new(1);
        m.flows_observe(&mut b, "/", &send("iperf3"));
        m.flows_observe(&mut b, "/", &send("iperf3"));
        m.flows_observe(&mut b, "/app", &send("nginx"));
        let mut last = Vec::new();
        m.flows_counters(&mut last, &[10, 2]);
        m.flows_counters(&mut last, &[15, 2]);
        let text = m.encode(Format::Prometheus);
        assert!(
            text.contains(r#"rtprobe_flows_samples_total{comm="iperf3",cgroup="/"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rtprobe_flows_samples_total{comm="other",cgroup="other"} 1"#),
            "{text}"
        );
        assert!(text.contains(
            r#"rtprobe_flows_stage_seconds_count{comm="iperf3",cgroup="/",stage="sender_queue"} 2"#
        ));
        assert!(
            !text.contains(r#"stage="nic""#),
            "no NIC stamp, no NIC series"
        );
        assert!(
            text.contains(r#"rtprobe_flows_program_total{counter="sends"} 15"#),
            "{text}"
        );
        assert!(
            text.contains(r#"rtprobe_build_info{version="#) && text.contains(r#"command="flows""#)
        );
        assert!(!text.contains("rtprobe_probes_sent"), "no probe families");
    }
}
