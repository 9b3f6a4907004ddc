//! The label sets of the metric families.

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
}

impl FlowLabels {
    pub fn new(target: impl Into<String>, flow: u8, tos: u8, size: usize) -> Self {
        Self {
            target: target.into(),
            flow: flow.to_string(),
            tos: format!("{tos:#04x}"),
            size: size.to_string(),
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StageLabels {
    pub(super) target: String,
    pub(super) flow: String,
    pub(super) tos: String,
    pub(super) size: String,
    /// The stage's key (`sender_queue`, `path`...).
    pub(super) stage: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LostLabels {
    pub(super) target: String,
    pub(super) flow: String,
    pub(super) tos: String,
    pub(super) size: String,
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
    pub(super) target: String,
    pub(super) flow: String,
    pub(super) tos: String,
    pub(super) size: String,
    /// "hardware", "software", "mixed" or "none" (nothing received yet).
    pub(super) source: String,
}

/// What the reflector did with a datagram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabels {
    pub(super) outcome: String,
}
