//! How the router and the reflector are asked to run: plain domain types
//! (no clap; the option model in [`crate::options`] gives them their flags).

use serde::{Deserialize, Serialize};

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
pub enum XdpAction {
    /// bpf_fib_lookup + MAC rewrite + XDP_REDIRECT (the router).
    #[default]
    Redirect,
    /// XDP_PASS every packet to the kernel stack.
    Pass,
}

/// Who answers the probes at the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReflectorKind {
    /// rtprobe's XDP program on the receiver's interface (XDP_TX).
    Kernel,
    /// A user-space thread reads each probe and sends the echo.
    User,
}

impl XdpMode {
    pub const ALL: [XdpMode; 4] = [XdpMode::Off, XdpMode::Skb, XdpMode::Native, XdpMode::Auto];

    pub fn as_str(self) -> &'static str {
        match self {
            XdpMode::Off => "off",
            XdpMode::Skb => "skb",
            XdpMode::Native => "native",
            XdpMode::Auto => "auto",
        }
    }
}

impl XdpAction {
    pub const ALL: [XdpAction; 2] = [XdpAction::Redirect, XdpAction::Pass];

    pub fn as_str(self) -> &'static str {
        match self {
            XdpAction::Redirect => "redirect",
            XdpAction::Pass => "pass",
        }
    }
}

impl ReflectorKind {
    pub const ALL: [ReflectorKind; 2] = [ReflectorKind::Kernel, ReflectorKind::User];

    pub fn as_str(self) -> &'static str {
        match self {
            ReflectorKind::Kernel => "kernel",
            ReflectorKind::User => "user",
        }
    }
}

/// `Display` and `FromStr` from `ALL` and `as_str`, so the words are
/// written once.
macro_rules! words {
    ($t:ty, $what:literal) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                let t = s.trim().to_ascii_lowercase();
                <$t>::ALL
                    .into_iter()
                    .find(|v| v.as_str() == t)
                    .ok_or_else(|| {
                        let all: Vec<&str> = <$t>::ALL.iter().map(|v| v.as_str()).collect();
                        format!("invalid {} {s:?}: use one of {}", $what, all.join(", "))
                    })
            }
        }
    };
}
pub(crate) use words;

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
