//! Running a scenario with a fake cell runner and a fake figure maker:
//! every cell written, and the report generated from their summaries.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use super::{
    tests::{FULL, err, parse},
    *,
};
use crate::{
    stats::{Latency, RunReport, Summary, report::FlowSummary},
    tune::{LoadReport, load::FlowReport},
};

/// Answers from a table; fails the cells it is told to.
struct FakeRunner {
    fail: Vec<String>,
    ran: Vec<String>,
}

fn latency(p50_us: u64) -> Latency {
    Latency {
        count: 100,
        min: Some(p50_us * 900),
        p50: Some(p50_us * 1000),
        p90: Some(p50_us * 1500),
        p99: Some(p50_us * 2000),
        p999: Some(p50_us * 3000),
        max: Some(p50_us * 4000),
        mean: Some(p50_us as f64 * 1000.0),
        unbinned: None,
    }
}

impl CellRunner for FakeRunner {
    fn run_cell(&mut self, cell: &Cell) -> Result<CellResult> {
        self.ran.push(cell.id.clone());
        if self.fail.contains(&cell.id) {
            bail!("testbed exploded\nbadly");
        }
        // The runner writes the cell's files; the fake writes a CSV whose
        // median is the summary's (for the confidence intervals).
        let mut csv = String::from("seq,one_way_ns\n");
        for i in 0..400u64 {
            let v = (100 + 10 * cell.variant as u64) * 1000 + (i * 37) % 2000;
            csv += &format!("{i},{v}\n");
        }
        std::fs::write(cell.csv(), csv)?;
        let mut report = RunReport::default();
        if !cell.run.knobs.loads().is_empty() {
            let rep = LoadReport {
                bottleneck: None,
                flows: vec![FlowReport {
                    kind: "udp".into(),
                    spec: "udp:150%,size=1470".into(),
                    port: 5201,
                    achieved_bps: 95.6e6,
                    loss_pct: Some(36.0),
                    expected_loss_pct: Some(36.2),
                    ..Default::default()
                }],
                total_achieved_bps: 95.6e6,
            };
            report.load = Some(rep);
        }
        let mut knobs = crate::model::knobs::AppliedKnobs::default();
        if cell.set == "bql-3000" {
            knobs
                .unsupported
                .insert("bql".into(), "no BQL on this device (veth)".into());
        }
        if cell.set == "small-queue" {
            knobs.skipped = vec!["qdisc fq_codel skipped: the kernel lacks fq_codel".into()];
        }
        report.host = Some(crate::model::host::HostFacts {
            cores: Some(2),
            cpuidle_driver: "haltpoll".into(),
            cpuidle_governor: "haltpoll".into(),
            kernel: "6.18".into(),
            ..Default::default()
        });
        let p50 = 100 + 10 * cell.variant as u64;
        Ok(CellResult {
            summary: Summary {
                sent: 100,
                received: 99,
                lost: 1,
                loss_pct: 1.0,
                one_way_ns: latency(p50),
                rtt_ns: latency(2 * p50),
                report,
                ..Default::default()
            },
            knobs,
        })
    }
}

struct FakeFigures(Vec<(String, String)>);

impl FigureMaker for FakeFigures {
    fn compare(&mut self, out_dir: &Path, baseline: &Cell, other: &Cell) -> Result<Vec<PathBuf>> {
        self.0.push((baseline.id.clone(), other.id.clone()));
        let f = out_dir.join("fig").join(format!("{}-box.svg", other.id));
        Ok(vec![f])
    }
}

struct CountProgress(usize, usize, bool);

impl Progress for CountProgress {
    fn start_cell(&mut self, _: &Cell) {
        self.0 += 1;
    }
    fn end_cell(&mut self, _: &Cell, _: bool) {
        self.1 += 1;
    }
    fn finish(&mut self) {
        self.2 = true;
    }
}

#[test]
fn run_writes_every_cell_and_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let sc = parse(FULL).unwrap();
    let mut runner = FakeRunner {
        fail: vec!["s1472-i10ms-off-idle".into()],
        ran: vec![],
    };
    let mut figs = FakeFigures(vec![]);
    let mut prog = CountProgress(0, 0, false);
    let out = run_scenario(&sc, dir.path(), &mut runner, Some(&mut figs), &mut prog).unwrap();
    assert_eq!(out.cells, 16);
    assert_eq!(out.failed, 1);
    assert_eq!(runner.ran.len(), 16);
    assert_eq!((prog.0, prog.1, prog.2), (16, 16, true));
    // Figures: every non-baseline cell against its group's baseline.
    assert_eq!(figs.0.len(), 12 - 1);
    assert!(figs.0.contains(&(
        "s64-i1ms-off-baseline".into(),
        "s64-i1ms-off-bql-3000".into()
    )));
    assert!(
        figs.0
            .iter()
            .all(|(b, o)| b.ends_with("baseline") && !o.ends_with("baseline"))
    );
    assert!(dir.path().join("scenario.toml").exists());

    let report = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(report.starts_with("# rtprobe scenario: demo"), "{report}");
    assert!(report.contains("**1 failed**"));
    assert!(
        report.contains("\n- host: 2 cores (unknown), kernel 6.18, preemption unknown"),
        "{report}"
    );
    assert!(report.contains("### 64 B every 1ms"));
    assert!(report.contains("### 1472 B every 10ms"));
    assert_eq!(report.matches("### ").count(), 4);
    // Baseline p50 100 us, variant 1 is 10 us slower.
    assert!(
        report.contains(
            "| baseline | 100 µs | 200 µs | 300 µs | 400 µs | baseline | baseline | 200 µs | 1.00 |"
        ),
        "{report}"
    );
    assert!(
        report.contains(
            "| bql-3000 | 110 µs | 220 µs | 330 µs | 440 µs | +10 µs | p50 higher by 10 µs, 95 % CI"
        ),
        "{report}"
    );
    assert!(report.contains("udp 95.6 Mbit/s, loss 36.0 % (calc. 36.2 %)"));
    assert!(report.contains("bql unsupported: no BQL on this device"));
    assert!(report.contains("**SKIPPED** qdisc fq_codel skipped"));
    assert!(
        report.contains("**FAILED**: testbed exploded badly"),
        "{report}"
    );
    assert!(report.contains("[csv](s64-i1ms-off-baseline.csv) [json](s64-i1ms-off-baseline.json)"));
    assert!(report.contains("[queue](s64-i1ms-off-small-queue-queue.csv)"));
    assert!(report.contains("[s64-i1ms-off-bql-3000-box.svg](fig/s64-i1ms-off-bql-3000-box.svg)"));
    assert!(
        report.contains("| bql-3000 | bql_limit_max=3000, link_rate=100mbit, load=[tcp:100%] |"),
        "{report}"
    );

    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap())
            .unwrap();
    let cells = results["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 16);
    assert_eq!(cells[0]["summary"]["one_way_ns"]["p50"], 100_000);
    assert!(cells[15]["error"].as_str().unwrap().contains("exploded"));
}

#[test]
fn without_figures_the_report_says_how_to_draw_them() {
    let dir = tempfile::tempdir().unwrap();
    let sc = parse("[probe]\ncount = 10\n[set.base]\n[set.\"with-stress\"]\nstress = 2\n").unwrap();
    let mut runner = FakeRunner {
        fail: vec![],
        ran: vec![],
    };
    let out = run_scenario(
        &sc,
        dir.path(),
        &mut runner,
        None,
        &mut CountProgress(0, 0, false),
    )
    .unwrap();
    assert_eq!(out.failed, 0);
    let report = std::fs::read_to_string(out.report).unwrap();
    assert!(
        report.contains("rtprobe plot s64-i1ms-off-base.csv s64-i1ms-off-with-stress.csv --label base --label with-stress"),
        "{report}"
    );
}

#[test]
fn retain_sets_and_plan() {
    let mut sc = parse(FULL).unwrap();
    assert!(
        sc.retain_sets(&["nope".into()])
            .unwrap_err()
            .to_string()
            .contains("baseline, bql-3000")
    );
    sc.retain_sets(&["bql-3000".into(), "idle".into()]).unwrap();
    let cells = sc.cells(Path::new("out"));
    assert_eq!(cells.len(), 8);
    let p = plan(&sc, &cells, Path::new("out"), &["a note".into()]);
    assert!(
        p.contains("8 cells = 2 sizes x 2 intervals x 1 xdp modes x 2 sets"),
        "{p}"
    );
    assert!(p.contains("set bql-3000 (baseline)"), "{p}");
    assert!(p.contains("note: a note"));
}

/// Every shipped scenario parses and validates, and passes the kernel
/// check on a complete kernel; on this machine's kernel the ones needing
/// a missing qdisc either say skip or fail naming the key and line.
#[test]
fn extra_flows_in_a_scenario() {
    let sc = parse(
        "[probe]\nport = 5061\nintervals = [\"1ms\", \"100us\"]\n\
         flows = [\"port=5062,tos=0,size=1472,interval=1ms\", \"port=5063\"]\n",
    )
    .unwrap();
    assert_eq!(sc.spec.flows.flows.as_ref().unwrap().len(), 2);
    assert_eq!(sc.spec.flows.flows.as_ref().unwrap()[0].size, Some(1472));
    let cells = sc.cells(Path::new("o"));
    assert_eq!(cells[1].run.extra_flows[1].port, 5063);
    let e = err("[probe]\nflows = [\"port=5061\"]\n");
    assert!(
        e.contains("probe.flows") && e.contains("already used"),
        "{e}"
    );
    let e = err("[probe]\nflows = [\"tos=1\"]\n");
    assert!(e.contains("probe.flows") && e.contains("port=5062"), "{e}");
    let e = err("[probe]\nflows = [\"port=5062,size=4000\"]\n");
    assert!(e.contains("out of range"), "{e}");
}

/// Two flows; under "prio" the main flow ignores the load, under "fifo"
/// both grow with it.
struct FlowRunner;

impl CellRunner for FlowRunner {
    fn run_cell(&mut self, cell: &Cell) -> Result<CellResult> {
        let share: f64 = cell
            .run
            .knobs
            .loads()
            .iter()
            .map(|l| match l.rate().unwrap() {
                crate::tune::amounts::LoadRate::Share(s) => s,
                _ => 0.0,
            })
            .sum();
        let lp = 100 + (share * 10_000.0) as u64;
        let hp = if cell.set.starts_with("prio") {
            100 + (share * 50.0) as u64
        } else {
            lp
        };
        let flow = |id: u8, port: u16, p99_us: u64| FlowSummary {
            flow: id,
            port,
            tos: if id == 0 { 0xC0 } else { 0 },
            summary: Summary {
                one_way_ns: Latency {
                    p99: Some(p99_us * 1000),
                    max: Some(p99_us * 2000),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        };
        let report = RunReport {
            flows: vec![flow(0, 5061, hp), flow(1, 5062, lp)],
            ..Default::default()
        };
        Ok(CellResult {
            summary: Summary {
                one_way_ns: latency(hp),
                report,
                ..Default::default()
            },
            knobs: Default::default(),
        })
    }
}

#[test]
fn report_says_whether_the_priority_bound_held() {
    let sc = parse(
        "[probe]\nintervals = [\"1ms\"]\nflows = [\"port=5062,tos=0\"]\n\
         [knobs]\nlink_rate = \"100mbit\"\n\
         [set.prio-0]\nqdisc = \"htb-prio\"\n\
         [set.prio-100]\nqdisc = \"htb-prio\"\nload = [\"tcp:100%,cc=cubic\"]\n\
         [set.fifo-0]\nqdisc = \"pfifo\"\n\
         [set.fifo-50]\nqdisc = \"pfifo\"\nload = [\"tcp:50%\"]\n",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut prog = CountProgress(0, 0, false);
    run_scenario(&sc, dir.path(), &mut FlowRunner, None, &mut prog).unwrap();
    let report = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(report.contains("## Flows side by side"), "{report}");
    assert!(
        report.contains(
            "| set | load | flow 0 (port 5061, TOS 0xC0) | flow 1 (port 5062, TOS 0x00) |"
        ),
        "{report}"
    );
    assert!(
        report.contains("| prio-100 | tcp:100%,cc=cubic | 150 µs / 300 µs | 10.1 ms / 20.2 ms |"),
        "{report}"
    );
    assert!(
        report.contains("- flow 0: **bound held**: p99 100 µs idle, at most 150 µs under load (tcp:100%,cc=cubic): +50 µs, +50 % (tolerance +500 µs)"),
        "{report}"
    );
    assert!(
        report.contains("- flow 1: p99 100 µs idle, at most 10.1 ms"),
        "{report}"
    );
    assert!(report.contains("+10 ms, +10000 %"), "{report}");
    assert!(
        report.contains(
            "- flow 0: **bound did not hold**: p99 100 µs idle, at most 5.1 ms under load (tcp:50%)"
        ),
        "{report}"
    );
    assert_eq!(
        report.matches("### 64 B every 1ms: ").count(),
        2,
        "{report}"
    );
}
