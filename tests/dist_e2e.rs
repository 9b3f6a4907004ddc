//! The Debian package of `cargo xtask dist`: it installs with dpkg, the
//! installed binary runs, the systemd units pass `systemd-analyze verify`,
//! and `dpkg --purge` leaves nothing behind. `cargo xtask test` builds the
//! package first and passes its path in `RTPROBE_DEB`.
//!
//! Also (no root): the Kubernetes example asks for the same capabilities as
//! the systemd units.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use common::is_root;

const PACKAGE: &str = "rtprobe";
const UNITS: [&str; 2] = ["rtprobe-reflect.service", "rtprobe-mesh.service"];
const CONFFILES: [&str; 2] = ["/etc/default/rtprobe", "/etc/rtprobe/targets.toml"];

fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn run(program: &str, args: &[&str]) -> (bool, String) {
    let o = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

fn run_ok(program: &str, args: &[&str]) -> String {
    let (ok, text) = run(program, args);
    assert!(ok, "{program} {args:?} failed: {text}");
    text
}

/// dpkg's view: "install ok installed", "deinstall ok config-files"... or
/// None when it knows nothing of the package.
fn package_status() -> Option<String> {
    let (ok, text) = run("dpkg-query", &["-W", "-f=${Status}", PACKAGE]);
    ok.then(|| text.trim().to_string())
        .filter(|s| !s.contains("not-installed"))
}

/// The paths the .deb holds that are rtprobe's own: every file, and the
/// directories named after it (/etc/rtprobe, /usr/share/doc/rtprobe), not
/// the ones other packages share (/usr/bin...). Also how many paths in all.
fn deb_contents(deb: &Path) -> (Vec<PathBuf>, usize) {
    let list = run_ok("dpkg-deb", &["--contents", deb.to_str().unwrap()]);
    let paths: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.'))
        .filter(|p| p.len() > 1)
        .collect();
    let own = paths
        .iter()
        .filter(|p| !p.ends_with('/') || p.contains("rtprobe"))
        .map(PathBuf::from)
        .collect();
    (own, paths.len())
}

/// Purges the package on drop, so a failing test leaves the host as it was.
struct Purge;
impl Drop for Purge {
    fn drop(&mut self) {
        if package_status().is_some() {
            let _ = run("dpkg", &["--purge", PACKAGE]);
        }
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn deb_installs_runs_verifies_and_purges_cleanly() {
    if !is_root("deb_installs_runs_verifies_and_purges_cleanly") {
        return;
    }
    let Some(deb) = std::env::var_os("RTPROBE_DEB").map(PathBuf::from) else {
        let why = "RTPROBE_DEB is not set: `cargo xtask test` builds the package \
                   (cargo xtask dist) and sets it";
        assert!(!under_ci(), "{why}");
        println!("SKIPPED: deb_installs_runs_verifies_and_purges_cleanly: {why}");
        return;
    };
    assert!(deb.is_file(), "RTPROBE_DEB={} is no file", deb.display());
    let (files, all_paths) = deb_contents(&deb);
    assert!(
        files.iter().any(|f| f == Path::new("/usr/bin/rtprobe")),
        "no /usr/bin/rtprobe in {files:?}"
    );
    // The host must not have an rtprobe of its own: the test would replace
    // it and then purge it.
    assert_eq!(
        package_status(),
        None,
        "a package {PACKAGE} is already known to dpkg on this host: this test installs and \
         purges its own, so remove that one first (dpkg --purge {PACKAGE})"
    );
    let present: Vec<_> = files.iter().filter(|p| p.exists()).collect();
    assert!(
        present.is_empty(),
        "files the package would install already exist (not from dpkg): {present:?}; \
         remove them or run the test on another machine"
    );
    let _purge = Purge;

    let t = Instant::now();
    run_ok("dpkg", &["--install", deb.to_str().unwrap()]);
    let install_ms = t.elapsed().as_millis();
    assert_eq!(package_status().as_deref(), Some("install ok installed"));
    check_installed(&files);

    let t = Instant::now();
    run_ok("dpkg", &["--purge", PACKAGE]);
    let purge_ms = t.elapsed().as_millis();
    assert_eq!(package_status(), None, "dpkg still knows {PACKAGE}");
    let left: Vec<_> = files.iter().filter(|p| p.exists()).collect();
    assert!(left.is_empty(), "left after dpkg --purge: {left:?}");
    assert!(!Path::new("/etc/rtprobe").exists(), "/etc/rtprobe left");
    // The maintainer scripts' deb-systemd-helper masks the units on remove
    // and must unmask and forget them on purge.
    let state: Vec<PathBuf> = UNITS
        .iter()
        .flat_map(|u| {
            [
                Path::new("/etc/systemd/system").join(u),
                Path::new("/var/lib/systemd/deb-systemd-helper-enabled").join(u),
                Path::new("/var/lib/systemd/deb-systemd-helper-masked").join(u),
            ]
        })
        .filter(|p| p.symlink_metadata().is_ok())
        .collect();
    assert!(
        state.is_empty(),
        "systemd state left after purge: {state:?}"
    );
    let size_kib = std::fs::metadata(&deb).unwrap().len() / 1024;
    eprintln!(
        "deb: {} ({size_kib} KiB, {} paths, {} of them rtprobe's); dpkg --install {install_ms} ms, \
         --purge {purge_ms} ms; nothing left",
        deb.display(),
        all_paths,
        files.len()
    );
}

/// What the installed package must provide, checked from the host's paths.
fn check_installed(files: &[PathBuf]) {
    let missing: Vec<_> = files.iter().filter(|p| !p.exists()).collect();
    assert!(missing.is_empty(), "not installed: {missing:?}");
    let version = run_ok("/usr/bin/rtprobe", &["--version"]);
    assert!(
        version.starts_with(&format!("rtprobe {}", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    let help = run_ok("/usr/bin/rtprobe", &["reflect", "--help"]);
    assert!(help.contains("--kernel"), "{help}");
    for f in [
        "/usr/share/man/man1/rtprobe.1.gz",
        "/usr/share/man/man1/rtprobe-reflect.1.gz",
        "/usr/share/bash-completion/completions/rtprobe",
        "/usr/share/zsh/vendor-completions/_rtprobe",
        "/usr/share/fish/vendor_completions.d/rtprobe.fish",
        "/usr/share/doc/rtprobe/examples/rtprobe-reflect-kernel.conf",
        "/usr/share/doc/rtprobe/RUNBOOK.md",
        "/usr/share/doc/rtprobe/FLEET.md",
        "/usr/share/rtprobe/prometheus/rules/rtprobe-alerts.yml",
        "/usr/share/rtprobe/alertmanager/alertmanager.yml",
        "/usr/share/rtprobe/grafana/rtprobe-fleet.json",
    ] {
        assert!(Path::new(f).is_file(), "{f} not installed");
    }
    let conffiles = run_ok("dpkg-query", &["-W", "-f=${Conffiles}", PACKAGE]);
    for c in CONFFILES {
        assert!(conffiles.contains(c), "{c} is not a conffile: {conffiles}");
    }
    // The eBPF objects are inside the binary: no other file carries them.
    let bin = std::fs::read("/usr/bin/rtprobe").unwrap();
    let elf_objects = bin.windows(4).filter(|w| w == b"\x7fELF").count();
    assert!(
        elf_objects >= 2,
        "no embedded eBPF object in /usr/bin/rtprobe"
    );
    let units: Vec<String> = UNITS
        .iter()
        .map(|u| unit_path(u).display().to_string())
        .collect();
    let mut args = vec!["verify"];
    args.extend(units.iter().map(String::as_str));
    // verify also runs `man` for each Documentation=man:... page.
    let (ok, text) = run("systemd-analyze", &args);
    let ours: Vec<&str> = text.lines().filter(|l| l.contains("rtprobe")).collect();
    assert!(ok && ours.is_empty(), "systemd-analyze verify: {text}");
    for u in &units {
        eprintln!("{}", exposure(u, None));
    }
    check_kernel_drop_in();
    check_man_pages_name_installed_files();
    check_installed_monitoring();
}

/// The paths the installed man pages name in FILES and SEE ALSO
/// (`\fI/path\fR`) are installed: the docs they point at included.
fn check_man_pages_name_installed_files() {
    let mut named = Vec::new();
    for e in std::fs::read_dir("/usr/share/man/man1").unwrap() {
        let page = e.unwrap().path();
        let file = page.file_name().unwrap().to_string_lossy().to_string();
        if !file.starts_with("rtprobe") {
            continue;
        }
        let roff = run_ok("zcat", &[page.to_str().unwrap()]);
        assert!(roff.contains(".SH \"SEE ALSO\""), "{file} has no SEE ALSO");
        for chunk in roff.split("\\fI/").skip(1) {
            let path = chunk.split("\\fR").next().unwrap().replace("\\-", "-");
            // "/usr/lib/systemd/system/a.service, b.service": the first.
            let path = format!("/{}", path.split([',', ' ']).next().unwrap());
            assert!(
                Path::new(&path).exists(),
                "{file} names {path}, which is not installed"
            );
            named.push(path);
        }
    }
    for must in [
        "/usr/share/doc/rtprobe/REMOTE.md",
        "/etc/rtprobe/targets.toml",
        "/usr/share/rtprobe/prometheus/",
    ] {
        assert!(
            named.iter().any(|p| p == must),
            "no man page names {must}: {named:?}"
        );
    }
    assert!(run_ok("zcat", &["/usr/share/man/man1/rtprobe.1.gz"]).contains(".SH FILES"));
}

/// The monitoring files as installed: Prometheus' config finds its rules
/// and its rule tests pass, Alertmanager's config loads, the dashboard is
/// JSON. promtool and amtool come from `cargo xtask setup`.
fn check_installed_monitoring() {
    let prom = Path::new("/usr/share/rtprobe/prometheus");
    let tool = |name: &str| {
        let found = which(name);
        assert!(
            found || !under_ci(),
            "{name} not installed: cargo xtask setup installs it"
        );
        if !found {
            println!("SKIPPED: the installed files' {name} check: no {name}");
        }
        found
    };
    if tool("promtool") {
        run_ok(
            "promtool",
            &[
                "check",
                "config",
                prom.join("prometheus.yml").to_str().unwrap(),
            ],
        );
        let o = Command::new("promtool")
            .args(["test", "rules", "tests/rtprobe-rules.test.yml"])
            .current_dir(prom)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "installed rule tests: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    if tool("amtool") {
        run_ok(
            "amtool",
            &[
                "check-config",
                "/usr/share/rtprobe/alertmanager/alertmanager.yml",
            ],
        );
    }
    let dash = std::fs::read_to_string("/usr/share/rtprobe/grafana/rtprobe-fleet.json").unwrap();
    let dash: serde_json::Value = serde_json::from_str(&dash).expect("the dashboard is JSON");
    assert!(dash["panels"].as_array().is_some_and(|p| !p.is_empty()));
}

fn which(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The reflector's unit with the shipped --kernel drop-in in place, in a
/// directory of its own (the host's /etc/systemd stays untouched).
fn check_kernel_drop_in() {
    let dir = tempfile::tempdir().unwrap();
    let drop_ins = dir.path().join("rtprobe-reflect.service.d");
    std::fs::create_dir(&drop_ins).unwrap();
    let unit = dir.path().join("rtprobe-reflect.service");
    std::fs::copy(unit_path("rtprobe-reflect.service"), &unit).unwrap();
    std::fs::copy(
        "/usr/share/doc/rtprobe/examples/rtprobe-reflect-kernel.conf",
        drop_ins.join("kernel.conf"),
    )
    .unwrap();
    let unit = unit.display().to_string();
    let search = format!("{}:", dir.path().display());
    let o = Command::new("systemd-analyze")
        .args(["verify", &unit])
        .env("SYSTEMD_UNIT_PATH", &search)
        .output()
        .expect("run systemd-analyze");
    let text = String::from_utf8_lossy(&o.stderr);
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("rtprobe") || l.contains("kernel.conf"))
        .collect();
    assert!(
        o.status.success() && ours.is_empty(),
        "systemd-analyze verify with the kernel drop-in: {text}"
    );
    let score = exposure(&unit, Some(&search));
    assert!(
        score.contains("CAP_BPF") && !score.contains("runs as root user"),
        "drop-in not read, or root: {score}"
    );
    eprintln!("with the kernel drop-in: {}", score.lines().last().unwrap());
}

/// `systemd-analyze security`'s verdict on a unit file (with the drop-in
/// lines it flags when `search` holds drop-ins): the overall line last.
fn exposure(unit: &str, search: Option<&str>) -> String {
    let mut cmd = Command::new("systemd-analyze");
    cmd.args(["security", "--offline=true", unit]);
    if let Some(s) = search {
        cmd.env("SYSTEMD_UNIT_PATH", s);
    }
    let o = cmd.output().expect("run systemd-analyze security");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "systemd-analyze security {unit}: {text}"
    );
    let mut lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("runs as root user") || l.contains("~CAP_BPF"))
        .collect();
    let overall = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or("no overall exposure level");
    lines.push(overall.trim_start_matches(['→', ' ']));
    lines.join("\n")
}

/// Where cargo-deb put a unit (/usr/lib/systemd/system or /lib/...).
fn unit_path(unit: &str) -> PathBuf {
    ["/usr/lib/systemd/system", "/lib/systemd/system"]
        .iter()
        .map(|d| Path::new(d).join(unit))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{unit} not installed"))
}

fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The capabilities a unit (or drop-in) keeps: its CapabilityBoundingSet=,
/// without the CAP_ prefix, sorted.
fn unit_capabilities(unit: &str) -> Vec<String> {
    let line = unit
        .lines()
        .rfind(|l| l.starts_with("CapabilityBoundingSet="))
        .expect("a CapabilityBoundingSet= line");
    let mut caps: Vec<String> = line["CapabilityBoundingSet=".len()..]
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_string())
        .collect();
    caps.sort();
    caps
}

/// The `add:` capability list of each container of the DaemonSet, in order.
fn daemonset_capabilities(yaml: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut container = None;
    // A container's `- name:` is two columns right of `containers:`; other
    // `- name:` lines (env, volumeMounts) are deeper.
    let mut item_indent = None;
    for raw in yaml.lines() {
        let indent = raw.len() - raw.trim_start().len();
        let line = raw.trim();
        if line == "containers:" {
            item_indent = Some(indent + 2);
        }
        if let Some(name) = line.strip_prefix("- name: ")
            && Some(indent) == item_indent
        {
            container = Some(name.to_string());
        }
        if let Some(list) = line.strip_prefix("add: ") {
            let mut caps: Vec<String> = list
                .trim_matches(['[', ']'])
                .split(',')
                .map(|c| c.trim().trim_matches('"').to_string())
                .filter(|c| !c.is_empty())
                .collect();
            caps.sort();
            out.push((container.clone().expect("add: inside a container"), caps));
        }
    }
    out
}

#[test]
fn the_daemonset_asks_for_the_units_capabilities() {
    let yaml = repo_file("deploy/k8s/rtprobe-daemonset.yaml");
    let k8s = daemonset_capabilities(&yaml);
    let kernel = unit_capabilities(&repo_file("deploy/systemd/rtprobe-reflect-kernel.conf"));
    let mesh = unit_capabilities(&repo_file("deploy/systemd/rtprobe-mesh.service"));
    assert_eq!(kernel, ["BPF", "NET_ADMIN", "NET_BIND_SERVICE", "PERFMON"]);
    assert!(
        mesh.is_empty(),
        "the mesh prober needs no capability: {mesh:?}"
    );
    assert_eq!(
        k8s,
        [("reflect".to_string(), kernel), ("mesh".to_string(), mesh)],
        "deploy/k8s/rtprobe-daemonset.yaml and deploy/systemd/ disagree"
    );
    // The reflector there is the in-kernel one, which the kernel drop-in is for.
    assert!(yaml.contains("\"--kernel\""));
    assert_eq!(yaml.matches("drop: [\"ALL\"]").count(), 2);
    let user_space = unit_capabilities(&repo_file("deploy/systemd/rtprobe-reflect.service"));
    assert_eq!(user_space, ["NET_BIND_SERVICE"]);
}
