//! The text form of a qdisc, `KIND[,key=value|flag]...`: parsing onto
//! the kind's preset, range checks, printing it back, and serde through it.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{AutoRate, FqCodel, HfscParams, HtbParams, HtbPrioParams, Leaf, QdiscSpec};
use crate::{
    model::units::{fmt_duration, parse_duration},
    tune::amounts::Bytes,
};

impl fmt::Display for QdiscSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())?;
        match self {
            QdiscSpec::PfifoFast => Ok(()),
            QdiscSpec::Pfifo { limit_pkts } => write!(f, ",limit={limit_pkts}"),
            QdiscSpec::Bfifo { limit_bytes } => write!(f, ",limit={limit_bytes}"),
            QdiscSpec::Prio { bands, leaf } => write!(f, ",bands={bands},leaf={}", leaf.as_str()),
            QdiscSpec::FqCodel(p) => {
                if p == &FqCodel::kernel() {
                    return write!(f, ",preset=kernel");
                }
                if let Some(x) = p.limit {
                    write!(f, ",limit={x}")?;
                }
                if let Some(x) = p.target {
                    write!(f, ",target={}", fmt_duration(x))?;
                }
                if let Some(x) = p.interval {
                    write!(f, ",interval={}", fmt_duration(x))?;
                }
                if let Some(x) = p.quantum {
                    write!(f, ",quantum={x}")?;
                }
                if let Some(x) = p.flows {
                    write!(f, ",flows={x}")?;
                }
                match p.ecn {
                    Some(true) => write!(f, ",ecn"),
                    Some(false) => write!(f, ",noecn"),
                    None => Ok(()),
                }
            }
            QdiscSpec::Htb(p) => write!(
                f,
                ",probe_rate={},probe_burst={},bulk_rate={},bulk_ceil={},bulk_burst={},default={},leaf={}",
                p.probe_rate,
                p.probe_burst.0,
                p.bulk_rate,
                p.bulk_ceil,
                p.bulk_burst.0,
                p.default_class,
                p.leaf.as_str()
            ),
            QdiscSpec::HtbPrio(p) => {
                write!(f, ",hp_rate={},link={},hp_port=", p.hp_rate, p.link)?;
                match p.hp_port {
                    Some(x) => write!(f, "{x}")?,
                    None => f.write_str("auto")?,
                }
                f.write_str(",hp_tos=")?;
                match p.hp_tos {
                    Some(t) => write!(f, "0x{t:02X}")?,
                    None => f.write_str("none")?,
                }
                write!(
                    f,
                    ",bulk_prio={},quantum={},limit={}",
                    p.bulk_prio, p.quantum.0, p.limit_pkts
                )
            }
            QdiscSpec::Hfsc(p) => write!(
                f,
                ",link={},rt_rate={},rt_umax={},rt_dmax={},bulk_rate={},bulk_umax={},bulk_dmax={},leaf={}",
                p.link,
                p.rt_rate,
                p.rt_umax.0,
                fmt_duration(p.rt_dmax),
                p.bulk_rate,
                p.bulk_umax.0,
                fmt_duration(p.bulk_dmax),
                p.leaf.as_str()
            ),
            QdiscSpec::Tbf { rate, burst, limit } => {
                write!(f, ",rate={rate},burst={},limit={}", burst.0, limit.0)
            }
        }
    }
}

impl FqCodel {
    fn kernel() -> Self {
        FqCodel {
            limit: None,
            target: None,
            interval: None,
            quantum: None,
            flows: None,
            ecn: None,
        }
    }
}

impl FromStr for QdiscSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',').map(str::trim);
        let kind = parts.next().unwrap_or_default();
        let mut spec = QdiscSpec::preset(kind)?;
        for p in parts {
            if p.is_empty() {
                continue;
            }
            let (k, v) = match p.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (p, None),
            };
            spec.set(k, v)
                .map_err(|e| format!("invalid qdisc {s:?}: {e}"))?;
        }
        spec.check()
            .map_err(|e| format!("invalid qdisc {s:?}: {e}"))?;
        Ok(spec)
    }
}

fn need<'a>(k: &str, v: Option<&'a str>) -> Result<&'a str, String> {
    v.ok_or_else(|| format!("{k} needs a value ({k}=...)"))
}

fn num<T: FromStr>(k: &str, v: Option<&str>) -> Result<T, String> {
    let v = need(k, v)?;
    v.parse()
        .map_err(|_| format!("{k}={v}: expected a whole number"))
}

fn bytes(k: &str, v: Option<&str>) -> Result<Bytes, String> {
    need(k, v)?.parse().map_err(|e| format!("{k}: {e}"))
}

fn dur(k: &str, v: Option<&str>) -> Result<Duration, String> {
    need(k, v).and_then(|v| parse_duration(v).map_err(|e| format!("{k}: {e}")))
}

fn rate(k: &str, v: Option<&str>) -> Result<AutoRate, String> {
    need(k, v).and_then(|v| AutoRate::parse(v).map_err(|e| format!("{k}: {e}")))
}

impl QdiscSpec {
    fn allowed(&self) -> &'static [&'static str] {
        match self {
            QdiscSpec::PfifoFast => &[],
            QdiscSpec::Pfifo { .. } | QdiscSpec::Bfifo { .. } => &["limit"],
            QdiscSpec::Prio { .. } => &["bands", "leaf"],
            QdiscSpec::FqCodel(_) => &[
                "preset", "limit", "target", "interval", "quantum", "flows", "ecn", "noecn",
            ],
            QdiscSpec::Htb(_) => &[
                "probe_rate",
                "probe_burst",
                "bulk_rate",
                "bulk_ceil",
                "bulk_burst",
                "default",
                "leaf",
            ],
            QdiscSpec::HtbPrio(_) => &[
                "hp_rate",
                "link",
                "hp_port",
                "hp_tos",
                "bulk_prio",
                "quantum",
                "limit",
            ],
            QdiscSpec::Hfsc(_) => &[
                "link",
                "rt_rate",
                "rt_umax",
                "rt_dmax",
                "bulk_rate",
                "bulk_umax",
                "bulk_dmax",
                "leaf",
            ],
            QdiscSpec::Tbf { .. } => &["rate", "burst", "limit"],
        }
    }

    fn set(&mut self, k: &str, v: Option<&str>) -> Result<(), String> {
        let allowed = self.allowed();
        if !allowed.contains(&k) {
            return Err(if allowed.is_empty() {
                format!("{} takes no parameters (got {k:?})", self.kind())
            } else {
                format!(
                    "unknown {} parameter {k:?}: expected one of {}",
                    self.kind(),
                    allowed.join(", ")
                )
            });
        }
        match self {
            QdiscSpec::PfifoFast => {}
            QdiscSpec::Pfifo { limit_pkts } => *limit_pkts = num(k, v)?,
            QdiscSpec::Bfifo { limit_bytes } => *limit_bytes = bytes(k, v)?.0,
            QdiscSpec::Prio { bands, leaf } => match k {
                "bands" => *bands = num(k, v)?,
                _ => *leaf = Leaf::parse(need(k, v)?)?,
            },
            QdiscSpec::FqCodel(p) => p.set(k, v)?,
            QdiscSpec::Htb(p) => p.set(k, v)?,
            QdiscSpec::HtbPrio(p) => p.set(k, v)?,
            QdiscSpec::Hfsc(p) => p.set(k, v)?,
            QdiscSpec::Tbf {
                rate: r,
                burst,
                limit,
            } => match k {
                "rate" => {
                    *r = need(k, v)?.parse().map_err(|e| format!("rate: {e}"))?;
                }
                "burst" => *burst = bytes(k, v)?,
                _ => *limit = bytes(k, v)?,
            },
        }
        Ok(())
    }

    /// Ranges the kernel would refuse, caught before anything is touched.
    fn check(&self) -> Result<(), String> {
        match self {
            QdiscSpec::Pfifo { limit_pkts } if *limit_pkts == 0 => {
                Err("limit must be at least 1 packet".into())
            }
            QdiscSpec::Bfifo { limit_bytes } if *limit_bytes < 64 => {
                Err("limit below 64 bytes holds no packet".into())
            }
            QdiscSpec::Prio { bands, .. } if !(2..=16).contains(bands) => {
                Err(format!("bands={bands}: prio takes 2 to 16 bands"))
            }
            QdiscSpec::FqCodel(p) => {
                if p.limit == Some(0) || p.flows == Some(0) || p.quantum == Some(0) {
                    return Err("limit, flows and quantum must be above 0".into());
                }
                if p.flows.is_some_and(|f| f > 65536) {
                    return Err("flows must be at most 65536".into());
                }
                Ok(())
            }
            QdiscSpec::HtbPrio(p) => {
                if !(1..=7).contains(&p.bulk_prio) {
                    return Err(format!(
                        "bulk_prio={}: htb prios are 0 to 7 and 0 is the high class's",
                        p.bulk_prio
                    ));
                }
                if p.hp_port == Some(0) {
                    return Err("hp_port=0 is not a usable port".into());
                }
                if p.limit_pkts == 0 {
                    return Err("limit must be at least 1 packet".into());
                }
                if p.quantum.0 < 64 || p.quantum.0 > 200_000 {
                    return Err(format!(
                        "quantum={}: give 64 to 200000 bytes (a frame: 1514)",
                        p.quantum.0
                    ));
                }
                Ok(())
            }
            QdiscSpec::Tbf { burst, limit, .. } if burst.0 < 1514 || limit.0 < 1514 => {
                Err("burst and limit must hold a full frame (at least 1514 bytes)".into())
            }
            _ => Ok(()),
        }
    }
}

// The per-kind setters: `k` is one of the kind's `allowed()` keys.

impl FqCodel {
    fn set(&mut self, k: &str, v: Option<&str>) -> Result<(), String> {
        let p = self;
        match k {
            "preset" => match need(k, v)? {
                "kernel" => *p = FqCodel::kernel(),
                "study" => {}
                o => return Err(format!("preset={o}: expected study or kernel")),
            },
            "limit" => p.limit = Some(num(k, v)?),
            "target" => p.target = Some(dur(k, v)?),
            "interval" => p.interval = Some(dur(k, v)?),
            "quantum" => p.quantum = Some(bytes(k, v)?.0 as u32),
            "flows" => p.flows = Some(num(k, v)?),
            "ecn" | "noecn" => {
                if v.is_some() {
                    return Err(format!("{k} is a flag: write it without a value"));
                }
                p.ecn = Some(k == "ecn");
            }
            _ => unreachable!("checked against allowed()"),
        }
        Ok(())
    }
}

impl HtbParams {
    fn set(&mut self, k: &str, v: Option<&str>) -> Result<(), String> {
        let p = self;
        match k {
            "probe_rate" => p.probe_rate = rate(k, v)?,
            "probe_burst" => p.probe_burst = bytes(k, v)?,
            "bulk_rate" => p.bulk_rate = rate(k, v)?,
            "bulk_ceil" => p.bulk_ceil = rate(k, v)?,
            "bulk_burst" => p.bulk_burst = bytes(k, v)?,
            "default" => {
                let d = need(k, v)?;
                if d.is_empty() || u16::from_str_radix(d, 16).is_err() {
                    return Err(format!(
                        "default={d}: expected a class minor id in hex as tc reads it (20, 30)"
                    ));
                }
                p.default_class = d.to_string();
            }
            _ => p.leaf = Leaf::parse(need(k, v)?)?,
        }
        Ok(())
    }
}

impl HtbPrioParams {
    fn set(&mut self, k: &str, v: Option<&str>) -> Result<(), String> {
        let p = self;
        match k {
            "hp_rate" => p.hp_rate = rate(k, v)?,
            "link" => p.link = rate(k, v)?,
            "hp_port" => {
                p.hp_port = match need(k, v)? {
                    "auto" => None,
                    _ => Some(num(k, v)?),
                }
            }
            "hp_tos" => {
                p.hp_tos = match need(k, v)? {
                    "none" => None,
                    t => Some(
                        crate::model::units::parse_u8_maybe_hex(t)
                            .map_err(|e| format!("hp_tos: {e}"))?,
                    ),
                }
            }
            "bulk_prio" => p.bulk_prio = num(k, v)?,
            "quantum" => p.quantum = bytes(k, v)?,
            _ => p.limit_pkts = num(k, v)?,
        }
        Ok(())
    }
}

impl HfscParams {
    fn set(&mut self, k: &str, v: Option<&str>) -> Result<(), String> {
        let p = self;
        match k {
            "link" => p.link = rate(k, v)?,
            "rt_rate" => p.rt_rate = rate(k, v)?,
            "rt_umax" => p.rt_umax = bytes(k, v)?,
            "rt_dmax" => p.rt_dmax = dur(k, v)?,
            "bulk_rate" => p.bulk_rate = rate(k, v)?,
            "bulk_umax" => p.bulk_umax = bytes(k, v)?,
            "bulk_dmax" => p.bulk_dmax = dur(k, v)?,
            _ => p.leaf = Leaf::parse(need(k, v)?)?,
        }
        Ok(())
    }
}

impl Serialize for QdiscSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for QdiscSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
