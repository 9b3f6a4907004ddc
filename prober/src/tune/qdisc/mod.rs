//! The qdisc on the bottleneck interface, with the study's parameter sets
//! as presets, and the guard that installs the whole tree (shaper + qdisc)
//! and restores the interface's default qdisc afterwards.
//!
//! Written as `KIND[,key=value|flag]...`, on the CLI (`--qdisc
//! fq_codel,target=5ms`) and in scenario files (`qdisc = "pfifo,limit=20"`).
//! A bare kind is the study's preset (section 2.3):
//!
//! | kind        | preset                                                                  |
//! |-------------|-------------------------------------------------------------------------|
//! | pfifo_fast  | (no parameters; limit = txqueuelen)                                     |
//! | pfifo       | `limit=100`                                                             |
//! | bfifo       | `limit=151400` (100 full-size frames: pfifo's 100 in bytes)             |
//! | prio        | `bands=3,leaf=sfq` + u32 filter: probe port -> band 1 (class :1)        |
//! | fq_codel    | `limit=1000,target=1.5ms,interval=40ms,quantum=1514,flows=1024,noecn`  |
//! | htb         | probe class `probe_rate=auto,probe_burst=15k`, bulk class               |
//! |             | `bulk_rate=auto,bulk_ceil=auto,bulk_burst=15k`, `default=20,leaf=sfq`   |
//! | hfsc        | root `link=auto` (sc + ul), real-time class `rt_umax=1500,rt_dmax=6ms,` |
//! |             | `rt_rate=auto`, bulk class `bulk_umax=1500,bulk_dmax=50ms,bulk_rate=auto` |
//! | tbf         | `rate=10mbit,burst=1600,limit=16kb` (the bandwidth lab's tbf)           |
//! | htb-prio    | not the study's: a strict-priority tree for study 4's bound (below)    |
//! |             | `hp_rate=auto,link=auto,hp_port=auto,hp_tos=none,bulk_prio=1,`          |
//! |             | `quantum=1514,limit=100`                                                |
//!
//! `auto` rates follow the link: htb's bulk class gets the link rate (ceil)
//! minus the probe class, hfsc's root the link rate (the study's 1000mbit
//! and 999mbit were its 1 Gbit/s link; without shaping they stay so). The
//! probe/real-time class gets the study's 200kbit (htb) / 250kbit (hfsc),
//! raised to twice the probe flow's wire rate when the probes need more:
//! the study's probes (200 B every 8 ms) fit in 200kbit, rtprobe's 1472 B
//! every 1 ms do not, and a class slower than its flow measures its own
//! backlog instead of the link. The study's htb used `default 30`, a class
//! it never created, so its bulk traffic went through htb's unshaped direct
//! queue; the preset sends unclassified traffic to the bulk class 20
//! instead (`default=30` reproduces the original).
//!
//! `htb-prio` is the priority scheme this kernel has (sch_prio and
//! sch_hfsc are not built in everywhere; `htb` is). Its tree:
//!
//! ```text
//! 10: htb default 20
//!   10:1  rate LINK ceil LINK                      (parent: the link)
//!     10:10 rate HP   ceil LINK prio 0 quantum Q   (high priority) -> 11: pfifo limit N
//!     10:20 rate LINK-HP ceil LINK prio 1 quantum Q (everything else) -> 12: pfifo limit N
//! u32: UDP dport = hp_port (default: the probe flow's) -> 10:10
//!      [ip tos = hp_tos (mask 0xfc) -> 10:10]
//! ```
//!
//! Why this bounds the high class's wait: htb serves, at every dequeue,
//! the classes that are within their own rate (level 0) before any class
//! that borrows, and among those the lowest `prio` first. While the high
//! class sends below `HP` (auto: twice the probe flow's wire rate, at
//! least 5mbit) it is therefore always picked first, whatever the bulk
//! class holds; a high packet waits for at most the one bulk packet
//! already dequeued (a full frame's time at the link rate, 121 µs at
//! 100 Mbit/s, if segmentation offload is off where the queue is) plus
//! the high packets ahead of it, which depends only on the high arrival
//! rate. When both classes borrow, `prio` still orders them at the parent.
//!
//! The study's `htb` preset gives no such order: both classes have htb's
//! default prio 0, so while both have tokens they share the link by
//! deficit round robin, and the bulk class's quantum (rate / r2q, clamped
//! by htb to 200000 bytes) lets it send up to ~200 KB per turn ahead of a
//! waiting probe (16 ms at 100 Mbit/s). Its classes hang from the root
//! with no parent, so the bulk class cannot borrow (its ceil has no
//! effect) and stops at its own rate, the link minus the probe class: the
//! probe goes first only while the bulk class is out of tokens. Whether
//! that happens depends on the probe's rate (`tc -s class` on a run: both
//! classes `borrowed: 0`; see docs/STUDIES.md). A small quantum
//! (`quantum=1514`) keeps the turns short in htb-prio too.
//!
//! The tree: without shaping the qdisc is the root (handle 10:); with
//! shaping it is the leaf under the shaper's class 1:1 (see `shaping`).
//! Classes of a classful qdisc are 10:N, their leaves 11:, 12:, ...; the
//! u32 filter sits on 10: and matches the probe flow's UDP destination port.
//!
//! Availability: a kind is tried on `lo` of a scratch namespace that is
//! created and deleted for the check, so the user's interfaces are never
//! touched; "Specified qdisc kind is unknown" means the module is missing
//! and maps to `Error::QdiscUnavailable`.
//!
//! Kernel interface: tc (rtnetlink) for changes, RTM_GETQDISC (`nl`) to
//! snapshot and verify; sch_* modules as named above; Linux >= 3.5
//! (fq_codel), 4.x for everything else used here.
//!
//! Layout: this file holds the kinds, their presets and the guard that
//! installs a tree; `parse` the text form above (and serde through it);
//! `render` the tc commands of each kind and of the whole tree.

mod parse;
mod render;

use std::{fmt, time::Duration};

use anyhow::{Context, Result, bail};

pub(crate) use self::render::{RenderCtx, render_tree};
use super::{
    amounts::{Bytes, Rate},
    at::At,
    tc::{self, TcCmd},
};

/// Handle of the chosen qdisc, at the root or under the shaper.
pub(crate) const QDISC_HANDLE: &str = "10:";

/// What a classful qdisc puts under its classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leaf {
    /// Stochastic fairness queueing, as the study did.
    Sfq,
    /// A pfifo (limit = txqueuelen); available everywhere.
    Pfifo,
    /// Whatever the parent qdisc creates by itself.
    Default,
}

impl Leaf {
    fn as_str(self) -> &'static str {
        match self {
            Leaf::Sfq => "sfq",
            Leaf::Pfifo => "pfifo",
            Leaf::Default => "default",
        }
    }

    fn parse(v: &str) -> Result<Self, String> {
        match v {
            "sfq" => Ok(Leaf::Sfq),
            "pfifo" => Ok(Leaf::Pfifo),
            "default" | "none" => Ok(Leaf::Default),
            _ => Err(format!("leaf={v}: expected sfq, pfifo or default")),
        }
    }
}

/// A rate given explicitly or derived from the link and the probe flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AutoRate {
    Auto,
    Fixed(Rate),
}

impl AutoRate {
    fn parse(v: &str) -> Result<Self, String> {
        if v == "auto" {
            Ok(AutoRate::Auto)
        } else {
            v.parse().map(AutoRate::Fixed)
        }
    }
}

impl fmt::Display for AutoRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AutoRate::Auto => f.write_str("auto"),
            AutoRate::Fixed(r) => write!(f, "{r}"),
        }
    }
}

/// fq_codel parameters; None = the kernel's default.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FqCodel {
    pub(crate) limit: Option<u32>,
    pub(crate) target: Option<Duration>,
    pub(crate) interval: Option<Duration>,
    pub(crate) quantum: Option<u32>,
    pub(crate) flows: Option<u32>,
    pub(crate) ecn: Option<bool>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HtbParams {
    pub(crate) probe_rate: AutoRate,
    pub(crate) probe_burst: Bytes,
    pub(crate) bulk_rate: AutoRate,
    pub(crate) bulk_ceil: AutoRate,
    pub(crate) bulk_burst: Bytes,
    /// Minor id (hex, as tc reads it) of the class for unclassified traffic.
    pub(crate) default_class: String,
    pub(crate) leaf: Leaf,
}

/// Strict priority on htb: a high-priority class with a guaranteed rate
/// and htb prio 0, a bulk class at a lower prio, both borrowing up to the
/// link.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HtbPrioParams {
    /// Guaranteed rate of the high-priority class.
    pub(crate) hp_rate: AutoRate,
    /// The parent class's rate and both classes' ceil.
    pub(crate) link: AutoRate,
    /// UDP destination port sent to the high class; None: the probe flow's.
    pub(crate) hp_port: Option<u16>,
    /// TOS byte (DSCP bits, mask 0xfc) also sent to the high class.
    pub(crate) hp_tos: Option<u8>,
    /// htb prio of the bulk class (the high class has 0).
    pub(crate) bulk_prio: u8,
    /// DRR quantum of both classes: how much a class sends per turn.
    pub(crate) quantum: Bytes,
    /// pfifo limit of each leaf, packets.
    pub(crate) limit_pkts: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HfscParams {
    pub(crate) link: AutoRate,
    pub(crate) rt_rate: AutoRate,
    pub(crate) rt_umax: Bytes,
    pub(crate) rt_dmax: Duration,
    pub(crate) bulk_rate: AutoRate,
    pub(crate) bulk_umax: Bytes,
    pub(crate) bulk_dmax: Duration,
    pub(crate) leaf: Leaf,
}

/// The qdisc to put on the bottleneck, with its parameters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum QdiscSpec {
    PfifoFast,
    Pfifo {
        limit_pkts: u32,
    },
    Bfifo {
        limit_bytes: u64,
    },
    Prio {
        bands: u8,
        leaf: Leaf,
    },
    FqCodel(FqCodel),
    Htb(HtbParams),
    HtbPrio(HtbPrioParams),
    Hfsc(HfscParams),
    Tbf {
        rate: Rate,
        burst: Bytes,
        limit: Bytes,
    },
}

/// Names accepted as the kind, in the order the help lists them.
pub(crate) const KINDS: [&str; 9] = [
    "pfifo_fast",
    "pfifo",
    "bfifo",
    "prio",
    "fq_codel",
    "htb",
    "htb-prio",
    "hfsc",
    "tbf",
];

impl QdiscSpec {
    /// The study's parameter set for `kind`.
    pub(crate) fn preset(kind: &str) -> Result<Self, String> {
        Ok(match kind {
            "pfifo_fast" => QdiscSpec::PfifoFast,
            "pfifo" => QdiscSpec::Pfifo { limit_pkts: 100 },
            "bfifo" => QdiscSpec::Bfifo {
                limit_bytes: 100 * super::shaping::MTU_FRAME,
            },
            "prio" => QdiscSpec::Prio {
                bands: 3,
                leaf: Leaf::Sfq,
            },
            "fq_codel" => QdiscSpec::FqCodel(FqCodel {
                limit: Some(1000),
                target: Some(Duration::from_micros(1500)),
                interval: Some(Duration::from_millis(40)),
                quantum: Some(1514),
                flows: Some(1024),
                ecn: Some(false),
            }),
            "htb" => QdiscSpec::Htb(HtbParams {
                probe_rate: AutoRate::Auto,
                probe_burst: Bytes(15 * 1024),
                bulk_rate: AutoRate::Auto,
                bulk_ceil: AutoRate::Auto,
                bulk_burst: Bytes(15 * 1024),
                default_class: "20".into(),
                leaf: Leaf::Sfq,
            }),
            "htb-prio" => QdiscSpec::HtbPrio(HtbPrioParams {
                hp_rate: AutoRate::Auto,
                link: AutoRate::Auto,
                hp_port: None,
                hp_tos: None,
                bulk_prio: 1,
                quantum: Bytes(super::shaping::MTU_FRAME),
                limit_pkts: 100,
            }),
            "hfsc" => QdiscSpec::Hfsc(HfscParams {
                link: AutoRate::Auto,
                rt_rate: AutoRate::Auto,
                rt_umax: Bytes(1500),
                rt_dmax: Duration::from_millis(6),
                bulk_rate: AutoRate::Auto,
                bulk_umax: Bytes(1500),
                bulk_dmax: Duration::from_millis(50),
                leaf: Leaf::Default,
            }),
            "tbf" => QdiscSpec::Tbf {
                rate: Rate::mbit(10),
                burst: Bytes(1600),
                limit: Bytes(16 * 1024),
            },
            _ => {
                return Err(format!(
                    "unknown qdisc {kind:?}: expected one of {}",
                    KINDS.join(", ")
                ));
            }
        })
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            QdiscSpec::PfifoFast => "pfifo_fast",
            QdiscSpec::Pfifo { .. } => "pfifo",
            QdiscSpec::Bfifo { .. } => "bfifo",
            QdiscSpec::Prio { .. } => "prio",
            QdiscSpec::FqCodel(_) => "fq_codel",
            QdiscSpec::Htb(_) => "htb",
            QdiscSpec::HtbPrio(_) => "htb-prio",
            QdiscSpec::Hfsc(_) => "hfsc",
            QdiscSpec::Tbf { .. } => "tbf",
        }
    }

    /// Everything the kernel must have for this spec: qdisc kinds and the
    /// u32 classifier (named "u32").
    pub(crate) fn requirements(&self) -> Vec<&'static str> {
        if let QdiscSpec::HtbPrio(_) = self {
            return vec!["htb", "pfifo", "u32"];
        }
        let mut r = vec![self.kind()];
        let leaf = match self {
            QdiscSpec::Prio { leaf, .. } => Some(*leaf),
            QdiscSpec::Htb(h) => Some(h.leaf),
            QdiscSpec::Hfsc(h) => Some(h.leaf),
            _ => None,
        };
        if let Some(l) = leaf {
            match l {
                Leaf::Sfq => r.push("sfq"),
                Leaf::Pfifo => r.push("pfifo"),
                Leaf::Default => {}
            }
            r.push("u32");
        }
        r
    }
}

/// Installs a tree on `dev` inside `ns`; restores the kernel's default
/// qdisc on `restore()` or drop.
pub(crate) struct QdiscTree<'a> {
    at: At<'a>,
    dev: String,
    /// Kind of the default root qdisc before (noqueue on veth, mq or
    /// pfifo_fast/fq_codel on NICs), to verify the restore.
    before_kind: Option<String>,
    installed: bool,
}

impl<'a> QdiscTree<'a> {
    /// Refuses an interface that already has a configured (non-default)
    /// root qdisc: rtprobe could not put it back as it was.
    pub(crate) fn install(at: impl Into<At<'a>>, dev: &str, cmds: &[TcCmd]) -> Result<Self> {
        let at = at.into();
        let root = crate::sys::root_qdisc(at.sys, at.ns, dev)?;
        if let Some(r) = &root
            && !r.is_kernel_default()
        {
            bail!(
                "{dev} in namespace {} already has a configured root qdisc ({} handle {}); \
                 rtprobe only shapes interfaces it can restore: remove it with \
                 `tc qdisc del dev {dev} root` or run without qdisc/shaping knobs",
                at.name(),
                r.kind,
                r.handle
            );
        }
        let mut tree = QdiscTree {
            at,
            dev: dev.to_string(),
            before_kind: root.map(|q| q.kind),
            installed: true,
        };
        for c in cmds {
            if let Err(e) = at.sys.tc(at.ns, c) {
                // Take down what half went in; the drop would too, but the
                // error the user sees must be the tc one.
                let _ = tree.restore();
                return Err(e.context(format!("installing the qdisc tree on {dev}")));
            }
        }
        Ok(tree)
    }

    pub(crate) fn restore(&mut self) -> Result<()> {
        if !self.installed {
            return Ok(());
        }
        self.installed = false;
        let (at, dev) = (self.at, self.dev.as_str());
        let before = self.before_kind.clone();
        (|| {
            let del = TcCmd::new(["qdisc", "del", "dev", dev, "root"]);
            if let Err(e) = at.sys.tc(at.ns, &del) {
                // Nothing installed (the first command failed): fine.
                let nothing = e.downcast_ref::<tc::TcError>().is_some_and(|t| {
                    let s = t.stderr.to_ascii_lowercase();
                    s.contains("cannot delete qdisc with handle of zero")
                        || s.contains("no such file")
                });
                if !nothing {
                    return Err(e);
                }
            }
            let now = crate::sys::root_qdisc(at.sys, at.ns, dev)?;
            let now_kind = now.as_ref().map(|q| q.kind.clone());
            if now.as_ref().is_some_and(|q| !q.is_kernel_default()) || now_kind != before {
                bail!("root qdisc of {dev} is {now_kind:?} after restore, was {before:?}");
            }
            Ok(())
        })()
        .with_context(|| format!("restoring the default qdisc of {dev}"))
    }
}

impl Drop for QdiscTree<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            log::warn!("{e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{render::Parent, *};
    use crate::tune::{ProbeContext, shaping::Shaping};

    fn ctx() -> RenderCtx {
        RenderCtx {
            link_rate: None,
            overhead_bytes: 24,
            probe: ProbeContext {
                port: 5061,
                size: 200,
                interval: Duration::from_millis(10),
                ipv6: false,
            },
        }
    }

    fn lines(c: &[TcCmd]) -> Vec<String> {
        c.iter().map(|c| c.line()).collect()
    }

    #[test]
    fn presets_are_the_study() {
        let q: QdiscSpec = "fq_codel".parse().unwrap();
        let (c, _) = q.render("eth1", Parent::Root, &ctx());
        assert_eq!(
            lines(&c),
            [
                "tc qdisc add dev eth1 root handle 10: fq_codel limit 1000 target 1500us interval 40000us quantum 1514 flows 1024 noecn"
            ]
        );
        let q: QdiscSpec = "pfifo".parse().unwrap();
        assert_eq!(q, QdiscSpec::Pfifo { limit_pkts: 100 });
        let q: QdiscSpec = "prio".parse().unwrap();
        let (c, _) = q.render("eth1", Parent::Root, &ctx());
        assert_eq!(
            lines(&c),
            [
                "tc qdisc add dev eth1 root handle 10: prio bands 3",
                "tc qdisc add dev eth1 parent 10:1 handle 11: sfq",
                "tc qdisc add dev eth1 parent 10:2 handle 12: sfq",
                "tc qdisc add dev eth1 parent 10:3 handle 13: sfq",
                "tc filter add dev eth1 parent 10: protocol ip prio 1 u32 match ip dport 5061 0xffff flowid 10:1",
            ]
        );
        assert_eq!(q.requirements(), ["prio", "sfq", "u32"]);
    }

    #[test]
    fn htb_preset_follows_the_study_and_the_link() {
        let q: QdiscSpec = "htb".parse().unwrap();
        // No shaping: the study's 1 Gbit/s numbers and its 200kbit probe
        // class (200 B every 100 ms need 2 x 21 kbit/s).
        let mut c = ctx();
        c.probe.interval = Duration::from_millis(100);
        let (cmds, eff) = q.render("eth1", Parent::Root, &c);
        assert_eq!(
            lines(&cmds),
            [
                "tc qdisc add dev eth1 root handle 10: htb default 20",
                "tc class add dev eth1 parent 10: classid 10:10 htb rate 200000bit burst 15360",
                "tc class add dev eth1 parent 10: classid 10:20 htb rate 999000000bit ceil 1000000000bit burst 15360",
                "tc qdisc add dev eth1 parent 10:10 handle 11: sfq",
                "tc qdisc add dev eth1 parent 10:20 handle 12: sfq",
                "tc filter add dev eth1 parent 10: protocol ip prio 1 u32 match ip dport 5061 0xffff flowid 10:10",
            ]
        );
        assert_eq!(eff["probe_rate"], "200kbit");
        // 1472 B every 1 ms under a 100 Mbit/s shaper: the probe class
        // grows to 2 x (1472+66) B/ms, the bulk class takes the rest.
        let mut c = ctx();
        c.link_rate = Some(Rate::mbit(100));
        c.probe.size = 1472;
        c.probe.interval = Duration::from_millis(1);
        let (cmds, eff) = q.render("veth0", Parent::ShaperClass, &c);
        assert_eq!(
            cmds[0].line(),
            "tc qdisc add dev veth0 parent 1:1 handle 10: htb default 20"
        );
        assert_eq!(eff["probe_rate"], "24608kbit");
        assert_eq!(eff["bulk_rate"], "75392kbit");
        assert_eq!(eff["bulk_ceil"], "100mbit");
        // The study's literal `default 30`.
        let q: QdiscSpec = "htb,default=30,leaf=pfifo".parse().unwrap();
        let (cmds, _) = q.render("eth1", Parent::Root, &ctx());
        assert!(cmds[0].line().ends_with("htb default 30"));
        assert!(cmds[3].line().ends_with("handle 11: pfifo"));
        assert_eq!(q.requirements(), ["htb", "pfifo", "u32"]);
    }

    #[test]
    fn htb_prio_tree() {
        let q: QdiscSpec = "htb-prio".parse().unwrap();
        assert_eq!(q.requirements(), ["htb", "pfifo", "u32"]);
        // Under a 100 Mbit/s shaper, 64 B every 100 us (10.4 Mbit/s on the
        // wire): the high class is guaranteed twice that.
        let mut c = ctx();
        c.link_rate = Some(Rate::mbit(100));
        c.probe.size = 64;
        c.probe.interval = Duration::from_micros(100);
        let (cmds, eff) = q.render("veth0", Parent::ShaperClass, &c);
        assert_eq!(
            lines(&cmds),
            [
                "tc qdisc add dev veth0 parent 1:1 handle 10: htb default 20",
                "tc class add dev veth0 parent 10: classid 10:1 htb rate 100000000bit ceil 100000000bit overhead 24",
                "tc class add dev veth0 parent 10:1 classid 10:10 htb rate 20800000bit ceil 100000000bit prio 0 quantum 1514 overhead 24",
                "tc class add dev veth0 parent 10:1 classid 10:20 htb rate 79200000bit ceil 100000000bit prio 1 quantum 1514 overhead 24",
                "tc qdisc add dev veth0 parent 10:10 handle 11: pfifo limit 100",
                "tc qdisc add dev veth0 parent 10:20 handle 12: pfifo limit 100",
                "tc filter add dev veth0 parent 10: protocol ip prio 1 u32 match ip dport 5061 0xffff flowid 10:10",
            ]
        );
        assert_eq!(eff["hp_rate"], "20800kbit");
        assert_eq!(eff["bulk_prio"], 1);
        // A slow probe flow keeps the 5mbit floor; TOS classification,
        // own port, lower bulk prio, limits; unshaped: a 1 Gbit/s link.
        let q: QdiscSpec = "htb-prio,hp_tos=0xC0,hp_port=6000,bulk_prio=3,limit=20,quantum=3000"
            .parse()
            .unwrap();
        let (cmds, eff) = q.render("eth1", Parent::Root, &ctx());
        let l = lines(&cmds);
        assert_eq!(l[0], "tc qdisc add dev eth1 root handle 10: htb default 20");
        assert!(
            l[2].contains("rate 5000000bit ceil 1000000000bit prio 0 quantum 3000"),
            "{}",
            l[2]
        );
        assert!(
            l[3].contains("rate 995000000bit ceil 1000000000bit prio 3"),
            "{}",
            l[3]
        );
        assert!(l[4].ends_with("pfifo limit 20"));
        assert!(l[6].contains("match ip dport 6000 0xffff flowid 10:10"));
        assert_eq!(
            l[7],
            "tc filter add dev eth1 parent 10: protocol ip prio 2 u32 match ip tos 0xc0 0xfc flowid 10:10"
        );
        assert_eq!(eff["hp_rate_reason"], "auto: the preset's minimum");
        assert_eq!(q.to_string().parse::<QdiscSpec>().unwrap(), q);
        assert!("htb-prio,bulk_prio=0".parse::<QdiscSpec>().is_err());
        assert!("htb-prio,bulk_prio=8".parse::<QdiscSpec>().is_err());
        assert!("htb-prio,hp_tos=0x1c0".parse::<QdiscSpec>().is_err());
        assert!("htb-prio,quantum=10".parse::<QdiscSpec>().is_err());
        assert!(
            "htb-prio,prio=1"
                .parse::<QdiscSpec>()
                .unwrap_err()
                .contains("hp_rate")
        );
    }

    #[test]
    fn hfsc_preset() {
        let q: QdiscSpec = "hfsc".parse().unwrap();
        let mut c = ctx();
        c.probe.interval = Duration::from_millis(100);
        let (cmds, _) = q.render("eth1", Parent::Root, &c);
        assert_eq!(
            lines(&cmds),
            [
                "tc qdisc add dev eth1 root handle 10: hfsc default 20",
                "tc class add dev eth1 parent 10: classid 10:1 hfsc sc rate 1000000000bit ul rate 1000000000bit",
                "tc class add dev eth1 parent 10:1 classid 10:10 hfsc sc umax 1500b dmax 6000us rate 250000bit",
                "tc class add dev eth1 parent 10:1 classid 10:20 hfsc sc umax 1500b dmax 50000us rate 999000000bit",
                "tc filter add dev eth1 parent 10: protocol ip prio 1 u32 match ip dport 5061 0xffff flowid 10:10",
            ]
        );
        // 200 B every 10 ms on the wire: 212.8 kbit/s, doubled above the study's 250kbit.
        let (cmds, eff) = q.render("eth1", Parent::Root, &ctx());
        assert!(cmds[2].line().ends_with("rate 425600bit"));
        assert!(eff["rt_rate_reason"].as_str().unwrap().contains("2 x"));
    }

    #[test]
    fn overrides_and_errors() {
        let q: QdiscSpec = "fq_codel,target=5ms,ecn,limit=100".parse().unwrap();
        let QdiscSpec::FqCodel(p) = &q else { panic!() };
        assert_eq!(p.target, Some(Duration::from_millis(5)));
        assert_eq!(p.ecn, Some(true));
        assert_eq!(p.limit, Some(100));
        assert_eq!(
            "fq_codel,preset=kernel"
                .parse::<QdiscSpec>()
                .unwrap()
                .to_string(),
            "fq_codel,preset=kernel"
        );
        let e = "fq_codel,targt=5ms".parse::<QdiscSpec>().unwrap_err();
        assert!(e.contains("unknown fq_codel parameter \"targt\""), "{e}");
        assert!(e.contains("target"), "{e}");
        assert!(
            "cake"
                .parse::<QdiscSpec>()
                .unwrap_err()
                .contains("unknown qdisc")
        );
        assert!("pfifo,limit=0".parse::<QdiscSpec>().is_err());
        assert!("pfifo,limit=lots".parse::<QdiscSpec>().is_err());
        assert!("prio,bands=1".parse::<QdiscSpec>().is_err());
        assert!(
            "pfifo_fast,limit=3"
                .parse::<QdiscSpec>()
                .unwrap_err()
                .contains("no parameters")
        );
        assert!("fq_codel,noecn=1".parse::<QdiscSpec>().is_err());
        assert!("htb,probe_rate=1mbps".parse::<QdiscSpec>().is_err());
        assert!("tbf,burst=100".parse::<QdiscSpec>().is_err());
    }

    #[test]
    fn display_round_trips() {
        for k in KINDS {
            let q = QdiscSpec::preset(k).unwrap();
            let back: QdiscSpec = q.to_string().parse().unwrap();
            assert_eq!(q, back, "{k}: {q}");
        }
        let q: QdiscSpec = "htb,probe_rate=1mbit,leaf=default".parse().unwrap();
        assert_eq!(q.to_string().parse::<QdiscSpec>().unwrap(), q);
    }

    #[test]
    fn tree_puts_the_qdisc_under_the_shaper() {
        let mut s = Shaping::new(Rate::mbit(100));
        s.queue_limit = Some(crate::tune::amounts::QueueLimit::Packets(20));
        let q: QdiscSpec = "fq_codel".parse().unwrap();
        let mut c = ctx();
        c.link_rate = Some(s.rate);
        let (cmds, meta) = render_tree("veth0", Some(&s), Some(&q), &c);
        assert_eq!(cmds.len(), 3);
        assert!(
            cmds[2]
                .line()
                .starts_with("tc qdisc add dev veth0 parent 1:1 handle 10: fq_codel")
        );
        assert_eq!(meta.tc.len(), 3);
        assert!(meta.qdisc.unwrap().position.contains("leaf"));
        // No qdisc: the FIFO with the queue limit is the leaf.
        let (cmds, _) = render_tree("veth0", Some(&s), None, &c);
        assert_eq!(
            cmds[2].line(),
            "tc qdisc add dev veth0 parent 1:1 handle 10: pfifo limit 20"
        );
        // No shaping: the qdisc is the root.
        let (cmds, meta) = render_tree("veth0", None, Some(&q), &ctx());
        assert!(cmds[0].line().contains(" root handle 10: fq_codel"));
        assert!(meta.shaping.is_none());
    }
}

/// The typed tree writes the JSON the map it replaced wrote, captured
/// from the map builder before it was typed.
#[cfg(test)]
mod typed_meta_tests {
    use super::*;
    use crate::tune::{ProbeContext, Shaping, amounts::QueueLimit};

    const SHAPED_HTB_PRIO: &str = r#"{"qdisc":{"effective":{"bulk_class":"10:20","bulk_prio":1,"bulk_rate":"95mbit","ceil":"100mbit","hp_class":"10:10","hp_port":5061,"hp_prio":0,"hp_rate":"5mbit","hp_rate_reason":"auto: the preset's minimum","hp_tos":null,"leaf":"pfifo","leaf_limit_packets":100,"link_rate":"100mbit","overhead_bytes":24,"quantum_bytes":1514},"kind":"htb-prio","position":"leaf under the shaper (parent 1:1)","spec":"htb-prio,hp_rate=auto,link=auto,hp_port=auto,hp_tos=none,bulk_prio=1,quantum=1514,limit=100"},"shaping":{"burst_bytes":12500,"overhead_bytes":24,"queue_limit":"20p","rate":"100mbit","rate_bps":100000000,"shaper":"htb"},"tc":["tc qdisc add dev veth0 root handle 1: htb default 1","tc class add dev veth0 parent 1: classid 1:1 htb rate 100000000bit ceil 100000000bit burst 12500 cburst 12500 overhead 24","tc qdisc add dev veth0 parent 1:1 handle 10: htb default 20","tc class add dev veth0 parent 10: classid 10:1 htb rate 100000000bit ceil 100000000bit overhead 24","tc class add dev veth0 parent 10:1 classid 10:10 htb rate 5000000bit ceil 100000000bit prio 0 quantum 1514 overhead 24","tc class add dev veth0 parent 10:1 classid 10:20 htb rate 95000000bit ceil 100000000bit prio 1 quantum 1514 overhead 24","tc qdisc add dev veth0 parent 10:10 handle 11: pfifo limit 100","tc qdisc add dev veth0 parent 10:20 handle 12: pfifo limit 100","tc filter add dev veth0 parent 10: protocol ip prio 1 u32 match ip dport 5061 0xffff flowid 10:10"]}"#;
    const ROOT_FQ_CODEL: &str = r#"{"qdisc":{"effective":{"ecn":false,"flows":1024,"interval":"40ms","limit":1000,"quantum":1514,"target":"1.5ms"},"kind":"fq_codel","position":"root","spec":"fq_codel,limit=1000,target=1.5ms,interval=40ms,quantum=1514,flows=1024,noecn"},"tc":["tc qdisc add dev veth0 root handle 10: fq_codel limit 1000 target 1500us interval 40000us quantum 1514 flows 1024 noecn"]}"#;
    const SHAPER_ONLY: &str = r#"{"shaping":{"burst_bytes":12500,"overhead_bytes":24,"queue_limit":"20p","rate":"100mbit","rate_bps":100000000,"shaper":"htb"},"tc":["tc qdisc add dev veth0 root handle 1: htb default 1","tc class add dev veth0 parent 1: classid 1:1 htb rate 100000000bit ceil 100000000bit burst 12500 cburst 12500 overhead 24","tc qdisc add dev veth0 parent 1:1 handle 10: pfifo limit 20"]}"#;

    #[test]
    fn the_tree_writes_the_json_the_map_wrote() {
        let mut s = Shaping::new(Rate::mbit(100));
        s.queue_limit = Some(QueueLimit::Packets(20));
        let c = RenderCtx {
            link_rate: Some(Rate::mbit(100)),
            overhead_bytes: 24,
            probe: ProbeContext {
                port: 5061,
                size: 200,
                interval: Duration::from_millis(10),
                ipv6: false,
            },
        };
        let htb_prio: QdiscSpec = "htb-prio".parse().unwrap();
        let fq_codel: QdiscSpec = "fq_codel".parse().unwrap();
        for (shaping, qdisc, old) in [
            (Some(&s), Some(&htb_prio), SHAPED_HTB_PRIO),
            (None, Some(&fq_codel), ROOT_FQ_CODEL),
            (Some(&s), None, SHAPER_ONLY),
        ] {
            let (_, mut meta) = render_tree("veth0", shaping, qdisc, &c);
            // What install_tree adds once the tree is in.
            (meta.dev, meta.netns, meta.status) = ("veth0".into(), "ns".into(), "applied".into());
            let mut old: serde_json::Value = serde_json::from_str(old).unwrap();
            old["dev"] = "veth0".into();
            old["netns"] = "ns".into();
            old["status"] = "applied".into();
            assert_eq!(serde_json::to_value(&meta).unwrap(), old);
            assert_eq!(serde_json::to_string(&meta).unwrap(), old.to_string());
        }
    }
}
