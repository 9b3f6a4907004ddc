//! The host a run measured on: the facts that shape its latencies (cores,
//! how idle CPUs wake, the kernel's preemption, a hypervisor, the clock),
//! as every run's report, the text summary's header and `cargo xtask
//! bench` name them, and how two hosts differ. Plain data: `sys::host`
//! reads them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a cpuidle driver or governor is called when the kernel has none
/// (no /sys/devices/system/cpu/cpuidle: idle CPUs halt, or a VM's idle
/// vCPUs exit to the hypervisor, with no polling state first).
pub(crate) const NO_CPUIDLE: &str = "none";

/// The host's facts, the JSON's `extra.host`. Unknown is null, never a
/// guess.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct HostFacts {
    /// The kernel's clock source (tsc, kvm-clock, hpet, arch_sys_counter...).
    pub(crate) clocksource: Option<String>,
    /// Online CPUs.
    pub(crate) cores: Option<u32>,
    /// The CPU's model name.
    pub(crate) cpu_model: Option<String>,
    /// The cpuidle driver (haltpoll, intel_idle, acpi_idle...), "none"
    /// when the kernel has none.
    pub(crate) cpuidle_driver: String,
    /// The cpuidle governor (menu, teo, haltpoll, ladder), "none" when
    /// the kernel has no cpuidle.
    pub(crate) cpuidle_governor: String,
    /// The hypervisor's name (KVM, Xen, Microsoft Hyper-V, VMware...);
    /// null on bare metal or when nothing names it.
    pub(crate) hypervisor: Option<String>,
    /// The kernel release (`uname -r`).
    pub(crate) kernel: String,
    /// The firmware's vendor and product (DMI), e.g. "QEMU Standard PC
    /// (Q35 + ICH9, 2009)", "Dell Inc. PowerEdge R650"; null without DMI.
    pub(crate) machine: Option<String>,
    /// The preemption model: none, voluntary, full, lazy or rt; "dynamic"
    /// when only known to be chosen at boot, "none or voluntary" when the
    /// kernel says no more; null when nothing said.
    pub(crate) preemption: Option<String>,
    /// Where `preemption` came from, in words.
    pub(crate) preemption_source: String,
    /// Whether this kernel runs in a virtual machine; null when nothing
    /// could tell (no CPU flags, no DMI, no /sys/hypervisor).
    pub(crate) vm: Option<bool>,
    /// What told `vm` and `hypervisor`, in words.
    pub(crate) vm_source: String,
}

impl HostFacts {
    /// One line: "2 cores (AMD EPYC), kernel 6.18.44, preemption none
    /// (kernel config), cpuidle haltpoll/haltpoll, clocksource tsc, VM
    /// (KVM)".
    pub(crate) fn line(&self) -> String {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
        let cores = self.cores.map_or("? cores".into(), |c| {
            format!("{c} core{}", if c == 1 { "" } else { "s" })
        });
        let vm = match (self.vm, &self.hypervisor) {
            (Some(true), Some(h)) => format!("VM ({h})"),
            (Some(true), None) => "VM (hypervisor not named)".into(),
            (Some(false), _) => "bare metal".into(),
            (None, _) => "VM or bare metal: unknown".into(),
        };
        format!(
            "{cores} ({}), kernel {}, preemption {} ({}), cpuidle {}/{}, clocksource {}, {vm}",
            opt(&self.cpu_model),
            if self.kernel.is_empty() {
                "unknown"
            } else {
                &self.kernel
            },
            opt(&self.preemption),
            self.preemption_from(),
            self.cpuidle_driver,
            self.cpuidle_governor,
            opt(&self.clocksource),
        )
    }

    /// Where the preemption model came from, in a word or two.
    fn preemption_from(&self) -> &str {
        let s = self.preemption_source.as_str();
        if s.starts_with("/sys/kernel/debug") {
            "debugfs"
        } else if s.starts_with("preempt=") {
            "boot command line"
        } else if s.starts_with("/proc/config.gz") || s.starts_with("/boot/config") {
            "kernel config"
        } else if s.starts_with("uname -v") {
            "uname -v"
        } else {
            "no source"
        }
    }

    /// The facts in which `other` differs from these, in words ("cores 2
    /// vs 16"), compared where both know them: `rtprobe compare`'s
    /// different-host warning. Where a fact came from (the preemption's
    /// source) is not compared: the same host says more to root.
    pub(crate) fn differences(&self, other: &HostFacts) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |name: &str, a: Option<String>, b: Option<String>| {
            if let (Some(a), Some(b)) = (a, b)
                && a != b
            {
                out.push(format!("{name} {a} vs {b}"));
            }
        };
        let known = |s: &str| (!s.is_empty()).then(|| s.to_string());
        cmp(
            "cores",
            self.cores.map(|c| c.to_string()),
            other.cores.map(|c| c.to_string()),
        );
        cmp("CPU", self.cpu_model.clone(), other.cpu_model.clone());
        cmp("kernel", known(&self.kernel), known(&other.kernel));
        cmp(
            "preemption",
            self.preemption.clone(),
            other.preemption.clone(),
        );
        cmp(
            "cpuidle",
            known(&format!(
                "{}/{}",
                self.cpuidle_driver, self.cpuidle_governor
            ))
            .filter(|_| !self.cpuidle_driver.is_empty()),
            known(&format!(
                "{}/{}",
                other.cpuidle_driver, other.cpuidle_governor
            ))
            .filter(|_| !other.cpuidle_driver.is_empty()),
        );
        cmp(
            "clocksource",
            self.clocksource.clone(),
            other.clocksource.clone(),
        );
        let virt = |h: &HostFacts| {
            h.vm.map(|vm| match (vm, &h.hypervisor) {
                (true, Some(name)) => format!("VM ({name})"),
                (true, None) => "VM".to_string(),
                (false, _) => "bare metal".to_string(),
            })
        };
        cmp("virtualization", virt(self), virt(other));
        cmp("machine", self.machine.clone(), other.machine.clone());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm() -> HostFacts {
        HostFacts {
            clocksource: Some("tsc".into()),
            cores: Some(2),
            cpu_model: Some("AMD EPYC".into()),
            cpuidle_driver: "haltpoll".into(),
            cpuidle_governor: "haltpoll".into(),
            hypervisor: Some("KVM".into()),
            kernel: "6.18.44-fc".into(),
            machine: None,
            preemption: Some("none".into()),
            preemption_source: "/proc/config.gz: CONFIG_PREEMPT_NONE".into(),
            vm: Some(true),
            vm_source: "cpuid".into(),
        }
    }

    #[test]
    fn one_line_names_every_fact() {
        assert_eq!(
            vm().line(),
            "2 cores (AMD EPYC), kernel 6.18.44-fc, preemption none (kernel config), \
             cpuidle haltpoll/haltpoll, clocksource tsc, VM (KVM)"
        );
        assert_eq!(
            HostFacts::default().line(),
            "? cores (unknown), kernel unknown, preemption unknown (no source), cpuidle /, \
             clocksource unknown, VM or bare metal: unknown"
        );
    }

    #[test]
    fn differences_name_the_facts_both_know() {
        let a = vm();
        assert!(a.differences(&a).is_empty());
        let b = HostFacts {
            cores: Some(16),
            cpuidle_driver: NO_CPUIDLE.into(),
            cpuidle_governor: NO_CPUIDLE.into(),
            preemption_source: "debugfs".into(),
            machine: Some("QEMU Standard PC".into()),
            clocksource: None,
            ..vm()
        };
        assert_eq!(
            a.differences(&b),
            ["cores 2 vs 16", "cpuidle haltpoll/haltpoll vs none/none"]
        );
        let metal = HostFacts {
            vm: Some(false),
            hypervisor: None,
            ..vm()
        };
        assert_eq!(
            a.differences(&metal),
            ["virtualization VM (KVM) vs bare metal"]
        );
        assert!(
            a.differences(&HostFacts::default()).is_empty(),
            "nothing known"
        );
    }
}
