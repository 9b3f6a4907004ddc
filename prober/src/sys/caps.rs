//! The calling thread's effective capabilities, so that a command can say
//! which one it lacks before the kernel answers EPERM somewhere deep
//! inside (rather than asking for uid 0, which a service with
//! `AmbientCapabilities=` does not have).
//!
//! Kernel interface: the `CapEff` line of /proc/thread-self/status
//! (Linux >= 3.17 for thread-self; capabilities are per thread).

use anyhow::{Context, Result};

/// A capability by its number (linux/capability.h) and its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cap {
    pub(crate) bit: u32,
    pub(crate) name: &'static str,
}

pub(crate) const CAP_NET_ADMIN: Cap = Cap {
    bit: 12,
    name: "CAP_NET_ADMIN",
};
pub(crate) const CAP_SYS_ADMIN: Cap = Cap {
    bit: 21,
    name: "CAP_SYS_ADMIN",
};
pub(crate) const CAP_PERFMON: Cap = Cap {
    bit: 38,
    name: "CAP_PERFMON",
};
pub(crate) const CAP_BPF: Cap = Cap {
    bit: 39,
    name: "CAP_BPF",
};

/// The effective set of the calling thread, as a bit mask.
pub(crate) fn effective() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .context("read /proc/thread-self/status")?;
    parse_cap_eff(&status).context("no CapEff line in /proc/thread-self/status")
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Which of `needed` the effective set `eff` lacks. CAP_SYS_ADMIN stands
/// in for CAP_BPF and CAP_PERFMON (the kernel accepts it for both, and
/// kernels before 5.8 know only it).
pub(crate) fn missing(eff: u64, needed: &[Cap]) -> Vec<Cap> {
    let has = |c: Cap| eff & (1u64 << c.bit) != 0;
    needed
        .iter()
        .copied()
        .filter(|&c| {
            let stands_in = (c == CAP_BPF || c == CAP_PERFMON) && has(CAP_SYS_ADMIN);
            !has(c) && !stands_in
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_eff_is_read_and_sys_admin_stands_in_for_bpf_and_perfmon() {
        let status = "Name:\trtprobe\nCapInh:\t0000000000000000\nCapEff:\t000000c000001000\n";
        let eff = parse_cap_eff(status).unwrap();
        assert_eq!(eff, (1 << 12) | (1 << 38) | (1 << 39));
        let need = [CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON];
        assert!(missing(eff, &need).is_empty());
        assert_eq!(missing(1 << 12, &need), vec![CAP_BPF, CAP_PERFMON]);
        assert_eq!(missing(1 << 21, &need), vec![CAP_NET_ADMIN]);
        assert_eq!(missing(0, &[CAP_NET_ADMIN]), vec![CAP_NET_ADMIN]);
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
        // This process can always read its own.
        effective().unwrap();
    }
}
