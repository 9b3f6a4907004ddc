//! The option model: parsing on both sides, merge precedence, one set of
//! limits, and every flag of the probe command reachable from a scenario.

use std::time::Duration;

use anyhow::Result;
use clap::{CommandFactory, Parser};

use super::{plan::*, *};
use crate::{
    cli::Cli,
    ebpf::XdpMode,
    tune::{Bytes, Knobs, Rate},
};

fn opts(args: &[&str]) -> Result<RunOptions> {
    let mut v = vec!["rtprobe"];
    v.extend_from_slice(args);
    let p = Cli::try_parse_from(v).unwrap().probe;
    let to_cli = |e: SpecError| anyhow::anyhow!("{}", e.for_cli());
    let o = validate(&p.run, &p.knobs.into(), &p.output).map_err(to_cli)?;
    check_output_paths(&o).map_err(to_cli)?;
    Ok(o)
}

fn knobs(toml_text: &str) -> KnobSpec {
    toml::from_str(toml_text).unwrap()
}

#[test]
fn defaults_and_limits() {
    let o = opts(&[]).unwrap();
    assert_eq!(o.probe.count, Some(DEFAULT_COUNT));
    assert_eq!(o.probe.size, 64);
    assert_eq!(o.probe.port, 5061);
    assert_eq!(o.xdp_mode, XdpMode::Auto, "the probe command's default");
    assert!(
        opts(&["--size", "8"])
            .unwrap_err()
            .to_string()
            .contains("--size 8")
    );
    assert!(opts(&["--size", "9000"]).is_err());
    assert!(opts(&["--count", "0"]).is_err());
    assert!(opts(&["--port", "0"]).is_err());
    assert!(
        opts(&["--out", "/nonexistent-dir/x.csv"])
            .unwrap_err()
            .to_string()
            .contains("does not exist")
    );
    assert!(
        opts(&["--out", "/tmp"])
            .unwrap_err()
            .to_string()
            .contains("directory")
    );
    let d = opts(&["--duration", "2s"]).unwrap();
    assert_eq!(d.probe.count, None);
    assert!(opts(&["--tx-if", "a", "--rx-if", "a"]).is_err());
    let e = opts(&[
        "--xdp-mode",
        "native",
        "--bottleneck",
        "router",
        "--link-rate",
        "100mbit",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("past the router's qdisc"), "{e}");
    assert!(e.to_string().starts_with("--bottleneck"), "{e}");
    assert!(
        opts(&[
            "--xdp-mode",
            "native",
            "--xdp-action",
            "pass",
            "--bottleneck",
            "router",
            "--link-rate",
            "100mbit"
        ])
        .is_ok()
    );
    assert!(opts(&["--tx-if", "a", "--rx-if", "b", "--bottleneck", "router"]).is_err());
    let f = opts(&["--count", "100", "--flow", "port=5062,interval=100us,tos=0"]).unwrap();
    assert_eq!(f.extra_flows.len(), 1);
    assert_eq!(
        f.extra_flows[0].count,
        Some(1000),
        "same wall time as the main flow"
    );
    assert_eq!(
        (
            f.extra_flows[0].flow,
            f.extra_flows[0].port,
            f.extra_flows[0].tos
        ),
        (1, 5062, 0)
    );
    let e = opts(&["--flow", "port=5061"]).unwrap_err().to_string();
    assert!(
        e.starts_with("--flow port=5061"),
        "port clash with the main flow: {e}"
    );
}

#[test]
fn pacing_flags() {
    let o = opts(&["--interval", "1ms"]).unwrap();
    assert_eq!(o.probe.spin, None, "adaptive by default");
    assert!(!o.probe.busy_poll);
    let o = opts(&["--interval", "1ms", "--spin", "20us"]).unwrap();
    assert_eq!(o.probe.spin, Some(Duration::from_micros(20)));
    let o = opts(&["--busy-poll"]).unwrap();
    assert!(o.probe.busy_poll);
    let o = opts(&["--rt-priority", "50"]).unwrap();
    assert_eq!(o.probe.rt.fifo_priority, Some(50));
    if rt_throttling_on() {
        assert!(
            opts(&["--busy-poll", "--rt-priority", "50"])
                .unwrap_err()
                .to_string()
                .contains("throttling")
        );
    }
    assert!(opts(&["--interval", "10us", "--spin", "20us"]).is_err());
    assert!(
        Cli::try_parse_from(["rtprobe", "--busy-poll", "--spin", "5us"]).is_err(),
        "busy-poll already spins all the time"
    );
    // An extra flow's fixed spin is at most its interval.
    let f = opts(&["--spin", "50us", "--flow", "port=5062,interval=20us"]).unwrap();
    assert_eq!(f.extra_flows[0].spin, Some(Duration::from_micros(20)));
    let f = opts(&["--flow", "port=5062,interval=20us"]).unwrap();
    assert_eq!(f.extra_flows[0].spin, None);
}

#[test]
fn knobs_from_toml_are_checked_by_name() {
    let k = Knobs::from(knobs(
        r#"
        link_rate = "100mbit"
        queue_limit = 20
        load = ["tcp:100%,cc=bbr"]
        tsq = "64KiB"
        bql_limit_max = 3000
        queue_sample = "10ms"
        "#,
    ));
    assert_eq!(k.link_rate, Some(Rate::mbit(100)));
    assert_eq!(k.tsq, Some(Bytes(65536)));
    assert_eq!(k.queue_sample, Some(Duration::from_millis(10)));
    k.validate().unwrap();
    let e = toml::from_str::<KnobSpec>("link_rat = \"100mbit\"").unwrap_err();
    assert!(e.to_string().contains("unknown field `link_rat`"), "{e}");
    let e = toml::from_str::<KnobSpec>("\n\nlink_rate = \"100mbps\"").unwrap_err();
    assert!(e.to_string().contains("bytes per second"), "{e}");
    assert!(e.to_string().contains("line 3"), "{e}");
    let e = toml::from_str::<KnobSpec>("qdisc = \"fq_codel,targt=5ms\"").unwrap_err();
    assert!(e.to_string().contains("targt"), "{e}");
}

#[test]
fn merge_takes_the_set_over_the_common_table() {
    let base = knobs("link_rate = \"100mbit\"\nload = [\"tcp\"]");
    let set = knobs("load = []\nbql_limit_max = 3000");
    let m = Knobs::from(merge(&base, &set).unwrap());
    assert_eq!(m.link_rate, Some(Rate::mbit(100)));
    assert_eq!(m.loads(), &[]);
    assert_eq!(m.bql_limit_max, Some(Bytes(3000)));
    assert!(Knobs::default().is_empty());
    assert!(!m.is_empty());
    assert!(
        m.describe().contains("bql_limit_max=3000"),
        "{}",
        m.describe()
    );
}

#[test]
fn merge_precedence_file_then_set_then_command_line() {
    let file = knobs("link_rate = \"100mbit\"\nqdisc = \"pfifo\"\nstress = 2");
    let set = knobs("qdisc = \"fq_codel\"\nstress = 4");
    let cli = Cli::try_parse_from(["t", "--stress", "8", "--busy-poll", "--count", "7"])
        .unwrap()
        .probe;
    let m = merge(&merge(&file, &set).unwrap(), &cli.knobs.into()).unwrap();
    assert_eq!(m.link_rate, Some(Rate::mbit(100)), "file only");
    assert_eq!(
        m.qdisc.as_ref().map(|q| q.kind()),
        Some("fq_codel"),
        "set over file"
    );
    assert_eq!(m.stress, Some(8), "command line over set");
    // Probe options: the command line's count replaces the file's duration.
    let file_run: RunSpec =
        toml::from_str("duration = \"30s\"\nport = 6000\nspin = \"5us\"").unwrap();
    let r = file_run.overridden_by(&cli.run).unwrap();
    assert_eq!((r.probe.count, r.probe.duration), (Some(7), None));
    assert_eq!(r.probe.port, Some(6000));
    assert_eq!(r.pacing.busy_poll, Some(true));
    // The file's spin stays and the one validator refuses the pair.
    assert_eq!(r.pacing.spin, Some(Duration::from_micros(5)));
    let e = validate(&r, &m, &OutputSpec::default()).unwrap_err();
    assert_eq!(e.key, "spin");
}

#[test]
fn ip_version_on_the_command_line_and_in_toml() {
    use crate::testbed::IpVersion;
    assert_eq!(opts(&[]).unwrap().ip, IpVersion::V4);
    let o = opts(&["--ip", "6"]).unwrap();
    assert_eq!(o.ip, IpVersion::V6);
    // The knobs learn the 40-byte header for the probe class's rate.
    assert!(o.knobs.probe.ipv6);
    assert!(!opts(&["--ip", "4"]).unwrap().knobs.probe.ipv6);
    let e = |args: &[&str]| opts(args).unwrap_err().to_string();
    let m = e(&["--ip", "6", "--size", "1472"]);
    assert!(
        m.starts_with("--size 1472 does not fit") && m.contains("1452"),
        "{m}"
    );
    assert!(opts(&["--ip", "6", "--size", "1452"]).is_ok());
    let m = e(&["--ip", "6", "--flow", "port=5070,size=1460"]);
    assert!(m.contains("1460") && m.contains("IPv6"), "{m}");
    assert!(opts(&["--ip", "6", "--reflector", "kernel"]).is_ok());
    assert!(opts(&["--ip", "6", "--reflector", "user"]).is_ok());
    let m = e(&["--ip", "6", "--target", "192.0.2.7"]);
    assert!(m.starts_with("--ip is for testbed runs"), "{m}");
    assert!(Cli::try_parse_from(["t", "--ip", "5"]).is_err());
    // TOML: `ip = 6` or "6"; anything else names the key.
    for v in ["6", "\"6\""] {
        let sc = crate::scenario::Scenario::parse(
            std::path::Path::new("t.toml"),
            &format!("[probe]\nip = {v}\n"),
        )
        .unwrap();
        let cells = sc.cells(std::path::Path::new("/o"));
        assert_eq!(cells[0].run.ip, IpVersion::V6, "ip = {v}");
    }
    let err = crate::scenario::Scenario::parse(std::path::Path::new("t.toml"), "[probe]\nip = 5\n")
        .map(|_| ())
        .unwrap_err();
    assert!(format!("{err:#}").contains("use 4 or 6"), "{err:#}");
}

/// A command line with every option set to a value that is not its
/// default (those that conflict with another are set in the test).
const EVERY_OPTION_SET: &[&str] = &[
    "t",
    "--size",
    "200",
    "--interval",
    "1.234567ms",
    "--duration",
    "1s 100ns",
    "--tos",
    "0xC0",
    "--port",
    "6000",
    "--ip",
    "6",
    "--timestamps",
    "software",
    "--timeout",
    "3s",
    "--tx-if",
    "a",
    "--rx-if",
    "b",
    "--force",
    "--xdp-mode",
    "skb",
    "--xdp-action",
    "pass",
    "--reflector",
    "user",
    "--flow",
    "port=6001,tos=0,size=100,interval=2.5ms",
    "--spin",
    "7us",
    "--bottleneck",
    "router",
    "--link-rate",
    "1.5gbit",
    "--shaper",
    "tbf",
    "--queue-limit",
    "64KiB",
    "--burst",
    "3000",
    "--wire-overhead",
    "4",
    "--qdisc",
    "fq_codel,target=5ms",
    "--missing",
    "skip",
    "--bql-limit-max",
    "3000",
    "--tsq",
    "64KiB",
    "--txqueuelen",
    "10",
    "--tx-ring",
    "64",
    "--gso",
    "off",
    "--device-unsupported",
    "fail",
    "--load",
    "tcp:50mbit,cc=bbr,flows=2",
    "--load",
    "udp:10mbit,size=1000",
    "--load-warmup",
    "2s",
    "--stress",
    "3",
    "--stress-tool",
    "stress-ng",
    "--rt-priority",
    "20",
    "--mlockall",
    "--pin-cpu",
    "1",
    "--cpu-dma-latency",
    "10",
    "--queue-sample",
    "10ms",
    "--forever",
    "--out-rotate",
    "1MiB",
    "--out-keep",
    "3",
    "--report-every",
    "2s",
    "--metrics-listen",
    "127.0.0.1:0",
    "--metrics-histograms",
    "rtt,stages",
    "--metrics-buckets",
    "24",
    "--metrics-token-file",
    "metrics.token",
    "--hdr-log",
    "x.hlog",
    "--target",
    "192.0.2.7:862",
    "--protocol",
    "stamp",
    "--auth-key",
    "key.bin",
];

#[test]
fn every_spec_round_trips_through_merge() {
    // Every option set to a value that is not its default: merging it over
    // an empty spec, or an empty spec over it, must give it back unchanged.
    let cli = Cli::try_parse_from(EVERY_OPTION_SET.iter().copied())
        .unwrap()
        .probe;
    let mut cli = cli;
    // --busy-poll conflicts with --spin and --count with --duration: set
    // them as a file would.
    cli.run.pacing.busy_poll = Some(false);
    cli.run.pacing.no_warm_up = Some(true);
    cli.run.probe.count = Some(12);
    // --targets conflicts with --target.
    cli.run.remote.targets = Some("targets.toml".into());
    assert_eq!(merge(&RunSpec::default(), &cli.run).unwrap(), cli.run);
    assert_eq!(merge(&cli.run, &RunSpec::default()).unwrap(), cli.run);
    let knobs = KnobSpec::from(cli.knobs);
    assert_eq!(merge(&KnobSpec::default(), &knobs).unwrap(), knobs);
    assert_eq!(merge(&knobs, &KnobSpec::default()).unwrap(), knobs);
    // No field left unset: a new option must be added here too.
    for v in [
        serde_json::to_value(&cli.run).unwrap(),
        serde_json::to_value(&knobs).unwrap(),
    ] {
        for (k, v) in v.as_object().unwrap() {
            assert!(!v.is_null(), "{k} is not set in this test");
        }
    }
}

/// A TOML document with one `key = {}`: every option refuses an inline
/// table, so the error says whether the key is known.
fn toml_knows(table: &str, key: &str) -> bool {
    let text = format!("[{table}]\n{key} = {{}}\n");
    let e = crate::scenario::Scenario::parse(std::path::Path::new("t.toml"), &text)
        .map(|_| ())
        .unwrap_err();
    !format!("{e:#}").contains("unknown field")
}

#[test]
fn every_probe_command_option_has_a_toml_key() {
    // Where a scenario cannot take a flag, and why: the scenario names each
    // cell's output files and label itself, and the log level is global.
    const CLI_ONLY: [&str; 6] = ["out", "json", "label", "quiet", "verbose", "help"];
    let cmd = Cli::command();
    let mut checked = 0;
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if CLI_ONLY.contains(&id) || id == "version" {
            continue;
        }
        assert!(
            toml_knows("probe", id) || toml_knows("knobs", id),
            "{} has no TOML key {id:?} in [probe] or [knobs]",
            arg.get_long().unwrap_or(id)
        );
        checked += 1;
    }
    assert!(checked >= 35, "only {checked} options walked");
    // And the check can fail.
    assert!(!toml_knows("probe", "no_such_option"));
    assert!(!toml_knows("knobs", "size"), "a probe option is not a knob");
}

#[test]
fn the_same_limits_on_the_command_line_and_in_toml() {
    use crate::scenario::Scenario;
    let toml_err = |text: &str| {
        format!(
            "{:#}",
            Scenario::parse(std::path::Path::new("s.toml"), text).unwrap_err()
        )
    };
    // Sizes 16..31 were taken by scenario files and refused by the run.
    for size in [16, 31] {
        let e = opts(&["--size", &size.to_string()])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("--size {size} is out of range")),
            "{e}"
        );
        let t = toml_err(&format!("[probe]\ncount = 5\nsizes = [64, {size}]\n"));
        assert!(
            t.starts_with(&format!("s.toml:3:1: probe.sizes: {size} is out of range")),
            "{t}"
        );
        assert!(t.contains(&e["--size ".len()..]), "same words: {t} / {e}");
        let t = toml_err(&format!("[probe]\n\nsize = {size}\n"));
        assert!(t.starts_with("s.toml:3:1: probe.size:"), "{t}");
    }
    // Intervals: the same bounds on both sides.
    assert!(opts(&["--interval", "1us"]).is_ok());
    assert!(
        Scenario::parse(
            std::path::Path::new("s.toml"),
            "[probe]\nintervals = [\"1us\"]\n"
        )
        .is_ok()
    );
    let e = opts(&["--interval", "2h"]).unwrap_err().to_string();
    let t = toml_err("[probe]\nintervals = [\"1ms\", \"2h\"]\n");
    assert!(e.starts_with("--interval 7200s is too long"), "{e}");
    assert!(t.contains("probe.intervals: 7200s is too long"), "{t}");
    // Options that were command line only now work in files, checked alike.
    let t = toml_err("[probe]\nbusy_poll = true\nspin = \"5us\"\n");
    assert!(t.contains("probe.spin"), "{t}");
    let sc = Scenario::parse(
        std::path::Path::new("s.toml"),
        "[probe]\nbusy_poll = true\nreflector = \"user\"\nflows = [\"port=5062\"]\n",
    )
    .unwrap();
    let c = &sc.cells(std::path::Path::new("/o"))[0];
    assert!(c.run.probe.busy_poll);
    assert_eq!(c.run.reflector, Some(crate::ebpf::ReflectorKind::User));
    assert_eq!(c.run.extra_flows.len(), 1);
}

#[test]
fn command_line_overrides_a_scenario_and_is_blamed_by_flag() {
    use crate::scenario::{Overrides, Scenario};
    let text = "[probe]\nsizes = [64, 200]\nduration = \"10s\"\n[knobs]\nlink_rate = \"100mbit\"\n";
    let cli = Cli::try_parse_from(["t", "--count", "5", "--size", "1472", "--qdisc", "pfifo"])
        .unwrap()
        .probe;
    let over = Overrides {
        run: cli.run,
        knobs: cli.knobs.into(),
    };
    let sc = Scenario::parse_with(std::path::Path::new("s.toml"), text, &over).unwrap();
    let cells = sc.cells(std::path::Path::new("/o"));
    assert_eq!(cells.len(), 1, "--size replaces the file's sizes");
    assert_eq!(cells[0].run.probe.size, 1472);
    assert_eq!(
        (cells[0].run.probe.count, cells[0].run.probe.duration),
        (Some(5), None)
    );
    assert_eq!(cells[0].run.knobs.link_rate, Some(Rate::mbit(100)));
    assert_eq!(
        cells[0].run.knobs.qdisc.as_ref().map(|q| q.kind()),
        Some("pfifo")
    );
    let bad = Cli::try_parse_from(["t", "--size", "8"]).unwrap().probe;
    let over = Overrides {
        run: bad.run,
        knobs: bad.knobs.into(),
    };
    let e = format!(
        "{:#}",
        Scenario::parse_with(std::path::Path::new("s.toml"), text, &over).unwrap_err()
    );
    assert!(e.starts_with("--size 8 is out of range"), "{e}");
}

#[test]
fn cli_parses_specs_and_flattens_them_without_clashes() {
    Cli::command().debug_assert();
    let t = Cli::try_parse_from(["t", "--count", "5", "--qdisc", "pfifo", "--gso", "off"]).unwrap();
    assert_eq!(t.probe.run.probe.count, Some(5));
    assert_eq!(t.probe.knobs.gso, Some(false));
    // Unset is None, not a default: that is what lets the file show through.
    let t = Cli::try_parse_from(["t"]).unwrap();
    assert_eq!(t.probe.run, RunSpec::default());
    assert_eq!(KnobSpec::from(t.probe.knobs), KnobSpec::default());
    assert_eq!(t.probe.output, OutputSpec::default());
}

#[test]
fn knob_flags_parse_like_the_toml() {
    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        k: KnobArgs,
    }
    let t = T::try_parse_from([
        "t",
        "--link-rate",
        "100mbit",
        "--queue-limit",
        "20p",
        "--load",
        "tcp:50%",
        "--load",
        "udp:150mbit,size=1470",
        "--qdisc",
        "pfifo,limit=50",
        "--missing",
        "skip",
        "--rt-priority",
        "80",
        "--mlockall",
    ])
    .unwrap();
    assert_eq!(t.k.mlockall, Some(true));
    let k = Knobs::from(KnobSpec::from(t.k)).validate();
    // queue_limit + qdisc conflict is caught.
    assert_eq!(k.unwrap_err().key, "queue_limit");
    let t = T::try_parse_from(["t", "--link-rate", "100mbps"]);
    assert!(t.is_err());
    let t = T::try_parse_from(["t", "--link-rate", "100mbit", "--load", "tcp:50%"]).unwrap();
    let k = Knobs::from(KnobSpec::from(t.k));
    k.validate().unwrap();
    assert_eq!(k.loads().len(), 1);
    assert_eq!(k.shaping().unwrap().rate, Rate::mbit(100));
    // The same words in TOML give the same knobs.
    let from_toml = Knobs::from(knobs("link_rate = \"100mbit\"\nload = [\"tcp:50%\"]\n"));
    assert_eq!(from_toml, k);
}

#[test]
fn flow_specs_read_back_as_written() {
    for s in [
        "port=5062",
        "port=5062,tos=192,size=1472,interval=100us",
        "port=7,interval=1s 100ns",
    ] {
        let f = FlowSpec::parse(s).unwrap();
        assert_eq!(FlowSpec::parse(&f.to_string()).unwrap(), f, "{s}");
    }
}

mod never_panic {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn flow_and_tos_parsers_take_any_string(s in "\\PC*") {
            let _ = super::FlowSpec::parse(&s);
            let _ = crate::model::units::parse_u8_maybe_hex(&s);
        }

        #[test]
        fn flow_specs_of_the_right_shape_read_back(
            port in 1u16..,
            tos in proptest::option::of(any::<u8>()),
            size in proptest::option::of(0usize..100_000),
            interval_ns in proptest::option::of(1u64..10_000_000_000_000),
        ) {
            let f = super::FlowSpec {
                port,
                tos,
                size,
                interval: interval_ns.map(std::time::Duration::from_nanos),
            };
            prop_assert_eq!(super::FlowSpec::parse(&f.to_string()), Ok(f));
        }

        #[test]
        fn a_probe_table_of_any_value_is_an_error_or_a_plan(
            key in "(size|interval|count|duration|tos|port|timeout|spin|busy_poll|no_warm_up|flows|xdp_mode)",
            value in "(-?[0-9]{1,25}(\\.[0-9]{1,5})?|\"[ -~]{0,20}\"|true|\\[\\]|\\[\"port=[0-9]{1,6}\"\\])",
        ) {
            let text = format!("[probe]\n{key} = {value}\n");
            let _ = crate::scenario::Scenario::parse(std::path::Path::new("p.toml"), &text);
        }
    }
}

/// The kernel refuses names of 16 bytes or more with ERANGE, which read
/// "Numerical result out of range" twice; validation says it first.
#[test]
fn interface_names_over_15_bytes_are_refused_in_one_line() {
    let long = "enp0s31f6abcdefghij"; // 19 bytes
    let e = opts(&["--tx-if", long, "--rx-if", "eth1"])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "--tx-if {long} is 19 bytes: Linux interface names are at most 15 bytes \
             (IFNAMSIZ - 1); check the name with `ip link`"
        )
    );
    let e = opts(&["--tx-if", "eth0", "--rx-if", "a/b"])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--rx-if a/b is not an interface name"), "{e}");
    let fifteen = "abcdefghijklmno";
    assert!(bad_interface_name(fifteen).is_none());
    assert!(bad_interface_name(&format!("{fifteen}p")).is_some());
    // Bytes, not characters: 8 two-byte characters are 16 bytes.
    assert!(bad_interface_name("éééééééé").is_some());
    assert!(bad_interface_name("").is_some() && bad_interface_name("..").is_some());
}

#[test]
fn remote_stamp_and_auth_rules_are_the_validators() {
    let err = |args: &[&str]| opts(args).unwrap_err().to_string();
    for (args, line) in [
        (
            &["--auth-key", "k"][..],
            "--auth-key is STAMP's authenticated mode: add --protocol stamp",
        ),
        (
            &[
                "--protocol",
                "stamp",
                "--auth-key",
                "k",
                "--size",
                "112",
                "--reflector",
                "kernel",
            ][..],
            "--reflector kernel answers unauthenticated STAMP only: drop --auth-key or use \
             --reflector user",
        ),
        (
            &["--protocol", "stamp", "--flow", "port=5070"][..],
            "--flow works with the rtprobe protocol only: drop --flow or --protocol stamp",
        ),
        (
            &["--protocol", "stamp", "--size", "40"][..],
            "--size 40 is too small for stamp probes: use at least 44 bytes",
        ),
        (
            &["--protocol", "stamp", "--auth-key", "k", "--size", "100"][..],
            "--size 100 is too small for stamp probes: use at least 112 bytes",
        ),
        (
            &["--target", "192.0.2.7", "--tx-if", "a", "--rx-if", "b"][..],
            "--target probes a remote reflector: --tx-if/--rx-if build a testbed; use one or \
             the other",
        ),
        (
            &["--target", "192.0.2.7", "--flow", "port=5070"][..],
            "--flow is for testbed runs; with --target run one rtprobe per flow",
        ),
        (
            &["--target", "192.0.2.7", "--reflector", "user"][..],
            "--reflector chooses the testbed's reflector; with --target the remote host's answers",
        ),
        (
            &["--target", "192.0.2.7", "--xdp-mode", "off"][..],
            "--xdp-mode sets the testbed's router; with --target there is none",
        ),
        (
            &["--target", "192.0.2.7", "--timestamps", "hardware"][..],
            "--timestamps hardware is for testbed runs; with --target use software or auto",
        ),
        (
            &["--target", "a", "--target", "b", "--hdr-log", "x.hlog"][..],
            "--hdr-log writes one target's histograms; with several targets use --metrics-listen",
        ),
        (
            &["--target", "192.0.2.7", "--link-rate", "10mbit"][..],
            "--target takes only the sender's real-time knobs",
        ),
    ] {
        let e = err(args);
        assert!(e.starts_with(line), "{args:?}: {e}");
    }
    // What a remote run may use; the key file is read at run time.
    let o = opts(&[
        "--target",
        "192.0.2.7",
        "--protocol",
        "stamp",
        "--auth-key",
        "k",
        "--size",
        "112",
        "--rt-priority",
        "50",
    ]);
    assert!(o.is_ok(), "{o:?}");
    assert!(opts(&["--protocol", "stamp", "--size", "44"]).is_ok());
}

#[test]
fn several_targets_default_to_the_fleet_series_budget() {
    use crate::options::continuous::MetricsSeries;
    let series = |args: &[&str]| opts(args).unwrap().continuous.metrics_series;
    let listen = ["--metrics-listen", "127.0.0.1:0"];
    let one = [&["--target", "192.0.2.7"][..], &listen].concat();
    assert_eq!(
        series(&one),
        MetricsSeries::default(),
        "one target: every histogram"
    );
    let two = [
        &["--target", "192.0.2.7", "--target", "192.0.2.8"][..],
        &listen,
    ]
    .concat();
    assert_eq!(series(&two), MetricsSeries::for_fleet());
    assert!(!series(&two).stages);
    // Asked for, the stages come back; the bucket count is kept either way.
    let asked = [
        &two[..],
        &[
            "--metrics-histograms",
            "rtt,stages",
            "--metrics-buckets",
            "24",
        ],
    ]
    .concat();
    let s = series(&asked);
    assert!(
        s.rtt && s.stages && !s.one_way && s.buckets.count() == 24,
        "{s:?}"
    );
    let fewer = [&two[..], &["--metrics-buckets", "24"]].concat();
    assert_eq!(series(&fewer).buckets.count(), 24);
    assert!(!series(&fewer).stages);
}
