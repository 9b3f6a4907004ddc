//! TCP Small Queues: `net.ipv4.tcp_limit_output_bytes` caps the bytes one
//! TCP socket may have queued below it (qdisc + device), so a bulk flow
//! cannot fill the queue the probes wait in. The study went from 1 MiB to
//! 512 KiB and 64 KiB (2.2); on 6.x kernels the default is 4 MiB.
//!
//! The sysctl is per network namespace (since Linux 4.15): it is written
//! by a thread inside the sender namespace, where the TCP load's sockets
//! live, and the host's value is never touched. /proc/sys/net resolves the
//! namespace of the thread that opens the file, so no remount is needed.
//! As a guard against a kernel where it is global, the value seen from the
//! calling thread's namespace is compared before and after.
//!
//! Kernel interface: /proc/sys/net/ipv4/tcp_limit_output_bytes; Linux >= 4.15.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::KnobGuard;
use crate::testbed::Netns;

pub const SYSCTL: &str = "/proc/sys/net/ipv4/tcp_limit_output_bytes";

pub struct TsqGuard<'a> {
    ns: &'a Netns,
    bytes: u64,
    previous: u64,
    restored: bool,
}

fn read_here() -> Result<u64> {
    let s = std::fs::read_to_string(SYSCTL).with_context(|| format!("read {SYSCTL}"))?;
    s.trim()
        .parse()
        .with_context(|| format!("{SYSCTL} holds {s:?}"))
}

/// The value inside `ns`.
pub fn read(ns: &Netns) -> Result<u64> {
    ns.run(read_here)
}

/// Sets tcp_limit_output_bytes inside `ns`.
pub fn apply(ns: &Netns, bytes: u64) -> Result<TsqGuard<'_>> {
    if bytes == 0 || bytes > i32::MAX as u64 {
        bail!("tcp_limit_output_bytes {bytes} is out of range (1..2147483647)");
    }
    let outside_before = read_here().ok();
    let previous = ns.run(|| {
        let prev = read_here()?;
        std::fs::write(SYSCTL, bytes.to_string())
            .with_context(|| format!("write {bytes} to {SYSCTL} in namespace {}", ns.name()))?;
        Ok(prev)
    })?;
    let guard = TsqGuard {
        ns,
        bytes,
        previous,
        restored: false,
    };
    let outside_after = read_here().ok();
    if outside_before != outside_after {
        drop(guard);
        bail!(
            "net.ipv4.tcp_limit_output_bytes is not per-namespace on this kernel (writing it in {} \
             changed it outside too); it was put back. TSQ needs Linux >= 4.15",
            ns.name()
        );
    }
    Ok(guard)
}

impl KnobGuard for TsqGuard<'_> {
    fn name(&self) -> &'static str {
        "tsq"
    }

    fn metadata(&self) -> Value {
        json!({
            "status": "applied",
            "netns": self.ns.name(),
            "sysctl": "net.ipv4.tcp_limit_output_bytes",
            "bytes": self.bytes,
            "previous": self.previous,
        })
    }

    fn restore(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        let prev = self.previous;
        self.ns
            .run(|| {
                std::fs::write(SYSCTL, prev.to_string())
                    .with_context(|| format!("write {prev} to {SYSCTL}"))
            })
            .with_context(|| format!("restoring TSQ in namespace {}", self.ns.name()))
    }
}

impl Drop for TsqGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            log::warn!("{e:#}");
        }
    }
}
