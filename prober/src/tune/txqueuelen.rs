//! txqueuelen: the length of the device's default qdisc queue (pfifo_fast
//! and the default leaves of htb/prio use it as their packet limit, read
//! when the qdisc is created: it is applied before the qdisc tree). A veth
//! has no queue at all by default (noqueue), so txqueuelen only matters
//! there once a qdisc is installed. The bufferbloat report's 1000 x 1500 B
//! at 100 Mbit/s is 120 ms of queue.
//!
//! Kernel interface: sysfs /sys/class/net/DEV/tx_queue_len through the
//! namespace's own sysfs (see `sysfs`); Linux >= 2.6.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{KnobGuard, sysfs};
use crate::testbed::Netns;

pub struct TxQueueLenGuard<'a> {
    ns: &'a Netns,
    dev: String,
    len: u32,
    previous: u64,
    restored: bool,
}

pub fn read(ns: &Netns, dev: &str) -> Result<u64> {
    let dev = dev.to_string();
    sysfs::with_sysfs(ns, |sys| {
        sysfs::read_u64(&sysfs::netdev_dir(sys, &dev)?.join("tx_queue_len"))
    })
}

pub fn apply<'a>(ns: &'a Netns, dev: &str, len: u32) -> Result<TxQueueLenGuard<'a>> {
    if len == 0 {
        bail!("txqueuelen 0 would leave pfifo_fast without a queue: give at least 1");
    }
    let dev_s = dev.to_string();
    let previous = sysfs::with_sysfs(ns, |sys| {
        let p = sysfs::netdev_dir(sys, &dev_s)?.join("tx_queue_len");
        let prev = sysfs::read_u64(&p)?;
        sysfs::write(&p, &len.to_string())?;
        Ok(prev)
    })
    .with_context(|| format!("setting txqueuelen of {dev}"))?;
    Ok(TxQueueLenGuard {
        ns,
        dev: dev.to_string(),
        len,
        previous,
        restored: false,
    })
}

impl KnobGuard for TxQueueLenGuard<'_> {
    fn name(&self) -> &'static str {
        "txqueuelen"
    }

    fn metadata(&self) -> Value {
        json!({ "status": "applied", "netns": self.ns.name(), "dev": self.dev,
                "packets": self.len, "previous": self.previous })
    }

    fn restore(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        let (dev, prev) = (self.dev.clone(), self.previous);
        sysfs::with_sysfs(self.ns, |sys| {
            sysfs::write(
                &sysfs::netdev_dir(sys, &dev)?.join("tx_queue_len"),
                &prev.to_string(),
            )
        })
        .with_context(|| format!("restoring txqueuelen of {}", self.dev))
    }
}

impl Drop for TxQueueLenGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            log::warn!("{e:#}");
        }
    }
}
