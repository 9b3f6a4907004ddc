//! The choices `bench-forward` offers, as plain domain types (`FromStr`,
//! `Serialize`): the CLI parses into them, nothing here knows clap.

use std::{fmt, str::FromStr};

use serde::Serialize;

/// Implements `as_str`, `Display`, `FromStr` and the list of names of a
/// fieldless enum from one table of (variant, name).
macro_rules! named_enum {
    ($ty:ident, $what:literal, [$(($v:ident, $n:literal)),+ $(,)?]) => {
        impl $ty {
            /// Every name, in declaration order (for help texts).
            pub(crate) const NAMES: &'static [&'static str] = &[$($n),+];

            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $($ty::$v => $n),+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        /// Read from its name, with the command line's error words.
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <String as serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($n => Ok($ty::$v),)+
                    _ => Err(format!(
                        "unknown {} {s:?}: use one of {}",
                        $what,
                        Self::NAMES.join(", ")
                    )),
                }
            }
        }
    };
}

/// One forwarding variant of the router hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ForwardMode {
    /// Kernel IP forwarding, no XDP program.
    Off,
    /// rtprobe's router in generic (skb) XDP, redirecting.
    Skb,
    /// rtprobe's router in native (driver) XDP, redirecting.
    Native,
    /// rtprobe's router in generic XDP, passing every packet to the kernel.
    SkbPass,
    /// rtprobe's router in native XDP, passing every packet to the kernel.
    NativePass,
}

named_enum!(
    ForwardMode,
    "mode",
    [
        (Off, "off"),
        (Skb, "skb"),
        (Native, "native"),
        (SkbPass, "skb-pass"),
        (NativePass, "native-pass"),
    ]
);

impl ForwardMode {
    /// Whether the router redirects in XDP (the modes `--work` applies to).
    pub(crate) fn redirects_in_xdp(self) -> bool {
        matches!(self, ForwardMode::Skb | ForwardMode::Native)
    }
}

/// How the load is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Generator {
    /// Frames built in the kernel and redirected into the sender's veth
    /// (BPF_PROG_TEST_RUN live frames): no socket or skb cost.
    Xdp,
    /// UDP sendmmsg from sockets in the sender namespace.
    Socket,
}

named_enum!(Generator, "generator", [(Xdp, "xdp"), (Socket, "socket")]);

/// What takes the load at the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Sink {
    /// A native XDP program on the receiver's veth drops the load.
    Xdp,
    /// The receiver's stack (no socket: UDP drops it after the lookup).
    Stack,
}

named_enum!(Sink, "sink", [(Xdp, "xdp"), (Stack, "stack")]);

/// Where the bounce section's device under test handles the frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BounceHook {
    /// `bench_bounce` (XDP_TX) in generic XDP.
    Skb,
    /// `bench_bounce` (XDP_TX) in native XDP.
    Native,
    /// `bench_xsk` in native XDP hands every frame to an AF_XDP socket
    /// (copy mode) of its queue; a user-space thread per queue swaps the
    /// MACs and sends it back out through the same socket.
    Afxdp,
}

named_enum!(
    BounceHook,
    "bounce hook",
    [(Skb, "skb"), (Native, "native"), (Afxdp, "afxdp")]
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in ForwardMode::NAMES {
            assert_eq!(n.parse::<ForwardMode>().unwrap().as_str(), *n);
        }
        for n in BounceHook::NAMES {
            assert_eq!(n.parse::<BounceHook>().unwrap().to_string(), *n);
        }
        assert_eq!("socket".parse::<Generator>(), Ok(Generator::Socket));
        assert_eq!("stack".parse::<Sink>(), Ok(Sink::Stack));
        let e = "turbo".parse::<ForwardMode>().unwrap_err();
        assert!(e.contains("off, skb, native"), "{e}");
    }
}
