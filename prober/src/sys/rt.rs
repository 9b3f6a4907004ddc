//! Real-time settings for the probe sender thread: SCHED_FIFO priority,
//! mlockall and CPU pinning, each optional. The study ran its sender and
//! iperf server real-time, which is why CPU stress barely moved its
//! numbers (1.3, 1.4).
//!
//! `apply_to_current_thread()` is meant for the probe engine's sender
//! thread: scheduling policy and affinity are per thread (pid 0 = the
//! caller in sched_setscheduler/sched_setaffinity), mlockall is per
//! process. The returned guard puts the thread's policy and affinity back
//! and unlocks memory if it locked it; it must be dropped on the same
//! thread (it is not Send).
//!
//! Note: the kernel's RT throttling (kernel.sched_rt_runtime_us, 95 % by
//! default) still preempts a FIFO thread that never sleeps.
//!
//! Kernel interface: sched_setscheduler(2), sched_setaffinity(2),
//! mlockall(2); Linux >= 2.6.

use std::marker::PhantomData;

use crate::model::knobs::RtApplied;
use anyhow::{Result, bail};
use nix::{
    errno::Errno,
    sched::{CpuSet, sched_getaffinity, sched_setaffinity},
    unistd::Pid,
};
use serde::{Deserialize, Serialize};

/// What the sender thread asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RtSettings {
    /// SCHED_FIFO priority 1..=99.
    pub(crate) fifo_priority: Option<u8>,
    /// Lock all current and future memory (no page faults while sending).
    pub(crate) mlockall: bool,
    /// Pin the thread to this CPU.
    pub(crate) cpu: Option<usize>,
    /// Hold this CPU idle-latency limit (PM QoS, µs) while the guard lives.
    #[serde(default)]
    pub(crate) cpu_dma_latency_us: Option<u32>,
    /// The limit was asked for (`--cpu-dma-latency`): failing to hold it is
    /// an error. Otherwise it is the real-time default, and a process that
    /// may not open /dev/cpu_dma_latency (it is root's) runs without it.
    #[serde(default)]
    pub(crate) cpu_dma_latency_explicit: bool,
}

impl RtSettings {
    pub(crate) fn is_empty(&self) -> bool {
        self.fifo_priority.is_none()
            && !self.mlockall
            && self.cpu.is_none()
            && self.cpu_dma_latency_us.is_none()
    }

    /// Checks ranges without touching the system.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if let Some(p) = self.fifo_priority
            && !(1..=99).contains(&p)
        {
            return Err(format!(
                "SCHED_FIFO priority {p} is out of range: use 1 to 99"
            ));
        }
        if let Some(c) = self.cpu
            && c >= CpuSet::count()
        {
            return Err(format!("CPU {c} does not exist"));
        }
        Ok(())
    }

    pub(crate) fn metadata(&self) -> RtApplied {
        RtApplied {
            cpu: self.cpu,
            cpu_dma_latency_us: self.cpu_dma_latency_us,
            mlockall: self.mlockall,
            sched_fifo_priority: self.fifo_priority,
        }
    }

    /// Applies the settings to the calling thread.
    pub(crate) fn apply_to_current_thread(&self) -> Result<RtGuard> {
        self.validate().map_err(anyhow::Error::msg)?;
        let mut guard = RtGuard {
            prev_sched: None,
            prev_affinity: None,
            locked: false,
            pm_qos: None,
            _not_send: PhantomData,
        };
        if let Some(us) = self.cpu_dma_latency_us {
            match hold_cpu_dma_latency(us) {
                Ok(f) => guard.pm_qos = Some((f, us)),
                Err(e) if !self.cpu_dma_latency_explicit => {
                    log::warn!("{e:#}; the sender runs without a CPU latency limit")
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(cpu) = self.cpu {
            let prev = sched_getaffinity(Pid::from_raw(0))?;
            if !prev.is_set(cpu).unwrap_or(false) {
                let allowed: Vec<String> = (0..CpuSet::count())
                    .filter(|c| prev.is_set(*c).unwrap_or(false))
                    .map(|c| c.to_string())
                    .collect();
                bail!(
                    "cannot pin the sender to CPU {cpu}: this process may only use CPUs {}",
                    allowed.join(",")
                );
            }
            pin_to_cpu(cpu)
                .map_err(|e| anyhow::anyhow!("cannot pin the sender to CPU {cpu}: {e}"))?;
            guard.prev_affinity = Some(prev);
        }
        if let Some(prio) = self.fifo_priority {
            // SAFETY: all-zero is a valid sched_param (plain integers); pid 0 is the calling
            // thread, and `p` is a live sched_param the kernel writes into.
            let (policy, mut prev_param) = unsafe {
                let mut p: libc::sched_param = std::mem::zeroed();
                let pol = libc::sched_getscheduler(0);
                libc::sched_getparam(0, &mut p);
                (pol, p)
            };
            if let Err(e) = set_fifo(0, prio) {
                let e = Errno::from_raw(e.raw_os_error().unwrap_or(0));
                bail!(match e {
                    Errno::EPERM => format!(
                        "SCHED_FIFO priority {prio} was refused (EPERM): run as root, give the binary \
                         CAP_SYS_NICE, or raise the RT priority limit (ulimit -r {prio})"
                    ),
                    e => format!("SCHED_FIFO priority {prio} failed: {e}"),
                });
            }
            if policy >= 0 {
                prev_param.sched_priority = prev_param.sched_priority.max(0);
                guard.prev_sched = Some((policy, prev_param));
            }
        }
        if self.mlockall {
            // SAFETY: mlockall takes flags only.
            let r = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
            if r != 0 {
                let e = Errno::last();
                bail!(match e {
                    Errno::ENOMEM | Errno::EPERM => format!(
                        "mlockall failed ({e}): run as root or raise the locked-memory limit \
                         (ulimit -l unlimited)"
                    ),
                    e => format!("mlockall failed: {e}"),
                });
            }
            guard.locked = true;
        }
        Ok(guard)
    }
}

/// Puts thread `tid` (0: the calling one) under SCHED_FIFO at `prio`: the
/// one place rtprobe asks for a real-time policy (the sender, the probe's
/// receive threads, the bench's generators and NAPI threads).
pub(crate) fn set_fifo(tid: i32, prio: u8) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: prio.into(),
    };
    // SAFETY: `param` is a live sched_param the kernel only reads.
    if unsafe { libc::sched_setscheduler(tid, libc::SCHED_FIFO, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Pins the calling thread to `cpu`: the one place rtprobe sets an
/// affinity (the sender, the bench's generators and AF_XDP threads).
pub(crate) fn pin_to_cpu(cpu: usize) -> nix::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &set)
}

/// Holds a PM QoS CPU latency request of `us` µs: the cpuidle governor
/// then skips idle states whose exit latency is longer (Linux >= 2.6.19;
/// Documentation/power/pm_qos_interface.rst). The request lasts while the
/// returned file is open.
pub(crate) fn hold_cpu_dma_latency(us: u32) -> Result<std::fs::File> {
    use std::io::Write;
    let path = "/dev/cpu_dma_latency";
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => anyhow::anyhow!(
                "cannot open {path} to hold a CPU latency limit ({e}): run as root or pass \
                 --cpu-dma-latency off"
            ),
            std::io::ErrorKind::NotFound => anyhow::anyhow!(
                "{path} is missing (a kernel without PM QoS?): pass --cpu-dma-latency off"
            ),
            _ => anyhow::anyhow!("cannot open {path}: {e}"),
        })?;
    // The binary form: one native-endian s32.
    f.write_all(&(us.min(i32::MAX as u32) as i32).to_ne_bytes())
        .map_err(|e| anyhow::anyhow!("writing {us} µs to {path} failed: {e}"))?;
    Ok(f)
}

/// Puts the thread back as it was. Not Send: it must drop on the thread
/// it was made on, because policy and affinity are per thread.
pub(crate) struct RtGuard {
    prev_sched: Option<(i32, libc::sched_param)>,
    prev_affinity: Option<CpuSet>,
    locked: bool,
    /// The open /dev/cpu_dma_latency and the limit written: the kernel
    /// drops the request when it closes, also if the process dies.
    pm_qos: Option<(std::fs::File, u32)>,
    _not_send: PhantomData<*const ()>,
}

impl RtGuard {
    /// The CPU latency limit this guard holds, in µs.
    pub(crate) fn cpu_dma_latency_us(&self) -> Option<u32> {
        self.pm_qos.as_ref().map(|(_, us)| *us)
    }
}

impl Drop for RtGuard {
    fn drop(&mut self) {
        if let Some((pol, param)) = self.prev_sched.take() {
            // SAFETY: restoring the calling thread's own policy.
            if unsafe { libc::sched_setscheduler(0, pol, &param) } != 0 {
                log::warn!(
                    "could not restore the sender thread's scheduling policy: {}",
                    Errno::last()
                );
            }
        }
        if let Some(set) = self.prev_affinity.take()
            && let Err(e) = sched_setaffinity(Pid::from_raw(0), &set)
        {
            log::warn!("could not restore the sender thread's CPU affinity: {e}");
        }
        if self.locked {
            // SAFETY: no arguments.
            unsafe { libc::munlockall() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's scheduling policy and priority.
    fn current_policy() -> (i32, i32) {
        // SAFETY: all-zero is a valid sched_param (plain integers); pid 0 is the calling
        // thread, and `p` is a live sched_param the kernel writes into.
        unsafe {
            let mut p: libc::sched_param = std::mem::zeroed();
            libc::sched_getparam(0, &mut p);
            (libc::sched_getscheduler(0), p.sched_priority)
        }
    }

    #[test]
    fn validation() {
        assert!(RtSettings::default().is_empty());
        let s = RtSettings {
            fifo_priority: Some(0),
            ..Default::default()
        };
        assert!(s.validate().unwrap_err().contains("1 to 99"));
        let s = RtSettings {
            cpu: Some(100_000),
            ..Default::default()
        };
        assert!(s.validate().is_err());
        let s = RtSettings {
            fifo_priority: Some(80),
            mlockall: true,
            cpu: Some(0),
            cpu_dma_latency_us: Some(0),
            cpu_dma_latency_explicit: true,
        };
        assert!(s.validate().is_ok());
        assert_eq!(s.metadata().sched_fifo_priority, Some(80));
        assert_eq!(s.metadata().cpu_dma_latency_us, Some(0));
    }

    #[test]
    #[ignore = "needs root: run by cargo xtask test"]
    fn applies_and_restores_on_the_thread() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root");
            return;
        }
        // The kernel's aggregate CPU latency target (an s32 read back).
        let target = || {
            let b = std::fs::read("/dev/cpu_dma_latency").unwrap();
            i32::from_ne_bytes(b[..4].try_into().unwrap())
        };
        let before_target = target();
        std::thread::spawn(move || {
            let before_pol = current_policy();
            let before_aff = sched_getaffinity(Pid::from_raw(0)).unwrap();
            let s = RtSettings {
                fifo_priority: Some(10),
                mlockall: true,
                cpu: Some(0),
                cpu_dma_latency_us: Some(0),
                cpu_dma_latency_explicit: true,
            };
            {
                let g = s.apply_to_current_thread().unwrap();
                assert_eq!(g.cpu_dma_latency_us(), Some(0));
                assert_eq!(current_policy(), (libc::SCHED_FIFO, 10));
                let aff = sched_getaffinity(Pid::from_raw(0)).unwrap();
                assert!(aff.is_set(0).unwrap());
                assert_eq!(
                    (0..CpuSet::count())
                        .filter(|c| aff.is_set(*c).unwrap())
                        .count(),
                    1
                );
                assert_eq!(target(), 0, "the PM QoS request is held");
            }
            assert_eq!(target(), before_target, "and released with the guard");
            assert_eq!(current_policy(), before_pol);
            assert_eq!(sched_getaffinity(Pid::from_raw(0)).unwrap(), before_aff);
        })
        .join()
        .unwrap();
    }
}
