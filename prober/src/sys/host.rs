//! The host's facts ([`HostFacts`]) from the files the kernel publishes
//! about itself, for every run's report and `cargo xtask bench`:
//!
//! - cores: /sys/devices/system/cpu/online;
//! - cpuidle: /sys/devices/system/cpu/cpuidle/current_driver and
//!   current_governor (current_governor_ro before Linux 5.10 without
//!   `cpuidle_sysfs_switch`); "none" when the directory is absent;
//! - preemption: /sys/kernel/debug/sched/preempt (Linux >= 5.12, debugfs
//!   mounted, root) when readable, else the kernel's config
//!   (/proc/config.gz, /boot/config-RELEASE) with a `preempt=` on
//!   /proc/cmdline for a PREEMPT_DYNAMIC kernel, else the flags of
//!   /proc/sys/kernel/version (`uname -v`); the report says which;
//! - a VM: the `hypervisor` flag of /proc/cpuinfo (the CPUID bit a
//!   hypervisor sets), /sys/hypervisor/type (Xen), DMI
//!   (/sys/class/dmi/id/sys_vendor, product_name); the hypervisor's name
//!   from CPUID leaf 0x40000000 on x86, else from those;
//! - /sys/devices/system/clocksource/clocksource0/current_clocksource;
//! - /proc/cpuinfo's model name; /proc/sys/kernel/osrelease (`uname -r`).
//!
//! Two more facts that the run's report and its validation ask for, read
//! here so that the layers above stay pure: this process's peak resident
//! memory (VmHWM of /proc/self/status, [`peak_rss_kib`]) and whether the
//! kernel throttles real-time tasks (/proc/sys/kernel/sched_rt_runtime_us,
//! [`rt_throttling_on`]).
//!
//! None of these follows a network namespace and none needs root, so they
//! are read with plain file reads here rather than through a namespace's
//! worker of [`super::Sys`] (which enters the namespace and mounts its
//! sysfs, as root): an unprivileged `--target` run names its host too.
//! [`HostFiles`] is the seam the unit tests fake.

use std::io::Read as _;

use crate::model::host::{HostFacts, NO_CPUIDLE};

/// Where the facts are read from.
pub(crate) trait HostFiles {
    /// A file's text, None when it cannot be read.
    fn read(&self, path: &str) -> Option<String>;
    /// The vendor signature of CPUID leaf 0x40000000 ("KVMKVMKVM"), when
    /// the CPU says a hypervisor runs it.
    fn cpuid_hypervisor(&self) -> Option<String>;
}

/// This machine.
struct Kernel;

impl HostFiles for Kernel {
    fn read(&self, path: &str) -> Option<String> {
        if path.ends_with(".gz") {
            // /proc/config.gz: the kernel's config, gzipped.
            let f = std::fs::File::open(path).ok()?;
            let mut text = String::new();
            flate2::read::GzDecoder::new(f)
                .read_to_string(&mut text)
                .ok()?;
            return Some(text);
        }
        std::fs::read_to_string(path).ok()
    }

    fn cpuid_hypervisor(&self) -> Option<String> {
        #[cfg(target_arch = "x86_64")]
        {
            let r = std::arch::x86_64::__cpuid(0x4000_0000);
            let bytes: Vec<u8> = [r.ebx, r.ecx, r.edx]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect();
            let sig = String::from_utf8_lossy(&bytes)
                .trim_matches(|c: char| c == '\0' || c.is_whitespace())
                .to_string();
            (!sig.is_empty()).then_some(sig)
        }
        #[cfg(not(target_arch = "x86_64"))]
        None
    }
}

/// This host's facts.
pub(crate) fn host_facts() -> HostFacts {
    read_facts(&Kernel)
}

/// The process's peak resident memory so far (VmHWM of
/// /proc/self/status), in KiB; None (null in JSON, "-" in text) if unknown.
pub(crate) fn peak_rss_kib() -> Option<u64> {
    vm_hwm_kib(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// The VmHWM line of a /proc/PID/status, in KiB. Pure.
fn vm_hwm_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Whether the kernel caps real-time tasks' CPU share
/// (/proc/sys/kernel/sched_rt_runtime_us is not -1; Linux >= 2.6.25);
/// true when unknown.
pub(crate) fn rt_throttling_on() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/sched_rt_runtime_us")
        .map(|s| s.trim() != "-1")
        .unwrap_or(true)
}

/// Where the cgroup v2 hierarchy is mounted (/proc/self/mountinfo: the
/// first `cgroup2` mount; /sys/fs/cgroup on a pure v2 host,
/// /sys/fs/cgroup/unified on a hybrid one); None without one.
pub(crate) fn cgroup2_root() -> Option<std::path::PathBuf> {
    cgroup2_mount(&std::fs::read_to_string("/proc/self/mountinfo").ok()?)
}

/// The directories (relative to `root`, "/" for the root itself) of the
/// cgroups `ids` (a cgroup v2 id is its directory's inode number). Walks
/// at most 100 000 directories; an id not found is left out.
pub(crate) fn cgroup_paths(
    root: &std::path::Path,
    ids: &[u64],
) -> std::collections::HashMap<u64, String> {
    use std::os::unix::fs::MetadataExt as _;
    let mut found = std::collections::HashMap::new();
    let mut todo = vec![root.to_path_buf()];
    let mut walked = 0;
    while let Some(dir) = todo.pop() {
        walked += 1;
        if walked > 100_000 || found.len() == ids.len() {
            break;
        }
        if let Ok(m) = std::fs::metadata(&dir)
            && ids.contains(&m.ino())
        {
            let rel = dir.strip_prefix(root).unwrap_or(&dir).display().to_string();
            found.insert(m.ino(), format!("/{rel}"));
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        todo.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    found
}

/// The mount point of the first cgroup2 line of a mountinfo. Pure.
fn cgroup2_mount(mountinfo: &str) -> Option<std::path::PathBuf> {
    mountinfo.lines().find_map(|l| {
        // "ID PARENT MAJ:MIN ROOT POINT OPTIONS [TAGS...] - FSTYPE SOURCE ..."
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(std::path::PathBuf::from))
            .flatten()
    })
}

/// The facts as `files` tell them.
pub(crate) fn read_facts(files: &dyn HostFiles) -> HostFacts {
    let text = |p: &str| {
        files
            .read(p)
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    };
    let cpuinfo = files.read("/proc/cpuinfo").unwrap_or_default();
    let kernel = text("/proc/sys/kernel/osrelease").unwrap_or_default();
    let idle = "/sys/devices/system/cpu/cpuidle";
    let (preemption, preemption_source) = preemption(files, &kernel);
    let (vm, hypervisor, vm_source) = virtualization(files, &cpuinfo);
    HostFacts {
        clocksource: text("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        cores: text("/sys/devices/system/cpu/online").and_then(|l| count_cpu_list(&l)),
        cpu_model: cpuinfo_field(&cpuinfo, &["model name", "Model", "cpu model", "Hardware"]),
        cpuidle_driver: text(&format!("{idle}/current_driver")).unwrap_or(NO_CPUIDLE.into()),
        cpuidle_governor: text(&format!("{idle}/current_governor"))
            .or_else(|| text(&format!("{idle}/current_governor_ro")))
            .unwrap_or(NO_CPUIDLE.into()),
        hypervisor,
        kernel,
        machine: dmi(files),
        preemption,
        preemption_source,
        vm,
        vm_source,
    }
}

/// CPUs in a kernel CPU list ("0-3,8,10-11" -> 7).
fn count_cpu_list(list: &str) -> Option<u32> {
    let mut n = 0;
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        n += b.checked_sub(a)? + 1;
    }
    Some(n)
}

/// The first of `keys` that /proc/cpuinfo has, on its first CPU.
fn cpuinfo_field(cpuinfo: &str, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| {
        cpuinfo.lines().find_map(|l| {
            let (key, v) = l.split_once(':')?;
            (key.trim() == *k && !v.trim().is_empty()).then(|| v.trim().to_string())
        })
    })
}

/// (model, where it came from).
fn preemption(files: &dyn HostFiles, release: &str) -> (Option<String>, String) {
    // "none (voluntary) full lazy": the mode in parentheses.
    if let Some(t) = files.read("/sys/kernel/debug/sched/preempt")
        && let Some(mode) = t.split_whitespace().find_map(|w| {
            w.strip_prefix('(')
                .and_then(|w| w.strip_suffix(')'))
                .map(str::to_string)
        })
    {
        return (Some(mode), "/sys/kernel/debug/sched/preempt".into());
    }
    let cmdline = files.read("/proc/cmdline").unwrap_or_default();
    let boot = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("preempt="))
        .map(str::to_string);
    let unreadable = "/sys/kernel/debug/sched/preempt unreadable";
    let boot_config = format!("/boot/config-{release}");
    for path in ["/proc/config.gz", boot_config.as_str()] {
        let Some(config) = files.read(path) else {
            continue;
        };
        let set = |k: &str| config.lines().any(|l| l.trim() == format!("CONFIG_{k}=y"));
        let built = [
            ("PREEMPT_RT", "rt"),
            ("PREEMPT_LAZY", "lazy"),
            ("PREEMPT", "full"),
            ("PREEMPT_VOLUNTARY", "voluntary"),
            ("PREEMPT_NONE", "none"),
        ]
        .into_iter()
        .find(|(k, _)| set(k));
        let Some((key, mode)) = built else { continue };
        if mode != "rt" && set("PREEMPT_DYNAMIC") {
            return match boot {
                Some(b) => (
                    Some(b),
                    format!("preempt= on /proc/cmdline (PREEMPT_DYNAMIC in {path}); {unreadable}"),
                ),
                None => (
                    Some(mode.into()),
                    format!(
                        "{path}: CONFIG_{key}, the boot default of PREEMPT_DYNAMIC; {unreadable}"
                    ),
                ),
            };
        }
        return (Some(mode.into()), format!("{path}: CONFIG_{key}"));
    }
    let Some(version) = files.read("/proc/sys/kernel/version") else {
        return (
            None,
            "no debugfs, kernel config or kernel version to read".into(),
        );
    };
    let has = |w: &str| version.split_whitespace().any(|v| v == w);
    let src = |what: &str| format!("uname -v says {what}; {unreadable}, no kernel config");
    if has("PREEMPT_RT") {
        (Some("rt".into()), src("PREEMPT_RT"))
    } else if has("PREEMPT_DYNAMIC") {
        match boot {
            Some(b) => (Some(b), src("PREEMPT_DYNAMIC, preempt= on /proc/cmdline")),
            None => (
                Some("dynamic".into()),
                src("PREEMPT_DYNAMIC, boot default unknown"),
            ),
        }
    } else if has("PREEMPT_LAZY") {
        (Some("lazy".into()), src("PREEMPT_LAZY"))
    } else if has("PREEMPT") {
        (Some("full".into()), src("PREEMPT"))
    } else {
        (Some("none or voluntary".into()), src("no PREEMPT flag"))
    }
}

/// (a VM?, the hypervisor's name, what told).
fn virtualization(files: &dyn HostFiles, cpuinfo: &str) -> (Option<bool>, Option<String>, String) {
    let flag = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().any(|f| f == "hypervisor"));
    let sys_type = files
        .read("/sys/hypervisor/type")
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty());
    let dmi_vm = dmi(files).and_then(|m| dmi_hypervisor(&m));
    let cpuid = flag
        .unwrap_or(false)
        .then(|| files.cpuid_hypervisor())
        .flatten()
        .map(|sig| hypervisor_name(&sig));
    let name = cpuid.clone().or(sys_type.clone()).or(dmi_vm.clone());
    let mut told = Vec::new();
    if flag == Some(true) {
        told.push("the hypervisor flag of /proc/cpuinfo".to_string());
    }
    if cpuid.is_some() {
        told.push("CPUID leaf 0x40000000".into());
    }
    if sys_type.is_some() {
        told.push("/sys/hypervisor/type".into());
    }
    if dmi_vm.is_some() {
        told.push("DMI".into());
    }
    let vm = if flag == Some(true) || sys_type.is_some() || dmi_vm.is_some() {
        Some(true)
    } else {
        // An x86 CPU without the flag runs on bare metal; elsewhere no flag
        // says either way.
        flag.map(|_| false)
    };
    let source = match (vm, told.is_empty()) {
        (Some(false), _) => {
            "no hypervisor flag in /proc/cpuinfo, no /sys/hypervisor, no VM in DMI".into()
        }
        (None, _) => "no CPU flags in /proc/cpuinfo, no /sys/hypervisor, no DMI naming a VM".into(),
        (Some(true), _) => told.join(", "),
    };
    (vm, name, source)
}

/// "vendor product" from DMI, None without DMI.
fn dmi(files: &dyn HostFiles) -> Option<String> {
    let field = |f: &str| {
        files
            .read(&format!("/sys/class/dmi/id/{f}"))
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    };
    match (field("sys_vendor"), field("product_name")) {
        (Some(v), Some(p)) if p.starts_with(&v) => Some(p),
        (Some(v), Some(p)) => Some(format!("{v} {p}")),
        (v, p) => v.or(p),
    }
}

/// The hypervisor a DMI vendor/product names, if it names one.
fn dmi_hypervisor(machine: &str) -> Option<String> {
    [
        ("QEMU", "QEMU"),
        ("KVM", "KVM"),
        ("VMware", "VMware"),
        ("VirtualBox", "VirtualBox"),
        ("Xen", "Xen"),
        ("Microsoft Corporation Virtual Machine", "Microsoft Hyper-V"),
        ("Google Compute Engine", "KVM (Google Compute Engine)"),
        ("Parallels", "Parallels"),
        ("Firecracker", "Firecracker"),
        ("Cloud Hypervisor", "Cloud Hypervisor"),
    ]
    .into_iter()
    .find(|(k, _)| machine.contains(k))
    .map(|(_, name)| name.to_string())
}

/// A CPUID hypervisor signature in words.
fn hypervisor_name(sig: &str) -> String {
    match sig {
        "KVMKVMKVM" => "KVM".into(),
        "Microsoft Hv" => "Microsoft Hyper-V".into(),
        "VMwareVMware" => "VMware".into(),
        "XenVMMXenVMM" => "Xen".into(),
        "TCGTCGTCGTCG" => "QEMU (TCG)".into(),
        "ACRNACRNACRN" => "ACRN".into(),
        "bhyve bhyve" => "bhyve".into(),
        "lrpepyh  vr" | "prl hyperv" => "Parallels".into(),
        "QNXQVMBSQG" => "QNX".into(),
        "VBoxVBoxVBox" => "VirtualBox".into(),
        other => format!("signature {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_on_a_hybrid_host_and_none_without() {
        let hybrid = "30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw\n\
                      32 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(std::path::PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount("32 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw\n"),
            None
        );
    }

    #[test]
    fn peak_rss_is_the_vm_hwm_line() {
        let status = "Name:\trtprobe\nVmPeak:\t  9000 kB\nVmHWM:\t    2048 kB\nVmRSS:\t1 kB\n";
        assert_eq!(vm_hwm_kib(status), Some(2048));
        assert_eq!(vm_hwm_kib("Name:\tkthreadd\n"), None);
        assert!(peak_rss_kib().is_some_and(|k| k > 0));
    }

    /// Files from a map; the CPUID signature given.
    struct Fake(BTreeMap<&'static str, &'static str>, Option<&'static str>);

    impl HostFiles for Fake {
        fn read(&self, path: &str) -> Option<String> {
            self.0.get(path).map(|t| t.to_string())
        }
        fn cpuid_hypervisor(&self) -> Option<String> {
            self.1.map(str::to_string)
        }
    }

    const CPUINFO_VM: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n\
        flags\t\t: fpu vme sse2 hypervisor lahf_lm\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\n";

    /// This project's VM: haltpoll, a PREEMPT_DYNAMIC kernel built
    /// PREEMPT_NONE, no DMI, KVM by CPUID.
    fn firecracker() -> Fake {
        Fake(
            BTreeMap::from([
                ("/proc/cpuinfo", CPUINFO_VM),
                ("/proc/sys/kernel/osrelease", "6.18.44-fc-v595\n"),
                ("/proc/sys/kernel/version", "#1 SMP PREEMPT_DYNAMIC @0\n"),
                ("/proc/cmdline", "console=ttyS0 cpuidle_haltpoll.force=1\n"),
                (
                    "/proc/config.gz",
                    "CONFIG_PREEMPT_BUILD=y\nCONFIG_PREEMPT_NONE=y\n# CONFIG_PREEMPT is not set\n\
                     CONFIG_PREEMPT_COUNT=y\nCONFIG_PREEMPTION=y\nCONFIG_PREEMPT_DYNAMIC=y\n",
                ),
                ("/sys/devices/system/cpu/online", "0-1\n"),
                (
                    "/sys/devices/system/cpu/cpuidle/current_driver",
                    "haltpoll\n",
                ),
                (
                    "/sys/devices/system/cpu/cpuidle/current_governor_ro",
                    "haltpoll\n",
                ),
                (
                    "/sys/devices/system/clocksource/clocksource0/current_clocksource",
                    "tsc\n",
                ),
            ]),
            Some("KVMKVMKVM"),
        )
    }

    #[test]
    fn a_vm_with_haltpoll_and_a_dynamic_kernel() {
        let f = read_facts(&firecracker());
        assert_eq!(f.cores, Some(2));
        assert_eq!(f.cpu_model.as_deref(), Some("AMD EPYC"));
        assert_eq!(f.kernel, "6.18.44-fc-v595");
        assert_eq!(
            (f.cpuidle_driver.as_str(), f.cpuidle_governor.as_str()),
            ("haltpoll", "haltpoll")
        );
        assert_eq!(f.clocksource.as_deref(), Some("tsc"));
        assert_eq!(f.preemption.as_deref(), Some("none"));
        assert!(
            f.preemption_source
                .starts_with("/proc/config.gz: CONFIG_PREEMPT_NONE, the boot default")
        );
        assert_eq!((f.vm, f.hypervisor.as_deref()), (Some(true), Some("KVM")));
        assert_eq!(
            f.vm_source,
            "the hypervisor flag of /proc/cpuinfo, CPUID leaf 0x40000000"
        );
        assert_eq!(f.machine, None);
    }

    #[test]
    fn preemption_from_each_source_in_turn() {
        let mut f = firecracker();
        f.0.insert("/proc/cmdline", "quiet preempt=full\n");
        let facts = read_facts(&f);
        assert_eq!(facts.preemption.as_deref(), Some("full"));
        assert!(
            facts
                .preemption_source
                .starts_with("preempt= on /proc/cmdline")
        );
        f.0.insert(
            "/sys/kernel/debug/sched/preempt",
            "none voluntary (full) lazy\n",
        );
        let facts = read_facts(&f);
        assert_eq!(facts.preemption.as_deref(), Some("full"));
        assert_eq!(facts.preemption_source, "/sys/kernel/debug/sched/preempt");
        // No debugfs, no config: uname -v.
        let mut f = firecracker();
        f.0.remove("/proc/config.gz");
        let facts = read_facts(&f);
        assert_eq!(facts.preemption.as_deref(), Some("dynamic"));
        assert!(
            facts
                .preemption_source
                .starts_with("uname -v says PREEMPT_DYNAMIC, boot default unknown")
        );
        f.0.insert("/proc/sys/kernel/version", "#1 SMP PREEMPT_RT Tue");
        assert_eq!(read_facts(&f).preemption.as_deref(), Some("rt"));
        f.0.insert("/proc/sys/kernel/version", "#1 SMP Tue");
        assert_eq!(
            read_facts(&f).preemption.as_deref(),
            Some("none or voluntary")
        );
        // A /boot config of a non-dynamic kernel.
        f.0.insert(
            "/boot/config-6.18.44-fc-v595",
            "CONFIG_PREEMPT_VOLUNTARY=y\n",
        );
        let facts = read_facts(&f);
        assert_eq!(facts.preemption.as_deref(), Some("voluntary"));
        assert_eq!(
            facts.preemption_source,
            "/boot/config-6.18.44-fc-v595: CONFIG_PREEMPT_VOLUNTARY"
        );
        f.0.remove("/proc/sys/kernel/version");
        f.0.remove("/boot/config-6.18.44-fc-v595");
        assert_eq!(read_facts(&f).preemption, None);
    }

    #[test]
    fn bare_metal_without_cpuidle_and_vms_known_by_dmi() {
        let metal = Fake(
            BTreeMap::from([
                (
                    "/proc/cpuinfo",
                    "model name\t: Intel(R) Xeon(R) Gold 6338\nflags\t: fpu sse2\n",
                ),
                ("/sys/devices/system/cpu/online", "0-31,64-95\n"),
                ("/sys/class/dmi/id/sys_vendor", "Dell Inc.\n"),
                ("/sys/class/dmi/id/product_name", "PowerEdge R650\n"),
            ]),
            Some("should not be asked"),
        );
        let f = read_facts(&metal);
        assert_eq!(f.cores, Some(64));
        assert_eq!((f.vm, f.hypervisor), (Some(false), None));
        assert_eq!(f.machine.as_deref(), Some("Dell Inc. PowerEdge R650"));
        assert_eq!(
            (f.cpuidle_driver.as_str(), f.cpuidle_governor.as_str()),
            (NO_CPUIDLE, NO_CPUIDLE)
        );
        assert_eq!((f.clocksource, f.preemption), (None, None));
        // An ARM guest: no CPU flags, DMI names QEMU.
        let arm = Fake(
            BTreeMap::from([
                (
                    "/proc/cpuinfo",
                    "processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd0c\n",
                ),
                ("/sys/class/dmi/id/sys_vendor", "QEMU\n"),
                (
                    "/sys/class/dmi/id/product_name",
                    "QEMU KVM Virtual Machine\n",
                ),
            ]),
            None,
        );
        let f = read_facts(&arm);
        assert_eq!((f.vm, f.hypervisor.as_deref()), (Some(true), Some("QEMU")));
        assert_eq!(f.machine.as_deref(), Some("QEMU KVM Virtual Machine"));
        assert_eq!(f.vm_source, "DMI");
        let nothing = read_facts(&Fake(BTreeMap::new(), None));
        assert_eq!((nothing.vm, nothing.cores), (None, None));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("3-1"), None);
    }
}
