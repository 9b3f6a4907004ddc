//! Reading a scenario file: its TOML tables as serde sees them, and a
//! parse error as one line naming the file, line, column and key.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Result, anyhow};
use serde::{Deserialize, Deserializer, de};

use crate::{
    ebpf::XdpMode,
    model::units,
    options::{
        KnobSpec, RunSpec,
        located::{line_col, located_toml_error},
    },
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ScenarioFile {
    pub(super) name: Option<String>,
    pub(super) description: Option<String>,
    pub(super) output: Option<PathBuf>,
    #[serde(default)]
    pub(super) probe: ProbeSection,
    #[serde(default)]
    pub(super) knobs: KnobSpec,
    #[serde(default)]
    pub(super) set: Sets,
}

/// `[set.NAME]` tables in the order the file has them (toml keeps the
/// order with its `preserve_order` feature; a map visitor sees it).
#[derive(Debug, Default)]
pub(super) struct Sets(pub(super) Vec<(String, KnobSpec)>);

impl<'de> Deserialize<'de> for Sets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Sets;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("tables [set.NAME] of knobs")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut m: A) -> Result<Sets, A::Error> {
                let mut v = Vec::new();
                while let Some((k, knobs)) = m.next_entry::<String, KnobSpec>()? {
                    v.push((k, knobs));
                }
                Ok(Sets(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// `[probe]`: every option of [`RunSpec`] (the probe command's flags in
/// snake_case), plus the matrix: `sizes`, `intervals`, `xdp_modes` (one
/// cell per combination) instead of `size`, `interval`, `xdp_mode`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ProbeSection {
    pub(super) sizes: Option<Vec<usize>>,
    pub(super) intervals: Option<Vec<Humane>>,
    pub(super) xdp_modes: Option<Vec<XdpMode>>,
    #[serde(flatten)]
    pub(super) run: RunSpec,
    /// Every key (serde gives flattened maps all of them): those no spec
    /// knows are refused, with their line.
    #[serde(flatten)]
    pub(super) unknown: BTreeMap<String, de::IgnoredAny>,
}

/// A duration written as "1ms", "1.5ms", "30s".
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Humane(pub(super) Duration);

impl<'de> Deserialize<'de> for Humane {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        units::humane_duration::deserialize(d).map(Humane)
    }
}

/// One line for a toml parse/deserialize error: file, line, column, key.
fn toml_error(file: &Path, text: &str, e: &toml::de::Error) -> anyhow::Error {
    if let Some(located) = probe_key_error(file, text) {
        return located;
    }
    located_toml_error(file, text, e)
}

/// `[probe]` is read through serde's `flatten` (one spec per concept in
/// one table), which loses the position of a bad value. Reading each of its
/// entries alone finds the one that fails, with its line and key.
fn probe_key_error(file: &Path, text: &str) -> Option<anyhow::Error> {
    use toml::de::{DeTable, DeValue};
    let doc = DeTable::parse(text).ok()?;
    let (_, probe) = doc.get_ref().iter().find(|(k, _)| k.get_ref() == "probe")?;
    let DeValue::Table(t) = probe.get_ref() else {
        return None;
    };
    for (k, v) in t.iter() {
        let entry = text.get(k.span().start..v.span().end)?;
        if let Err(e) = toml::from_str::<ScenarioFile>(&format!("[probe]\n{entry}\n")) {
            let (l, c) = line_col(text, k.span().start);
            let msg = e.message().trim().replace('\n', " ");
            return Some(anyhow!(
                "{}:{l}:{c}: probe.{}: {msg}",
                file.display(),
                k.get_ref()
            ));
        }
    }
    None
}

/// The file's tables, read with serde; a bench-forward sweep given here is
/// named as such.
pub(super) fn read_file(path: &Path, text: &str) -> Result<ScenarioFile> {
    toml::from_str(text).map_err(|e| {
        if crate::options::bench_forward::BenchForwardArgs::parse(path, text).is_ok() {
            anyhow!(
                "{} is a bench-forward sweep, not a scenario: run `sudo rtprobe \
                 bench-forward --config {}`",
                path.display(),
                path.display()
            )
        } else {
            toml_error(path, text, &e)
        }
    })
}
