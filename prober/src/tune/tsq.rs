//! TCP Small Queues: `net.ipv4.tcp_limit_output_bytes` caps the bytes one
//! TCP socket may have queued below it (qdisc + device), so a bulk flow
//! cannot fill the queue the probes wait in. The study went from 1 MiB to
//! 512 KiB and 64 KiB (2.2); on 6.x kernels the default is 4 MiB.
//!
//! The sysctl is per network namespace (since Linux 4.15): it is written
//! in the sender namespace (through [`crate::sys::Sys::set_sysctl`]), where
//! the TCP load's sockets live, and the host's value is never touched. As a
//! guard against a kernel where it is global, the host's value is compared
//! before and after.
//!
//! Kernel interface: /proc/sys/net/ipv4/tcp_limit_output_bytes; Linux >= 4.15.

use anyhow::{Context, Result, bail};

use super::{KnobGuard, at::At};
use crate::model::knobs::{APPLIED, AppliedKnobs, TsqApplied};
use crate::sys::Ns;

#[cfg(test)]
pub(crate) const SYSCTL: &str = "/proc/sys/net/ipv4/tcp_limit_output_bytes";
const KEY: &str = "net.ipv4.tcp_limit_output_bytes";

pub(crate) struct TsqGuard<'a> {
    at: At<'a>,
    bytes: u64,
    previous: u64,
    restored: bool,
}

fn read_in(at: At<'_>, ns: Ns<'_>) -> Result<u64> {
    let s = at.sys.sysctl(ns, KEY)?;
    s.parse().with_context(|| format!("{KEY} holds {s:?}"))
}

#[cfg(test)]
pub(crate) fn read<'a>(at: impl Into<At<'a>>) -> Result<u64> {
    let at = at.into();
    read_in(at, at.ns)
}

pub(crate) fn apply<'a>(at: impl Into<At<'a>>, bytes: u64) -> Result<TsqGuard<'a>> {
    let at = at.into();
    if bytes == 0 || bytes > i32::MAX as u64 {
        bail!("tcp_limit_output_bytes {bytes} is out of range (1..2147483647)");
    }
    let outside_before = read_in(at, Ns::Host).ok();
    let previous = read_in(at, at.ns)?;
    at.sys
        .set_sysctl(at.ns, KEY, &bytes.to_string())
        .with_context(|| format!("in namespace {}", at.name()))?;
    let guard = TsqGuard {
        at,
        bytes,
        previous,
        restored: false,
    };
    let outside_after = read_in(at, Ns::Host).ok();
    if outside_before != outside_after {
        drop(guard);
        bail!(
            "net.ipv4.tcp_limit_output_bytes is not per-namespace on this kernel (writing it in {} \
             changed it outside too); it was put back. TSQ needs Linux >= 4.15",
            at.name()
        );
    }
    Ok(guard)
}

impl TsqGuard<'_> {
    /// What was applied, for the run metadata's `tsq`.
    pub(crate) fn metadata(&self) -> TsqApplied {
        TsqApplied {
            bytes: self.bytes,
            netns: self.at.name(),
            previous: self.previous,
            status: APPLIED.into(),
            sysctl: KEY.into(),
        }
    }
}

impl KnobGuard for TsqGuard<'_> {
    fn name(&self) -> &'static str {
        "tsq"
    }

    fn record(&self, into: &mut AppliedKnobs) {
        into.tsq = Some(self.metadata());
    }

    fn restore(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        self.at
            .sys
            .set_sysctl(self.at.ns, KEY, &self.previous.to_string())
            .with_context(|| format!("restoring TSQ in namespace {}", self.at.name()))
    }
}

impl Drop for TsqGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            log::warn!("{e:#}");
        }
    }
}
