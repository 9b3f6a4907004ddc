//! The tc commands that install a [`QdiscSpec`] on a device, and what they
//! mean for the run metadata (autos resolved).

use std::time::Duration;

use serde_json::{Value, json};

use super::{
    AutoRate, FqCodel, HfscParams, HtbParams, HtbPrioParams, Leaf, QDISC_HANDLE, QdiscSpec,
};
use crate::{
    model::{
        knobs::{QdiscApplied, QdiscTreeApplied},
        units::fmt_duration,
    },
    tune::{
        ProbeContext,
        amounts::{Bytes, Rate, tc_time},
        shaping::{SHAPER_CLASS, Shaping},
        tc::TcCmd,
    },
};

/// Where the qdisc goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parent {
    Root,
    ShaperClass,
}

/// What rendering needs to know about the run.
#[derive(Debug, Clone)]
pub(crate) struct RenderCtx {
    pub(crate) link_rate: Option<Rate>,
    pub(crate) overhead_bytes: u32,
    pub(crate) probe: ProbeContext,
}

/// The commands every kind shares, for one device and position.
struct QdiscCmds<'a> {
    dev: &'a str,
    parent: Parent,
    ctx: &'a RenderCtx,
}

impl QdiscCmds<'_> {
    /// `qdisc add dev DEV root|parent 1:1 handle 10: KIND`, to which the
    /// kind's parameters are appended.
    fn head(&self, kind: &str) -> Vec<String> {
        let mut v: Vec<String> = ["qdisc", "add", "dev", self.dev]
            .iter()
            .map(|s| s.to_string())
            .collect();
        match self.parent {
            Parent::Root => v.push("root".into()),
            Parent::ShaperClass => v.extend(["parent".into(), SHAPER_CLASS.into()]),
        }
        v.extend(["handle".into(), QDISC_HANDLE.into(), kind.into()]);
        v
    }

    /// The u32 filter on 10: sending the probe flow's UDP port to `flowid`.
    fn probe_filter(&self, flowid: &str) -> TcCmd {
        TcCmd::new([
            "filter",
            "add",
            "dev",
            self.dev,
            "parent",
            QDISC_HANDLE,
            "protocol",
            "ip",
            "prio",
            "1",
            "u32",
            "match",
            "ip",
            "dport",
            &self.ctx.probe.port.to_string(),
            "0xffff",
            "flowid",
            flowid,
        ])
    }

    /// A `leaf` qdisc (handles 11:, 12:, ...) under each of `classes`.
    fn leaves(&self, leaf: Leaf, classes: &[String]) -> Vec<TcCmd> {
        if leaf == Leaf::Default {
            return vec![];
        }
        classes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v: Vec<String> = ["qdisc", "add", "dev", self.dev, "parent", c, "handle"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                v.push(format!("{:x}:", 0x11 + i));
                v.push(leaf.as_str().into());
                TcCmd(v)
            })
            .collect()
    }

    /// `class add dev DEV parent PARENT classid ID KIND`, then `rest`.
    fn class(&self, kind: &str, parent: &str, id: &str, rest: &[&str]) -> TcCmd {
        let mut c: Vec<String> = [
            "class", "add", "dev", self.dev, "parent", parent, "classid", id, kind,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        c.extend(rest.iter().map(|s| s.to_string()));
        TcCmd(c)
    }
}

impl QdiscSpec {
    /// tc commands installing this qdisc as `parent` (root or the shaper's
    /// class) on `dev`, and the effective parameters (autos resolved).
    pub(crate) fn render(&self, dev: &str, parent: Parent, ctx: &RenderCtx) -> (Vec<TcCmd>, Value) {
        let w = QdiscCmds { dev, parent, ctx };
        match self {
            QdiscSpec::PfifoFast => (vec![TcCmd(w.head("pfifo_fast"))], json!({})),
            QdiscSpec::Pfifo { limit_pkts } => {
                let mut v = w.head("pfifo");
                v.extend(["limit".into(), limit_pkts.to_string()]);
                (vec![TcCmd(v)], json!({ "limit_packets": limit_pkts }))
            }
            QdiscSpec::Bfifo { limit_bytes } => {
                let mut v = w.head("bfifo");
                v.extend(["limit".into(), limit_bytes.to_string()]);
                (vec![TcCmd(v)], json!({ "limit_bytes": limit_bytes }))
            }
            QdiscSpec::Prio { bands, leaf } => render_prio(&w, *bands, *leaf),
            QdiscSpec::FqCodel(p) => p.render(&w),
            QdiscSpec::Htb(p) => p.render(&w),
            QdiscSpec::HtbPrio(p) => p.render(&w),
            QdiscSpec::Hfsc(p) => p.render(&w),
            QdiscSpec::Tbf { rate, burst, limit } => {
                let mut v = w.head("tbf");
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

/// prio with `bands` bands, a `leaf` under each, the probe flow in band 1.
fn render_prio(w: &QdiscCmds<'_>, bands: u8, leaf: Leaf) -> (Vec<TcCmd>, Value) {
    let mut v = w.head("prio");
    v.extend(["bands".into(), bands.to_string()]);
    let classes: Vec<String> = (1..=bands).map(|b| format!("10:{b:x}")).collect();
    let mut cmds = vec![TcCmd(v)];
    cmds.extend(w.leaves(leaf, &classes));
    cmds.push(w.probe_filter("10:1"));
    (
        cmds,
        json!({ "bands": bands, "leaf": leaf.as_str(), "probe_class": "10:1", "probe_port": w.ctx.probe.port }),
    )
}

impl FqCodel {
    fn render(&self, w: &QdiscCmds<'_>) -> (Vec<TcCmd>, Value) {
        let p = self;
        let mut v = w.head("fq_codel");
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
}

/// The bulk class's rate: the given one, or what the link leaves after
/// the probe class (the study's 999mbit without a link rate).
fn bulk_rate(r: AutoRate, link: Option<Rate>, probe: Rate) -> Rate {
    match r {
        AutoRate::Fixed(r) => r,
        AutoRate::Auto => match link {
            Some(l) => Rate::from_bps(l.bps.saturating_sub(probe.bps).max(8000)),
            None => Rate::mbit(999),
        },
    }
}

/// The link's rate: the given one, or the shaped link (the study's
/// 1000mbit without one).
fn link_rate(r: AutoRate, link: Option<Rate>) -> Rate {
    match r {
        AutoRate::Fixed(r) => r,
        AutoRate::Auto => link.unwrap_or(Rate::mbit(1000)),
    }
}

impl HtbParams {
    fn render(&self, w: &QdiscCmds<'_>) -> (Vec<TcCmd>, Value) {
        let (p, ctx) = (self, w.ctx);
        let probe_min = Rate::from_bps(200_000);
        let (probe_rate, probe_why) = resolve_probe_rate(p.probe_rate, probe_min, ctx);
        let ceil = link_rate(p.bulk_ceil, ctx.link_rate);
        let bulk = bulk_rate(p.bulk_rate, ctx.link_rate, probe_rate);
        let mut v = w.head("htb");
        v.extend(["default".into(), p.default_class.clone()]);
        let probe_burst = p.probe_burst.0.to_string();
        let bulk_burst = p.bulk_burst.0.to_string();
        let h = QDISC_HANDLE;
        let mut cmds = vec![
            TcCmd(v),
            w.class(
                "htb",
                h,
                "10:10",
                &["rate", &probe_rate.tc(), "burst", &probe_burst],
            ),
            w.class(
                "htb",
                h,
                "10:20",
                &["rate", &bulk.tc(), "ceil", &ceil.tc(), "burst", &bulk_burst],
            ),
        ];
        cmds.extend(w.leaves(p.leaf, &["10:10".into(), "10:20".into()]));
        cmds.push(w.probe_filter("10:10"));
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
}

impl HfscParams {
    fn render(&self, w: &QdiscCmds<'_>) -> (Vec<TcCmd>, Value) {
        let (p, ctx) = (self, w.ctx);
        let rt_min = Rate::from_bps(250_000);
        let (rt, rt_why) = resolve_probe_rate(p.rt_rate, rt_min, ctx);
        let root = link_rate(p.link, ctx.link_rate);
        let bulk = bulk_rate(p.bulk_rate, ctx.link_rate, rt);
        let mut v = w.head("hfsc");
        v.extend(["default".into(), "20".into()]);
        // A service curve: at most `umax` bytes delayed at most `dmax`, then `rate`.
        let sc = |umax: Bytes, dmax: Duration, rate: Rate| -> [String; 7] {
            [
                "sc".into(),
                "umax".into(),
                format!("{}b", umax.0),
                "dmax".into(),
                tc_time(dmax),
                "rate".into(),
                rate.tc(),
            ]
        };
        let (rt_sc, bulk_sc) = (
            sc(p.rt_umax, p.rt_dmax, rt),
            sc(p.bulk_umax, p.bulk_dmax, bulk),
        );
        let root_s = root.tc();
        let mut cmds = vec![
            TcCmd(v),
            w.class(
                "hfsc",
                QDISC_HANDLE,
                "10:1",
                &["sc", "rate", &root_s, "ul", "rate", &root_s],
            ),
            w.class(
                "hfsc",
                "10:1",
                "10:10",
                &rt_sc.each_ref().map(String::as_str),
            ),
            w.class(
                "hfsc",
                "10:1",
                "10:20",
                &bulk_sc.each_ref().map(String::as_str),
            ),
        ];
        cmds.extend(w.leaves(p.leaf, &["10:10".into(), "10:20".into()]));
        cmds.push(w.probe_filter("10:10"));
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
}

impl HtbPrioParams {
    fn render(&self, w: &QdiscCmds<'_>) -> (Vec<TcCmd>, Value) {
        let (p, ctx, dev) = (self, w.ctx, w.dev);
        let h = QDISC_HANDLE;
        let (hp, hp_why) = resolve_probe_rate(p.hp_rate, HTB_PRIO_MIN_HP_RATE, ctx);
        let link = link_rate(p.link, ctx.link_rate);
        let bulk = Rate::from_bps(link.bps.saturating_sub(hp.bps).max(8000));
        let port = p.hp_port.unwrap_or(ctx.probe.port);
        let overhead = ctx.overhead_bytes.to_string();
        let quantum = p.quantum.0.to_string();
        let mut head = w.head("htb");
        head.extend(["default".into(), "20".into()]);
        let class = |parent: &str, id: &str, rest: &[&str]| {
            let mut c = w.class("htb", parent, id, rest);
            c.0.extend(["overhead".into(), overhead.clone()]);
            c
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

/// The whole tc tree for the bottleneck: shaper (if any) and qdisc (if
/// any), plus what it means, for the run metadata.
pub(crate) fn render_tree(
    dev: &str,
    shaping: Option<&Shaping>,
    qdisc: Option<&QdiscSpec>,
    ctx: &RenderCtx,
) -> (Vec<TcCmd>, QdiscTreeApplied) {
    let mut cmds = Vec::new();
    let mut meta = QdiscTreeApplied::default();
    let parent = match shaping {
        Some(s) => {
            cmds.extend(s.commands(dev));
            meta.shaping = Some(s.metadata());
            Parent::ShaperClass
        }
        None => Parent::Root,
    };
    match qdisc {
        Some(q) => {
            let (c, eff) = q.render(dev, parent, ctx);
            cmds.extend(c);
            meta.qdisc = Some(QdiscApplied {
                effective: eff,
                kind: q.kind().into(),
                position: match parent {
                    Parent::Root => "root",
                    Parent::ShaperClass => "leaf under the shaper (parent 1:1)",
                }
                .into(),
                spec: q.to_string(),
            });
        }
        None => {
            if let Some(leaf) = shaping.and_then(|s| s.default_leaf(dev, QDISC_HANDLE)) {
                cmds.push(leaf);
            }
        }
    }
    meta.tc = cmds.iter().map(TcCmd::line).collect();
    (cmds, meta)
}
