//! TX ring size: how many packets the NIC's descriptor ring holds. In the
//! bandwidth lab a saturated link's delay was the time spent in a full TX
//! ring and grew with `ethtool -G DEV tx N` (64..4096, default 256).
//! veth has no ring (its `ethtool -g` is unsupported): that is reported,
//! not an error, unless the user asked for it to be.
//!
//! Kernel interface: SIOCETHTOOL ETHTOOL_GRINGPARAM/SRINGPARAM (see
//! `sys::ethtool`), called from a thread
//! inside the interface's namespace; Linux >= 2.6.

use anyhow::{Context, Result};

use super::{KnobGuard, Outcome, at::At};
use crate::model::knobs::{APPLIED, AppliedKnobs, TxRingApplied};
use crate::sys::ethtool::Unsupported;

pub(crate) struct TxRingGuard<'a> {
    at: At<'a>,
    dev: String,
    tx: u32,
    previous: u32,
    restored: bool,
}

pub(crate) fn apply<'a>(
    at: impl Into<At<'a>>,
    dev: &str,
    tx: u32,
) -> Result<Outcome<TxRingGuard<'a>>> {
    let at = at.into();
    let r = match at.sys.ring(at.ns, dev) {
        Ok(r) => r,
        Err(e) if e.downcast_ref::<Unsupported>().is_some() => {
            let drv = at
                .sys
                .driver(at.ns, dev)
                .unwrap_or_else(|_| "unknown".into());
            return Ok(Outcome::Unsupported(format!(
                "TX ring size is not adjustable on {dev} (driver {drv} has no ring: ethtool -g unsupported)"
            )));
        }
        Err(e) => return Err(e),
    };
    at.sys.set_tx_ring(at.ns, dev, tx)?;
    Ok(Outcome::Applied(TxRingGuard {
        at,
        dev: dev.to_string(),
        tx,
        previous: r.tx,
        restored: false,
    }))
}

impl TxRingGuard<'_> {
    /// What was applied, for the run metadata's `tx_ring`.
    pub(crate) fn metadata(&self) -> TxRingApplied {
        TxRingApplied {
            dev: self.dev.clone(),
            netns: self.at.name(),
            previous: self.previous,
            status: APPLIED.into(),
            tx: self.tx,
        }
    }
}

impl KnobGuard for TxRingGuard<'_> {
    fn name(&self) -> &'static str {
        "tx_ring"
    }

    fn record(&self, into: &mut AppliedKnobs) {
        into.tx_ring = Some(self.metadata());
    }

    fn restore(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        self.at
            .sys
            .set_tx_ring(self.at.ns, &self.dev, self.previous)
            .with_context(|| format!("restoring the TX ring of {}", self.dev))
    }
}

impl Drop for TxRingGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            log::warn!("{e:#}");
        }
    }
}
