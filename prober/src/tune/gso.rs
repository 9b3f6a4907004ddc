//! Segmentation offload (TSO + GSO) on the sender's interface. TCP always
//! builds GSO super-packets (up to 64 KiB; since Linux 4.x it does not
//! even look at the device's GSO flag) and the kernel cuts them into
//! frames only after the qdisc, just before the driver. So:
//!
//! - at the sender's own qdisc (bottleneck = sender) a queue of "20
//!   packets" holds 20 super-packets whatever this knob says: limit it in
//!   bytes there (queue_limit = "30KiB");
//! - with segmentation off on the sender's interface, frames leave the
//!   sender already cut to the MTU, so a queue further on (bottleneck =
//!   router) holds wire frames, as a switch port does: the bufferbloat
//!   experiment's 20 vs 100 packets.
//!
//! A NIC with TSO queues super-packets too, so the study ran with it on:
//! this knob is left alone unless asked for.
//!
//! Kernel interface: SIOCETHTOOL ETHTOOL_GTSO/STSO/GGSO/SGSO (the legacy
//! per-feature calls, still mapped onto netdev features), from a thread in
//! the interface's namespace; Linux >= 2.6.18.

use anyhow::{Context, Result};

use super::{KnobGuard, at::At};
use crate::model::knobs::{APPLIED, AppliedKnobs, GsoApplied, TsoGso};
use crate::sys::Offload;
pub(crate) use crate::sys::ethtool::Segmentation;

pub(crate) struct GsoGuard<'a> {
    at: At<'a>,
    dev: String,
    on: bool,
    previous: Segmentation,
    restored: bool,
}

pub(crate) fn read<'a>(at: impl Into<At<'a>>, dev: &str) -> Result<Segmentation> {
    let at = at.into();
    Ok(Segmentation {
        tso: at.sys.offload(at.ns, dev, Offload::Tso)?,
        gso: at.sys.offload(at.ns, dev, Offload::Gso)?,
    })
}

/// Sets TSO and GSO, touching only what differs: a feature the kernel
/// holds fixed (veth with a native XDP program forces GSO off) is fine as
/// long as it is already as asked.
fn set(at: At<'_>, dev: &str, want: Segmentation) -> Result<()> {
    let now = read(at, dev)?;
    if now.tso != want.tso {
        at.sys.set_offload(at.ns, dev, Offload::Tso, want.tso)?;
    }
    if now.gso != want.gso {
        at.sys.set_offload(at.ns, dev, Offload::Gso, want.gso)?;
    }
    Ok(())
}

/// Turns TSO and GSO on or off on `dev`.
pub(crate) fn apply<'a>(at: impl Into<At<'a>>, dev: &str, on: bool) -> Result<GsoGuard<'a>> {
    let at = at.into();
    let previous = (|| {
        let prev = read(at, dev)?;
        set(at, dev, Segmentation { tso: on, gso: on })?;
        Ok::<_, anyhow::Error>(prev)
    })()
    .with_context(|| format!("switching segmentation offload of {dev}"))?;
    Ok(GsoGuard {
        at,
        dev: dev.to_string(),
        on,
        previous,
        restored: false,
    })
}

impl GsoGuard<'_> {
    /// What was applied, for the run metadata's `gso`.
    pub(crate) fn metadata(&self) -> GsoApplied {
        GsoApplied {
            dev: self.dev.clone(),
            netns: self.at.name(),
            previous: TsoGso {
                gso: self.previous.gso,
                tso: self.previous.tso,
            },
            status: APPLIED.into(),
            tso_gso: self.on,
        }
    }
}

impl KnobGuard for GsoGuard<'_> {
    fn name(&self) -> &'static str {
        "gso"
    }

    fn record(&self, into: &mut AppliedKnobs) {
        into.gso = Some(self.metadata());
    }

    fn restore(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        set(self.at, &self.dev, self.previous)
            .with_context(|| format!("restoring segmentation offload of {}", self.dev))
    }
}

impl Drop for GsoGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            log::warn!("{e:#}");
        }
    }
}
