//! Applying the knobs to a testbed: [`apply`] installs each in the
//! order the module documentation gives and returns the [`Applied`]
//! guards, which record what they did, sample the bottleneck queue and
//! restore everything (in reverse) on `restore()` or drop.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

use super::{
    At, Bottleneck, DEFAULT_LOAD_WARMUP, DevicePolicy, KnobGuard, Knobs, LoadReport, LoadSpec,
    MissingPolicy, Outcome, QdiscSpec, QueueLimit, Rate, Shaping, bql, gso, load, qdisc, ring,
    sampler, stress, tsq, txqueuelen,
};
use crate::{
    error::Error,
    model::knobs::{APPLIED, AppliedKnobs, BottleneckAt, LoadStarted, QdiscTreeApplied},
    sys::{Netns, Ns, QdiscInfo, rt::RtSettings},
    testbed::Testbed,
};

/// Everything `apply` changed; restores it all (in reverse) on drop or
/// `restore()`. Borrows the testbed so it cannot outlive it: knobs must be
/// undone while the interfaces are still where they were put.
pub(crate) struct Applied<'tb> {
    guards: Vec<Box<dyn KnobGuard + 'tb>>,
    load: Option<load::Load>,
    sampler: Option<sampler::QueueSampler>,
    /// `bottleneck` and `load`: what `apply` noted besides the guards.
    notes: AppliedKnobs,
    skipped: Vec<String>,
    unsupported: BTreeMap<String, String>,
    rt: RtSettings,
    queue_sample: Option<Duration>,
    bottleneck_ns: &'tb Netns,
    bottleneck_dev: String,
    sys: &'tb dyn crate::sys::Sys,
    /// The bottleneck's root qdisc counters when the load's window opened.
    queue_at_mark: Option<(Instant, QdiscInfo)>,
    restored: bool,
}

impl<'tb> Applied<'tb> {
    /// What was applied, for RunMeta.knobs: one entry per knob, plus
    /// `bottleneck`, `skipped` (requested but not run: the run is not what
    /// was asked) and `unsupported` (device cannot, reported).
    pub(crate) fn metadata(&self) -> AppliedKnobs {
        let mut m = self.notes.clone();
        for g in &self.guards {
            g.record(&mut m);
        }
        if !self.rt.is_empty() {
            m.rt = Some(self.rt.metadata());
        }
        m.queue_sampler = self.sampler.as_ref().map(sampler::QueueSampler::metadata);
        m.skipped = self.skipped.clone();
        m.unsupported = self.unsupported.clone();
        m
    }

    /// Real-time settings for the probe sender thread to apply to itself.
    #[cfg(test)]
    pub(crate) fn rt(&self) -> &RtSettings {
        &self.rt
    }

    /// The bottleneck interface and its namespace.
    #[cfg(test)]
    pub(crate) fn bottleneck(&self) -> (&'tb Netns, &str) {
        (self.bottleneck_ns, &self.bottleneck_dev)
    }

    /// Starts the queue sampler into `csv` if the knobs ask for one
    /// (`queue_sample`); returns whether it started.
    pub(crate) fn start_queue_sampler(&mut self, csv: &Path) -> Result<bool> {
        let Some(iv) = self.queue_sample else {
            return Ok(false);
        };
        if self.sampler.is_some() {
            bail!("the queue sampler is already running");
        }
        self.sampler = Some(sampler::start(
            self.bottleneck_ns,
            &self.bottleneck_dev,
            iv,
            csv,
        )?);
        Ok(true)
    }

    /// Stops the competing load (and the queue sampler) and returns what
    /// the load achieved (None without load) and what was asked for but
    /// did not run, for the run report.
    pub(crate) fn stop_load(&mut self) -> Result<(Option<LoadReport>, Vec<String>)> {
        if let Some(s) = &mut self.sampler {
            s.stop()?;
        }
        // The kernel's side of the load's window, read while the senders
        // still run: the window ends at their last datagram.
        let queue = match (&self.load, self.queue_at_mark.take()) {
            (Some(_), Some((at, before))) => self.root_qdisc().map(|now| {
                load::QueueWindow::between(&self.bottleneck_dev, &before, &now, at.elapsed())
            }),
            _ => None,
        };
        let load = match &mut self.load {
            Some(l) => {
                let mut rep = l.stop()?;
                rep.bottleneck = queue;
                Some(rep)
            }
            None => None,
        };
        Ok((load, self.skipped.clone()))
    }

    /// The bottleneck's root qdisc, None (logged) if the kernel has none
    /// there or cannot say.
    fn root_qdisc(&self) -> Option<QdiscInfo> {
        let ns = Ns::Named(self.bottleneck_ns.name());
        match crate::sys::root_qdisc(self.sys, ns, &self.bottleneck_dev) {
            Ok(q) => q,
            Err(e) => {
                log::warn!("bottleneck counters of {}: {e:#}", self.bottleneck_dev);
                None
            }
        }
    }

    /// Undoes everything now; the first error is returned, the rest logged,
    /// and every knob is attempted.
    pub(crate) fn restore(mut self) -> Result<()> {
        self.restore_all()
    }

    fn restore_all(&mut self) -> Result<()> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        let mut first: Option<anyhow::Error> = None;
        let mut note = |e: anyhow::Error| {
            if first.is_some() {
                log::warn!("{e:#}");
            } else {
                first = Some(e);
            }
        };
        if let Some(mut l) = self.load.take()
            && let Err(e) = l.stop()
        {
            note(e);
        }
        if let Some(mut s) = self.sampler.take()
            && let Err(e) = s.stop()
        {
            note(e);
        }
        while let Some(mut g) = self.guards.pop() {
            if let Err(e) = g.restore() {
                note(e.context(format!("restoring {}", g.name())));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Applied<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.restore_all() {
            log::warn!("{e:#}");
        }
    }
}

struct TreeKnob<'a> {
    tree: qdisc::QdiscTree<'a>,
    meta: QdiscTreeApplied,
}

impl KnobGuard for TreeKnob<'_> {
    fn name(&self) -> &'static str {
        "qdisc_tree"
    }

    fn record(&self, into: &mut AppliedKnobs) {
        into.qdisc_tree = Some(self.meta.clone());
    }

    fn restore(&mut self) -> Result<()> {
        self.tree.restore()
    }
}

/// Speed of a physical NIC (sysfs `speed`, Mb/s), None for virtual devices.
fn nic_speed(at: At<'_>, dev: &str) -> Result<Option<Rate>> {
    let entries = at.sys.sysfs_list(at.ns, &format!("class/net/{dev}"))?;
    if !entries.iter().any(|e| e == "device") {
        return Ok(None);
    }
    Ok(at
        .sys
        .sysfs_read(at.ns, &crate::sys::netdev_attr(dev, "speed"))
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|m| *m > 0)
        .map(|m| Rate::mbit(m as u64)))
}

/// The qdisc to install: the one asked for, or None if there is none or
/// the kernel lacks what it needs and `missing = skip` (then with the
/// reason to report). With `missing = fail` that is a `QdiscUnavailable`
/// error naming the first missing kind.
pub(super) fn decide_qdisc(
    sys: &dyn crate::sys::Sys,
    knobs: &Knobs,
) -> Result<(Option<QdiscSpec>, Option<String>)> {
    let Some(q) = &knobs.qdisc else {
        return Ok((None, None));
    };
    let missing = sys.missing_qdisc_kinds(&q.requirements())?;
    let Some(first) = missing.first() else {
        return Ok((Some(q.clone()), None));
    };
    match knobs.missing() {
        MissingPolicy::Fail => Err(anyhow::Error::new(Error::QdiscUnavailable {
            kind: first.clone(),
        })
        .context(format!(
            "qdisc {} needs {} (set missing = skip / --missing skip to run without it)",
            q.kind(),
            missing.join(", ")
        ))),
        MissingPolicy::Skip => {
            let why = format!("qdisc {q} skipped: the kernel lacks {}", missing.join(", "));
            log::warn!("{why}");
            Ok((None, Some(why)))
        }
    }
}

/// Applies `knobs` to the testbed. On error everything applied so far is
/// restored before returning.
pub(crate) fn apply<'tb>(tb: &'tb Testbed, knobs: &Knobs) -> Result<Applied<'tb>> {
    knobs.validate_with_probe().map_err(|e| anyhow!(e))?;
    let (ns, iface) = bottleneck_of(tb, knobs)?;
    let dev = iface.name.clone();
    // Every knob reaches the kernel through the testbed's Sys.
    let at = At::new(tb.sys(), Ns::Named(ns.name()));
    let at_sender = At::new(tb.sys(), Ns::Named(tb.sender.name()));
    let mut a = Applied {
        guards: Vec::new(),
        load: None,
        sampler: None,
        notes: AppliedKnobs::default(),
        skipped: Vec::new(),
        unsupported: BTreeMap::new(),
        rt: knobs.rt(),
        queue_sample: knobs.queue_sample,
        bottleneck_ns: ns,
        bottleneck_dev: dev.clone(),
        sys: tb.sys(),
        queue_at_mark: None,
        restored: false,
    };
    a.notes.bottleneck = Some(BottleneckAt {
        dev: dev.clone(),
        netns: ns.name().into(),
        side: knobs.bottleneck().as_str().into(),
    });

    // Decide about the qdisc before touching anything.
    let (qdisc, skipped) = decide_qdisc(tb.sys(), knobs)?;
    a.skipped.extend(skipped);
    let shaping = knobs.shaping();

    a.apply_device_knobs(knobs, at, at_sender, &tb.sender_if.name)?;
    if shaping.is_some() || qdisc.is_some() {
        let tree = install_tree(at, &dev, knobs, shaping.as_ref(), qdisc.as_ref())?;
        a.guards.push(Box::new(tree));
    }
    if let Some(b) = knobs.tsq {
        a.guards.push(Box::new(tsq::apply(at_sender, b.0)?));
    }
    if let Some(n) = knobs.stress {
        a.guards.push(Box::new(stress::start(
            n,
            knobs.stress_tool.unwrap_or_default(),
        )?));
    }
    if !knobs.loads().is_empty() {
        a.start_load(tb, knobs, at, shaping)?;
    }
    Ok(a)
}

/// The namespace and interface the bottleneck knobs act on.
fn bottleneck_of<'tb>(
    tb: &'tb Testbed,
    knobs: &Knobs,
) -> Result<(&'tb Netns, &'tb crate::testbed::Iface)> {
    Ok(match knobs.bottleneck() {
        Bottleneck::Sender => (&tb.sender, &tb.sender_if),
        Bottleneck::Router => match (&tb.router, &tb.router_out) {
            (Some(r), Some(i)) => (r, i),
            _ => bail!(
                "bottleneck = router needs the router namespace, which NIC-pair mode does not have: \
                 use bottleneck = sender"
            ),
        },
    })
}

/// Renders the shaper and qdisc for `dev` and installs them; the guard
/// carries the tree's metadata.
fn install_tree<'a>(
    at: At<'a>,
    dev: &str,
    knobs: &Knobs,
    shaping: Option<&Shaping>,
    qdisc: Option<&QdiscSpec>,
) -> Result<TreeKnob<'a>> {
    let ctx = qdisc::RenderCtx {
        link_rate: knobs.link_rate,
        overhead_bytes: knobs.overhead_bytes(),
        probe: knobs.probe.clone(),
    };
    let (cmds, mut meta) = qdisc::render_tree(dev, shaping, qdisc, &ctx);
    let tree = qdisc::QdiscTree::install(at, dev, &cmds)?;
    meta.status = APPLIED.into();
    meta.netns = at.name();
    meta.dev = dev.into();
    Ok(TreeKnob { tree, meta })
}

impl<'tb> Applied<'tb> {
    /// txqueuelen, segmentation offload, TX ring and BQL, in that order
    /// (txqueuelen is read by qdiscs when they are created).
    fn apply_device_knobs(
        &mut self,
        knobs: &Knobs,
        at: At<'tb>,
        at_sender: At<'tb>,
        sender_dev: &str,
    ) -> Result<()> {
        let dev = self.bottleneck_dev.clone();
        if let Some(n) = knobs.txqueuelen {
            self.guards.push(Box::new(txqueuelen::apply(at, &dev, n)?));
        }
        if let Some(on) = knobs.gso {
            // Always the sender's interface: it decides what size leaves the sender.
            self.guards
                .push(Box::new(gso::apply(at_sender, sender_dev, on)?));
        }
        if let Some(n) = knobs.tx_ring {
            match ring::apply(at, &dev, n)? {
                Outcome::Applied(g) => self.guards.push(Box::new(g)),
                Outcome::Unsupported(why) => self.device_unsupported(knobs, "tx_ring", why)?,
            }
        }
        if let Some(b) = knobs.bql_limit_max {
            match bql::apply(at, &dev, b.0)? {
                Outcome::Applied(g) => self.guards.push(Box::new(g)),
                Outcome::Unsupported(why) => self.device_unsupported(knobs, "bql", why)?,
            }
        }
        Ok(())
    }

    /// A device knob the driver cannot do: reported, or an error with
    /// `device_unsupported = fail`.
    fn device_unsupported(&mut self, knobs: &Knobs, key: &str, why: String) -> Result<()> {
        match knobs.device_unsupported() {
            DevicePolicy::Report => {
                log::info!("{why}");
                self.unsupported.insert(key.into(), why);
                Ok(())
            }
            DevicePolicy::Fail => bail!("{why} (device_unsupported = fail)"),
        }
    }

    /// Starts the competing load, waits out its warm-up and opens its
    /// measuring window.
    fn start_load(
        &mut self,
        tb: &'tb Testbed,
        knobs: &Knobs,
        at: At<'tb>,
        shaping: Option<Shaping>,
    ) -> Result<()> {
        let link_rate = match knobs.link_rate {
            Some(r) => Some(r),
            None if knobs.loads().iter().any(LoadSpec::needs_link_rate) => {
                nic_speed(at, &self.bottleneck_dev)?
            }
            None => None,
        };
        let queue_bytes_hint = match knobs.queue_limit {
            Some(QueueLimit::Bytes(b)) => b,
            Some(QueueLimit::Packets(p)) => p as u64 * 4096,
            None => 1000 * 4096,
        };
        let target = load::LoadTarget {
            sys: tb.sys(),
            sender: &tb.sender,
            receiver: &tb.receiver,
            dst: tb.receiver_if.addr,
            src: tb.sender_if.addr,
            link_rate,
            shaping,
            queue_bytes_hint,
        };
        // CLOCK_REALTIME, as the CSV's probe times: `rtprobe plot` marks
        // when the load came on and when the measured part began.
        let started_ns = crate::probe::clock::realtime_ns();
        let mut l = load::start(&target, knobs.loads()).context("starting the competing load")?;
        let warmup = knobs.load_warmup.unwrap_or(DEFAULT_LOAD_WARMUP);
        std::thread::sleep(warmup);
        l.mark();
        self.queue_at_mark = self.root_qdisc().map(|q| (Instant::now(), q));
        let measured_from_ns = crate::probe::clock::realtime_ns();
        self.notes.load = Some(LoadStarted {
            link_rate: link_rate.map(|r| r.to_string()),
            measured_from_ns,
            receiver: tb.receiver_if.addr.to_string(),
            specs: knobs.loads().iter().map(|l| l.to_string()).collect(),
            started_ns,
            warmup: crate::model::units::fmt_duration(warmup),
        });
        self.load = Some(l);
        Ok(())
    }
}
