//! `results.json`: for every cell its probe options, the knobs requested
//! and applied, and its summary or error; rewritten after each cell.

use std::path::Path;

use anyhow::Result;
use serde_json::{Map, Value};

use super::{Cell, CellResult, RunOptions, Scenario};
use crate::model::units;

pub(super) fn write_results_json(
    out_dir: &Path,
    sc: &Scenario,
    cells: &[Cell],
    results: &[Result<CellResult, String>],
) -> Result<()> {
    let rows: Vec<Value> = cells
        .iter()
        .zip(results)
        .map(|(c, r)| {
            let mut m = Map::new();
            m.insert("cell".into(), Value::String(c.id.clone()));
            m.insert("set".into(), Value::String(c.set.clone()));
            m.insert("probe".into(), Value::Object(cell_probe_json(sc, &c.run)));
            m.insert(
                "knobs_requested".into(),
                Value::String(c.run.knobs.describe()),
            );
            match r {
                Ok(res) => {
                    m.insert(
                        "summary".into(),
                        serde_json::to_value(&res.summary).unwrap_or(Value::Null),
                    );
                    m.insert(
                        "knobs".into(),
                        serde_json::to_value(&res.knobs).unwrap_or(Value::Null),
                    );
                }
                Err(e) => {
                    m.insert("error".into(), Value::String(e.clone()));
                }
            }
            Value::Object(m)
        })
        .collect();
    let doc = serde_json::json!({
        "scenario": sc.name,
        "probe": matrix_json(sc),
        "cells": rows,
    });
    Ok(crate::export::json::write_value(
        &out_dir.join("results.json"),
        &doc,
    )?)
}

/// results.json's `probe` of the scenario: the axes and what the cells
/// share.
fn matrix_json(sc: &Scenario) -> Map<String, Value> {
    let a = &sc.axes;
    let mut m = shared_probe_json(sc, sc.common());
    m.insert("sizes".into(), serde_json::json!(a.sizes));
    m.insert(
        "intervals".into(),
        serde_json::json!(
            a.intervals
                .iter()
                .map(|d| units::fmt_duration(*d))
                .collect::<Vec<_>>()
        ),
    );
    m.insert("xdp_modes".into(), serde_json::json!(a.xdp_modes));
    m
}

/// results.json's `probe` of one cell: its size, interval and XDP mode and
/// what the cells share.
fn cell_probe_json(sc: &Scenario, run: &RunOptions) -> Map<String, Value> {
    let mut m = shared_probe_json(sc, run);
    m.insert("size".into(), serde_json::json!(run.probe.size));
    m.insert(
        "interval".into(),
        serde_json::json!(units::fmt_duration(run.probe.interval)),
    );
    m.insert("xdp_mode".into(), serde_json::json!(run.xdp_mode));
    m
}

fn shared_probe_json(sc: &Scenario, run: &RunOptions) -> Map<String, Value> {
    let p = &run.probe;
    let fields = serde_json::json!({
        "count": p.count,
        "duration": p.duration.map(units::fmt_duration),
        "xdp_action": run.xdp_action,
        "tos": p.tos,
        "port": p.port,
        "timestamps": p.timestamps,
        "timeout": units::fmt_duration(p.timeout),
        "tx_if": run.tx_if,
        "rx_if": run.rx_if,
        // As the file (or --flow) gives them; unset fields follow the cell.
        "flows": sc.spec.flows.flows.clone().unwrap_or_default(),
    });
    match fields {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}
