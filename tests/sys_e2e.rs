//! Root tests of the kernel layer's edges, on the real kernel: NIC-pair
//! refusal and give-back (after a normal end and after SIGINT), and
//! `rtprobe cleanup` after a SIGKILLed run, for the veth testbed and for
//! NIC-pair mode. Each NIC-pair test builds a namespace of its own whose
//! veth carries that namespace's default route, and runs rtprobe inside it
//! (`nsenter --net`, which keeps the mount namespace: under `ip netns exec`
//! the namespaces rtprobe creates would be mounted in a private mount table
//! and die with a killed run), so the host's interfaces are never at stake.

mod common;

use std::{
    path::Path,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use common::{bin, is_root, sh, sh_ok, unique};

/// A namespace with veth `a`/`b`: `a` up with IPv4 and IPv6 addresses, an
/// IPv4 and an IPv6 default route and one more route through it, MTU 1400,
/// GRO on and TX checksumming off (not veth's defaults); `b` down.
/// Deleted on drop.
struct Home {
    ns: String,
    a: String,
    b: String,
}

impl Home {
    fn new() -> Self {
        let h = Home {
            ns: unique("rtsys-home"),
            a: unique("sxa"),
            b: unique("sxb"),
        };
        let (ns, a, b) = (&h.ns, &h.a, &h.b);
        sh_ok(&format!("ip netns add {ns}"));
        sh_ok(&format!(
            "ip -n {ns} link set lo up && \
             ip -n {ns} link add {a} type veth peer name {b} && \
             ip -n {ns} link set {a} mtu 1400 && \
             ip -n {ns} addr add 192.0.2.10/24 dev {a} && \
             ip -n {ns} addr add 2001:db8:5::10/64 dev {a} nodad && \
             ip -n {ns} link set {a} up && \
             ip -n {ns} route add default via 192.0.2.1 dev {a} && \
             ip -n {ns} -6 route add default via 2001:db8:5::1 dev {a} && \
             ip -n {ns} route add 198.51.100.0/24 via 192.0.2.1 dev {a} metric 50 && \
             ip netns exec {ns} ethtool -K {a} gro on tx off"
        ));
        h
    }

    /// Everything the give-back must restore, as text.
    fn state(&self) -> String {
        let (ns, a, b) = (&self.ns, &self.a, &self.b);
        let mut s = String::new();
        for dev in [a, b] {
            // Flags and MTU (not the operational state, which the kernel's
            // link watch settles a moment later).
            s += &sh_ok(&format!(
                "ip -n {ns} -o link show dev {dev} | grep -o '<[^>]*>.*mtu [0-9]*'"
            ));
            s += &sh_ok(&format!(
                "ip -n {ns} -o addr show dev {dev} | awk '{{print $3, $4}}' | sort"
            ));
        }
        for fam in ["-4", "-6"] {
            s += &sh_ok(&format!(
                "ip -n {ns} {fam} route show table main | sed 's/ linkdown//' | sort"
            ));
        }
        s += &sh_ok(&format!(
            "ip netns exec {ns} ethtool -k {a} | \
             grep -E '^(generic-receive-offload|tx-checksumming|tcp-segmentation-offload|generic-segmentation-offload):'"
        ));
        s
    }

    fn rtprobe(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.ns)).arg(bin());
        c
    }

    fn pair_args(&self) -> Vec<String> {
        vec![
            "--tx-if".into(),
            self.a.clone(),
            "--rx-if".into(),
            self.b.clone(),
        ]
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = sh(&format!("ip netns del {}", self.ns));
    }
}

fn out_args(dir: &Path) -> [String; 2] {
    ["--out".into(), dir.join("o.csv").display().to_string()]
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn nic_pair_refuses_the_interface_with_the_default_route() {
    if !is_root("nic_pair_refuses_the_interface_with_the_default_route") {
        return;
    }
    let home = Home::new();
    let before = home.state();
    let dir = tempfile::tempdir().unwrap();
    let o = home
        .rtprobe()
        .args(home.pair_args())
        .args(["--count", "5"])
        .args(out_args(dir.path()))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("refusing to move {}", home.a))
            && err.contains("default route (default via 192.0.2.1")
            && err.contains("--force"),
        "{err}"
    );
    assert_eq!(home.state(), before, "a refusal changes nothing");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn nic_pair_gives_everything_back_after_a_run_and_after_sigint() {
    if !is_root("nic_pair_gives_everything_back_after_a_run_and_after_sigint") {
        return;
    }
    let home = Home::new();
    let before = home.state();
    let dir = tempfile::tempdir().unwrap();
    let o = home
        .rtprobe()
        .args(home.pair_args())
        .args(["--force", "--quiet", "--count", "50", "--interval", "1ms"])
        .args(out_args(dir.path()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(home.state(), before, "after a normal end");

    let child = home
        .rtprobe()
        .args(home.pair_args())
        .args([
            "--force",
            "--quiet",
            "--count",
            "100000",
            "--interval",
            "1ms",
        ])
        .args(out_args(dir.path()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = wait_for_testbed(&child);
    signal(pid, nix::sys::signal::Signal::SIGINT);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert_eq!(home.state(), before, "after SIGINT");
}

/// The pid of the rtprobe (nsenter execs it: same pid), once
/// its testbed record lists its namespaces and probing has had time to start.
fn wait_for_testbed(child: &Child) -> u32 {
    let pid = child.id();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        if record_of(pid).is_some_and(|r| r["steps"].as_array().is_some_and(|s| s.len() >= 2)) {
            std::thread::sleep(Duration::from_millis(1500));
            return pid;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("rtprobe (pid {pid}) did not build its testbed in 20 s");
}

fn record_of(pid: u32) -> Option<serde_json::Value> {
    std::fs::read_dir("/run/rtprobe")
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .find(|v| v["pid"] == pid)
}

fn namespaces_in(record: &serde_json::Value) -> Vec<String> {
    record["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["netns"].as_str().map(str::to_string))
        .collect()
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}

fn present(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// SIGKILLs a running rtprobe, checks its namespaces stay, then runs
/// `cleanup --dry-run` and `cleanup` (with `cleanup` as the command maker).
fn kill_then_cleanup(child: Child, cleanup: impl Fn() -> Command) -> Vec<String> {
    let pid = wait_for_testbed(&child);
    let record = record_of(pid).unwrap();
    let id = record["id"].as_str().unwrap().to_string();
    let nss = namespaces_in(&record);
    signal(pid, nix::sys::signal::Signal::SIGKILL);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), None, "killed by a signal");
    assert!(!nss.is_empty());
    for n in &nss {
        assert!(present(n), "{n} should outlive a SIGKILLed run");
    }
    // A new run mentions it (this one stops at once: no such interfaces).
    let o = cleanup()
        .args([
            "--tx-if",
            "rtsys-nx0",
            "--rx-if",
            "rtsys-nx1",
            "--count",
            "1",
        ])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(
        err.contains("stale testbed(s) from dead runs: run `rtprobe cleanup`"),
        "{err}"
    );
    let o = cleanup().args(["cleanup", "--dry-run"]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(text.contains(&format!("testbed {id} (")), "{text}");
    for n in &nss {
        assert!(present(n), "--dry-run removed {n}");
    }
    let o = cleanup().arg("cleanup").output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}{}", stderr(&o));
    assert!(text.contains(&format!("testbed {id} (")), "{text}");
    for n in &nss {
        assert!(!present(n), "{n} left after cleanup: {text}");
    }
    assert!(record_of(pid).is_none(), "record left after cleanup");
    nss
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn cleanup_after_sigkill_removes_the_veth_testbed() {
    if !is_root("cleanup_after_sigkill_removes_the_veth_testbed") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(bin())
        .args(["--quiet", "--count", "100000", "--interval", "1ms"])
        .args(out_args(dir.path()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let nss = kill_then_cleanup(child, || Command::new(bin()));
    assert_eq!(nss.len(), 3, "{nss:?}");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn cleanup_after_sigkill_gives_the_nic_pair_back() {
    if !is_root("cleanup_after_sigkill_gives_the_nic_pair_back") {
        return;
    }
    let home = Home::new();
    let before = home.state();
    let dir = tempfile::tempdir().unwrap();
    let child = home
        .rtprobe()
        .args(home.pair_args())
        .args([
            "--force",
            "--quiet",
            "--count",
            "100000",
            "--interval",
            "1ms",
        ])
        .args(out_args(dir.path()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kill_then_cleanup(child, || home.rtprobe());
    assert_eq!(home.state(), before, "after cleanup");
}
