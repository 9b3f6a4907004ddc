//! The label sets of the metric families. Every probe series carries
//! [`FlowLabels`] first (flattened into the families that add a label of
//! their own), so a label that every series of a target carries is added
//! in that one struct.

use prometheus_client::encoding::EncodeLabelSet;

/// What tells one probe flow from another.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowLabels {
    /// Where the probes go, e.g. "10.99.2.2:5061".
    pub target: String,
    /// Flow id (0 = the main flow).
    pub flow: String,
    /// IP TOS byte, e.g. "0xc0".
    pub tos: String,
    /// UDP payload bytes.
    pub size: String,
    /// A targets file's labels of this target (`site="fra1"`...).
    #[prometheus(flatten)]
    pub extra: Vec<(String, String)>,
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
    pub fn with_extra(mut self, labels: &std::collections::BTreeMap<String, String>) -> Self {
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
