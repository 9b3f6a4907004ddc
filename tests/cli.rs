//! CLI behaviour that needs no root: help, bad flags, not-root errors.

mod common;

use std::process::Command;

use common::bin;

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(bin())
        .args(args)
        .output()
        .expect("run rtprobe");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn help_lists_the_main_flags() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for f in [
        "--xdp-mode",
        "--size",
        "--interval",
        "--count",
        "--duration",
        "--tos",
        "--port",
        "--out",
        "--json",
        "--tx-if",
        "--rx-if",
        "--busy-poll",
        "--no-warm-up",
        "plot",
    ] {
        assert!(out.contains(f), "--help does not mention {f}");
    }
}

#[test]
fn bad_flags_give_one_line_errors() {
    for (args, needle) in [
        (&["--xdp-mode", "turbo"][..], "turbo"),
        (&["--interval", "soon"][..], "invalid duration"),
        (&["--tos", "0x1ff"][..], "invalid TOS"),
        (&["--size", "abc"][..], "abc"),
        // Too large for the clock: an error, not a panic or a wrapped value.
        (
            &["--interval", "99999999999999999999.5s", "--count", "1"][..],
            "too large: at most 100 years",
        ),
        (
            &["--duration", "300years"][..],
            "too large: at most 100 years",
        ),
        (&["--timeout=-1s"][..], "invalid duration"),
        (
            &["--cpu-dma-latency", "low"][..],
            "expected microseconds (0, 10us) or off",
        ),
        // A busy-polling sender never sleeps, so it has no wake-up to warm.
        (&["--busy-poll", "--no-warm-up"][..], "cannot be used with"),
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"));
    }
}

#[test]
fn invalid_values_fail_before_touching_the_system() {
    for (args, needle) in [
        (&["--size", "4"][..], "--size 4 is out of range"),
        (&["--size", "9000"][..], "--size 9000 is out of range"),
        (&["--count", "0"][..], "--count 0"),
        (
            &["--out", "/nonexistent-rtprobe-dir/o.csv"][..],
            "does not exist",
        ),
        (
            &["--tx-if", "a", "--rx-if", "a"][..],
            "--rx-if must name another",
        ),
        (
            &["--flow", "port=5061"][..],
            "--flow port=5061 is already used",
        ),
        (
            &["--queue-sample", "10ms"][..],
            "--queue-sample has no queue",
        ),
    ] {
        let (code, _, err) = run(args);
        // A value the validator refuses is a usage error, as clap's: 2.
        assert_eq!(code, 2, "{args:?}");
        assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
        assert!(
            err.starts_with("Error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn not_root_is_a_clear_error() {
    // As root, drop privileges with setpriv (util-linux) to check the message.
    let me_root = nix::unistd::geteuid().is_root();
    let o = if me_root {
        if Command::new("setpriv").arg("--version").output().is_err() {
            eprintln!("SKIPPED not_root_is_a_clear_error: setpriv (util-linux) missing");
            return;
        }
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(bin())
            .args(["--count", "1", "--out", "/tmp/rtprobe-notroot.csv"])
            .output()
            .unwrap()
    } else {
        Command::new(bin())
            .args(["--count", "1", "--out", "/tmp/rtprobe-notroot.csv"])
            .output()
            .unwrap()
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("needs root") && err.contains("sudo"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn completions_print_a_script_and_reject_unknown_shells() {
    for (shell, needle) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef rtprobe"),
        ("fish", "complete -c rtprobe"),
    ] {
        let (code, out, err) = run(&["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(out.contains(needle), "{shell}: {out}");
        assert!(out.contains("bench-forward"), "{shell}");
    }
    let (code, _, err) = run(&["completions", "tcsh"]);
    assert_eq!(code, 2);
    assert!(err.contains("tcsh") && err.contains("bash"), "{err}");
}

#[test]
fn man_writes_one_page_per_visible_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man");
    let (code, stdout, err) = run(&["man", "--out-dir", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let listed: Vec<&str> = stdout.lines().collect();
    assert!(listed[0].ends_with("/rtprobe.1"), "{stdout}");
    assert!(
        listed.iter().any(|l| l.ends_with("/rtprobe-plot.1")),
        "{stdout}"
    );
    for l in listed {
        assert!(std::path::Path::new(l).is_file(), "{l}");
    }
    let (_, help, _) = run(&["--help"]);
    assert!(
        !help
            .lines()
            .any(|l| l.starts_with("  man ") || l.starts_with("  testbed ")),
        "hidden subcommands listed: {help}"
    );
}

/// `rtprobe host` names this machine as every run's summary does: the
/// kernel it runs, its CPUs, and "none" for an absent cpuidle.
#[test]
fn host_prints_the_facts_a_summary_names() {
    let (code, out, err) = run(&["host", "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(j["kernel"], release.trim());
    let online = std::thread::available_parallelism().unwrap().get() as u64;
    assert!(j["cores"].as_u64().is_some_and(|c| c >= online), "{j}");
    let idle = std::path::Path::new("/sys/devices/system/cpu/cpuidle/current_driver");
    if !idle.exists() {
        assert_eq!(j["cpuidle_driver"], "none");
    }
    assert!(
        j["preemption_source"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    let (code, line, _) = run(&["host"]);
    assert_eq!(code, 0);
    assert_eq!(line.lines().count(), 1);
    assert!(
        line.contains(&format!("kernel {}", release.trim())),
        "{line}"
    );
}

#[test]
fn compare_prints_verdicts_and_fails_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, shift: i64| {
        let mut t = String::from("seq,flow,one_way_ns,rtt_ns\n");
        for i in 0..2000i64 {
            let v = 30_000 + (i * 7919) % 40_000 + shift;
            t.push_str(&format!("{i},0,{v},{}\n", 2 * v));
        }
        let p = dir.path().join(name);
        std::fs::write(&p, t).unwrap();
        p.to_string_lossy().into_owned()
    };
    let base = write("base.csv", 0);
    let fast = write("fast.csv", -20_000);
    let json = dir.path().join("c.json");
    let (code, out, err) = run(&[
        "compare",
        &base,
        &fast,
        "--resamples",
        "200",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("p50 lower by 20 µs, 95 % CI"), "{out}");
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["runs"][0]["percentiles"][0]["significant"], true);

    let (code, _, err) = run(&["compare", &base]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["compare", &base, &fast, "--resamples", "5"]);
    assert_eq!(code, 2, "{err}");
    let missing = dir.path().join("missing.csv");
    let (code, _, err) = run(&["compare", &base, missing.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("Error: ") && err.contains("no such file"),
        "{err}"
    );
}

#[test]
fn durations_beyond_the_clock_are_one_line_usage_errors() {
    for (args, value) in [
        (
            &["--interval", "99999999999999999999.5s", "--count", "1"][..],
            "99999999999999999999.5s",
        ),
        (&["--duration", "300years"][..], "300years"),
        (&["--timeout", "101years"][..], "101years"),
        (&["--spin", "1e3s"][..], "1e3s"),
    ] {
        let (code, out, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: nothing runs: {out}");
        assert!(!err.contains("panicked"), "{err}");
        // One error line (clap adds its "For more information" hint).
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 2, "{args:?}: {err}");
        assert!(
            lines[0].starts_with("error: invalid value") && lines[0].contains(value),
            "{args:?}: {err}"
        );
        assert!(lines[1].contains("--help"), "{err}");
    }
}

#[test]
fn scenario_files_take_every_option_and_the_command_line_overrides_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("opts.toml");
    // Options that used to be command line only: busy_poll, reflector,
    // extra flows, xdp_action, timestamps.
    std::fs::write(
        &file,
        "[probe]\nsizes = [64, 200]\ncount = 20\nbusy_poll = true\nreflector = \"user\"\n\
         xdp_action = \"pass\"\ntimestamps = \"software\"\nflows = [\"port=5070,size=100\"]\n\
         [set.base]\n[set.fifo]\nqdisc = \"pfifo,limit=20\"\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let (code, out, err) = run(&["run", "--check", f]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("4 cells = 2 sizes x 1 intervals"), "{out}");
    let (code, out, err) = run(&["run", "--check", f, "--size", "1472", "--stress", "2"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2 cells = 1 sizes"), "{out}");
    assert!(
        out.contains("stress=2"),
        "the command line's knob in every set: {out}"
    );
    // A bad override is blamed on the flag, a bad file value on key and line.
    let (code, _, err) = run(&["run", "--check", f, "--size", "20"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--size 20 is out of range"), "{err}");
    std::fs::write(&file, "[probe]\ncount = 5\n\nsizes = [64, 20]\n").unwrap();
    let (code, _, err) = run(&["run", "--check", f]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("opts.toml:4:1: probe.sizes: 20 is out of range"),
        "{err}"
    );
}

#[test]
fn continuous_options_fail_with_one_line_before_touching_the_system() {
    // Out-of-range values are usage errors, like a flag that does not parse: exit 2.
    for (args, code, needle) in [
        (
            &["--out-rotate", "lots"][..],
            2,
            "invalid rotation \"lots\"",
        ),
        (&["--out-keep", "3"][..], 2, "--out-rotate"),
        (&["--forever", "--count", "5"][..], 2, "cannot be used with"),
        (
            &["--metrics-listen", "localhost"][..],
            2,
            "invalid socket address",
        ),
        (
            &["--out-rotate", "1KiB"][..],
            2,
            "--out-rotate 1KiB is too small",
        ),
        (
            &["--out-rotate", "1h", "--out-keep", "0"][..],
            2,
            "--out-keep 0",
        ),
        (&["--report-every", "1ms"][..], 2, "at least 100ms"),
        (&["--forever", "--duration", "5s"][..], 2, "drop --duration"),
        (
            &["--hdr-log", "/nonexistent-rtprobe-dir/x.hlog"][..],
            2,
            "does not exist",
        ),
    ] {
        let (got, _, err) = run(args);
        assert_eq!(got, code, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"));
    }
}

#[test]
fn reflect_refuses_a_port_already_in_use() {
    // A port that was free a moment ago, on loopback (no root needed).
    for host in ["127.0.0.1", "[::1]"] {
        let probe = std::net::UdpSocket::bind(format!("{host}:0")).unwrap();
        let addr = probe.local_addr().unwrap().to_string();
        drop(probe);
        let mut first = Command::new(bin())
            .args(["reflect", "--listen", &addr, "--duration", "20s"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Until the first one answers on the port (it binds before it prints).
        let mut taken = false;
        for _ in 0..100 {
            if std::net::UdpSocket::bind(&addr).is_err() {
                taken = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let second = run(&["reflect", "--listen", &addr, "--duration", "1s"]);
        let _ = first.kill();
        let out = first.wait_with_output().unwrap();
        assert!(taken, "the first reflector never bound {addr}: {out:?}");
        let (code, stdout, stderr) = second;
        assert_ne!(code, 0, "a second reflector bound {addr}: {stdout}{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&addr), "{stderr}");
        assert!(stderr.contains("already in use"), "{stderr}");
        assert!(stderr.contains("--listen"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// Bad `rtprobe reflect` options fail in one line before anything is bound
/// or served: `--json /` (once only found at exit, losing every counter)
/// and a STAMP-only flag, each with `--metrics-listen`.
#[test]
fn reflect_checks_options_and_the_json_path_before_serving() {
    let free = || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().to_string()
    };
    let cases: [(&[&str], &str); 4] = [
        (&["--json", "/"], "is a directory"),
        (&["--json", "/no/such/dir/r.json"], "does not exist"),
        (&["--stateless"], "--protocol stamp"),
        (
            &["--peers", "/no/such/peers.toml"],
            "--peers /no/such/peers.toml",
        ),
    ];
    for (extra, says) in cases {
        let (listen, metrics) = (free(), free());
        let mut args = vec![
            "reflect",
            "--listen",
            &listen,
            "--metrics-listen",
            &metrics,
            "--duration",
            "2s",
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&args);
        assert_ne!(code, 0, "{extra:?}: {stdout}{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{extra:?}: {stderr}");
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
        assert!(!stderr.contains("serving metrics"), "{extra:?}: {stderr}");
        assert!(!stderr.contains("answering"), "{extra:?}: {stderr}");
    }
    // A known peer that is no address or prefix: the parser says what is.
    let (code, _, stderr) = run(&["reflect", "--peer", "db-1", "--duration", "1s"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("e.g. 192.0.2.0/24"), "{stderr}");
}

#[test]
fn bench_forward_config_errors_name_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sweep.toml");
    std::fs::write(&file, "step = \"2s\"\nperf_stats = true\n").unwrap();
    let f = file.to_str().unwrap();
    let (code, _, err) = run(&["bench-forward", "--config", f]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("sweep.toml:2:1: perf_stats: unknown field"),
        "{err}"
    );
    // A bad value in the file is refused before anything runs; the same
    // key given on the command line wins over the file.
    std::fs::write(&file, "modes = [\"native\"]\nwork = [0]\n").unwrap();
    let (code, _, err) = run(&["bench-forward", "--config", f]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--work 0 is out of range"), "{err}");
    let (code, _, err) = run(&[
        "bench-forward",
        "--config",
        f,
        "--work",
        "1",
        "--step",
        "1ms",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--step 1ms is too short"), "{err}");
    let (code, _, err) = run(&["bench-forward", "--config", "/nonexistent/sweep.toml"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("check the path"), "{err}");
}

#[test]
fn plot_draws_a_bench_forward_report() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("thesis.json");
    let step = |mode: &str, work: Option<u32>, size: u32, pps: f64| {
        serde_json::json!({"mode": mode, "work": work, "size": size, "load_pct": 100,
                           "forwarded_pps": pps})
    };
    let bounce = |hook: &str, queues: u32, pps: f64| {
        serde_json::json!({"hook": hook, "queues": queues, "size": 64, "bounced_pps": pps,
                           "bounced_pps_per_core": pps * 1.2})
    };
    let report = serde_json::json!({
        "machine": {"cpus": 2, "cpu_model": "Test CPU", "kernel": "6.18", "loadavg_at_start": 2.5},
        "testbed_ids": ["t1"],
        "rt_priority": 50,
        "steps": [step("off", None, 64, 3e5), step("native", None, 64, 7e5),
                  step("native", Some(1), 64, 6e5), step("native", Some(12800), 64, 4e4)],
        "bounce": [bounce("native", 1, 2e6), bounce("native", 2, 2.9e6),
                   bounce("afxdp", 1, 4e5), bounce("afxdp", 2, 5e5)],
        "perf_note": null
    });
    std::fs::write(&json, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    let out = dir.path().join("fig");
    let (code, stdout, err) = run(&[
        "plot",
        json.to_str().unwrap(),
        "--format",
        "svg,png",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let svg = out.join("thesis-forwarding.svg");
    assert!(stdout.contains(svg.to_str().unwrap()), "{stdout}");
    assert!(out.join("thesis-forwarding.png").is_file(), "{stdout}");
    let text = std::fs::read_to_string(&svg).unwrap();
    for want in [
        "Memory accesses per packet (log scale)",
        "12800",
        "AF_XDP (user space)",
        "load average 2.50",
    ] {
        assert!(text.contains(want), "{want} missing from the figure");
    }
    // A report is drawn on its own, not mixed with probe CSVs.
    let csv = dir.path().join("x.csv");
    std::fs::write(&csv, "seq\n").unwrap();
    let (code, _, err) = run(&["plot", json.to_str().unwrap(), csv.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("on its own"), "{err}");
}

/// Remote, STAMP and auth rules are the validator's: `run --check` refuses
/// a scenario whose cells could not run, naming the key, its line and the
/// cell, before anything is touched (no root needed).
#[test]
fn run_check_refuses_cells_that_break_the_remote_stamp_and_auth_rules() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stamp.toml");
    let f = file.to_str().unwrap();
    for (toml, says) in [
        (
            "[probe]\ncount = 5\nsize = 112\nprotocol = \"stamp\"\nauth_key = \"k.key\"\n\
             reflector = \"kernel\"\n",
            "stamp.toml:6:1: probe.reflector: kernel answers unauthenticated STAMP only: drop \
             --auth-key or use --reflector user (cell s112-i1ms-off-default)",
        ),
        (
            "[probe]\ncount = 5\nprotocol = \"stamp\"\nflows = [\"port=5070\"]\n\
             [set.base]\n[set.fifo]\nqdisc = \"pfifo,limit=20\"\n",
            "stamp.toml:4:1: probe.flows: works with the rtprobe protocol only: drop --flow or \
             --protocol stamp (cell s64-i1ms-off-base)",
        ),
        (
            "[probe]\ncount = 5\nauth_key = \"k.key\"\n",
            "stamp.toml:3:1: probe.auth_key: is STAMP's authenticated mode: add --protocol stamp",
        ),
        (
            "[probe]\ncount = 5\nprotocol = \"stamp\"\nsizes = [64, 40]\n",
            "stamp.toml:4:1: probe.sizes: 40 is too small for stamp probes: use at least 44 \
             bytes (cell s40-i1ms-off-default)",
        ),
        (
            "[probe]\ncount = 5\ntarget = \"192.0.2.7\"\nxdp_modes = [\"auto\"]\n\
             [set.base]\n[set.shaped]\nlink_rate = \"10mbit\"\n",
            "probe.target: takes only the sender's real-time knobs (--rt-priority, --mlockall, \
             --pin-cpu, --cpu-dma-latency); the other knobs change a testbed's interfaces \
             (cell s64-i1ms-auto-shaped)",
        ),
    ] {
        std::fs::write(&file, toml).unwrap();
        let (code, out, err) = run(&["run", "--check", f]);
        eprintln!("exit {code}: {}", err.trim());
        assert_eq!(code, 1, "{toml}: {out}{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{toml}: {err}");
        assert!(out.is_empty(), "no plan printed: {out}");
    }
    // The command line's flag over a valid file: blamed on the flag.
    std::fs::write(&file, "[probe]\ncount = 5\nprotocol = \"stamp\"\n").unwrap();
    let (code, out, err) = run(&["run", "--check", f]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("OK"), "{out}");
    let (code, _, err) = run(&["run", "--check", f, "--flow", "port=5070"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "--flow works with the rtprobe protocol only: drop --flow or --protocol stamp \
             (on the command line)"
        ),
        "{err}"
    );
}

/// The probe command refuses the same combinations as a usage error (exit
/// 2) before it asks for root or touches anything.
#[test]
fn probe_refuses_remote_stamp_and_auth_combinations_as_usage_errors() {
    for (args, says) in [
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
            "Error: --reflector kernel answers unauthenticated STAMP only",
        ),
        (
            &["--protocol", "stamp", "--flow", "port=5070"][..],
            "Error: --flow works with the rtprobe protocol only",
        ),
        (
            &["--target", "192.0.2.7", "--tx-if", "a", "--rx-if", "b"][..],
            "Error: --target probes a remote reflector",
        ),
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.starts_with(says), "{args:?}: {err}");
    }
}

#[test]
fn targets_writes_every_peers_file_and_the_file_sd_list_from_one_inventory() {
    let dir = tempfile::tempdir().unwrap();
    let inv = dir.path().join("fleet.toml");
    let mut text = String::from("[defaults]\ninterval = \"100ms\"\nport = 8620\n");
    for i in 1..=4 {
        text += &format!(
            "\n[[host]]\nname = \"h{i}\"\naddress = \"10.79.0.{i}\"\nmetrics = \"10.81.0.{i}:9464\"\nlabels = {{ rack = \"r{}\" }}\n",
            (i + 1) / 2
        );
    }
    std::fs::write(&inv, text).unwrap();
    let inv = inv.to_str().unwrap();
    let out = dir.path().join("peers");
    let sd = dir.path().join("sd.yml");
    let (code, stdout, stderr) = run(&[
        "targets",
        inv,
        "--out-dir",
        out.to_str().unwrap(),
        "--prometheus-sd",
        sd.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout.lines().count(),
        5,
        "the four peers files and the list: {stdout}"
    );
    for i in 1..=4 {
        let file = std::fs::read_to_string(out.join(format!("h{i}.toml"))).unwrap();
        // The same text as --host prints, naming the three others.
        let (code, printed, _) = run(&["targets", inv, "--host", &format!("h{i}")]);
        assert_eq!((code, &printed), (0, &file));
        let names: Vec<&str> = file.lines().filter(|l| l.starts_with("name = ")).collect();
        assert_eq!(names.len(), 3, "{file}");
        assert!(!file.contains(&format!("name = \"h{i}\"")), "{file}");
        assert!(file.contains("target_rack = \"r"), "{file}");
    }
    let sd: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&sd).unwrap()).unwrap();
    assert_eq!(sd[2]["targets"][0], "10.81.0.3:9464");
    assert_eq!(sd[2]["labels"]["host"], "h3");
    assert_eq!(sd[2]["labels"]["rack"], "r2");

    for (args, needle) in [
        (
            &["targets", inv][..],
            "required arguments were not provided",
        ),
        (
            &["targets", inv, "--host", "h9"][..],
            "no [[host]] named \"h9\": give one of h1, h2, h3, h4",
        ),
        (
            &["targets", "/nonexistent/fleet.toml", "--host", "h1"][..],
            "/nonexistent/fleet.toml",
        ),
        (
            &["targets", inv, "--host", "h1", "--out-dir", "x"][..],
            "cannot be used with",
        ),
    ] {
        let (code, _, err) = run(args);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
