//! Durable records of testbeds, for `rtprobe cleanup`.
//!
//! Each testbed writes /run/rtprobe/ID.json before it changes anything and
//! rewrites it before each further change: its owner (PID and the process
//! start time, field 22 of /proc/PID/stat, so a recycled PID is not taken
//! for the owner), the network namespace it started in, and its undo steps
//! (namespaces, borrowed NIC-pair interfaces with their recorded state).
//! A normal end removes the record. After a SIGKILL or a power cut (/run is
//! a tmpfs: the namespaces went with the reboot, and so did the record)
//! `rtprobe cleanup` finds records whose owner is gone and undoes them.

use std::{
    io::Write,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::{Kind, Step, nicpair, undo_step};
use crate::sys::{Ns, Sys};

pub(crate) const RUN_DIR: &str = "/run/rtprobe";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) id: String,
    pub(crate) pid: u32,
    /// /proc/PID/stat field 22 (clock ticks after boot).
    pub(crate) start_time: u64,
    pub(crate) kind: String,
    /// Inode of the network namespace the run started in (where NIC-pair
    /// interfaces go back to).
    pub(crate) host_netns: u64,
    pub(crate) steps: Vec<Step>,
    #[serde(skip)]
    pub(crate) dir: PathBuf,
}

/// Start time of process `pid` (field 22 of /proc/PID/stat), None if there
/// is no such process.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm (field 2) may hold spaces and parentheses: count after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn netns_inode(path: &str) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("stat {path}"))?
        .ino())
}

impl Record {
    /// A record owned by this process, in /run/rtprobe.
    pub(crate) fn new(id: &str, kind: Kind) -> Result<Self> {
        Self::new_in(Path::new(RUN_DIR), id, kind)
    }

    pub(crate) fn new_in(dir: &Path, id: &str, kind: Kind) -> Result<Self> {
        let kind = match kind {
            Kind::Veth => "veth",
            Kind::NicPair => "nic-pair",
        };
        Self::new_kind(dir, id, kind)
    }

    /// A record in `dir` of a testbed of shape `kind` ("veth", "nic-pair",
    /// "pair": the two-namespace pair of `rtprobe testbed --pair`).
    pub(crate) fn new_kind(dir: &Path, id: &str, kind: &str) -> Result<Self> {
        let pid = std::process::id();
        let r = Self {
            id: id.to_string(),
            pid,
            start_time: start_time(pid).context("read this process's start time")?,
            kind: kind.to_string(),
            host_netns: netns_inode("/proc/self/ns/net")?,
            steps: Vec::new(),
            dir: dir.to_path_buf(),
        };
        r.save()?;
        Ok(r)
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.join(format!("{}.json", self.id))
    }

    /// Writes the record (whole, through a rename, so a crash leaves the
    /// old or the new one).
    pub(crate) fn save(&self) -> Result<()> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("create {}", self.dir.display()))?;
        let tmp = self.dir.join(format!(".{}.json.tmp", self.id));
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, self.path())
            .with_context(|| format!("write {}", self.path().display()))
    }

    pub(crate) fn remove(self) {
        if let Err(e) = std::fs::remove_file(self.path()) {
            log::warn!("could not remove {}: {e}", self.path().display());
        }
    }

    /// Is the process that made this testbed still running?
    pub(crate) fn owner_alive(&self) -> bool {
        start_time(self.pid) == Some(self.start_time)
    }

    /// One line for listings.
    pub(crate) fn describe(&self) -> String {
        let mut ns = Vec::new();
        let mut ifs = Vec::new();
        for s in &self.steps {
            match s {
                Step::Netns(n) => ns.push(n.as_str()),
                Step::Borrowed(b) => ifs.push(b.name.as_str()),
            }
        }
        let mut line = format!(
            "testbed {} ({}, owner pid {} gone): namespaces {}",
            self.id,
            self.kind,
            self.pid,
            if ns.is_empty() {
                "-".to_string()
            } else {
                ns.join(", ")
            }
        );
        if !ifs.is_empty() {
            line += &format!("; gives back {}", ifs.join(", "));
        }
        line
    }
}

/// All records in `dir`; unreadable ones are reported and skipped.
pub(crate) fn load_all(dir: &Path) -> Vec<Record> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        // rtprobe's own small records; the cap only guards against a
        // stray file in the directory.
        match crate::input::read_capped(&p, "testbed record", crate::input::MAX_RECORD_BYTES)
            .map_err(anyhow::Error::from)
            .and_then(|b| Ok(serde_json::from_slice::<Record>(&b)?))
        {
            Ok(mut r) => {
                r.dir = dir.to_path_buf();
                out.push(r);
            }
            Err(e) => log::warn!("skipping {}: {e:#}", p.display()),
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// Records in `dir` whose owner is gone.
pub(crate) fn stale(dir: &Path) -> Vec<Record> {
    load_all(dir)
        .into_iter()
        .filter(|r| !r.owner_alive())
        .collect()
}

/// One line on stderr when testbeds of dead runs are left (once per
/// process: a scenario builds a testbed per cell).
pub(crate) fn mention_stale() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(mention_stale_now);
}

fn mention_stale_now() {
    let n = stale(Path::new(RUN_DIR)).len();
    if n > 0 {
        eprintln!("{n} stale testbed(s) from dead runs: run `rtprobe cleanup`");
    }
}

/// Where the record's NIC-pair interfaces go back to: this process's
/// namespace if the run started here, else the named namespace with the
/// same inode.
fn host_of(sys: &dyn Sys, r: &Record) -> Result<Option<String>> {
    if netns_inode("/proc/self/ns/net")? == r.host_netns {
        return Ok(None);
    }
    for name in sys.netns_list() {
        let p = Path::new(super::netns::NETNS_RUN_DIR).join(&name);
        if std::fs::metadata(&p).is_ok_and(|m| m.ino() == r.host_netns) {
            return Ok(Some(name));
        }
    }
    bail!(
        "testbed {} started in another network namespace that has no name here: run `rtprobe cleanup` inside it",
        r.id
    )
}

/// Lists (and unless `dry_run`, removes) the testbeds in `dir` whose owner
/// is gone. Returns how many it found; the first failure is the error,
/// after every testbed was tried.
pub(crate) fn cleanup(
    sys: &dyn Sys,
    dir: &Path,
    dry_run: bool,
    out: &mut dyn Write,
) -> Result<usize> {
    let found = stale(dir);
    let mut first_err = None;
    for r in &found {
        writeln!(out, "{}", r.describe())?;
        if dry_run {
            continue;
        }
        let res = (|| -> Result<()> {
            let mut err = None;
            for s in r.steps.iter().rev() {
                let res = match s {
                    // Only an interface still in its testbed namespace needs
                    // the namespace it came from; one whose namespace is gone
                    // went back to the initial namespace (a NIC) or with it
                    // (a virtual device): nothing left to give back.
                    Step::Borrowed(b) if !nicpair::still_borrowed(sys, b) => {
                        writeln!(
                            out,
                            "  {} is no longer in {}: nothing to give back",
                            b.name, b.netns
                        )?;
                        Ok(())
                    }
                    Step::Borrowed(_) => host_of(sys, r).and_then(|host| {
                        let host = host.as_deref().map_or(Ns::Host, Ns::Named);
                        undo_step(sys, host, s, true)
                    }),
                    Step::Netns(_) => undo_step(sys, Ns::Host, s, true),
                };
                if let Err(e) = res {
                    err.get_or_insert(e);
                }
            }
            err.map_or(Ok(()), Err)
        })();
        match res {
            Ok(()) => {
                r.clone().remove();
                writeln!(out, "  removed")?;
            }
            Err(e) => {
                writeln!(out, "  not fully removed: {e:#}")?;
                first_err.get_or_insert(e);
            }
        }
    }
    if found.is_empty() {
        writeln!(out, "no stale testbeds")?;
    }
    first_err.map_or(Ok(found.len()), Err)
}
