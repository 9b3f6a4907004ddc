//! Byte Queue Limits: caps how many bytes the driver's TX ring may hold,
//! so packets wait in the qdisc (where AQM and priorities act) instead of
//! in the ring (where nothing does). The study lowered `limit_max` to
//! 3000 bytes (2.1) and it moved the whole latency distribution down.
//!
//! Written per TX queue, `/sys/class/net/DEV/queues/tx-N/byte_queue_limits/limit_max`,
//! through the namespace's own sysfs ([`crate::sys::Sys`]). Devices without BQL
//! (veth, and any device without a TX ring: the kernel hides the
//! directory for lltx / IFF_NO_QUEUE devices since 6.x) are reported as
//! "no BQL on this device", which is not an error unless the user asked
//! for it to be.
//!
//! Kernel interface: sysfs byte_queue_limits (CONFIG_BQL, Linux >= 3.3).

use anyhow::{Context, Result};

use super::{KnobGuard, Outcome, at::At};
use crate::model::knobs::{APPLIED, AppliedKnobs, BqlApplied, BqlQueue};
use crate::sys::netdev_attr;

pub(crate) struct BqlGuard<'a> {
    at: At<'a>,
    dev: String,
    limit_max: u64,
    /// (tx-N, previous limit_max)
    prev: Vec<(String, u64)>,
    restored: bool,
}

fn limit_path(dev: &str, queue: &str) -> String {
    netdev_attr(dev, &format!("queues/{queue}/byte_queue_limits/limit_max"))
}

/// TX queues of `dev` that have BQL, in queue order.
fn bql_queues(at: At<'_>, dev: &str) -> Result<Vec<String>> {
    let mut queues: Vec<String> = at
        .sys
        .sysfs_list(at.ns, &netdev_attr(dev, "queues"))?
        .into_iter()
        .filter(|n| n.starts_with("tx-"))
        .collect();
    queues.sort_by_key(|q| q[3..].parse::<u32>().unwrap_or(u32::MAX));
    let mut with_bql = Vec::new();
    for q in queues {
        let dir = netdev_attr(dev, &format!("queues/{q}"));
        if at
            .sys
            .sysfs_list(at.ns, &dir)?
            .iter()
            .any(|e| e == "byte_queue_limits")
        {
            with_bql.push(q);
        }
    }
    Ok(with_bql)
}

fn read_limit(at: At<'_>, dev: &str, q: &str) -> Result<u64> {
    let s = at.sys.sysfs_read(at.ns, &limit_path(dev, q))?;
    s.parse()
        .with_context(|| format!("limit_max of {dev} {q} holds {s:?}, not a number"))
}

/// Sets limit_max on every TX queue of `dev`.
pub(crate) fn apply<'a>(
    at: impl Into<At<'a>>,
    dev: &str,
    limit_max: u64,
) -> Result<Outcome<BqlGuard<'a>>> {
    let at = at.into();
    let queues = bql_queues(at, dev)?;
    if queues.is_empty() {
        let drv = at
            .sys
            .driver(at.ns, dev)
            .unwrap_or_else(|_| "unknown".into());
        return Ok(Outcome::Unsupported(format!(
            "no BQL on this device ({dev}, driver {drv}: no byte_queue_limits in sysfs)"
        )));
    }
    let mut prev = Vec::new();
    for q in &queues {
        prev.push((q.clone(), read_limit(at, dev, q)?));
    }
    // The guard puts back the queues already changed if a later one fails.
    let mut guard = BqlGuard {
        at,
        dev: dev.to_string(),
        limit_max,
        prev: Vec::new(),
        restored: false,
    };
    for (q, old) in prev {
        at.sys
            .sysfs_write(at.ns, &limit_path(dev, &q), &limit_max.to_string())?;
        guard.prev.push((q, old));
    }
    Ok(Outcome::Applied(guard))
}

/// limit_max of every TX queue of `dev` (for tests and reports).
#[cfg(test)]
pub(crate) fn read<'a>(at: impl Into<At<'a>>, dev: &str) -> Result<Vec<(String, u64)>> {
    let at = at.into();
    let mut out = Vec::new();
    for q in bql_queues(at, dev)? {
        let v = read_limit(at, dev, &q)?;
        out.push((q, v));
    }
    out.sort();
    Ok(out)
}

impl BqlGuard<'_> {
    /// What was applied, for the run metadata's `bql`.
    pub(crate) fn metadata(&self) -> BqlApplied {
        BqlApplied {
            dev: self.dev.clone(),
            limit_max_bytes: self.limit_max,
            netns: self.at.name(),
            queues: (self.prev.iter())
                .map(|(q, old)| BqlQueue {
                    previous: *old,
                    queue: q.clone(),
                })
                .collect(),
            status: APPLIED.into(),
        }
    }
}

impl KnobGuard for BqlGuard<'_> {
    fn name(&self) -> &'static str {
        "bql"
    }

    fn record(&self, into: &mut AppliedKnobs) {
        into.bql = Some(self.metadata());
    }

    fn restore(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        let mut first_err = None;
        for (q, old) in &self.prev {
            if let Err(e) =
                self.at
                    .sys
                    .sysfs_write(self.at.ns, &limit_path(&self.dev, q), &old.to_string())
            {
                first_err.get_or_insert(e);
            }
        }
        first_err
            .map_or(Ok(()), Err)
            .with_context(|| format!("restoring BQL limit_max of {}", self.dev))
    }
}

impl Drop for BqlGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            log::warn!("{e:#}");
        }
    }
}
