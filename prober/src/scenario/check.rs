//! What `rtprobe run --check` adds to parsing: what the kernel must have
//! (qdiscs, congestion controls, stress-ng), asked without touching the
//! user's setup, and the plan it prints.

use std::{fmt, path::Path, time::Duration};

use anyhow::Result;

use super::{Cell, Scenario};
use crate::{
    options::located::{key_span, located},
    tune::{MissingPolicy, StressTool},
};

/// What the system must provide, asked without touching the user's setup.
pub trait SystemCheck {
    /// Kinds (and "u32") the kernel lacks among `kinds`.
    fn missing_qdiscs(&mut self, kinds: &[&'static str]) -> Result<Vec<String>>;
    fn congestion_controls(&mut self) -> Result<Vec<String>>;
    fn has_stress_ng(&mut self) -> bool;
}

/// The real checks, through the kernel layer: qdiscs in a scratch
/// namespace, /proc for congestion controls; PATH for stress-ng.
pub(crate) struct KernelCheck(pub(crate) crate::sys::SysRef);

impl SystemCheck for KernelCheck {
    fn missing_qdiscs(&mut self, kinds: &[&'static str]) -> Result<Vec<String>> {
        self.0.missing_qdisc_kinds(kinds)
    }

    fn congestion_controls(&mut self) -> Result<Vec<String>> {
        crate::tune::load::available_cc(self.0.as_ref())
    }

    fn has_stress_ng(&mut self) -> bool {
        crate::tune::stress::stress_ng_path().is_some()
    }
}

impl Scenario {
    /// What the kernel must have, checked before anything is touched:
    /// qdiscs (unless the set skips missing ones), congestion controls,
    /// stress-ng. Errors name the file, line and key.
    pub(crate) fn check_system(&self, sys: &mut dyn SystemCheck) -> Result<Vec<String>> {
        let mut notes = Vec::new();
        let mut cc: Option<Vec<String>> = None;
        for s in &self.sets {
            let where_ = |key: &str| -> Vec<String> {
                if self.set_has_key(&s.name, key) {
                    vec!["set".into(), s.name.clone(), key.into()]
                } else {
                    vec!["knobs".into(), key.into()]
                }
            };
            let loc = |key: &str, m: &dyn fmt::Display| {
                let p = where_(key);
                let p: Vec<&str> = p.iter().map(String::as_str).collect();
                located(&self.path, &self.source, &p, m)
            };
            if let Some(q) = &s.knobs.qdisc {
                let missing = sys.missing_qdiscs(&q.requirements())?;
                if !missing.is_empty() {
                    let what = format!(
                        "qdisc {} needs {}, which this kernel lacks",
                        q.kind(),
                        missing.join(", ")
                    );
                    match s.knobs.missing() {
                        MissingPolicy::Fail => {
                            return Err(loc(
                                "qdisc",
                                &format!(
                                    "{what}: pick another qdisc, load the module, or set \
                                     missing = \"skip\" (or run with --missing skip) to run \
                                     this set without it"
                                ),
                            ));
                        }
                        MissingPolicy::Skip => {
                            notes.push(format!("set {}: {what}; it will be skipped", s.name))
                        }
                    }
                }
            }
            for l in s.knobs.loads() {
                if let Some(c) = l.cc() {
                    if cc.is_none() {
                        cc = Some(sys.congestion_controls()?);
                    }
                    let avail = cc.as_deref().unwrap_or_default();
                    if let Err(m) = crate::tune::load::check_cc(c, avail) {
                        return Err(loc("load", &m));
                    }
                }
            }
            if s.knobs.stress_tool == Some(StressTool::StressNg) && !sys.has_stress_ng() {
                return Err(loc(
                    "stress_tool",
                    &"stress-ng is not installed: apt-get install stress-ng, or use the built-in stress",
                ));
            }
        }
        Ok(notes)
    }

    fn set_has_key(&self, set: &str, key: &str) -> bool {
        key_span(&self.source, &["set", set, key]).is_some()
    }
}

/// What `--check` prints: the matrix and the knob sets.
pub fn plan(sc: &Scenario, cells: &[Cell], out_dir: &Path, notes: &[String]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "scenario {} ({}): OK", sc.name, sc.path.display());
    if let Some(d) = &sc.description {
        let _ = writeln!(s, "  {d}");
    }
    let est: Duration = cells.iter().map(Cell::estimate).sum();
    let _ = writeln!(
        s,
        "  {} cells = {} sizes x {} intervals x {} xdp modes x {} sets, about {} in all",
        cells.len(),
        sc.axes.sizes.len(),
        sc.axes.intervals.len(),
        sc.axes.xdp_modes.len(),
        sc.sets.len(),
        humantime::format_duration(Duration::from_secs(est.as_secs()))
    );
    let _ = writeln!(s, "  output: {}", out_dir.display());
    for (i, set) in sc.sets.iter().enumerate() {
        let _ = writeln!(
            s,
            "  set {}{}: {}",
            set.name,
            if i == 0 { " (baseline)" } else { "" },
            set.knobs.describe()
        );
    }
    for n in notes {
        let _ = writeln!(s, "  note: {n}");
    }
    s
}
