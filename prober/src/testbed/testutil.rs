//! Helpers for root tests: unique namespaces (deleted on drop, taking
//! their veths with them) and `ip` commands run inside them. Tests only;
//! the product talks netlink.

use std::process::Command;

use crate::sys::Netns;

/// Panics with a clear message unless running as root: a root test that
/// cannot run fails, it never passes. Root tests are `#[ignore]`d (so plain
/// `cargo test` does not run them) and call this first.
pub(crate) fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: run by `cargo xtask test` as root"
    );
}

/// For root tests that are not `#[ignore]`d: true as root; under CI
/// (`CI=true`) a missing root is a failure (panic); elsewhere a visible
/// `SKIPPED (not root): TEST` line on stderr and false. Never a silent pass.
pub(crate) fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{test} needs root and CI=true: run `cargo xtask test` as root");
    }
    // Straight to stderr: libtest captures eprintln! of passing tests.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED (not root): {test} (run `cargo xtask test` as root)"
    );
    false
}

/// A name unique to this process and call: "rtpt-<pid>-<random>".
pub(crate) fn unique_name(tag: &str) -> String {
    format!(
        "rtpt-{}-{tag}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// A fresh namespace with loopback up, deleted on drop.
pub(crate) fn netns(tag: &str) -> Netns {
    let ns = Netns::create(&unique_name(tag)).expect("create a test namespace");
    ip(&ns, "link set lo up");
    ns
}

/// Runs `ip -n NS ARGS...` and panics with the command and its stderr on failure.
pub(crate) fn ip(ns: &Netns, args: &str) {
    run(Command::new("ip")
        .args(["-n", ns.name()])
        .args(args.split_whitespace()));
}

/// Runs `ip netns exec NS CMD...` (e.g. sysctl inside the namespace).
pub(crate) fn exec(ns: &Netns, cmd: &str) -> String {
    run(Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(cmd.split_whitespace()))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn a command");
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The MAC address of `ifname` in `ns` (from `ip -j`: sysfs shows the
/// namespace it was mounted in, not the caller's).
pub(crate) fn mac(ns: &Netns, ifname: &str) -> [u8; 6] {
    let out = run(Command::new("ip").args(["-n", ns.name(), "-j", "link", "show", "dev", ifname]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j output");
    let s = v[0]["address"].as_str().expect("an address field");
    let mut m = [0u8; 6];
    for (b, part) in m.iter_mut().zip(s.split(':')) {
        *b = u8::from_str_radix(part, 16).expect("hex MAC");
    }
    m
}

/// The ifindex of `ifname` in `ns`.
pub(crate) fn ifindex(ns: &Netns, ifname: &str) -> u32 {
    ns.run(|| Ok(nix::net::if_::if_nametoindex(ifname)?))
        .expect("ifindex of a test interface")
}
