//! One option model for the command line and scenario files.
//!
//! Each concept has one spec: a struct deriving both `clap::Args` and
//! `serde::Deserialize` (and `Serialize`) whose fields are all `Option`, so
//! "not given" is visible and specs merge by precedence:
//! scenario `[probe]`/`[knobs]` < `[set.NAME]` < the command line
//! ([`merge`]). One validator ([`plan::validate`]) turns the merged specs
//! into the run plan ([`plan::RunOptions`]) with the same limits for both,
//! and its errors carry the option's key, which the caller shows as the
//! flag (`--size`) or as the TOML key with its file and line.
//!
//! The flag of a field is its name in kebab case (`--link-rate`), the TOML
//! key is the same name in snake case (`link_rate`); the few exceptions
//! (`--flow` / `flows`) are spelled out on the field.
//!
//! Adding an option group (say `metrics.rs` with `MetricsSpec`):
//!
//! 1. write `options/metrics.rs`: a struct with
//!    `#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]`,
//!    `#[serde(deny_unknown_fields)]` and `Option` fields (durations through
//!    [`crate::model::units::parse_duration`] and
//!    `crate::model::units::humane_duration::option`);
//! 2. add `pub mod metrics;` below and one line to [`RunSpec`]:
//!    `#[command(flatten)] #[serde(flatten)] pub metrics: metrics::MetricsSpec,`
//!
//! The probe command then has the flags, and scenario files take the keys
//! in `[probe]` (and `rtprobe run FILE --flag` overrides them).
//! Domain types stay clap-free: their `clap::ValueEnum` impls live in
//! [`values`], and the knobs, a plain [`KnobSpec`] in `tune`, get their
//! flags from [`KnobArgs`] (converted with `From` where the command line
//! is read).

pub(crate) mod bench_forward;
pub(crate) mod continuous;
pub(crate) mod flows;
pub(crate) mod inventory;
pub(crate) mod knobs;
pub(crate) mod located;
pub(crate) mod output;
pub(crate) mod pacing;
pub(crate) mod passive;
pub(crate) mod plan;
pub(crate) mod probe;
pub(crate) mod remote;
pub(crate) mod targets;
pub(crate) mod values;
pub(crate) mod xdp;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

pub(crate) use crate::tune::KnobSpec;

pub(crate) use self::{
    flows::{FlowSpec, FlowsSpec},
    knobs::KnobArgs,
    output::OutputSpec,
    pacing::PacingSpec,
    plan::{RunOptions, SpecError},
    probe::ProbeSpec,
    xdp::XdpSpec,
};

/// What one probe run does, as the probe command's flags and a scenario's
/// `[probe]` table give it (the knobs are [`KnobSpec`], the outputs
/// [`OutputSpec`]). Groups are flattened: one line per group.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
pub(crate) struct RunSpec {
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) probe: ProbeSpec,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) xdp: XdpSpec,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) flows: FlowsSpec,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) pacing: PacingSpec,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) continuous: continuous::ContinuousArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub(crate) remote: remote::RemoteOptions,
}

impl RunSpec {
    /// `top` over `self`, with count and duration as one choice: a
    /// command line `--count` replaces a file's `duration` and the other
    /// way round.
    pub(crate) fn overridden_by(&self, top: &RunSpec) -> anyhow::Result<RunSpec> {
        let mut base = self.clone();
        if top.probe.count.is_some() || top.probe.duration.is_some() {
            base.probe.count = None;
            base.probe.duration = None;
        }
        merge(&base, top)
    }
}

/// `top` with every field it leaves unset (`None`) taken from `base`. One
/// function for every spec: both are written through serde, `top`'s set
/// fields laid over `base`'s, and read back, so a new field needs nothing
/// here. A field whose value does not read back as written is a bug that
/// `every_spec_round_trips` catches; it is an error, not a panic.
pub(crate) fn merge<T: Serialize + DeserializeOwned>(base: &T, top: &T) -> anyhow::Result<T> {
    use anyhow::Context;
    use serde_json::Value;
    let internal = "internal: an option does not read back as written";
    let (Value::Object(mut b), Value::Object(t)) = (
        serde_json::to_value(base).context(internal)?,
        serde_json::to_value(top).context(internal)?,
    ) else {
        anyhow::bail!("{internal}: a spec is not a map");
    };
    for (k, v) in t {
        if !v.is_null() {
            b.insert(k, v);
        }
    }
    // Unset stays absent: a field's own deserializer never sees a null.
    b.retain(|_, v| !v.is_null());
    serde_json::from_value(Value::Object(b)).context(internal)
}

/// Every key a spec takes (its fields, flattened groups included), read
/// from its serialized form, where every unset field is a null.
pub(crate) fn keys_of<T: Serialize + Default>() -> Vec<String> {
    match serde_json::to_value(T::default()) {
        Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// `--kebab-case` flag of a spec key (`link_rate` -> `--link-rate`), with
/// the keys whose flag is spelled differently.
pub(crate) fn flag_of(key: &str) -> String {
    match key {
        "flows" => "--flow".into(),
        "load" => "--load".into(),
        k => format!("--{}", k.replace('_', "-")),
    }
}

#[cfg(test)]
mod tests;
