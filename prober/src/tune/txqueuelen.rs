//! txqueuelen: the length of the device's default qdisc queue (pfifo_fast
//! and the default leaves of htb/prio use it as their packet limit, read
//! when the qdisc is created: it is applied before the qdisc tree). A veth
//! has no queue at all by default (noqueue), so txqueuelen only matters
//! there once a qdisc is installed. The bufferbloat report's 1000 x 1500 B
//! at 100 Mbit/s is 120 ms of queue.
//!
//! Kernel interface: sysfs /sys/class/net/DEV/tx_queue_len through the
//! namespace's own sysfs ([`crate::sys::Sys::sysfs_write`]); Linux >= 2.6.

use anyhow::{Context, Result, bail};

use super::{KnobGuard, at::At};
use crate::model::knobs::{APPLIED, AppliedKnobs, TxQueueLenApplied};
use crate::sys::netdev_attr;

pub(crate) struct TxQueueLenGuard<'a> {
    at: At<'a>,
    dev: String,
    len: u32,
    previous: u64,
    restored: bool,
}

fn parse(dev: &str, s: &str) -> Result<u64> {
    s.parse()
        .with_context(|| format!("tx_queue_len of {dev} holds {s:?}, not a number"))
}

#[cfg(test)]
pub(crate) fn read<'a>(at: impl Into<At<'a>>, dev: &str) -> Result<u64> {
    let at = at.into();
    parse(
        dev,
        &at.sys
            .sysfs_read(at.ns, &netdev_attr(dev, "tx_queue_len"))?,
    )
}

pub(crate) fn apply<'a>(at: impl Into<At<'a>>, dev: &str, len: u32) -> Result<TxQueueLenGuard<'a>> {
    let at = at.into();
    if len == 0 {
        bail!("txqueuelen 0 would leave pfifo_fast without a queue: give at least 1");
    }
    let path = netdev_attr(dev, "tx_queue_len");
    let previous = (|| {
        let prev = parse(dev, &at.sys.sysfs_read(at.ns, &path)?)?;
        at.sys.sysfs_write(at.ns, &path, &len.to_string())?;
        Ok::<_, anyhow::Error>(prev)
    })()
    .with_context(|| format!("setting txqueuelen of {dev}"))?;
    Ok(TxQueueLenGuard {
        at,
        dev: dev.to_string(),
        len,
        previous,
        restored: false,
    })
}

impl TxQueueLenGuard<'_> {
    /// What was applied, for the run metadata's `txqueuelen`.
    pub(crate) fn metadata(&self) -> TxQueueLenApplied {
        TxQueueLenApplied {
            dev: self.dev.clone(),
            netns: self.at.name(),
            packets: self.len,
            previous: self.previous,
            status: APPLIED.into(),
        }
    }
}

impl KnobGuard for TxQueueLenGuard<'_> {
    fn name(&self) -> &'static str {
        "txqueuelen"
    }

    fn record(&self, into: &mut AppliedKnobs) {
        into.txqueuelen = Some(self.metadata());
    }

    fn restore(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        self.at
            .sys
            .sysfs_write(
                self.at.ns,
                &netdev_attr(&self.dev, "tx_queue_len"),
                &self.previous.to_string(),
            )
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
