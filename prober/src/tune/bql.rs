//! Byte Queue Limits: caps how many bytes the driver's TX ring may hold,
//! so packets wait in the qdisc (where AQM and priorities act) instead of
//! in the ring (where nothing does). The study lowered `limit_max` to
//! 3000 bytes (2.1) and it moved the whole latency distribution down.
//!
//! Written per TX queue, `/sys/class/net/DEV/queues/tx-N/byte_queue_limits/limit_max`,
//! through the namespace's own sysfs (see `sysfs`). Devices without BQL
//! (veth, and any device without a TX ring: the kernel hides the
//! directory for lltx / IFF_NO_QUEUE devices since 6.x) are reported as
//! "no BQL on this device", which is not an error unless the user asked
//! for it to be.
//!
//! Kernel interface: sysfs byte_queue_limits (CONFIG_BQL, Linux >= 3.3).

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::{KnobGuard, Outcome, sysfs};
use crate::testbed::Netns;
use crate::testbed::ethtool;

pub struct BqlGuard<'a> {
    ns: &'a Netns,
    dev: String,
    limit_max: u64,
    /// (tx-N, previous limit_max)
    prev: Vec<(String, u64)>,
    restored: bool,
}

/// Sets limit_max on every TX queue of `dev` in `ns`.
pub fn apply<'a>(ns: &'a Netns, dev: &str, limit_max: u64) -> Result<Outcome<BqlGuard<'a>>> {
    let dev_s = dev.to_string();
    let res = sysfs::with_sysfs(ns, |sys| {
        let dir = sysfs::netdev_dir(sys, &dev_s)?.join("queues");
        let mut queues: Vec<String> = std::fs::read_dir(&dir)
            .with_context(|| format!("list {}", dir.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("tx-"))
            .collect();
        queues.sort_by_key(|q| q[3..].parse::<u32>().unwrap_or(u32::MAX));
        let with_bql: Vec<String> = queues
            .into_iter()
            .filter(|q| dir.join(q).join("byte_queue_limits").is_dir())
            .collect();
        if with_bql.is_empty() {
            let drv = ethtool::driver(&dev_s).unwrap_or_else(|_| "unknown".into());
            return Ok(Err(format!(
                "no BQL on this device ({dev_s}, driver {drv}: no byte_queue_limits in sysfs)"
            )));
        }
        let mut prev = Vec::new();
        for q in &with_bql {
            let p = dir.join(q).join("byte_queue_limits/limit_max");
            prev.push((q.clone(), sysfs::read_u64(&p)?));
        }
        let mut done = Vec::new();
        for (q, old) in &prev {
            let p = dir.join(q).join("byte_queue_limits/limit_max");
            if let Err(e) = sysfs::write(&p, &limit_max.to_string()) {
                // Put back the queues already changed before failing.
                for (q2, old2) in &done {
                    let _ = sysfs::write(
                        &dir.join(q2).join("byte_queue_limits/limit_max"),
                        &u64::to_string(old2),
                    );
                }
                return Err(e);
            }
            done.push((q.clone(), *old));
        }
        Ok(Ok(prev))
    })?;
    Ok(match res {
        Ok(prev) => Outcome::Applied(BqlGuard {
            ns,
            dev: dev.to_string(),
            limit_max,
            prev,
            restored: false,
        }),
        Err(reason) => Outcome::Unsupported(reason),
    })
}

/// limit_max of every TX queue of `dev` (for tests and reports).
pub fn read(ns: &Netns, dev: &str) -> Result<Vec<(String, u64)>> {
    let dev = dev.to_string();
    sysfs::with_sysfs(ns, |sys| {
        let dir = sysfs::netdev_dir(sys, &dev)?.join("queues");
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir)?.filter_map(|e| e.ok()) {
            let n = e.file_name().to_string_lossy().into_owned();
            let p = dir.join(&n).join("byte_queue_limits/limit_max");
            if n.starts_with("tx-") && p.exists() {
                out.push((n, sysfs::read_u64(&p)?));
            }
        }
        out.sort();
        Ok(out)
    })
}

impl KnobGuard for BqlGuard<'_> {
    fn name(&self) -> &'static str {
        "bql"
    }

    fn metadata(&self) -> Value {
        json!({
            "status": "applied",
            "netns": self.ns.name(),
            "dev": self.dev,
            "limit_max_bytes": self.limit_max,
            "queues": self.prev.iter().map(|(q, old)| json!({"queue": q, "previous": old})).collect::<Vec<_>>(),
        })
    }

    fn restore(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        let dev = self.dev.clone();
        let prev = self.prev.clone();
        sysfs::with_sysfs(self.ns, |sys| {
            let dir = sysfs::netdev_dir(sys, &dev)?.join("queues");
            let mut first_err = None;
            for (q, old) in &prev {
                let p = dir.join(q).join("byte_queue_limits/limit_max");
                if let Err(e) = sysfs::write(&p, &old.to_string()) {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        })
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
