//! `rtprobe flows`' outputs: a CSV row per sampled send, and the text
//! tables of the stages per flow (live and at the end).

use std::{
    fmt::Write as _,
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use crate::{
    model::passive::SampledSend,
    stats::{
        passive::{FlowSummary, GroupSummary, StageSummary},
        summary::Latency,
    },
};

/// The CSV's header: one row per sampled send, stages in ns (empty where
/// the kernel did not report the stage).
pub(crate) const SENDS_CSV_HEADER: &str = "time_ns,cookie,pid,comm,cgroup_id,local,remote,bytes,\
stack_ns,sender_queue_ns,nic_ns,round_trip_ns,given_up,retransmitted";

/// A CSV of sampled sends.
pub(crate) struct SendsCsv {
    path: PathBuf,
    out: BufWriter<File>,
}

impl SendsCsv {
    pub(crate) fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).with_context(|| format!("create {}", path.display()))?;
        let mut out = BufWriter::new(file);
        writeln!(out, "{SENDS_CSV_HEADER}").with_context(|| format!("write {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            out,
        })
    }

    pub(crate) fn write(&mut self, s: &SampledSend) -> Result<()> {
        let ns = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        // A process name may hold a comma or a quote: quoted, quotes doubled.
        let comm = s.comm.replace('"', "\"\"");
        writeln!(
            self.out,
            "{},{},{},\"{comm}\",{},{},{},{},{},{},{},{},{},{}",
            s.time_ns,
            s.cookie,
            s.pid,
            s.cgroup_id,
            s.local,
            s.remote,
            s.bytes,
            ns(s.stack_ns),
            ns(s.sender_queue_ns),
            ns(s.nic_ns),
            ns(s.round_trip_ns),
            u8::from(s.given_up),
            u8::from(s.retransmitted),
        )
        .with_context(|| format!("write {}", self.path.display()))
    }

    /// Flushes what is buffered.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.out
            .flush()
            .with_context(|| format!("write {}", self.path.display()))
    }
}

/// "12.3" µs, or "-" for no value.
fn us(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |ns| format!("{:.1}", ns as f64 / 1e3))
}

/// "p50/p99" of a stage in µs.
fn p50_p99(l: &Latency) -> String {
    format!("{}/{}", us(l.p50), us(l.p99))
}

/// One table row's stage columns.
fn stage_cells(s: &StageSummary) -> String {
    format!(
        "{:>7} {:>15} {:>15} {:>15} {:>17}",
        s.samples,
        p50_p99(&s.stack),
        p50_p99(&s.sender_queue),
        p50_p99(&s.nic),
        p50_p99(&s.round_trip)
    )
}

const STAGE_HEADER: &str =
    "samples  stack p50/p99  queue p50/p99    nic p50/p99  round trip p50/p99";

/// The flows' table: one row per flow (the `top` most sampled), stages in
/// µs as p50/p99.
pub(crate) fn flows_table(flows: &[FlowSummary], all: &StageSummary, top: usize) -> String {
    let mut t = format!("{:<47} {:<16} {STAGE_HEADER}\n", "flow", "process");
    for f in flows.iter().take(top) {
        let flow = format!("{} -> {}", f.local, f.remote);
        let who = format!("{} ({})", f.comm, f.pid);
        let _ = writeln!(t, "{flow:<47} {who:<16} {}", stage_cells(&f.stages));
    }
    if flows.len() > top {
        let _ = writeln!(t, "... {} more flows", flows.len() - top);
    }
    let _ = writeln!(t, "{:<47} {:<16} {}", "all", "", stage_cells(all));
    t
}

/// A table of groups (processes or cgroups) under `title`.
pub(crate) fn groups_table(title: &str, groups: &[GroupSummary], top: usize) -> String {
    let mut t = format!("{title:<64} {STAGE_HEADER}\n");
    for g in groups.iter().take(top) {
        let _ = writeln!(t, "{:<64} {}", g.key, stage_cells(&g.stages));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send() -> SampledSend {
        SampledSend {
            time_ns: 1_700_000_000_000_000_000,
            cookie: 7,
            pid: 42,
            comm: "a,\"b\"".into(),
            cgroup_id: 1,
            local: "10.0.0.1:40000".parse().unwrap(),
            remote: "[fd00::2]:5201".parse().unwrap(),
            bytes: 1448,
            stack_ns: Some(5_000),
            sender_queue_ns: Some(300),
            nic_ns: None,
            round_trip_ns: Some(120_000),
            given_up: false,
            retransmitted: true,
        }
    }

    #[test]
    fn a_row_per_send_with_empty_cells_for_stages_not_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flows.csv");
        let mut c = SendsCsv::create(&path).unwrap();
        c.write(&send()).unwrap();
        c.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(SENDS_CSV_HEADER));
        assert_eq!(
            lines.next(),
            Some(
                "1700000000000000000,7,42,\"a,\"\"b\"\"\",1,10.0.0.1:40000,[fd00::2]:5201,1448,5000,300,,120000,0,1"
            )
        );
        let header_cols = SENDS_CSV_HEADER.split(',').count();
        assert_eq!(header_cols, 14);
    }

    #[test]
    fn a_directory_is_no_csv() {
        let dir = tempfile::tempdir().unwrap();
        let e = SendsCsv::create(dir.path()).err().unwrap();
        assert!(format!("{e:#}").contains(&dir.path().display().to_string()));
    }
}
