//! Loads `rtprobe flows`' sock_ops program (the `xdp-flows` object,
//! embedded at build time), attaches it to a cgroup through
//! [`crate::sys::Sys`], and hands out what it reports: the sampled sends
//! from its ring buffer and its per-CPU counters.
//!
//! The program calls two kfuncs, which aya does not resolve: their ids in
//! the running kernel's BTF are patched into the object first
//! ([`super::kfunc`]). A kernel without them (before Linux 6.15) is told
//! so before anything is loaded.
//!
//! Kernel interfaces: bpf(2) BPF_PROG_LOAD (sock_ops), BPF_MAP_CREATE (LRU
//! hash, per-CPU arrays, ring buffer: Linux >= 5.8), BPF_LINK_CREATE on a
//! cgroup v2 directory, `/sys/kernel/btf/vmlinux`. Minimum kernel: 6.15.

use std::{os::fd::AsRawFd, path::Path, time::Duration};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    EbpfLoader,
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{Iter, SockOps},
};
use xdp_common::flows::{
    CAP_PER_CPU_GLOBAL, EXISTING_PROGRAM, FLOW_COUNTER_COUNT, FLOW_COUNTERS_MAP, FLOWS_PROGRAM,
    GIVE_UP_GLOBAL, KFUNCS, MODE_MAP, MODE_UNWATCH, SAMPLE_GAP_GLOBAL, SAMPLES_MAP, TxSample,
};

use crate::sys::{BpfObject, CgroupLink, SysRef};

/// The sock_ops object, built by `build.rs` and embedded.
fn flows_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-flows"))
}

/// How many sends the program samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sampling {
    /// Sampled sends per second of one socket, at most.
    pub(crate) per_flow_per_sec: u32,
    /// Sampled sends per second of the whole host, at most.
    pub(crate) global_per_sec: u32,
    /// A sampled send whose ACK has not come after this is given up.
    pub(crate) give_up: Duration,
}

impl Sampling {
    /// The program's globals: the gap between two samples of a socket,
    /// the cap per CPU (the global cap shared out, rounded up), the
    /// give-up time, all in ns or counts.
    pub(crate) fn globals(&self, cpus: u32) -> (u64, u64, u64) {
        let gap_ns = 1_000_000_000 / u64::from(self.per_flow_per_sec.max(1));
        let cpus = u64::from(cpus.max(1));
        let per_cpu = u64::from(self.global_per_sec).div_ceil(cpus);
        (gap_ns, per_cpu, self.give_up.as_nanos() as u64)
    }
}

/// Whether this kernel can run the program: the ids of its kfuncs in
/// `btf`, or a refusal that names the kernel it needs.
pub(crate) fn kfunc_ids(btf: &aya::Btf) -> Result<Vec<(u32, u32)>> {
    let names: Vec<&str> = KFUNCS.iter().map(|k| k.1).collect();
    let ids = super::kfunc::ids_in(btf, &names);
    let missing: Vec<&str> = names
        .iter()
        .zip(&ids)
        .filter(|(_, id)| id.is_none())
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        let release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".into());
        bail!(
            "rtprobe flows needs Linux 6.15 or newer (BPF TX timestamping of TCP sockets: \
             the kernel function {} is missing); this kernel is {release}",
            missing.join(", ")
        );
    }
    Ok(KFUNCS
        .iter()
        .zip(ids)
        .map(|(&(number, _), id)| (number, id.unwrap_or_default()))
        .collect())
}

/// The loaded program, attached to a cgroup: its ring buffer and counters.
/// Dropping it detaches it.
pub(crate) struct FlowsProgram {
    sys: SysRef,
    /// The host's lock: one at a time (released after the undo on drop).
    _lock: std::fs::File,
    obj: BpfObject,
    link: Option<CgroupLink>,
    ring: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
}

impl FlowsProgram {
    /// Loads the program with `sampling` and attaches it to the cgroup v2
    /// directory `cgroup` (beside any programs already there).
    pub(crate) fn attach(sys: SysRef, cgroup: &Path, sampling: &Sampling) -> Result<Self> {
        let btf = super::kfunc::vmlinux()?;
        let kfuncs = kfunc_ids(&btf)?;
        let mut object = flows_object().to_vec();
        if object.is_empty() {
            bail!(
                "this rtprobe was built with AYA_BUILD_SKIP set and has no sock_ops program: \
                 rebuild it without AYA_BUILD_SKIP (cargo build)"
            );
        }
        let patched = super::kfunc::patch_calls(&mut object, &kfuncs)?;
        if patched.contains(&0) {
            bail!("internal: the sock_ops object calls a kfunc through no placeholder");
        }
        if !nix::unistd::geteuid().is_root() {
            bail!(
                "rtprobe flows needs root (CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON) to attach its \
                 sock_ops program: run it with sudo"
            );
        }
        let lock = lock()?;
        super::raise_memlock_limit();
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| anyhow!(e))?.get() as u32;
        let (gap_ns, per_cpu, give_up_ns) = sampling.globals(cpus);
        let mut ebpf = EbpfLoader::new()
            .override_global(SAMPLE_GAP_GLOBAL, &gap_ns, true)
            .override_global(CAP_PER_CPU_GLOBAL, &per_cpu, true)
            .override_global(GIVE_UP_GLOBAL, &give_up_ns, true)
            .load(&object)
            .context("cannot load the sock_ops program's maps")?;
        let prog: &mut SockOps = ebpf
            .program_mut(FLOWS_PROGRAM)
            .context("the sock_ops object has no program")?
            .try_into()
            .context("the flows program is no sock_ops program")?;
        prog.load()
            .context("loading the sock_ops program (the verifier refused it)")?;
        let ring = RingBuf::try_from(take(&mut ebpf, SAMPLES_MAP)?)?;
        let counters = PerCpuArray::try_from(take(&mut ebpf, FLOW_COUNTERS_MAP)?)?;
        let obj = BpfObject::new(ebpf);
        let link = sys.sock_ops_attach(cgroup, &obj, FLOWS_PROGRAM)?;
        let me = Self {
            sys,
            _lock: lock,
            obj,
            link: Some(link),
            ring,
            counters,
        };
        // The sockets open before: their established callback has passed.
        // (On an error here, dropping `me` detaches the program again.)
        me.obj.with(|ebpf| {
            load_iterator(ebpf, &btf)?;
            run_iterator(ebpf)
        })?;
        Ok(me)
    }

    /// Waits up to `timeout` for samples, then hands each one queued to
    /// `out`. Returns how many it handed out.
    pub(crate) fn drain(
        &mut self,
        timeout: Duration,
        out: &mut dyn FnMut(&TxSample),
    ) -> Result<usize> {
        let mut fds = [libc::pollfd {
            fd: self.ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout.as_millis() as i32) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).context("poll the sock_ops program's ring buffer");
            }
        }
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            if item.len() >= std::mem::size_of::<TxSample>() {
                // SAFETY: the program writes whole TxSamples; read unaligned.
                let s = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<TxSample>()) };
                out(&s);
                n += 1;
            }
        }
        Ok(n)
    }

    /// The program's counters, summed over the CPUs, in
    /// [`xdp_common::flows::FlowCounter`] order.
    pub(crate) fn counters(&self) -> Result<Vec<u64>> {
        (0..FLOW_COUNTER_COUNT)
            .map(|i| {
                let per_cpu = self
                    .counters
                    .get(&i, 0)
                    .context("read the sock_ops program's counters")?;
                Ok(per_cpu.iter().sum())
            })
            .collect()
    }

    /// Detaches the program, then turns the callbacks off again on the
    /// sockets of this network namespace it turned them on for (also done
    /// on drop). Returns the final counters, as [`Self::counters`].
    pub(crate) fn detach(mut self) -> Result<Vec<u64>> {
        self.undo()?;
        self.counters()
    }

    fn undo(&mut self) -> Result<()> {
        let Some(link) = self.link.take() else {
            return Ok(());
        };
        self.sys.sock_ops_detach(link)?;
        self.obj.with(|ebpf| {
            let mut mode: Array<_, u32> = Array::try_from(
                ebpf.map_mut(MODE_MAP)
                    .context("the sock_ops object has no mode map")?,
            )?;
            mode.set(0, &MODE_UNWATCH, 0)
                .context("set the sock_ops program's mode")?;
            run_iterator(ebpf)
        })
    }
}

impl Drop for FlowsProgram {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            log::warn!("{e:#}");
        }
    }
}

/// Loads the TCP socket iterator (the sock_ops program sees only the
/// sockets established after its attach; this one reaches those open).
fn load_iterator(ebpf: &mut aya::Ebpf, btf: &aya::Btf) -> Result<()> {
    let iter: &mut Iter = ebpf
        .program_mut(EXISTING_PROGRAM)
        .context("the sock_ops object has no socket iterator")?
        .try_into()
        .context("the socket iterator is no iterator program")?;
    iter.load("tcp", btf)
        .context("loading the TCP socket iterator (the verifier refused it)")
}

/// Runs the TCP socket iterator once over every TCP socket of this
/// thread's network namespace: it turns the callbacks on (or, in unwatch
/// mode, off again).
fn run_iterator(ebpf: &mut aya::Ebpf) -> Result<()> {
    use std::io::Read as _;
    let iter: &mut Iter = ebpf
        .program_mut(EXISTING_PROGRAM)
        .context("the sock_ops object has no socket iterator")?
        .try_into()
        .context("the socket iterator is no iterator program")?;
    let id = iter.attach().context("attach the TCP socket iterator")?;
    let mut file = iter
        .take_link(id)
        .context("take the iterator's link")?
        .into_file()
        .context("open the TCP socket iterator")?;
    // Reading runs the program over every socket; it writes nothing.
    let mut sink = Vec::new();
    file.read_to_end(&mut sink)
        .context("run the TCP socket iterator")?;
    Ok(())
}

/// The host's `rtprobe flows` lock, held while it runs: two at once would
/// share the sockets' callback flag, and the first to exit would turn it
/// off under the other. Released when the process ends, however it ends.
fn lock() -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let dir = std::path::Path::new(crate::testbed::record::RUN_DIR);
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let path = dir.join("flows.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    // SAFETY: flock on a file this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            bail!(
                "another rtprobe flows runs on this host ({} is locked): one at a time, stop it \
                 first (the first to exit would turn the kernel's callbacks off under the other)",
                path.display()
            );
        }
        return Err(e).with_context(|| format!("lock {}", path.display()));
    }
    Ok(file)
}

/// Takes the map `name` out of the loaded object.
fn take(ebpf: &mut aya::Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name)
        .with_context(|| format!("the sock_ops object has no map {name}"))
}

#[cfg(test)]
mod tests {
    use xdp_common::flows::FlowCounter;

    use super::*;

    #[test]
    fn sampling_shares_the_global_cap_among_the_cpus_rounding_up() {
        let s = Sampling {
            per_flow_per_sec: 10,
            global_per_sec: 1001,
            give_up: Duration::from_secs(2),
        };
        assert_eq!(s.globals(2), (100_000_000, 501, 2_000_000_000));
        assert_eq!(s.globals(0).1, 1001, "no CPU count: one share");
        let zero = Sampling {
            per_flow_per_sec: 0,
            ..s
        };
        assert_eq!(zero.globals(1).0, 1_000_000_000, "at most one a second");
    }

    /// A loopback TCP connection: the sending end, the reader's thread
    /// and the port.
    fn loopback() -> (std::net::TcpStream, std::thread::JoinHandle<()>, u16) {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let reader = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 65536];
            while c.read(&mut buf).map(|n| n > 0).unwrap_or(false) {}
        });
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        (c, reader, port)
    }

    /// Sends on both connections for `secs` while `prog` watches, and
    /// returns what it reported of each.
    fn samples_of(
        prog: &mut FlowsProgram,
        conns: &mut [(&mut std::net::TcpStream, u16); 2],
        secs: f64,
    ) -> [Vec<TxSample>; 2] {
        use std::io::Write;
        let until = std::time::Instant::now() + Duration::from_secs_f64(secs);
        let mut got = [Vec::new(), Vec::new()];
        let ports = [conns[0].1, conns[1].1];
        let mut keep = |s: &TxSample| {
            if let Some(i) = ports.iter().position(|&p| s.remote_port == u32::from(p)) {
                got[i].push(*s);
            }
        };
        while std::time::Instant::now() < until {
            for (c, _) in conns.iter_mut() {
                c.write_all(&[7u8; 1000]).unwrap();
            }
            std::thread::sleep(Duration::from_millis(1));
            prog.drain(Duration::ZERO, &mut keep).unwrap();
        }
        prog.drain(Duration::from_millis(100), &mut keep).unwrap();
        got
    }

    #[test]
    #[ignore = "needs root: run by cargo xtask test"]
    fn open_and_new_flows_are_sampled_at_each_stage_and_given_back_on_exit() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root");
            return;
        }
        let (mut before, r1, p1) = loopback();
        let sys: SysRef = crate::sys::linux();
        let sampling = Sampling {
            per_flow_per_sec: 50,
            global_per_sec: 10_000,
            give_up: Duration::from_secs(2),
        };
        let root = crate::sys::host::cgroup2_root().expect("a cgroup v2 mount");
        let mut prog = FlowsProgram::attach(sys, &root, &sampling).unwrap();
        let (mut after, r2, p2) = loopback();
        let got = samples_of(&mut prog, &mut [(&mut before, p1), (&mut after, p2)], 1.0);
        // Both connections still open: the exit gives all four ends back.
        let counters = prog.detach().unwrap();
        drop((before, after));
        r1.join().unwrap();
        r2.join().unwrap();
        eprintln!(
            "samples {} + {}; counters {counters:?}",
            got[0].len(),
            got[1].len()
        );
        for (what, g) in ["open before", "opened after"].iter().zip(&got) {
            // At most 50/s for 1 s, with one in flight at a time.
            assert!((5..=60).contains(&g.len()), "{what}: {} samples", g.len());
            for s in g {
                assert!(s.sendmsg_ns > 0 && s.sched_ns >= s.sendmsg_ns, "{s:?}");
                assert!(s.sw_ns >= s.sched_ns && s.ack_ns >= s.sw_ns, "{s:?}");
                assert_eq!(s.pid, std::process::id(), "{s:?}");
            }
        }
        let c = |k: FlowCounter| counters[k as usize];
        assert!(c(FlowCounter::SocketsUnwatched) >= 4, "{counters:?}");
        assert!(
            c(FlowCounter::SocketsUnwatched) <= c(FlowCounter::SocketsWatched),
            "{counters:?}"
        );
    }
}
