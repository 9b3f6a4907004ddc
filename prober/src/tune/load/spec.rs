//! The `--load` entry: `tcp[:SHARE|RATE][,key=value]...`, `udp:...`,
//! `fetch[:SIZE][,...]` (see the parent module for what each does), its
//! defaults and limits, and the check of a congestion control's name
//! against the kernel's.

use std::{fmt, str::FromStr, time::Duration};

use anyhow::Result;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::MAX_FLOWS;
use crate::{
    model::units,
    sys::Sys,
    tune::amounts::{Bytes, LoadRate},
};

/// One `--load` entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LoadSpec {
    Tcp {
        rate: LoadRate,
        cc: Option<String>,
        flows: u32,
        port: Option<u16>,
    },
    Udp {
        rate: LoadRate,
        size: u32,
        port: Option<u16>,
    },
    Fetch {
        size: u64,
        every: Duration,
        cc: Option<String>,
        timeout: Duration,
        port: Option<u16>,
    },
}

/// Page size of the fetch load when none is given. The study does not
/// state its page's size; 100 KiB takes several round trips in slow start,
/// so the queue's delay shows in the fetch time as it did there.
pub(super) const DEFAULT_FETCH_SIZE: u64 = 100 * 1024;
/// Pause between one fetch's end and the next one's start.
pub(super) const DEFAULT_FETCH_EVERY: Duration = Duration::from_secs(1);
/// A fetch not done by then is a failure (the study's slowest cell took
/// 10 s on average).
pub(super) const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest page, so that one fetch cannot outlast any sensible run.
pub(crate) const MAX_FETCH_SIZE: u64 = 1 << 30;

impl LoadSpec {
    pub(crate) fn flows(&self) -> u32 {
        match self {
            LoadSpec::Tcp { flows, .. } => *flows,
            LoadSpec::Udp { .. } | LoadSpec::Fetch { .. } => 1,
        }
    }

    pub(crate) fn port(&self) -> Option<u16> {
        match self {
            LoadSpec::Tcp { port, .. }
            | LoadSpec::Udp { port, .. }
            | LoadSpec::Fetch { port, .. } => *port,
        }
    }

    /// The rate it asks for; None for the fetch load (its rate is what
    /// its fetches get).
    pub(crate) fn rate(&self) -> Option<LoadRate> {
        match self {
            LoadSpec::Tcp { rate, .. } | LoadSpec::Udp { rate, .. } => Some(*rate),
            LoadSpec::Fetch { .. } => None,
        }
    }

    pub(crate) fn cc(&self) -> Option<&str> {
        match self {
            LoadSpec::Tcp { cc, .. } | LoadSpec::Fetch { cc, .. } => cc.as_deref(),
            LoadSpec::Udp { .. } => None,
        }
    }

    /// Needs a link rate to be resolved (a share other than TCP's 100 %).
    pub(crate) fn needs_link_rate(&self) -> bool {
        match self {
            LoadSpec::Tcp { rate, .. } => matches!(rate, LoadRate::Share(s) if *s < 1.0),
            LoadSpec::Udp { rate, .. } => matches!(rate, LoadRate::Share(_)),
            LoadSpec::Fetch { .. } => false,
        }
    }
}

impl fmt::Display for LoadSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadSpec::Tcp {
                rate,
                cc,
                flows,
                port,
            } => {
                write!(f, "tcp:{rate}")?;
                if let Some(c) = cc {
                    write!(f, ",cc={c}")?;
                }
                if *flows != 1 {
                    write!(f, ",flows={flows}")?;
                }
                if let Some(p) = port {
                    write!(f, ",port={p}")?;
                }
                Ok(())
            }
            LoadSpec::Udp { rate, size, port } => {
                write!(f, "udp:{rate},size={size}")?;
                if let Some(p) = port {
                    write!(f, ",port={p}")?;
                }
                Ok(())
            }
            LoadSpec::Fetch {
                size,
                every,
                cc,
                timeout,
                port,
            } => {
                write!(
                    f,
                    "fetch:{},every={}",
                    Bytes(*size),
                    units::fmt_duration(*every)
                )?;
                if let Some(c) = cc {
                    write!(f, ",cc={c}")?;
                }
                if *timeout != DEFAULT_FETCH_TIMEOUT {
                    write!(f, ",timeout={}", units::fmt_duration(*timeout))?;
                }
                if let Some(p) = port {
                    write!(f, ",port={p}")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for LoadSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |m: String| format!("invalid load {s:?}: {m}");
        let mut parts = s.split(',').map(str::trim);
        let head = parts.next().unwrap_or_default();
        let (kind, rate) = match head.split_once(':') {
            Some((k, r)) => (k.trim(), Some(r.trim())),
            None => (head, None),
        };
        let mut spec = LoadSpec::with_defaults(kind, rate).map_err(bad)?;
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| bad(format!("{p:?}: expected key=value")))?;
            spec.set(k, v).map_err(bad)?;
        }
        Ok(spec)
    }
}

impl LoadSpec {
    /// The `KIND[:RATE|SIZE]` head with every key at its default.
    fn with_defaults(kind: &str, rate: Option<&str>) -> Result<Self, String> {
        Ok(match kind {
            "tcp" => LoadSpec::Tcp {
                rate: match rate {
                    Some(r) => r.parse()?,
                    None => LoadRate::Share(1.0),
                },
                cc: None,
                flows: 1,
                port: None,
            },
            "udp" => LoadSpec::Udp {
                rate: rate
                    .ok_or("udp needs a rate: udp:150mbit or udp:150% (of the link)")?
                    .parse()?,
                size: 1470,
                port: None,
            },
            "fetch" => LoadSpec::Fetch {
                size: match rate {
                    Some(r) => {
                        let b: Bytes = r.parse()?;
                        if !(1..=MAX_FETCH_SIZE).contains(&b.0) {
                            return Err(format!(
                                "page size {r}: expected 1 byte to {}",
                                Bytes(MAX_FETCH_SIZE)
                            ));
                        }
                        b.0
                    }
                    None => DEFAULT_FETCH_SIZE,
                },
                every: DEFAULT_FETCH_EVERY,
                cc: None,
                timeout: DEFAULT_FETCH_TIMEOUT,
                port: None,
            },
            _ => {
                return Err(format!(
                    "unknown kind {kind:?}: expected tcp[:SHARE|RATE][,cc=..][,flows=N], \
                     udp:SHARE|RATE[,size=B] or fetch[:SIZE][,every=D]"
                ));
            }
        })
    }

    /// One `key=value` of the entry; a key its kind does not take is an
    /// error naming the ones it does.
    fn set(&mut self, k: &str, v: &str) -> Result<(), String> {
        match (self, k) {
            (LoadSpec::Tcp { cc, .. } | LoadSpec::Fetch { cc, .. }, "cc") => {
                if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!("cc={v}: expected a name such as cubic, bbr, reno"));
                }
                *cc = Some(v.to_string());
            }
            (LoadSpec::Tcp { flows, .. }, "flows") => {
                *flows = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_FLOWS).contains(n))
                    .ok_or_else(|| format!("flows={v}: expected 1 to {MAX_FLOWS}"))?;
            }
            (LoadSpec::Udp { size, .. }, "size") => {
                let b: Bytes = v.parse()?;
                if !(16..=65507).contains(&b.0) {
                    return Err(format!(
                        "size={v}: UDP payload must be 16 to 65507 bytes (1472 fits a 1500 MTU)"
                    ));
                }
                *size = b.0 as u32;
            }
            (LoadSpec::Fetch { every, .. }, "every") => {
                *every = units::parse_duration(v).map_err(|e| format!("every={v}: {e}"))?;
                if *every > Duration::from_secs(3600) {
                    return Err(format!("every={v}: at most 1h"));
                }
            }
            (LoadSpec::Fetch { timeout, .. }, "timeout") => {
                *timeout = units::parse_duration(v).map_err(|e| format!("timeout={v}: {e}"))?;
                if *timeout < Duration::from_millis(10) {
                    return Err(format!("timeout={v}: at least 10ms"));
                }
            }
            (
                LoadSpec::Tcp { port, .. }
                | LoadSpec::Udp { port, .. }
                | LoadSpec::Fetch { port, .. },
                "port",
            ) => {
                *port = Some(
                    v.parse()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| format!("port={v}: expected 1 to 65535"))?,
                );
            }
            (LoadSpec::Tcp { .. }, _) => {
                return Err(format!("unknown tcp key {k:?}: expected cc, flows or port"));
            }
            (LoadSpec::Udp { .. }, _) => {
                return Err(format!("unknown udp key {k:?}: expected size or port"));
            }
            (LoadSpec::Fetch { .. }, _) => {
                return Err(format!(
                    "unknown fetch key {k:?}: expected every, cc, timeout or port"
                ));
            }
        }
        Ok(())
    }
}

impl Serialize for LoadSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LoadSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Congestion controls the kernel has (the list is the same in every
/// namespace: it names the registered modules).
pub(crate) fn available_cc(sys: &dyn Sys) -> Result<Vec<String>> {
    let s = sys.sysctl(
        crate::sys::Ns::Host,
        "net.ipv4.tcp_available_congestion_control",
    )?;
    Ok(s.split_whitespace().map(str::to_string).collect())
}

/// An error naming the congestion controls the kernel has, if `cc` is not one.
pub(crate) fn check_cc(cc: &str, available: &[String]) -> Result<(), String> {
    if available.iter().any(|a| a == cc) {
        Ok(())
    } else {
        Err(format!(
            "congestion control {cc:?} is not available in this kernel (available: {}); \
             load its module (modprobe tcp_{cc}) or pick one of those",
            available.join(" ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::amounts::Rate;

    #[test]
    fn parses_load_specs() {
        assert_eq!(
            "tcp".parse::<LoadSpec>().unwrap(),
            LoadSpec::Tcp {
                rate: LoadRate::Share(1.0),
                cc: None,
                flows: 1,
                port: None
            }
        );
        let s: LoadSpec = "tcp:50%,cc=bbr,flows=2".parse().unwrap();
        assert_eq!(s.to_string(), "tcp:50%,cc=bbr,flows=2");
        assert!(s.needs_link_rate());
        assert!(!"tcp:100%".parse::<LoadSpec>().unwrap().needs_link_rate());
        assert!(!"tcp:40mbit".parse::<LoadSpec>().unwrap().needs_link_rate());
        let u: LoadSpec = "udp:150mbit,size=1470".parse().unwrap();
        assert_eq!(
            u,
            LoadSpec::Udp {
                rate: LoadRate::Rate(Rate::mbit(150)),
                size: 1470,
                port: None
            }
        );
        assert_eq!(u.to_string(), "udp:150mbit,size=1470");
        assert!("udp:150%".parse::<LoadSpec>().unwrap().needs_link_rate());
        for bad in [
            "udp",
            "quic:10%",
            "tcp:fast",
            "tcp:50%,flows=0",
            "tcp:50%,flows=99",
            "tcp,cc=",
            "tcp,size=100",
            "udp:10mbit,size=70000",
            "udp:10mbit,cc=bbr",
            "tcp,port=0",
            "tcp,bbr",
        ] {
            assert!(bad.parse::<LoadSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_fetch_specs() {
        let f: LoadSpec = "fetch:100KB,every=500ms".parse().unwrap();
        assert_eq!(
            f,
            LoadSpec::Fetch {
                size: 102_400,
                every: Duration::from_millis(500),
                cc: None,
                timeout: DEFAULT_FETCH_TIMEOUT,
                port: None
            }
        );
        assert_eq!(f.to_string(), "fetch:100KiB,every=500ms");
        assert_eq!(f.to_string().parse::<LoadSpec>().unwrap(), f);
        assert!(!f.needs_link_rate());
        assert_eq!((f.flows(), f.rate()), (1, None));
        let d: LoadSpec = "fetch".parse().unwrap();
        assert_eq!(d.to_string(), "fetch:100KiB,every=1s");
        let c: LoadSpec = "fetch:1MiB,cc=reno,timeout=5s,port=6000".parse().unwrap();
        assert_eq!(c.cc(), Some("reno"));
        assert_eq!(c.port(), Some(6000));
        assert_eq!(
            c.to_string(),
            "fetch:1MiB,every=1s,cc=reno,timeout=5s,port=6000"
        );
        // Each bad input: one line that names the key (or the size).
        for (bad, names) in [
            ("fetch:0", "page size"),
            ("fetch:2048MiB", "page size"),
            ("fetch:lots", "invalid size"),
            ("fetch,every=soon", "every=soon"),
            ("fetch,every=2h", "every=2h"),
            ("fetch,timeout=1ms", "timeout=1ms"),
            ("fetch,cc=", "cc="),
            ("fetch,flows=2", "unknown fetch key \"flows\""),
            ("fetch,size=10", "unknown fetch key \"size\""),
            ("fetch,port=0", "port=0"),
            ("fetch,500ms", "expected key=value"),
        ] {
            let e = bad.parse::<LoadSpec>().unwrap_err();
            assert!(e.contains(names) && !e.contains('\n'), "{bad}: {e}");
        }
    }

    #[test]
    fn cc_check_names_the_available_ones() {
        let avail = vec!["reno".to_string(), "cubic".to_string()];
        assert!(check_cc("cubic", &avail).is_ok());
        let e = check_cc("bbr", &avail).unwrap_err();
        assert!(e.contains("reno cubic") && e.contains("tcp_bbr"), "{e}");
    }
}
