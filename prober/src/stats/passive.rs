//! The stage histograms of `rtprobe flows`: per flow (a socket), per
//! process and per cgroup, and for the whole host. Pure.
//!
//! Memory is bounded: at most `max_flows` flows are itemized (the first
//! seen); the sends of any other flow still count in its process's, its
//! cgroup's and the host's figures, and the summary says how many flows
//! were left out. Processes and cgroups are few on a host, but are capped
//! the same way.

use std::{collections::HashMap, net::SocketAddr};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{hist::Hist, summary::Latency};
use crate::model::passive::SampledSend;

/// The histograms of one group of sampled sends.
#[derive(Debug, Clone, Default)]
pub(crate) struct StageHists {
    stages: [Hist; 4],
    samples: u64,
    bytes: u64,
    given_up: u64,
    retransmitted: u64,
}

/// What a group's sampled sends took, per stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct StageSummary {
    /// Sampled sends.
    pub(crate) samples: u64,
    /// Their bytes (of the sampled skbs at `sendmsg`).
    pub(crate) bytes: u64,
    /// Sends given up: no ACK came within the give-up time.
    pub(crate) given_up: u64,
    /// Sends whose bytes were sent again (the first time of each stage
    /// is kept).
    pub(crate) retransmitted: u64,
    /// `sendmsg` -> qdisc, ns.
    pub(crate) stack: Latency,
    /// qdisc -> driver, ns.
    pub(crate) sender_queue: Latency,
    /// driver -> the NIC's stamp, ns (none where the NIC does not stamp).
    pub(crate) nic: Latency,
    /// last TX stamp -> the ACK of the last byte, ns (the peer's delayed
    /// ACK included).
    pub(crate) round_trip: Latency,
}

impl StageHists {
    pub(crate) fn record(&mut self, s: &SampledSend) {
        self.samples += 1;
        self.bytes += u64::from(s.bytes);
        self.given_up += u64::from(s.given_up);
        self.retransmitted += u64::from(s.retransmitted);
        for (h, v) in self.stages.iter_mut().zip(s.stages()) {
            if let Some(v) = v {
                h.record(v.max(1));
            }
        }
    }

    pub(crate) fn summary(&self) -> StageSummary {
        let [stack, sender_queue, nic, round_trip] = self.stages.each_ref().map(Latency::of);
        StageSummary {
            samples: self.samples,
            bytes: self.bytes,
            given_up: self.given_up,
            retransmitted: self.retransmitted,
            stack,
            sender_queue,
            nic,
            round_trip,
        }
    }
}

/// One flow: its socket's ends and sender, and its stages.
#[derive(Debug, Clone)]
struct Flow {
    local: SocketAddr,
    remote: SocketAddr,
    pid: u32,
    comm: String,
    cgroup_id: u64,
    hists: StageHists,
}

/// A flow's summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FlowSummary {
    /// The socket's cookie.
    pub(crate) cookie: u64,
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
    /// The process of its first sampled send.
    pub(crate) pid: u32,
    pub(crate) comm: String,
    pub(crate) cgroup_id: u64,
    #[serde(flatten)]
    pub(crate) stages: StageSummary,
}

/// A process's or a cgroup's summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct GroupSummary {
    /// "comm (pid)" or the cgroup id.
    pub(crate) key: String,
    #[serde(flatten)]
    pub(crate) stages: StageSummary,
}

/// Everything `rtprobe flows` keeps of the samples it read.
#[derive(Debug, Clone)]
pub(crate) struct PassiveStats {
    max_groups: usize,
    flows: HashMap<u64, Flow>,
    /// Flows seen beyond the cap, by cookie (cookies only: 8 bytes each,
    /// so that a flow is counted once).
    flows_left_out: std::collections::HashSet<u64>,
    processes: HashMap<(u32, String), StageHists>,
    cgroups: HashMap<u64, StageHists>,
    all: StageHists,
}

impl PassiveStats {
    /// At most `max_groups` flows, processes and cgroups itemized each.
    pub(crate) fn new(max_groups: usize) -> Self {
        Self {
            max_groups,
            flows: HashMap::new(),
            flows_left_out: Default::default(),
            processes: HashMap::new(),
            cgroups: HashMap::new(),
            all: StageHists::default(),
        }
    }

    pub(crate) fn record(&mut self, s: &SampledSend) {
        self.all.record(s);
        let cap = self.max_groups;
        let room = self.flows.len() < cap;
        match self.flows.get_mut(&s.cookie) {
            Some(f) => f.hists.record(s),
            None if room => {
                let mut hists = StageHists::default();
                hists.record(s);
                self.flows.insert(
                    s.cookie,
                    Flow {
                        local: s.local,
                        remote: s.remote,
                        pid: s.pid,
                        comm: s.comm.clone(),
                        cgroup_id: s.cgroup_id,
                        hists,
                    },
                );
            }
            None => {
                self.flows_left_out.insert(s.cookie);
            }
        }
        record_capped(&mut self.processes, (s.pid, s.comm.clone()), cap, s);
        record_capped(&mut self.cgroups, s.cgroup_id, cap, s);
    }

    /// The whole host's stages.
    pub(crate) fn all(&self) -> StageSummary {
        self.all.summary()
    }

    /// Flows left out of the itemized ones (the cap).
    pub(crate) fn flows_left_out(&self) -> usize {
        self.flows_left_out.len()
    }

    /// Each itemized flow, the most sampled first.
    pub(crate) fn flows(&self) -> Vec<FlowSummary> {
        let mut v: Vec<FlowSummary> = self
            .flows
            .iter()
            .map(|(&cookie, f)| FlowSummary {
                cookie,
                local: f.local,
                remote: f.remote,
                pid: f.pid,
                comm: f.comm.clone(),
                cgroup_id: f.cgroup_id,
                stages: f.hists.summary(),
            })
            .collect();
        v.sort_by(|a, b| {
            b.stages
                .samples
                .cmp(&a.stages.samples)
                .then(a.cookie.cmp(&b.cookie))
        });
        v
    }

    /// Each process, the most sampled first.
    pub(crate) fn processes(&self) -> Vec<GroupSummary> {
        groups(&self.processes, |(pid, comm)| format!("{comm} ({pid})"))
    }

    /// Each cgroup by id, the most sampled first.
    pub(crate) fn cgroups(&self) -> Vec<GroupSummary> {
        groups(&self.cgroups, |id| id.to_string())
    }
}

/// Records `s` into `key`'s group unless the map is full of others.
fn record_capped<K: std::hash::Hash + Eq>(
    m: &mut HashMap<K, StageHists>,
    key: K,
    cap: usize,
    s: &SampledSend,
) {
    let full = m.len() >= cap;
    match m.get_mut(&key) {
        Some(h) => h.record(s),
        None if !full => m.entry(key).or_default().record(s),
        None => {}
    }
}

fn groups<K>(m: &HashMap<K, StageHists>, name: impl Fn(&K) -> String) -> Vec<GroupSummary> {
    let mut v: Vec<GroupSummary> = m
        .iter()
        .map(|(k, h)| GroupSummary {
            key: name(k),
            stages: h.summary(),
        })
        .collect();
    v.sort_by(|a, b| {
        b.stages
            .samples
            .cmp(&a.stages.samples)
            .then(a.key.cmp(&b.key))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(cookie: u64, pid: u32, stack: u64) -> SampledSend {
        SampledSend {
            time_ns: 0,
            cookie,
            pid,
            comm: format!("p{pid}"),
            cgroup_id: 1,
            local: "10.0.0.1:1000".parse().unwrap(),
            remote: "10.0.1.2:5201".parse().unwrap(),
            bytes: 100,
            stack_ns: Some(stack),
            sender_queue_ns: Some(2 * stack),
            nic_ns: None,
            round_trip_ns: Some(10 * stack),
            given_up: false,
            retransmitted: cookie == 2,
        }
    }

    #[test]
    fn each_flow_process_and_cgroup_gets_its_sends_stage_by_stage() {
        let mut st = PassiveStats::new(10);
        for i in 1..=3 {
            st.record(&send(1, 7, 1000 * i));
        }
        st.record(&send(2, 8, 5000));
        let flows = st.flows();
        assert_eq!(flows.len(), 2);
        assert_eq!((flows[0].cookie, flows[0].stages.samples), (1, 3));
        assert_eq!(flows[0].stages.stack.p50, Some(2000));
        // At the bucket's bound: 3 significant digits.
        let max = flows[0].stages.round_trip.max.unwrap();
        assert!((30_000..=30_030).contains(&max), "{max}");
        assert_eq!(flows[0].stages.nic.count, 0, "no NIC stamp, no NIC figure");
        assert_eq!(flows[1].stages.retransmitted, 1);
        assert_eq!(st.processes()[0].key, "p7 (7)");
        assert_eq!(st.cgroups()[0].stages.samples, 4);
        assert_eq!((st.all().samples, st.all().bytes), (4, 400));
    }

    #[test]
    fn flows_past_the_cap_count_in_their_groups_only_and_are_said() {
        let mut st = PassiveStats::new(2);
        for cookie in 1..=5 {
            st.record(&send(cookie, 7, 1000));
            st.record(&send(cookie, 7, 1000));
        }
        assert_eq!(st.flows().len(), 2);
        assert_eq!(st.flows_left_out(), 3, "each flow counted once");
        assert_eq!(st.processes()[0].stages.samples, 10);
        assert_eq!(st.all().samples, 10);
    }
}
