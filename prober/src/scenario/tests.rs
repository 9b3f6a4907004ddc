//! Scenario parsing, validation and matrix expansion, with a fake kernel
//! (running the cells and the report: `execute_tests.rs`).

use std::path::Path;

use anyhow::Result;

use super::{matrix::check_cell_count, *};
use crate::tune::{QueueLimit, Rate};

pub(super) const FULL: &str = r#"
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

pub(super) fn parse(text: &str) -> Result<Scenario> {
    Scenario::parse(Path::new("configs/demo.toml"), text)
}

pub(super) fn err(text: &str) -> String {
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
