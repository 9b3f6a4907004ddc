//! The XDP router and who echoes the probes.

use serde::{Deserialize, Serialize};

use crate::ebpf::{ReflectorKind, XdpAction, XdpMode};

#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct XdpSpec {
    /// XDP router attach mode on the router's interfaces [default: auto on the command line;
    /// off in scenario files].
    #[arg(long, value_enum)]
    pub(crate) xdp_mode: Option<XdpMode>,

    /// XDP router behaviour: forward in XDP (redirect) or hand every packet to the kernel
    /// (pass) [default: redirect].
    #[arg(long, value_enum)]
    pub(crate) xdp_action: Option<XdpAction>,

    /// Who echoes the probes [default: kernel where it attaches, else user, with a note].
    #[arg(long, value_enum)]
    pub(crate) reflector: Option<ReflectorKind>,
}
