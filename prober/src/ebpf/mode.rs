//! How the router and the reflector are asked to run: plain domain types
//! (no clap; the option model gives them their flags).

use serde::{Deserialize, Serialize};

use crate::model::words::words;

/// How the XDP router is attached on the router's interfaces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    /// No XDP program: the kernel forwards (the baseline).
    Off,
    /// Generic XDP (XDP_FLAGS_SKB_MODE), works on any driver.
    Skb,
    /// Driver XDP (XDP_FLAGS_DRV_MODE); fails if the driver lacks it.
    Native,
    /// The kernel chooses (native if the driver has it, else generic).
    #[default]
    Auto,
}

/// What the XDP router does with IPv4 it could forward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum XdpAction {
    /// bpf_fib_lookup + MAC rewrite + XDP_REDIRECT (the router).
    #[default]
    Redirect,
    /// XDP_PASS every packet to the kernel stack.
    Pass,
}

/// Who answers the probes at the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ReflectorKind {
    /// rtprobe's XDP program on the receiver's interface (XDP_TX).
    Kernel,
    /// A user-space thread reads each probe and sends the echo.
    User,
}

impl XdpMode {
    pub(crate) const ALL: [XdpMode; 4] =
        [XdpMode::Off, XdpMode::Skb, XdpMode::Native, XdpMode::Auto];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            XdpMode::Off => "off",
            XdpMode::Skb => "skb",
            XdpMode::Native => "native",
            XdpMode::Auto => "auto",
        }
    }
}

impl XdpAction {
    pub(crate) const ALL: [XdpAction; 2] = [XdpAction::Redirect, XdpAction::Pass];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            XdpAction::Redirect => "redirect",
            XdpAction::Pass => "pass",
        }
    }
}

impl ReflectorKind {
    pub(crate) const ALL: [ReflectorKind; 2] = [ReflectorKind::Kernel, ReflectorKind::User];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReflectorKind::Kernel => "kernel",
            ReflectorKind::User => "user",
        }
    }
}

words!(XdpMode, "XDP mode");
words!(XdpAction, "XDP action");
words!(ReflectorKind, "reflector");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        for m in XdpMode::ALL {
            assert_eq!(m.to_string().parse::<XdpMode>(), Ok(m));
        }
        assert_eq!("Native".parse::<XdpMode>(), Ok(XdpMode::Native));
        let e = "turbo".parse::<XdpMode>().unwrap_err();
        assert!(e.contains("off, skb, native, auto"), "{e}");
        assert_eq!("pass".parse::<XdpAction>(), Ok(XdpAction::Pass));
        assert_eq!("user".parse::<ReflectorKind>(), Ok(ReflectorKind::User));
    }
}
