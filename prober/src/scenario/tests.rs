//! Scenario parsing, validation, matrix expansion and report generation,
//! with a fake cell runner, a fake figure maker and a fake kernel.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use super::{matrix::check_cell_count, *};
use crate::{
    stats::{Latency, RunReport, Summary, report::FlowSummary},
    tune::{LoadReport, QueueLimit, Rate, load::FlowReport},
};

const FULL: &str = r#"
name = "demo"
description = "a small matrix"

[probe]
sizes = [64, 1472]
intervals = ["1ms", "10ms"]
count = 100
tos = "0xC0"

[knobs]
link_rate = "100mbit"
load = ["tcp:100%"]

[set.baseline]

[set.bql-3000]
bql_limit_max = 3000

[set.small-queue]
queue_limit = "20p"
queue_sample = "10ms"

[set.idle]
load = []
"#;

fn parse(text: &str) -> Result<Scenario> {
    Scenario::parse(Path::new("configs/demo.toml"), text)
}

fn err(text: &str) -> String {
    format!("{:#}", parse(text).unwrap_err())
}

#[test]
fn parses_a_full_scenario_in_file_order() {
    let sc = parse(FULL).unwrap();
    assert_eq!(sc.name, "demo");
    assert_eq!(sc.output, Path::new("results/demo"));
    assert_eq!(sc.common().probe.tos, 0xC0);
    assert_eq!(sc.common().probe.count, Some(100));
    assert_eq!(sc.axes.xdp_modes, [XdpMode::Off]);
    let names: Vec<&str> = sc.sets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["baseline", "bql-3000", "small-queue", "idle"]);
    // Common knobs merged under each set, overrides win.
    assert_eq!(sc.sets[1].knobs.link_rate, Some(Rate::mbit(100)));
    assert_eq!(sc.sets[1].knobs.loads().len(), 1);
    assert_eq!(sc.sets[2].knobs.queue_limit, Some(QueueLimit::Packets(20)));
    assert!(sc.sets[3].knobs.loads().is_empty());
}

#[test]
fn cells_cover_the_matrix_with_one_folder_of_outputs() {
    let sc = parse(FULL).unwrap();
    let cells = sc.cells(Path::new("/out"));
    assert_eq!(cells.len(), 2 * 2 * 4);
    assert_eq!(cells[0].id, "s64-i1ms-off-baseline");
    assert_eq!(cells[1].id, "s64-i1ms-off-bql-3000");
    assert_eq!(cells[4].id, "s64-i10ms-off-baseline");
    assert_eq!(cells[15].id, "s1472-i10ms-off-idle");
    assert_eq!(cells[0].csv(), Path::new("/out/s64-i1ms-off-baseline.csv"));
    assert_eq!(
        cells[0].json(),
        Path::new("/out/s64-i1ms-off-baseline.json")
    );
    assert_eq!(
        cells[2].run.queue_csv.as_deref(),
        Some(Path::new("/out/s64-i1ms-off-small-queue-queue.csv"))
    );
    assert!(cells[1].run.queue_csv.is_none());
    assert_eq!(cells[5].variant, 1);
    assert_eq!(cells[15].run.probe.size, 1472);
    assert_eq!(cells[15].run.probe.interval, Duration::from_millis(10));
    // The knobs know the cell's probe flow (filters, probe class).
    assert_eq!(cells[15].run.knobs.probe.size, 1472);
    assert_eq!(
        cells[15].run.knobs.probe.interval,
        Duration::from_millis(10)
    );
    assert_eq!(cells[15].run.knobs.probe.port, 5061);
    assert!(cells.iter().all(|c| c.total == 16));
    let ids: std::collections::HashSet<_> = cells.iter().map(|c| &c.id).collect();
    assert_eq!(ids.len(), 16);
    // Estimates: 100 x 1 ms + 1 s warm-up + 1 s timeout + 1 s setup.
    assert_eq!(cells[0].estimate(), Duration::from_millis(3100));
}

#[test]
fn xdp_modes_multiply_the_variants() {
    let sc = parse("[probe]\nxdp_modes = [\"off\", \"skb\", \"native\", \"auto\"]\n[set.idle]\n")
        .unwrap();
    let cells = sc.cells(Path::new("o"));
    assert_eq!(cells.len(), 4);
    assert_eq!(cells[0].id, "s64-i1ms-off-idle");
    assert_eq!(cells[2].run.xdp_mode, XdpMode::Native);
    assert_eq!(cells[3].label(), "idle (xdp auto)");
    assert_eq!(cells[3].variant, 3);
}

#[test]
fn no_sets_is_one_default_run() {
    let sc = parse("[probe]\nsizes=[200]\n").unwrap();
    assert_eq!(sc.sets.len(), 1);
    assert_eq!(sc.sets[0].name, "default");
    assert_eq!(sc.cells(Path::new("o"))[0].run.probe.count, Some(1000));
}

#[test]
fn errors_name_file_line_and_key() {
    // Unknown knob inside a set.
    let e = err("[probe]\ncount = 10\n\n[set.a]\nlink_rat = \"100mbit\"\n");
    assert!(e.starts_with("configs/demo.toml:5:1:"), "{e}");
    assert!(e.contains("unknown field `link_rat`"), "{e}");
    assert!(e.contains("link_rate"), "{e}");
    // Bad unit, with the key named.
    let e = err("[knobs]\n\nlink_rate = \"100mbps\"\n");
    assert!(e.starts_with("configs/demo.toml:3:"), "{e}");
    assert!(e.contains("knobs.link_rate"), "{e}");
    assert!(e.contains("bytes per second"), "{e}");
    // Bad unit inside a list, inside a set.
    let e = err("[set.x]\nload = [\"tcp:fast\"]\n");
    assert!(e.contains(":2:") && e.contains("set.x.load"), "{e}");
    // Unknown top-level key and unknown probe key.
    assert!(err("nmae = \"x\"\n").contains("unknown field `nmae`"));
    let e = err("[probe]\nsise = 64\n");
    assert!(
        e.contains(":2:") && e.contains("unknown field `sise`"),
        "{e}"
    );
    // `size` is a key now (the command line's --size); a list is not a size.
    let e = err("[probe]\ncount = 3\nsize = [64]\n");
    assert!(
        e.contains(":3:") && e.contains("probe.size") && e.contains("invalid type"),
        "{e}"
    );
    // Cross-field rules, blamed on the key in the set or in [knobs].
    let e =
        err("[knobs]\nlink_rate = \"100mbit\"\n[set.a]\n\nqueue_limit = 20\nqdisc = \"pfifo\"\n");
    assert!(
        e.starts_with("configs/demo.toml:5:1: set.a.queue_limit:"),
        "{e}"
    );
    let e = err("[knobs]\nqueue_limit = 20\n[set.a]\n");
    assert!(
        e.starts_with("configs/demo.toml:2:1: knobs.queue_limit:"),
        "{e}"
    );
    let e = err("[set.a]\nload = [\"tcp:50%\"]\n");
    assert!(e.contains("set.a.load") && e.contains("link_rate"), "{e}");
    let e = err("[probe]\ncount = 5\nduration = \"1s\"\n");
    assert!(
        e.contains("probe.duration") && e.contains("not both"),
        "{e}"
    );
    let e = err("[probe]\nsizes = [9000]\n");
    assert!(e.contains("probe.sizes") && e.contains("1472"), "{e}");
    let e = err("[probe]\nintervals = [\"1 parsec\"]\n");
    assert!(e.contains("probe.intervals"), "{e}");
    let e = err("[probe]\ntos = 300\n");
    assert!(e.contains("probe.tos") && e.contains("0..255"), "{e}");
    let e = err(
        "[probe]\nxdp_mode = \"native\"\n[set.a]\nbottleneck = \"router\"\nlink_rate = \"100mbit\"\n",
    );
    assert!(
        e.contains("set.a.bottleneck") && e.contains("XDP_REDIRECT"),
        "{e}"
    );
    let e = err("[set.a]\nqueue_sample = \"10ms\"\n");
    assert!(e.contains("no queue to sample"), "{e}");
    let e = err("[set.\"a b\"]\n");
    assert!(e.contains("set names"), "{e}");
    let e = err("[set.a]\nload = [\"tcp,port=5061\"]\n");
    assert!(e.contains("probe port"), "{e}");
    // TOML syntax error.
    let e = err("[probe\n");
    assert!(e.starts_with("configs/demo.toml:1:"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
}

/// A kernel like this machine's: no fq_codel, prio, hfsc, sfq; no bbr.
struct FakeKernel {
    lacks: Vec<&'static str>,
    cc: Vec<String>,
    stress_ng: bool,
}

impl FakeKernel {
    fn this_machine() -> Self {
        Self {
            lacks: vec!["fq_codel", "prio", "hfsc", "sfq", "netem", "cake", "fq"],
            cc: vec!["reno".into(), "cubic".into(), "bbr".into()],
            stress_ng: true,
        }
    }

    fn complete() -> Self {
        Self {
            lacks: vec![],
            ..Self::this_machine()
        }
    }
}

impl SystemCheck for FakeKernel {
    fn missing_qdiscs(&mut self, kinds: &[&'static str]) -> Result<Vec<String>> {
        Ok(kinds
            .iter()
            .filter(|k| self.lacks.contains(k))
            .map(|k| k.to_string())
            .collect())
    }

    fn congestion_controls(&mut self) -> Result<Vec<String>> {
        Ok(self.cc.clone())
    }

    fn has_stress_ng(&mut self) -> bool {
        self.stress_ng
    }
}

#[test]
fn missing_kernel_features_fail_before_anything_runs() {
    let text =
        "[knobs]\nlink_rate = \"100mbit\"\n[set.base]\n[set.codel]\n\nqdisc = \"fq_codel\"\n";
    let sc = parse(text).unwrap();
    let e = format!(
        "{:#}",
        sc.check_system(&mut FakeKernel::this_machine())
            .unwrap_err()
    );
    assert!(
        e.starts_with("configs/demo.toml:6:1: set.codel.qdisc:"),
        "{e}"
    );
    assert!(
        e.contains("needs fq_codel, which this kernel lacks") && e.contains("missing = \"skip\""),
        "{e}"
    );
    assert!(
        sc.check_system(&mut FakeKernel::complete())
            .unwrap()
            .is_empty()
    );
    // Skip: accepted, and said.
    let sc = parse(&format!("{text}missing = \"skip\"\n")).unwrap();
    let notes = sc.check_system(&mut FakeKernel::this_machine()).unwrap();
    assert!(
        notes[0].contains("codel") && notes[0].contains("skipped"),
        "{notes:?}"
    );
    // prio needs sfq leaves too, and says so.
    let sc = parse("[set.p]\nqdisc = \"prio\"\n").unwrap();
    let e = format!(
        "{:#}",
        sc.check_system(&mut FakeKernel::this_machine())
            .unwrap_err()
    );
    assert!(e.contains("prio, sfq"), "{e}");
    // htb-prio needs only what this kernel has; without htb it fails.
    let sc = parse("[set.p]\nqdisc = \"htb-prio\"\n").unwrap();
    assert!(
        sc.check_system(&mut FakeKernel::this_machine())
            .unwrap()
            .is_empty()
    );
    let mut no_htb = FakeKernel::this_machine();
    no_htb.lacks.push("htb");
    let e = format!("{:#}", sc.check_system(&mut no_htb).unwrap_err());
    assert!(e.contains("qdisc htb-prio needs htb"), "{e}");
    // A congestion control the kernel lacks.
    let sc = parse("[set.a]\nload = [\"tcp,cc=vegas\"]\n").unwrap();
    let e = format!(
        "{:#}",
        sc.check_system(&mut FakeKernel::this_machine())
            .unwrap_err()
    );
    assert!(
        e.contains("set.a.load") && e.contains("vegas") && e.contains("reno cubic bbr"),
        "{e}"
    );
    // stress-ng asked for but absent.
    let sc = parse("[set.a]\nstress = 2\nstress_tool = \"stress-ng\"\n").unwrap();
    let mut k = FakeKernel::this_machine();
    k.stress_ng = false;
    let e = format!("{:#}", sc.check_system(&mut k).unwrap_err());
    assert!(e.contains("stress-ng is not installed"), "{e}");
}

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
                crate::tune::units::LoadRate::Share(s) => s,
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

#[test]
fn every_shipped_config_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("configs/ exists") {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("toml") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        if crate::options::bench_forward::BenchForwardArgs::parse(&p, &text).is_ok() {
            // A bench-forward sweep (options::bench_forward tests it); `run` says so.
            let e = Scenario::load(&p).unwrap_err().to_string();
            assert!(e.contains("bench-forward --config"), "{e}");
            continue;
        }
        n += 1;
        let sc = Scenario::load(&p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
        assert!(
            sc.description.is_some(),
            "{} has no description",
            p.display()
        );
        assert!(!sc.cells(Path::new("o")).is_empty());
        sc.check_system(&mut FakeKernel::complete())
            .unwrap_or_else(|e| panic!("{e:#}"));
        if let Err(e) = sc.check_system(&mut FakeKernel::this_machine()) {
            let m = format!("{e:#}");
            assert!(m.contains(".qdisc:") && m.contains("lacks"), "{m}");
            assert!(m.starts_with(&p.display().to_string()), "{m}");
        }
    }
    assert!(n >= 16, "only {n} configs");
    for required in [
        "system-tests",
        "bql",
        "tsq",
        "qdisc-pfifo",
        "qdisc-bfifo",
        "qdisc-prio",
        "qdisc-fq_codel",
        "qdisc-htb",
        "qdisc-hfsc",
        "qdisc-tbf",
        "combination",
        "xdp-modes",
        "bandwidth-lab",
        "bufferbloat",
    ] {
        assert!(
            dir.join(format!("{required}.toml")).exists(),
            "configs/{required}.toml missing"
        );
    }
}

#[test]
fn continuous_keys_work_per_cell_and_forever_is_refused() {
    let sc = parse(
        "[probe]\nsizes = [64]\nintervals = [\"1ms\"]\ncount = 10\nhdr_log = \"x.hlog\"\n\
         metrics_listen = \"127.0.0.1:0\"\nout_rotate = \"1MiB\"\n[set.a]\n[set.b]\n",
    )
    .unwrap();
    let cells = sc.cells(Path::new("/out"));
    assert_eq!(cells.len(), 2);
    // One HDR log per cell, next to its CSV; the rest as the file says.
    assert_eq!(
        cells[1].run.continuous.hdr_log.as_deref(),
        Some(Path::new("/out/s64-i1ms-off-b.hlog"))
    );
    assert!(cells[0].run.continuous.metrics_listen.is_some());
    assert!(cells[0].run.continuous.rotation.is_some());
    assert!(!cells[0].run.continuous.forever);

    let e = err("[probe]\nsizes = [64]\nforever = true\n");
    assert!(e.contains("forever") && e.contains("never end"), "{e}");
    let e = err("[probe]\nsizes = [64]\nduration = \"0s\"\n");
    assert!(e.contains("never end"), "{e}");
}

/// 14.4 M cells from a 27 KB file used to be built (and abort at 4 GB);
/// the axes' lengths refuse it before one cell exists.
#[test]
fn a_matrix_over_the_cell_limit_is_refused_before_any_cell_is_built() {
    let sizes: Vec<String> = (0..2000).map(|i| (64 + i % 1400).to_string()).collect();
    let intervals: Vec<String> = (1..=1800).map(|i| format!("\"{i}us\"")).collect();
    let text = format!(
        "[probe]\nsizes = [{}]\nintervals = [{}]\nxdp_modes = [\"off\", \"skb\", \"native\", \"auto\"]\n",
        sizes.join(","),
        intervals.join(",")
    );
    let started = std::time::Instant::now();
    let e = err(&text);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        e,
        "configs/demo.toml: the matrix has 14400000 cells (2000 sizes x 1800 intervals x 4 XDP modes x \
         1 sets), over the limit of 10000: shorten the lists or split the scenario into \
         several files"
    );
}

#[test]
fn the_cell_count_is_checked_arithmetic_up_to_the_limit() {
    let p = Path::new("t.toml");
    let axes = |n| {
        [
            (n, "sizes"),
            (1, "intervals"),
            (1, "XDP modes"),
            (1, "sets"),
        ]
    };
    assert!(check_cell_count(p, axes(MAX_CELLS as usize)).is_ok());
    assert!(check_cell_count(p, axes(MAX_CELLS as usize + 1)).is_err());
    let e = check_cell_count(
        p,
        [
            (usize::MAX, "sizes"),
            (usize::MAX, "intervals"),
            (2, "XDP modes"),
            (1, "sets"),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("more than 2^64 cells"), "{e}");
    // Command-line overrides shrink the axes before the count.
    let mut over = Overrides::default();
    over.run.probe.size = Some(64);
    over.run.probe.interval = Some(std::time::Duration::from_millis(1));
    let text = format!(
        "[probe]\ncount = 10\nsizes = [{}]\nintervals = [{}]\n",
        vec!["64"; 200].join(","),
        vec!["\"1ms\""; 200].join(",")
    );
    assert!(Scenario::parse_with(p, &text, &Overrides::default()).is_err());
    assert_eq!(
        Scenario::parse_with(p, &text, &over)
            .unwrap()
            .cells(Path::new("o"))
            .len(),
        1
    );
}

#[test]
fn a_scenario_that_is_not_utf8_says_so_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("latin1.toml");
    std::fs::write(&p, b"[probe]\ncount = 10\n# d\xe9lai\n").unwrap();
    let e = Scenario::load(&p).unwrap_err().to_string();
    assert!(
        e.ends_with(
            "not UTF-8 (byte 0xe9 at offset 22, line 3): save the scenario file as UTF-8 text"
        ),
        "{e}"
    );
    assert!(!e.contains("check the path"), "{e}");
}

#[test]
fn a_scenario_over_the_size_cap_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("huge.toml");
    let f = std::fs::File::create(&p).unwrap();
    // Sparse: the size is what is refused, nothing is read.
    f.set_len(crate::input::MAX_CONFIG_BYTES + 1).unwrap();
    let e = Scenario::load(&p).unwrap_err().to_string();
    assert!(
        e.contains("over the 1048576-byte limit of a scenario file"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn the_run_help_states_the_cell_and_size_limits() {
    use clap::CommandFactory;
    let mut cmd = crate::cli::Cli::command();
    let run = cmd.find_subcommand_mut("run").unwrap();
    let help = run
        .get_arguments()
        .find(|a| a.get_id() == "config")
        .and_then(|a| a.get_help())
        .unwrap()
        .to_string();
    assert!(
        help.contains(&format!("at most {MAX_CELLS} cells")),
        "{help}"
    );
    assert_eq!(
        crate::input::MAX_CONFIG_BYTES,
        1024 * 1024,
        "the help says 1 MiB"
    );
}
