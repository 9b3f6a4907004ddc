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

use std::{fmt, str::FromStr, time::Duration};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Value, json};

use super::{
    ProbeContext,
    at::At,
    shaping::{SHAPER_CLASS, Shaping},
    tc::{self, TcCmd},
    units::{Bytes, Rate, tc_time},
};
use crate::model::units::{fmt_duration, parse_duration};

/// Handle of the chosen qdisc, at the root or under the shaper.
pub const QDISC_HANDLE: &str = "10:";

/// What a classful qdisc puts under its classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaf {
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
pub enum AutoRate {
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
pub struct FqCodel {
    pub limit: Option<u32>,
    pub target: Option<Duration>,
    pub interval: Option<Duration>,
    pub quantum: Option<u32>,
    pub flows: Option<u32>,
    pub ecn: Option<bool>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HtbParams {
    pub probe_rate: AutoRate,
    pub probe_burst: Bytes,
    pub bulk_rate: AutoRate,
    pub bulk_ceil: AutoRate,
    pub bulk_burst: Bytes,
    /// Minor id (hex, as tc reads it) of the class for unclassified traffic.
    pub default_class: String,
    pub leaf: Leaf,
}

/// Strict priority on htb: a high-priority class with a guaranteed rate
/// and htb prio 0, a bulk class at a lower prio, both borrowing up to the
/// link.
#[derive(Debug, Clone, PartialEq)]
pub struct HtbPrioParams {
    /// Guaranteed rate of the high-priority class.
    pub hp_rate: AutoRate,
    /// The parent class's rate and both classes' ceil.
    pub link: AutoRate,
    /// UDP destination port sent to the high class; None: the probe flow's.
    pub hp_port: Option<u16>,
    /// TOS byte (DSCP bits, mask 0xfc) also sent to the high class.
    pub hp_tos: Option<u8>,
    /// htb prio of the bulk class (the high class has 0).
    pub bulk_prio: u8,
    /// DRR quantum of both classes: how much a class sends per turn.
    pub quantum: Bytes,
    /// pfifo limit of each leaf, packets.
    pub limit_pkts: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HfscParams {
    pub link: AutoRate,
    pub rt_rate: AutoRate,
    pub rt_umax: Bytes,
    pub rt_dmax: Duration,
    pub bulk_rate: AutoRate,
    pub bulk_umax: Bytes,
    pub bulk_dmax: Duration,
    pub leaf: Leaf,
}

/// The qdisc to put on the bottleneck, with its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum QdiscSpec {
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
pub const KINDS: [&str; 9] = [
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
    pub fn preset(kind: &str) -> Result<Self, String> {
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

    pub fn kind(&self) -> &'static str {
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
    pub fn requirements(&self) -> Vec<&'static str> {
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

    /// tc commands installing this qdisc as `parent` (root or the shaper's
    /// class) on `dev`, and the effective parameters (autos resolved).
    pub fn render(&self, dev: &str, parent: Parent, ctx: &RenderCtx) -> (Vec<TcCmd>, Value) {
        let h = QDISC_HANDLE;
        let head = |kind: &str| -> Vec<String> {
            let mut v: Vec<String> = ["qdisc", "add", "dev", dev]
                .iter()
                .map(|s| s.to_string())
                .collect();
            match parent {
                Parent::Root => v.push("root".into()),
                Parent::ShaperClass => v.extend(["parent".into(), SHAPER_CLASS.into()]),
            }
            v.extend(["handle".into(), h.into(), kind.into()]);
            v
        };
        let filter = |flowid: &str| {
            TcCmd::new([
                "filter",
                "add",
                "dev",
                dev,
                "parent",
                h,
                "protocol",
                "ip",
                "prio",
                "1",
                "u32",
                "match",
                "ip",
                "dport",
                &ctx.probe.port.to_string(),
                "0xffff",
                "flowid",
                flowid,
            ])
        };
        let leaves = |leaf: Leaf, classes: &[String]| -> Vec<TcCmd> {
            if leaf == Leaf::Default {
                return vec![];
            }
            classes
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let mut v: Vec<String> = ["qdisc", "add", "dev", dev, "parent", c, "handle"]
                        .iter()
                        .map(|s| s.to_string())
                        .collect();
                    v.push(format!("{:x}:", 0x11 + i));
                    v.push(leaf.as_str().into());
                    TcCmd(v)
                })
                .collect()
        };
        let link = ctx.link_rate;
        match self {
            QdiscSpec::PfifoFast => (vec![TcCmd(head("pfifo_fast"))], json!({})),
            QdiscSpec::Pfifo { limit_pkts } => {
                let mut v = head("pfifo");
                v.extend(["limit".into(), limit_pkts.to_string()]);
                (vec![TcCmd(v)], json!({ "limit_packets": limit_pkts }))
            }
            QdiscSpec::Bfifo { limit_bytes } => {
                let mut v = head("bfifo");
                v.extend(["limit".into(), limit_bytes.to_string()]);
                (vec![TcCmd(v)], json!({ "limit_bytes": limit_bytes }))
            }
            QdiscSpec::Prio { bands, leaf } => {
                let mut v = head("prio");
                v.extend(["bands".into(), bands.to_string()]);
                let classes: Vec<String> = (1..=*bands).map(|b| format!("10:{b:x}")).collect();
                let mut cmds = vec![TcCmd(v)];
                cmds.extend(leaves(*leaf, &classes));
                cmds.push(filter("10:1"));
                (
                    cmds,
                    json!({ "bands": bands, "leaf": leaf.as_str(), "probe_class": "10:1", "probe_port": ctx.probe.port }),
                )
            }
            QdiscSpec::FqCodel(p) => {
                let mut v = head("fq_codel");
                if let Some(x) = p.limit {
                    v.extend(["limit".into(), x.to_string()]);
                }
                if let Some(x) = p.target {
                    v.extend(["target".into(), tc_time(x)]);
                }
                if let Some(x) = p.interval {
                    v.extend(["interval".into(), tc_time(x)]);
                }
                if let Some(x) = p.quantum {
                    v.extend(["quantum".into(), x.to_string()]);
                }
                if let Some(x) = p.flows {
                    v.extend(["flows".into(), x.to_string()]);
                }
                match p.ecn {
                    Some(true) => v.push("ecn".into()),
                    Some(false) => v.push("noecn".into()),
                    None => {}
                }
                (
                    vec![TcCmd(v)],
                    json!({
                        "limit": p.limit, "target": p.target.map(fmt_duration),
                        "interval": p.interval.map(fmt_duration), "quantum": p.quantum,
                        "flows": p.flows, "ecn": p.ecn,
                    }),
                )
            }
            QdiscSpec::Htb(p) => {
                let probe_min = Rate::from_bps(200_000);
                let (probe_rate, probe_why) = resolve_probe_rate(p.probe_rate, probe_min, ctx);
                let ceil = match p.bulk_ceil {
                    AutoRate::Fixed(r) => r,
                    AutoRate::Auto => link.unwrap_or(Rate::mbit(1000)),
                };
                let bulk = match p.bulk_rate {
                    AutoRate::Fixed(r) => r,
                    AutoRate::Auto => match link {
                        Some(l) => Rate::from_bps(l.bps.saturating_sub(probe_rate.bps).max(8000)),
                        None => Rate::mbit(999),
                    },
                };
                let mut v = head("htb");
                v.extend(["default".into(), p.default_class.clone()]);
                let mut cmds = vec![
                    TcCmd(v),
                    TcCmd::new([
                        "class",
                        "add",
                        "dev",
                        dev,
                        "parent",
                        h,
                        "classid",
                        "10:10",
                        "htb",
                        "rate",
                        &probe_rate.tc(),
                        "burst",
                        &p.probe_burst.0.to_string(),
                    ]),
                    TcCmd::new([
                        "class",
                        "add",
                        "dev",
                        dev,
                        "parent",
                        h,
                        "classid",
                        "10:20",
                        "htb",
                        "rate",
                        &bulk.tc(),
                        "ceil",
                        &ceil.tc(),
                        "burst",
                        &p.bulk_burst.0.to_string(),
                    ]),
                ];
                cmds.extend(leaves(p.leaf, &["10:10".into(), "10:20".into()]));
                cmds.push(filter("10:10"));
                (
                    cmds,
                    json!({
                        "probe_class": "10:10", "probe_rate": probe_rate.to_string(),
                        "probe_rate_reason": probe_why, "probe_burst_bytes": p.probe_burst.0,
                        "bulk_class": "10:20", "bulk_rate": bulk.to_string(), "bulk_ceil": ceil.to_string(),
                        "bulk_burst_bytes": p.bulk_burst.0, "default_class": p.default_class,
                        "leaf": p.leaf.as_str(), "probe_port": ctx.probe.port,
                    }),
                )
            }
            QdiscSpec::HtbPrio(p) => self.render_htb_prio(p, dev, head("htb"), ctx),
            QdiscSpec::Hfsc(p) => {
                let rt_min = Rate::from_bps(250_000);
                let (rt, rt_why) = resolve_probe_rate(p.rt_rate, rt_min, ctx);
                let root = match p.link {
                    AutoRate::Fixed(r) => r,
                    AutoRate::Auto => link.unwrap_or(Rate::mbit(1000)),
                };
                let bulk = match p.bulk_rate {
                    AutoRate::Fixed(r) => r,
                    AutoRate::Auto => match link {
                        Some(l) => Rate::from_bps(l.bps.saturating_sub(rt.bps).max(8000)),
                        None => Rate::mbit(999),
                    },
                };
                let mut v = head("hfsc");
                v.extend(["default".into(), "20".into()]);
                let class = |parent: &str, id: &str, rest: Vec<String>| {
                    let mut c: Vec<String> = [
                        "class", "add", "dev", dev, "parent", parent, "classid", id, "hfsc",
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                    c.extend(rest);
                    TcCmd(c)
                };
                let sc = |umax: Bytes, dmax: Duration, rate: Rate| -> Vec<String> {
                    vec![
                        "sc".into(),
                        "umax".into(),
                        format!("{}b", umax.0),
                        "dmax".into(),
                        tc_time(dmax),
                        "rate".into(),
                        rate.tc(),
                    ]
                };
                let mut cmds = vec![
                    TcCmd(v),
                    class(
                        h,
                        "10:1",
                        vec![
                            "sc".into(),
                            "rate".into(),
                            root.tc(),
                            "ul".into(),
                            "rate".into(),
                            root.tc(),
                        ],
                    ),
                    class("10:1", "10:10", sc(p.rt_umax, p.rt_dmax, rt)),
                    class("10:1", "10:20", sc(p.bulk_umax, p.bulk_dmax, bulk)),
                ];
                cmds.extend(leaves(p.leaf, &["10:10".into(), "10:20".into()]));
                cmds.push(filter("10:10"));
                (
                    cmds,
                    json!({
                        "link_rate": root.to_string(), "rt_class": "10:10", "rt_rate": rt.to_string(),
                        "rt_rate_reason": rt_why, "rt_umax_bytes": p.rt_umax.0, "rt_dmax": fmt_duration(p.rt_dmax),
                        "bulk_class": "10:20", "bulk_rate": bulk.to_string(), "bulk_umax_bytes": p.bulk_umax.0,
                        "bulk_dmax": fmt_duration(p.bulk_dmax), "leaf": p.leaf.as_str(), "probe_port": ctx.probe.port,
                    }),
                )
            }
            QdiscSpec::Tbf { rate, burst, limit } => {
                let mut v = head("tbf");
                v.extend([
                    "rate".into(),
                    rate.tc(),
                    "burst".into(),
                    burst.0.to_string(),
                    "limit".into(),
                    limit.0.to_string(),
                ]);
                (
                    vec![TcCmd(v)],
                    json!({ "rate": rate.to_string(), "burst_bytes": burst.0, "limit_bytes": limit.0 }),
                )
            }
        }
    }
}

impl QdiscSpec {
    fn render_htb_prio(
        &self,
        p: &HtbPrioParams,
        dev: &str,
        mut head: Vec<String>,
        ctx: &RenderCtx,
    ) -> (Vec<TcCmd>, Value) {
        let h = QDISC_HANDLE;
        let (hp, hp_why) = resolve_probe_rate(p.hp_rate, HTB_PRIO_MIN_HP_RATE, ctx);
        let link = match p.link {
            AutoRate::Fixed(r) => r,
            AutoRate::Auto => ctx.link_rate.unwrap_or(Rate::mbit(1000)),
        };
        let bulk = Rate::from_bps(link.bps.saturating_sub(hp.bps).max(8000));
        let port = p.hp_port.unwrap_or(ctx.probe.port);
        let overhead = ctx.overhead_bytes.to_string();
        let quantum = p.quantum.0.to_string();
        head.extend(["default".into(), "20".into()]);
        let class = |parent: &str, id: &str, rest: &[&str]| {
            let mut c: Vec<String> = [
                "class", "add", "dev", dev, "parent", parent, "classid", id, "htb",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            c.extend(rest.iter().map(|s| s.to_string()));
            c.extend(["overhead".into(), overhead.clone()]);
            TcCmd(c)
        };
        let leaf = |parent: &str, handle: &str| {
            TcCmd::new([
                "qdisc",
                "add",
                "dev",
                dev,
                "parent",
                parent,
                "handle",
                handle,
                "pfifo",
                "limit",
                &p.limit_pkts.to_string(),
            ])
        };
        let u32_to_hp = |prio: &str, field: &str, value: &str, mask: &str| {
            TcCmd::new([
                "filter", "add", "dev", dev, "parent", h, "protocol", "ip", "prio", prio, "u32",
                "match", "ip", field, value, mask, "flowid", "10:10",
            ])
        };
        let (link_s, hp_s, bulk_s) = (link.tc(), hp.tc(), bulk.tc());
        let bulk_prio = p.bulk_prio.to_string();
        let mut cmds = vec![
            TcCmd(head),
            class(h, "10:1", &["rate", &link_s, "ceil", &link_s]),
            class(
                "10:1",
                "10:10",
                &[
                    "rate", &hp_s, "ceil", &link_s, "prio", "0", "quantum", &quantum,
                ],
            ),
            class(
                "10:1",
                "10:20",
                &[
                    "rate", &bulk_s, "ceil", &link_s, "prio", &bulk_prio, "quantum", &quantum,
                ],
            ),
            leaf("10:10", "11:"),
            leaf("10:20", "12:"),
            u32_to_hp("1", "dport", &port.to_string(), "0xffff"),
        ];
        if let Some(t) = p.hp_tos {
            cmds.push(u32_to_hp("2", "tos", &format!("0x{t:02x}"), "0xfc"));
        }
        (
            cmds,
            json!({
                "link_rate": link.to_string(), "hp_class": "10:10", "hp_rate": hp.to_string(),
                "hp_rate_reason": hp_why, "hp_prio": 0, "hp_port": port,
                "hp_tos": p.hp_tos.map(|t| format!("0x{t:02X}")),
                "bulk_class": "10:20", "bulk_rate": bulk.to_string(), "bulk_prio": p.bulk_prio,
                "ceil": link.to_string(), "quantum_bytes": p.quantum.0, "leaf": "pfifo",
                "leaf_limit_packets": p.limit_pkts, "overhead_bytes": ctx.overhead_bytes,
            }),
        )
    }
}

/// The least guaranteed rate of htb-prio's high class: a few small flows.
const HTB_PRIO_MIN_HP_RATE: Rate = Rate { bps: 5_000_000 };

/// A class for the probe flow: the user's rate, or the study's minimum
/// raised to twice the probe flow's wire rate.
fn resolve_probe_rate(r: AutoRate, study: Rate, ctx: &RenderCtx) -> (Rate, String) {
    match r {
        AutoRate::Fixed(r) => (r, "given".into()),
        AutoRate::Auto => {
            let need = ctx.probe.wire_rate(ctx.overhead_bytes).scaled(2.0);
            if need.bps > study.bps {
                (
                    need,
                    format!(
                        "auto: 2 x the probe flow's wire rate ({}), above the study's {study}",
                        ctx.probe.wire_rate(ctx.overhead_bytes)
                    ),
                )
            } else {
                (study, "auto: the preset's minimum".into())
            }
        }
    }
}

/// Where the qdisc goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parent {
    Root,
    ShaperClass,
}

/// What rendering needs to know about the run.
#[derive(Debug, Clone)]
pub struct RenderCtx {
    pub link_rate: Option<Rate>,
    pub overhead_bytes: u32,
    pub probe: ProbeContext,
}

impl fmt::Display for QdiscSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())?;
        match self {
            QdiscSpec::PfifoFast => Ok(()),
            QdiscSpec::Pfifo { limit_pkts } => write!(f, ",limit={limit_pkts}"),
            QdiscSpec::Bfifo { limit_bytes } => write!(f, ",limit={limit_bytes}"),
            QdiscSpec::Prio { bands, leaf } => write!(f, ",bands={bands},leaf={}", leaf.as_str()),
            QdiscSpec::FqCodel(p) => {
                if p == &FqCodel::kernel() {
                    return write!(f, ",preset=kernel");
                }
                if let Some(x) = p.limit {
                    write!(f, ",limit={x}")?;
                }
                if let Some(x) = p.target {
                    write!(f, ",target={}", fmt_duration(x))?;
                }
                if let Some(x) = p.interval {
                    write!(f, ",interval={}", fmt_duration(x))?;
                }
                if let Some(x) = p.quantum {
                    write!(f, ",quantum={x}")?;
                }
                if let Some(x) = p.flows {
                    write!(f, ",flows={x}")?;
                }
                match p.ecn {
                    Some(true) => write!(f, ",ecn"),
                    Some(false) => write!(f, ",noecn"),
                    None => Ok(()),
                }
            }
            QdiscSpec::Htb(p) => write!(
                f,
                ",probe_rate={},probe_burst={},bulk_rate={},bulk_ceil={},bulk_burst={},default={},leaf={}",
                p.probe_rate,
                p.probe_burst.0,
                p.bulk_rate,
                p.bulk_ceil,
                p.bulk_burst.0,
                p.default_class,
                p.leaf.as_str()
            ),
            QdiscSpec::HtbPrio(p) => {
                write!(f, ",hp_rate={},link={},hp_port=", p.hp_rate, p.link)?;
                match p.hp_port {
                    Some(x) => write!(f, "{x}")?,
                    None => f.write_str("auto")?,
                }
                f.write_str(",hp_tos=")?;
                match p.hp_tos {
                    Some(t) => write!(f, "0x{t:02X}")?,
                    None => f.write_str("none")?,
                }
                write!(
                    f,
                    ",bulk_prio={},quantum={},limit={}",
                    p.bulk_prio, p.quantum.0, p.limit_pkts
                )
            }
            QdiscSpec::Hfsc(p) => write!(
                f,
                ",link={},rt_rate={},rt_umax={},rt_dmax={},bulk_rate={},bulk_umax={},bulk_dmax={},leaf={}",
                p.link,
                p.rt_rate,
                p.rt_umax.0,
                fmt_duration(p.rt_dmax),
                p.bulk_rate,
                p.bulk_umax.0,
                fmt_duration(p.bulk_dmax),
                p.leaf.as_str()
            ),
            QdiscSpec::Tbf { rate, burst, limit } => {
                write!(f, ",rate={rate},burst={},limit={}", burst.0, limit.0)
            }
        }
    }
}

impl FqCodel {
    fn kernel() -> Self {
        FqCodel {
            limit: None,
            target: None,
            interval: None,
            quantum: None,
            flows: None,
            ecn: None,
        }
    }
}

impl FromStr for QdiscSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',').map(str::trim);
        let kind = parts.next().unwrap_or_default();
        let mut spec = QdiscSpec::preset(kind)?;
        for p in parts {
            if p.is_empty() {
                continue;
            }
            let (k, v) = match p.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (p, None),
            };
            spec.set(k, v)
                .map_err(|e| format!("invalid qdisc {s:?}: {e}"))?;
        }
        spec.check()
            .map_err(|e| format!("invalid qdisc {s:?}: {e}"))?;
        Ok(spec)
    }
}

fn need<'a>(k: &str, v: Option<&'a str>) -> Result<&'a str, String> {
    v.ok_or_else(|| format!("{k} needs a value ({k}=...)"))
}

fn num<T: FromStr>(k: &str, v: Option<&str>) -> Result<T, String> {
    let v = need(k, v)?;
    v.parse()
        .map_err(|_| format!("{k}={v}: expected a whole number"))
}

fn bytes(k: &str, v: Option<&str>) -> Result<Bytes, String> {
    need(k, v)?.parse().map_err(|e| format!("{k}: {e}"))
}

fn dur(k: &str, v: Option<&str>) -> Result<Duration, String> {
    need(k, v).and_then(|v| parse_duration(v).map_err(|e| format!("{k}: {e}")))
}

fn rate(k: &str, v: Option<&str>) -> Result<AutoRate, String> {
    need(k, v).and_then(|v| AutoRate::parse(v).map_err(|e| format!("{k}: {e}")))
}

impl QdiscSpec {
    fn allowed(&self) -> &'static [&'static str] {
        match self {
            QdiscSpec::PfifoFast => &[],
            QdiscSpec::Pfifo { .. } | QdiscSpec::Bfifo { .. } => &["limit"],
            QdiscSpec::Prio { .. } => &["bands", "leaf"],
            QdiscSpec::FqCodel(_) => &[
                "preset", "limit", "target", "interval", "quantum", "flows", "ecn", "noecn",
            ],
            QdiscSpec::Htb(_) => &[
                "probe_rate",
                "probe_burst",
                "bulk_rate",
                "bulk_ceil",
                "bulk_burst",
                "default",
                "leaf",
            ],
            QdiscSpec::HtbPrio(_) => &[
                "hp_rate",
                "link",
                "hp_port",
                "hp_tos",
                "bulk_prio",
                "quantum",
                "limit",
            ],
            QdiscSpec::Hfsc(_) => &[
                "link",
                "rt_rate",
                "rt_umax",
                "rt_dmax",
                "bulk_rate",
                "bulk_umax",
                "bulk_dmax",
                "leaf",
            ],
            QdiscSpec::Tbf { .. } => &["rate", "burst", "limit"],
        }
    }

    fn set(&mut self, k: &str, v: Option<&str>) -> Result<(), String> {
        let allowed = self.allowed();
        if !allowed.contains(&k) {
            return Err(if allowed.is_empty() {
                format!("{} takes no parameters (got {k:?})", self.kind())
            } else {
                format!(
                    "unknown {} parameter {k:?}: expected one of {}",
                    self.kind(),
                    allowed.join(", ")
                )
            });
        }
        match self {
            QdiscSpec::PfifoFast => {}
            QdiscSpec::Pfifo { limit_pkts } => *limit_pkts = num(k, v)?,
            QdiscSpec::Bfifo { limit_bytes } => *limit_bytes = bytes(k, v)?.0,
            QdiscSpec::Prio { bands, leaf } => match k {
                "bands" => *bands = num(k, v)?,
                _ => *leaf = Leaf::parse(need(k, v)?)?,
            },
            QdiscSpec::FqCodel(p) => match k {
                "preset" => match need(k, v)? {
                    "kernel" => *p = FqCodel::kernel(),
                    "study" => {}
                    o => return Err(format!("preset={o}: expected study or kernel")),
                },
                "limit" => p.limit = Some(num(k, v)?),
                "target" => p.target = Some(dur(k, v)?),
                "interval" => p.interval = Some(dur(k, v)?),
                "quantum" => p.quantum = Some(bytes(k, v)?.0 as u32),
                "flows" => p.flows = Some(num(k, v)?),
                "ecn" | "noecn" => {
                    if v.is_some() {
                        return Err(format!("{k} is a flag: write it without a value"));
                    }
                    p.ecn = Some(k == "ecn");
                }
                _ => unreachable!("checked against allowed()"),
            },
            QdiscSpec::Htb(p) => match k {
                "probe_rate" => p.probe_rate = rate(k, v)?,
                "probe_burst" => p.probe_burst = bytes(k, v)?,
                "bulk_rate" => p.bulk_rate = rate(k, v)?,
                "bulk_ceil" => p.bulk_ceil = rate(k, v)?,
                "bulk_burst" => p.bulk_burst = bytes(k, v)?,
                "default" => {
                    let d = need(k, v)?;
                    if d.is_empty() || u16::from_str_radix(d, 16).is_err() {
                        return Err(format!(
                            "default={d}: expected a class minor id in hex as tc reads it (20, 30)"
                        ));
                    }
                    p.default_class = d.to_string();
                }
                _ => p.leaf = Leaf::parse(need(k, v)?)?,
            },
            QdiscSpec::HtbPrio(p) => match k {
                "hp_rate" => p.hp_rate = rate(k, v)?,
                "link" => p.link = rate(k, v)?,
                "hp_port" => {
                    p.hp_port = match need(k, v)? {
                        "auto" => None,
                        _ => Some(num(k, v)?),
                    }
                }
                "hp_tos" => {
                    p.hp_tos = match need(k, v)? {
                        "none" => None,
                        t => Some(
                            crate::model::units::parse_u8_maybe_hex(t)
                                .map_err(|e| format!("hp_tos: {e}"))?,
                        ),
                    }
                }
                "bulk_prio" => p.bulk_prio = num(k, v)?,
                "quantum" => p.quantum = bytes(k, v)?,
                _ => p.limit_pkts = num(k, v)?,
            },
            QdiscSpec::Hfsc(p) => match k {
                "link" => p.link = rate(k, v)?,
                "rt_rate" => p.rt_rate = rate(k, v)?,
                "rt_umax" => p.rt_umax = bytes(k, v)?,
                "rt_dmax" => p.rt_dmax = dur(k, v)?,
                "bulk_rate" => p.bulk_rate = rate(k, v)?,
                "bulk_umax" => p.bulk_umax = bytes(k, v)?,
                "bulk_dmax" => p.bulk_dmax = dur(k, v)?,
                _ => p.leaf = Leaf::parse(need(k, v)?)?,
            },
            QdiscSpec::Tbf {
                rate: r,
                burst,
                limit,
            } => match k {
                "rate" => {
                    *r = need(k, v)?.parse().map_err(|e| format!("rate: {e}"))?;
                }
                "burst" => *burst = bytes(k, v)?,
                _ => *limit = bytes(k, v)?,
            },
        }
        Ok(())
    }

    /// Ranges the kernel would refuse, caught before anything is touched.
    fn check(&self) -> Result<(), String> {
        match self {
            QdiscSpec::Pfifo { limit_pkts } if *limit_pkts == 0 => {
                Err("limit must be at least 1 packet".into())
            }
            QdiscSpec::Bfifo { limit_bytes } if *limit_bytes < 64 => {
                Err("limit below 64 bytes holds no packet".into())
            }
            QdiscSpec::Prio { bands, .. } if !(2..=16).contains(bands) => {
                Err(format!("bands={bands}: prio takes 2 to 16 bands"))
            }
            QdiscSpec::FqCodel(p) => {
                if p.limit == Some(0) || p.flows == Some(0) || p.quantum == Some(0) {
                    return Err("limit, flows and quantum must be above 0".into());
                }
                if p.flows.is_some_and(|f| f > 65536) {
                    return Err("flows must be at most 65536".into());
                }
                Ok(())
            }
            QdiscSpec::HtbPrio(p) => {
                if !(1..=7).contains(&p.bulk_prio) {
                    return Err(format!(
                        "bulk_prio={}: htb prios are 0 to 7 and 0 is the high class's",
                        p.bulk_prio
                    ));
                }
                if p.hp_port == Some(0) {
                    return Err("hp_port=0 is not a usable port".into());
                }
                if p.limit_pkts == 0 {
                    return Err("limit must be at least 1 packet".into());
                }
                if p.quantum.0 < 64 || p.quantum.0 > 200_000 {
                    return Err(format!(
                        "quantum={}: give 64 to 200000 bytes (a frame: 1514)",
                        p.quantum.0
                    ));
                }
                Ok(())
            }
            QdiscSpec::Tbf { burst, limit, .. } if burst.0 < 1514 || limit.0 < 1514 => {
                Err("burst and limit must hold a full frame (at least 1514 bytes)".into())
            }
            _ => Ok(()),
        }
    }
}

impl Serialize for QdiscSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for QdiscSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The whole tc tree for the bottleneck: shaper (if any) and qdisc (if
/// any), plus what it means, for the run metadata.
pub fn render_tree(
    dev: &str,
    shaping: Option<&Shaping>,
    qdisc: Option<&QdiscSpec>,
    ctx: &RenderCtx,
) -> (Vec<TcCmd>, Value) {
    let mut cmds = Vec::new();
    let mut meta = serde_json::Map::new();
    let parent = match shaping {
        Some(s) => {
            cmds.extend(s.commands(dev));
            meta.insert("shaping".into(), s.metadata());
            Parent::ShaperClass
        }
        None => Parent::Root,
    };
    match qdisc {
        Some(q) => {
            let (c, eff) = q.render(dev, parent, ctx);
            cmds.extend(c);
            meta.insert(
                "qdisc".into(),
                json!({
                    "spec": q.to_string(),
                    "kind": q.kind(),
                    "position": match parent { Parent::Root => "root", Parent::ShaperClass => "leaf under the shaper (parent 1:1)" },
                    "effective": eff,
                }),
            );
        }
        None => {
            if let Some(leaf) = shaping.and_then(|s| s.default_leaf(dev, QDISC_HANDLE)) {
                cmds.push(leaf);
            }
        }
    }
    meta.insert(
        "tc".into(),
        Value::Array(cmds.iter().map(|c| Value::String(c.line())).collect()),
    );
    (cmds, Value::Object(meta))
}

/// Installs a tree on `dev` inside `ns`; restores the kernel's default
/// qdisc on `restore()` or drop.
pub struct QdiscTree<'a> {
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
    pub fn install(at: impl Into<At<'a>>, dev: &str, cmds: &[TcCmd]) -> Result<Self> {
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

    pub fn restore(&mut self) -> Result<()> {
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
    use super::*;

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
        s.queue_limit = Some(crate::tune::units::QueueLimit::Packets(20));
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
        assert_eq!(meta["tc"].as_array().unwrap().len(), 3);
        assert!(meta["qdisc"]["position"].as_str().unwrap().contains("leaf"));
        // No qdisc: the FIFO with the queue limit is the leaf.
        let (cmds, _) = render_tree("veth0", Some(&s), None, &c);
        assert_eq!(
            cmds[2].line(),
            "tc qdisc add dev veth0 parent 1:1 handle 10: pfifo limit 20"
        );
        // No shaping: the qdisc is the root.
        let (cmds, meta) = render_tree("veth0", None, Some(&q), &ctx());
        assert!(cmds[0].line().contains(" root handle 10: fq_codel"));
        assert!(meta.get("shaping").is_none());
    }
}
