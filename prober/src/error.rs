//! Errors callers branch on. Everything else is `anyhow` with context.

use thiserror::Error;

#[derive(Debug, Error)]
pub(crate) enum Error {
    #[error(
        "rtprobe needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF) to build its testbed: run it with sudo"
    )]
    NotRoot,
    #[error(
        "XDP {mode} mode is not supported on {ifname}: {reason}; try --xdp-mode auto, skb or off"
    )]
    XdpModeUnsupported {
        mode: String,
        ifname: String,
        reason: String,
    },
    #[error(
        "qdisc {kind} is not available in this kernel (module sch_{kind} missing); pick another qdisc or load the module"
    )]
    QdiscUnavailable { kind: String },
    #[error("interface {0} not found: check the name with `ip link`")]
    InterfaceNotFound(String),
}
