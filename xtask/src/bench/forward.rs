//! The forwarding and thesis sections: `rtprobe bench-forward` runs, XDP
//! against kernel forwarding and the XDP thesis's other axes.

use std::process::Command;

use anyhow::Result;
use serde_json::Value;

use super::{
    run::{Ctx, have, output_text},
    table::{Row, row},
};

/// The XDP native speed-up over kernel forwarding, checked (not asserted) here.
pub(super) const TARGET_XDP_SPEEDUP: f64 = 3.0;

pub(super) fn forward_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let json = ctx.out.join("forward.json");
    let sizes = if quick { "64" } else { "64,1500" };
    let step = if quick { "2s" } else { "3s" };
    let mut c = Command::new(&ctx.bin);
    c.args([
        "bench-forward",
        "--quiet",
        "--modes",
        "off,skb,native,native-pass",
        "--sizes",
        sizes,
        "--load",
        "100",
        "--step",
        step,
        "--json",
    ])
    .arg(&json);
    if let Some(p) = ctx.rt_priority {
        c.args(["--rt-priority", &p.min(98).to_string()]);
    }
    let text = output_text(c, "rtprobe bench-forward")?;
    std::fs::write(ctx.out.join("forward.txt"), &text)?;
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    let steps = j["steps"].as_array().cloned().unwrap_or_default();
    let pps = |mode: &str, size: u64| {
        steps
            .iter()
            .find(|s| s["mode"] == mode && s["size"].as_u64() == Some(size))
            .map(|s| {
                (
                    s["forwarded_pps"].as_f64().unwrap_or(0.0),
                    s["limit"].as_str().unwrap_or("?").to_string(),
                )
            })
    };
    let mut rows = Vec::new();
    for size in sizes.split(',').filter_map(|s| s.parse::<u64>().ok()) {
        let Some((kernel, klimit)) = pps("off", size) else {
            continue;
        };
        for (mode, label) in [
            ("skb", "XDP skb"),
            ("native", "XDP native redirect"),
            ("native-pass", "XDP native pass"),
        ] {
            let Some((p, limit)) = pps(mode, size) else {
                continue;
            };
            let ratio = if kernel > 0.0 { p / kernel } else { 0.0 };
            let targeted = mode == "native";
            rows.push(row(
                &format!("forwarded pps {size} B, {label}"),
                format!("{p:.0}/s ({ratio:.2}x kernel; {limit} limit)"),
                format!("kernel {kernel:.0}/s ({klimit} limit)"),
                if targeted { ">= 3x kernel" } else { "-" },
                targeted.then_some(ratio >= TARGET_XDP_SPEEDUP),
            ));
        }
    }
    rows.push(row(
        "xdp-tools xdp-forward",
        "-".into(),
        if have("xdp-forward") {
            "installed but not measured: bench-forward has no xdp-forward mode yet".into()
        } else {
            "not installed (xdp-tools 1.3.1 has no xdp-forward; it ships from 1.4)".into()
        },
        "-",
        None,
    ));
    Ok(rows)
}

/// The XDP thesis's other axes (STUDY.md §3) in one bench-forward run:
/// the router's work variant at growing memory accesses per packet, and the
/// bounce device (XDP_TX in generic and native XDP, AF_XDP) at 1..8 queues, with
/// `perf stat` where the machine counts. Rows state relations measured
/// side by side, not absolute targets.
pub(super) fn thesis_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    let (work, queues, step) = if quick {
        ("1,12800", "1,2", "2s")
    } else {
        ("1,10,100,1000,12800", "1,2,4,8", "3s")
    };
    let j = thesis_run(ctx, work, queues, step)?;
    let steps = j["steps"].as_array().cloned().unwrap_or_default();
    let mut rows = work_rows(&steps, work);
    let bounce = j["bounce"].as_array().cloned().unwrap_or_default();
    rows.extend(bounce_rows(&bounce));
    rows.extend(bounce_per_core_row(&bounce));
    rows.push(perf_stat_row(&j));
    Ok(rows)
}

/// The thesis's bench-forward run; its text goes to thesis.txt, its JSON
/// (returned) to thesis.json.
fn thesis_run(ctx: &Ctx, work: &str, queues: &str, step: &str) -> Result<Value> {
    let json = ctx.out.join("thesis.json");
    let mut c = Command::new(&ctx.bin);
    c.args([
        "bench-forward",
        "--quiet",
        "--modes",
        "skb,native",
        "--work",
        work,
        "--sizes",
        "64",
        "--load",
        "100",
        "--bounce",
        "skb,native,afxdp",
        "--queues",
        queues,
        "--perf-stat",
        "--step",
        step,
        "--json",
    ])
    .arg(&json);
    if let Some(p) = ctx.rt_priority {
        c.args(["--rt-priority", &p.min(98).to_string()]);
    }
    let text = output_text(c, "rtprobe bench-forward (thesis axes)")?;
    std::fs::write(ctx.out.join("thesis.txt"), &text)?;
    Ok(serde_json::from_str(&std::fs::read_to_string(&json)?)?)
}

/// The router's work variant at each of `work`'s memory accesses per
/// packet, against the router without it, per XDP mode.
fn work_rows(steps: &[Value], work: &str) -> Vec<Row> {
    let pps = |mode: &str, work: Option<u64>| {
        steps
            .iter()
            .find(|s| s["mode"] == mode && s["work"].as_u64() == work)
            .and_then(|s| s["forwarded_pps"].as_f64())
    };
    let mut rows = Vec::new();
    for mode in ["skb", "native"] {
        let Some(plain) = pps(mode, None) else {
            continue;
        };
        for w in work.split(',').filter_map(|w| w.parse::<u64>().ok()) {
            if let Some(p) = pps(mode, Some(w)) {
                rows.push(row(
                    &format!("XDP {mode}, {w} memory accesses/packet"),
                    format!("{p:.0}/s"),
                    format!(
                        "router without the work {plain:.0}/s ({:.2}x)",
                        p / plain.max(1.0)
                    ),
                    "-",
                    None,
                ));
            }
        }
    }
    rows
}

/// One row per bounce hook: its rate at each queue count.
fn bounce_rows(bounce: &[Value]) -> Vec<Row> {
    let mut rows = Vec::new();
    for hook in ["skb", "native", "afxdp"] {
        let per_q: Vec<String> = bounce
            .iter()
            .filter(|b| b["hook"] == hook)
            .map(|b| {
                format!(
                    "{}q {:.0}/s",
                    b["queues"],
                    b["bounced_pps"].as_f64().unwrap_or(0.0)
                )
            })
            .collect();
        if !per_q.is_empty() {
            rows.push(row(
                &if hook == "afxdp" {
                    "AF_XDP bounce (user space, copy mode)".to_string()
                } else {
                    format!("XDP_TX bounce, {hook}")
                },
                per_q.join(", "),
                "-".into(),
                "-",
                None,
            ));
        }
    }
    rows
}

fn perf_stat_row(j: &Value) -> Row {
    row(
        "perf stat (IPC, branch, L1 misses)",
        match j["perf_note"].as_str() {
            None => "counted: see thesis.txt".into(),
            Some(n) if n.contains("no hardware event") => {
                "unknown: no hardware counters on this machine (thesis.txt)".into()
            }
            Some(n) => n.to_string(),
        },
        "-".into(),
        "-",
        None,
    )
}

/// Native XDP_TX against generic per core (the thesis compares hooks per
/// core: the totals move with which hook the generator beside it leaves
/// CPU to), at one queue.
fn bounce_per_core_row(bounce: &[Value]) -> Option<Row> {
    let per_core = |hook: &str| {
        bounce
            .iter()
            .find(|b| b["hook"] == hook && b["queues"] == 1)
            .and_then(|b| b["bounced_pps_per_core"].as_f64())
            .filter(|&v| v > 0.0)
    };
    let (native, skb) = (per_core("native")?, per_core("skb")?);
    Some(row(
        "XDP_TX bounce per core, 1 queue: native vs generic",
        format!("{:.2}x ({native:.0} vs {skb:.0} /s per core)", native / skb),
        "-".into(),
        "> 1.3x",
        Some(native > 1.3 * skb),
    ))
}
