//! Extra probe flows sent at the same time as the main one.

use std::{fmt, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::units;

#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FlowsSpec {
    /// Another probe flow at the same time (repeatable, at most 8), e.g. a low-priority flow:
    /// port=5062[,tos=0x00][,size=1472][,interval=100us]. Unset fields follow the main flow;
    /// rows carry the flow id (main = 0) and the summary has per-flow statistics.
    /// In scenario files: flows = ["port=5062,tos=0"].
    #[arg(long = "flow", value_name = "SPEC", value_parser = FlowSpec::parse)]
    pub(crate) flows: Option<Vec<FlowSpec>>,
}

/// An extra probe flow: `port=5062,tos=0x00,size=1472,interval=100us`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FlowSpec {
    pub(crate) port: u16,
    pub(crate) tos: Option<u8>,
    pub(crate) size: Option<usize>,
    pub(crate) interval: Option<Duration>,
}

impl FlowSpec {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut port = None;
        let (mut tos, mut size, mut interval) = (None, None, None);
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                format!("flow {s:?}: {part:?} is not key=value (keys: port, tos, size, interval)")
            })?;
            match k {
                "port" => {
                    port = Some(
                        v.parse::<u16>()
                            .map_err(|_| format!("flow {s:?}: bad port {v:?}"))?,
                    )
                }
                "tos" => tos = Some(units::parse_u8_maybe_hex(v)?),
                "size" => {
                    size = Some(
                        v.parse::<usize>()
                            .map_err(|_| format!("flow {s:?}: bad size {v:?}"))?,
                    )
                }
                "interval" => interval = Some(units::parse_duration(v)?),
                _ => {
                    return Err(format!(
                        "flow {s:?}: unknown key {k:?} (keys: port, tos, size, interval)"
                    ));
                }
            }
        }
        let port = port.ok_or_else(|| format!("flow {s:?}: give its port, e.g. port=5062"))?;
        if port == 0 {
            return Err(format!("flow {s:?}: port 0 is not usable"));
        }
        Ok(Self {
            port,
            tos,
            size,
            interval,
        })
    }
}

/// The `--flow` form, which `parse` reads back.
impl fmt::Display for FlowSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port={}", self.port)?;
        if let Some(t) = self.tos {
            write!(f, ",tos={t}")?;
        }
        if let Some(s) = self.size {
            write!(f, ",size={s}")?;
        }
        if let Some(i) = self.interval {
            write!(f, ",interval={}", units::fmt_duration_exact(i))?;
        }
        Ok(())
    }
}

impl Serialize for FlowSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FlowSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        FlowSpec::parse(&s).map_err(serde::de::Error::custom)
    }
}
