//! TX ring size: how many packets the NIC's descriptor ring holds. In the
//! bandwidth lab a saturated link's delay was the time spent in a full TX
//! ring and grew with `ethtool -G DEV tx N` (64..4096, default 256).
//! veth has no ring (its `ethtool -g` is unsupported): that is reported,
//! not an error, unless the user asked for it to be.
//!
//! Kernel interface: SIOCETHTOOL ETHTOOL_GRINGPARAM/SRINGPARAM (see
//! `testbed::ethtool`), called from a thread
//! inside the interface's namespace; Linux >= 2.6.

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::{KnobGuard, Outcome};
use crate::testbed::Netns;
use crate::testbed::ethtool;

pub struct TxRingGuard<'a> {
    ns: &'a Netns,
    dev: String,
    tx: u32,
    previous: u32,
    restored: bool,
}

pub fn apply<'a>(ns: &'a Netns, dev: &str, tx: u32) -> Result<Outcome<TxRingGuard<'a>>> {
    let dev_s = dev.to_string();
    let prev = ns.run(|| {
        let r = match ethtool::ring(&dev_s) {
            Ok(r) => r,
            Err(e) if e.downcast_ref::<ethtool::Unsupported>().is_some() => {
                let drv = ethtool::driver(&dev_s).unwrap_or_else(|_| "unknown".into());
                return Ok(Err(format!(
                    "TX ring size is not adjustable on {dev_s} (driver {drv} has no ring: ethtool -g unsupported)"
                )));
            }
            Err(e) => return Err(e),
        };
        ethtool::set_tx_ring(&dev_s, tx)?;
        Ok(Ok(r.tx))
    })?;
    Ok(match prev {
        Ok(previous) => Outcome::Applied(TxRingGuard {
            ns,
            dev: dev.to_string(),
            tx,
            previous,
            restored: false,
        }),
        Err(reason) => Outcome::Unsupported(reason),
    })
}

impl KnobGuard for TxRingGuard<'_> {
    fn name(&self) -> &'static str {
        "tx_ring"
    }

    fn metadata(&self) -> Value {
        json!({ "status": "applied", "netns": self.ns.name(), "dev": self.dev,
                "tx": self.tx, "previous": self.previous })
    }

    fn restore(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        let (dev, prev) = (self.dev.clone(), self.previous);
        self.ns
            .run(|| ethtool::set_tx_ring(&dev, prev))
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
