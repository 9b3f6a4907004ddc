//! Loads rtprobe's in-kernel reflector (`xdp_reflector`, in the same
//! embedded object as the router), sets its ports and rate limits at load
//! time, keeps its TAI -> REALTIME offset current, tells it which MAC and
//! addresses it answers for, attaches it to one interface and reads its
//! per-outcome counters. Dropping it detaches it.
//!
//! What it answers for: before attaching, the interface's MAC (sysfs
//! `address`) and addresses (rtnetlink RTM_GETADDR) go into the program's
//! maps, with each IPv4 subnet's broadcast and network address as sources
//! never to answer. The clock thread reads them again every second while
//! attached, so an address added, removed or changed later is followed
//! within about a second (until then a new address is not answered and a
//! removed one still is); a MAC change likewise.
//!
//! The known peers (`--peer`, `--peers`) go into the program's LPM trie
//! once, before it is attached; their budgets are the same load-time
//! limits ([`RateLimits`], shared with the user-space reflector).
//!
//! Kernel interfaces: bpf(2) (BPF_PROG_LOAD, per-CPU and plain arrays,
//! HASH, LRU_HASH and LPM_TRIE maps (Linux 4.11), global data set at load time, BPF_LINK_CREATE
//! for XDP), the program's `bpf_ktime_get_tai_ns` (Linux >= 6.1) and
//! BPF_CMPXCHG (5.12), `adjtimex(2)` (read only) for the kernel's TAI
//! offset, rtnetlink IFLA_XDP to read back the mode and RTM_GETADDR for
//! the addresses, sysfs for the MAC. Minimum kernel: 6.1.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, LpmTrie, MapData, lpm_trie::Key},
    programs::Xdp,
};
use xdp_common::{
    AddrKey, AddrKind, GLOBAL_INTERVAL_GLOBAL, GLOBAL_TOLERANCE_GLOBAL, Gcra, LOG_RARE_GLOBAL,
    PEER_GLOBAL_INTERVAL_GLOBAL, PEER_GLOBAL_TOLERANCE_GLOBAL, REFLECT_PORT_GLOBAL,
    REFLECTOR_ADDRS_MAP, REFLECTOR_ADDRS_MAX, REFLECTOR_CLOCK_MAP, REFLECTOR_COUNTERS_MAP,
    REFLECTOR_IFACE_MAP, REFLECTOR_PEERS_MAP, REFLECTOR_PROGRAM_NAME, REPLY_IFINDEX_GLOBAL,
    ReflectorClock, ReflectorIface, ReflectorOutcome, SOURCE_INTERVAL_GLOBAL,
    SOURCE_TOLERANCE_GLOBAL, STAMP_PORT_GLOBAL, addr_key_v4,
};

use super::{
    AttachedMode, attach_error, attach_flags, detach_checked, explain_load_error,
    explain_program_error, raise_memlock_limit, read_back, read_counters, router_object,
};
pub(crate) use crate::probe::reflect::RateLimits;
use crate::{
    ebpf::XdpMode,
    probe::{
        reflect::Peers,
        stamp::{ClockSync, ErrorEstimate},
    },
    stats::XdpCounters,
    sys::{BpfObject, Ns, Sys, SysRef, XdpLink, XdpProg},
};

/// How often the TAI offset (a leap second changes it) and the
/// interface's MAC and addresses are read again.
const CLOCK_REFRESH: Duration = Duration::from_secs(1);

/// A limit as the program's GCRA globals hold it (interval 0: none).
fn gcra(rate_pps: Option<u32>) -> Gcra {
    rate_pps.map_or(Gcra::default(), |r| {
        Gcra::per_second(r, RateLimits::burst(r))
    })
}

/// What the reflector answers for: one interface's MAC and addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) mac: [u8; 6],
    pub(crate) addrs: Vec<crate::sys::Addr>,
}

impl Identity {
    /// `ifname`'s MAC (sysfs) and addresses (rtnetlink) in `ns`.
    pub(crate) fn read(sys: &dyn Sys, ns: Ns, ifname: &str) -> Result<Self> {
        let text = sys
            .sysfs_read(ns, &crate::sys::netdev_attr(ifname, "address"))
            .with_context(|| format!("reading the MAC of {ifname}"))?;
        let mac = parse_mac(text.trim())
            .with_context(|| format!("{ifname} has no Ethernet MAC ({:?})", text.trim()))?;
        let addrs = sys
            .addrs(ns, ifname)
            .with_context(|| format!("reading the addresses of {ifname}"))?;
        Ok(Identity { mac, addrs })
    }

    /// The address map's entries: every address of the interface as its
    /// own, and for IPv4 subnets wider than /31 the broadcast and network
    /// address (both broadcasts to hosts of old) as never a source. An own
    /// address wins over a broadcast that happens to equal it.
    pub(crate) fn entries(&self) -> BTreeMap<AddrKey, AddrKind> {
        let mut out = BTreeMap::new();
        for a in &self.addrs {
            if let IpAddr::V4(v4) = a.addr
                && a.prefix_len < 31
            {
                let mask = u32::MAX << (32 - a.prefix_len);
                let ip = u32::from(v4);
                for b in [ip | !mask, ip & mask] {
                    out.entry(addr_key_v4(b.to_be_bytes()))
                        .or_insert(AddrKind::Broadcast);
                }
            }
        }
        for a in &self.addrs {
            let key = match a.addr {
                IpAddr::V4(v4) => addr_key_v4(v4.octets()),
                IpAddr::V6(v6) => v6.octets(),
            };
            out.insert(key, AddrKind::Own);
        }
        out
    }
}

/// "aa:bb:cc:dd:ee:ff" as six bytes; None for anything else (a tunnel
/// without a MAC, an InfiniBand address).
fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The program's view of its interface: the maps and what was last written.
struct IdentityMaps {
    iface: Array<MapData, ReflectorIface>,
    addrs: HashMap<MapData, AddrKey, u8>,
    written: BTreeMap<AddrKey, AddrKind>,
}

impl IdentityMaps {
    /// Writes `id` into the maps, removing entries that are gone. Refused
    /// whole when it does not fit, before anything is changed.
    fn write(&mut self, id: &Identity) -> Result<()> {
        let want = id.entries();
        if want.len() > REFLECTOR_ADDRS_MAX as usize {
            bail!(
                "the interface has {} addresses and subnet broadcasts; the in-kernel reflector                  holds at most {REFLECTOR_ADDRS_MAX}",
                want.len()
            );
        }
        for k in self.written.keys().filter(|k| !want.contains_key(*k)) {
            self.addrs
                .remove(k)
                .context("removing an address from the reflector's map")?;
        }
        for (k, v) in &want {
            self.addrs
                .insert(k, &(*v as u8), 0)
                .context("writing an address into the reflector's map")?;
        }
        self.written = want;
        self.iface
            .set(
                0,
                &ReflectorIface {
                    mac: id.mac,
                    _pad: [0; 2],
                },
                0,
            )
            .context("writing the reflector's MAC")
    }
}

/// The interface the refresher follows once attached.
struct Watch {
    sys: SysRef,
    netns: Option<String>,
    ifname: String,
    last: Identity,
}

#[derive(Default)]
struct IdentityState {
    maps: Option<IdentityMaps>,
    watch: Option<Watch>,
}

impl IdentityState {
    /// Reads the watched interface again and writes what changed.
    fn refresh(&mut self) {
        let (Some(maps), Some(w)) = (self.maps.as_mut(), self.watch.as_mut()) else {
            return;
        };
        let ns = w.netns.as_deref().map_or(Ns::Host, Ns::Named);
        match Identity::read(w.sys.as_ref(), ns, &w.ifname) {
            Ok(now) if now != w.last => match maps.write(&now) {
                Ok(()) => {
                    log::info!(
                        "in-kernel reflector: {} changed, now answering for {}",
                        w.ifname,
                        describe(&now)
                    );
                    w.last = now;
                }
                Err(e) => log::warn!("in-kernel reflector: {e:#}"),
            },
            Ok(_) => {}
            // The interface may be going away with its namespace.
            Err(e) => log::debug!("in-kernel reflector: {e:#}"),
        }
    }
}

/// "02:..:bb, 10.0.0.1/24 fd00::1/64" for the log.
fn describe(id: &Identity) -> String {
    let m = id.mac;
    let addrs: Vec<String> = id.addrs.iter().map(|a| a.to_string()).collect();
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}, {}",
        m[0],
        m[1],
        m[2],
        m[3],
        m[4],
        m[5],
        addrs.join(" ")
    )
}

/// The reflector's clock parameters as the kernel states them now: the
/// TAI offset from `adjtimex(2)` (CLOCK_TAI = CLOCK_REALTIME + tai, whole
/// seconds, exact) and the STAMP error estimate of this clock.
pub(crate) fn current_clock() -> ReflectorClock {
    let sync = ClockSync::read_kernel().ok();
    let tai_s = sync.as_ref().map_or(0, |s| s.tai_offset_s);
    let ee = sync
        .as_ref()
        .map_or(ErrorEstimate::from_error_ns(false, 0, false), |s| {
            ErrorEstimate::from_clock_sync(s, false)
        });
    ReflectorClock {
        tai_to_realtime_ns: -(tai_s as i64) * 1_000_000_000,
        stamp_error_estimate: ee.to_bits(),
        _pad: [0; 6],
    }
}

/// The loaded in-kernel reflector.
pub(crate) struct Reflector {
    sys: SysRef,
    prog: XdpProg,
    attached: Option<XdpLink>,
    stop: Arc<AtomicBool>,
    refresher: Option<JoinHandle<()>>,
    identity: Arc<Mutex<IdentityState>>,
    /// The program's rare-path log, when `-vv` asked for it.
    _log: Option<super::klog::KernelLog>,
}

/// Loads the reflector's object with its globals set: the ports, the reply
/// interface and the rate limits (the program itself is loaded after).
fn load_object(
    probe_port: u16,
    stamp_port: u16,
    reply_ifindex: u32,
    limits: RateLimits,
) -> Result<Ebpf> {
    let object = router_object();
    if object.is_empty() {
        bail!(
            "this rtprobe was built with AYA_BUILD_SKIP set and has no in-kernel reflector: \
             rebuild it without AYA_BUILD_SKIP (cargo build)"
        );
    }
    require_caps()?;
    raise_memlock_limit();
    let (source, global, peer_cap) = (
        gcra(limits.per_source_pps),
        gcra(limits.global_pps),
        gcra(limits.peers_pps),
    );
    EbpfLoader::new()
        .override_global(SOURCE_INTERVAL_GLOBAL, &source.interval_ns, true)
        .override_global(SOURCE_TOLERANCE_GLOBAL, &source.tolerance_ns, true)
        .override_global(GLOBAL_INTERVAL_GLOBAL, &global.interval_ns, true)
        .override_global(GLOBAL_TOLERANCE_GLOBAL, &global.tolerance_ns, true)
        .override_global(PEER_GLOBAL_INTERVAL_GLOBAL, &peer_cap.interval_ns, true)
        .override_global(PEER_GLOBAL_TOLERANCE_GLOBAL, &peer_cap.tolerance_ns, true)
        .override_global(REFLECT_PORT_GLOBAL, &probe_port, true)
        .override_global(STAMP_PORT_GLOBAL, &stamp_port, true)
        .override_global(REPLY_IFINDEX_GLOBAL, &reply_ifindex, true)
        .override_global(LOG_RARE_GLOBAL, &super::klog::global(), true)
        .load(object)
        .map_err(explain_load_error)
        .context("cannot load the in-kernel reflector's maps")
}

/// Takes the map `name` out of the loaded object.
fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name)
        .with_context(|| format!("the object has no {name} map"))
}

/// The reflector's clock map, with the current offset written.
fn take_clock(ebpf: &mut Ebpf) -> Result<Array<MapData, ReflectorClock>> {
    let mut clock: Array<MapData, ReflectorClock> =
        Array::try_from(take_map(ebpf, REFLECTOR_CLOCK_MAP)?)
            .context("the reflector clock map has an unexpected type")?;
    clock
        .set(0, &current_clock(), 0)
        .context("writing the reflector's clock offset")?;
    Ok(clock)
}

/// The maps that tell the reflector its interface and addresses.
fn take_identity_maps(ebpf: &mut Ebpf) -> Result<IdentityMaps> {
    Ok(IdentityMaps {
        iface: Array::try_from(take_map(ebpf, REFLECTOR_IFACE_MAP)?)
            .context("the reflector's interface map has an unexpected type")?,
        addrs: HashMap::try_from(take_map(ebpf, REFLECTOR_ADDRS_MAP)?)
            .context("the reflector's address map has an unexpected type")?,
        written: BTreeMap::new(),
    })
}

/// The thread that keeps the reflector's clock offset and identity
/// current until `stop`.
fn spawn_refresher(
    mut clock: Array<MapData, ReflectorClock>,
    stop: Arc<AtomicBool>,
    identity: Arc<Mutex<IdentityState>>,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kreflect-clock".into())
        .spawn(move || {
            let mut last = current_clock();
            while !stop.load(Ordering::Relaxed) {
                std::thread::park_timeout(CLOCK_REFRESH);
                let now = current_clock();
                if now != last && clock.set(0, &now, 0).is_ok() {
                    last = now;
                }
                identity.lock().unwrap_or_else(|e| e.into_inner()).refresh();
            }
        })
        .context("starting the reflector's clock thread")
}

impl Reflector {
    /// Loads the reflector answering rtprobe probes to UDP `probe_port`
    /// and STAMP to `stamp_port` (0: none), within `limits`, with `peers`
    /// as the known peers, the clock offset written and a thread that
    /// keeps it current. Replies leave by XDP_TX, or with
    /// `reply_ifindex` non-zero by a redirect to that interface (the one it
    /// is attached to: what a veth needs, see [`super::XdpSetup`]). It
    /// answers nothing until [`Self::attach`] tells it its interface.
    pub(crate) fn load(
        sys: SysRef,
        probe_port: u16,
        stamp_port: u16,
        reply_ifindex: u32,
        limits: RateLimits,
        peers: &Peers,
    ) -> Result<Self> {
        let mut ebpf = load_object(probe_port, stamp_port, reply_ifindex, limits)?;
        let log = super::klog::KernelLog::start(&mut ebpf, "in-kernel reflector")?;
        let prog = program(&mut ebpf)?;
        prog.load()
            .map_err(|e| explain_program_error(e, "loading the in-kernel reflector"))?;
        let prog_id = prog
            .info()
            .context("reading the loaded reflector's id")?
            .id();

        let clock = take_clock(&mut ebpf)?;
        write_peers(take_map(&mut ebpf, REFLECTOR_PEERS_MAP)?, peers)?;
        let identity = Arc::new(Mutex::new(IdentityState {
            maps: Some(take_identity_maps(&mut ebpf)?),
            watch: None,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let refresher = spawn_refresher(clock, Arc::clone(&stop), Arc::clone(&identity))?;
        Ok(Reflector {
            sys,
            prog: XdpProg {
                obj: BpfObject::new(ebpf),
                name: REFLECTOR_PROGRAM_NAME,
                id: prog_id,
            },
            attached: None,
            stop,
            refresher: Some(refresher),
            identity,
            _log: log,
        })
    }

    /// A reflector that was never loaded, for orchestration tests against
    /// the fake kernel.
    #[cfg(test)]
    pub(crate) fn stand_in(sys: SysRef, prog_id: u32) -> Self {
        Reflector {
            sys,
            prog: XdpProg {
                obj: BpfObject::stand_in(),
                name: REFLECTOR_PROGRAM_NAME,
                id: prog_id,
            },
            attached: None,
            stop: Arc::new(AtomicBool::new(false)),
            refresher: None,
            identity: Arc::default(),
            _log: None,
        }
    }

    /// Answers for `id` from now on (BPF_PROG_TEST_RUN tests; [`Self::attach`]
    /// reads the interface's own).
    pub(crate) fn set_identity(&self, id: &Identity) -> Result<()> {
        let mut st = self.identity.lock().unwrap_or_else(|e| e.into_inner());
        match st.maps.as_mut() {
            Some(m) => m.write(id),
            None => Ok(()),
        }
    }

    /// Attaches to `ifname` in `ns` in `mode` (native, skb or auto) and
    /// returns the mode the kernel reports.
    pub(crate) fn attach<'a>(
        &mut self,
        ns: impl Into<Ns<'a>>,
        ifname: &str,
        mode: XdpMode,
    ) -> Result<AttachedMode> {
        let ns = ns.into();
        let flags = attach_flags(mode)?;
        if self.attached.is_some() {
            bail!("the in-kernel reflector is already attached");
        }
        // Its MAC and addresses first, so the first probe is judged by them.
        let has_maps = self
            .identity
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .maps
            .is_some();
        let id = if has_maps {
            let id = Identity::read(self.sys.as_ref(), ns, ifname)?;
            self.set_identity(&id)?;
            log::info!(
                "in-kernel reflector answers for {ifname}: {}",
                describe(&id)
            );
            Some(id)
        } else {
            None
        };
        let link = self
            .sys
            .xdp_attach(ns, ifname, &self.prog, flags)
            .map_err(|e| attach_error(e, mode, ifname))?;
        let got = match read_back(self.sys.as_ref(), ns, &link, "the reflector") {
            Ok(m) => m,
            Err(e) => {
                let _ = self.sys.xdp_detach(link);
                return Err(e);
            }
        };
        log::info!(
            "in-kernel reflector (prog id {}) attached to {ifname} in namespace {ns} in {got} mode",
            self.prog.id
        );
        self.attached = Some(link);
        if let Some(last) = id {
            self.identity
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .watch = Some(Watch {
                sys: self.sys.clone(),
                netns: match ns {
                    Ns::Host => None,
                    Ns::Named(n) => Some(n.to_string()),
                },
                ifname: ifname.to_string(),
                last,
            });
        }
        Ok(got)
    }

    /// Packets and bytes per outcome, summed over CPUs, every outcome present.
    pub(crate) fn counters(&self) -> Result<XdpCounters> {
        self.prog.obj.with(|ebpf| {
            read_counters(
                ebpf,
                REFLECTOR_COUNTERS_MAP,
                ReflectorOutcome::ALL.iter().map(|o| (o.index(), o.name())),
            )
        })
    }

    /// Detaches from the interface (inside its namespace), if attached.
    pub(crate) fn detach(&mut self) -> Result<()> {
        let Some(a) = self.attached.take() else {
            return Ok(());
        };
        self.identity
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .watch = None;
        let what = format!(
            "detaching the in-kernel reflector from {} in namespace {}",
            a.dev,
            a.ns()
        );
        detach_checked(self.sys.as_ref(), a).context(what)
    }

    /// Runs `f` on the loaded program (BPF_PROG_TEST_RUN in the tests).
    #[cfg(test)]
    pub(super) fn with_xdp<T>(&self, f: impl FnOnce(&Xdp) -> Result<T>) -> Result<T> {
        self.prog.obj.with(|ebpf| {
            f(ebpf
                .program(REFLECTOR_PROGRAM_NAME)
                .context("program")?
                .try_into()?)
        })
    }
}

impl Drop for Reflector {
    fn drop(&mut self) {
        if let Err(e) = self.detach() {
            log::warn!("{e:#}");
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.refresher.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// What loading and attaching the reflector takes, found by trying on
/// Linux 6.18 as uid 65534 (docs/DEPLOY.md): CAP_BPF for the maps,
/// CAP_NET_ADMIN for the object's device map (the router's, in the same
/// object), the XDP program type and the attach, CAP_PERFMON for the
/// verifier to take the program (without it the load fails with EACCES).
/// CAP_SYS_ADMIN alone passes all three checks. Checked first, so that
/// the error names the one that is missing.
fn require_caps() -> Result<()> {
    use crate::sys::caps::{self, CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON, CAP_SYS_ADMIN};
    let eff = caps::effective()?;
    let missing = caps::missing(eff, &[CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN]);
    if missing.is_empty() || caps::missing(eff, &[CAP_SYS_ADMIN]).is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|c| c.name).collect();
    bail!(
        "the in-kernel reflector needs CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, and this process \
         lacks {}: run it as root, or grant them (systemd: AmbientCapabilities=; setpriv \
         --ambient-caps)",
        names.join(" and ")
    )
}

/// Fills the program's LPM trie with the known peers' prefixes, each
/// with its family (which the program checks against the source's).
fn write_peers(map: aya::maps::Map, peers: &Peers) -> Result<()> {
    let mut trie: LpmTrie<MapData, AddrKey, u8> =
        LpmTrie::try_from(map).context("the reflector's peers map has an unexpected type")?;
    for p in peers.prefixes() {
        let family = if p.addr.is_ipv4() { 4u8 } else { 6 };
        trie.insert(&Key::new(u32::from(p.key_len()), p.key()), &family, 0)
            .with_context(|| format!("writing the known peer {p} into the reflector's map"))?;
    }
    Ok(())
}

fn program(ebpf: &mut Ebpf) -> Result<&mut Xdp> {
    ebpf.program_mut(REFLECTOR_PROGRAM_NAME)
        .with_context(|| format!("the XDP object has no program {REFLECTOR_PROGRAM_NAME}"))?
        .try_into()
        .with_context(|| format!("{REFLECTOR_PROGRAM_NAME} is not an XDP program"))
}

/// Puts the loaded in-kernel reflector `r` on `ifname` in `ns`, native
/// where the driver can, else generic: `r` attached, and the mode the
/// kernel reports. The one place the reflector is attached, for the
/// testbed ([`super::XdpSetup::attach_reflector_ports`]) and for a host
/// (`rtprobe reflect --kernel`, [`super::host::attach_kernel`]); on an
/// error `r` is dropped, unloaded.
pub(crate) fn put_on(
    mut r: Reflector,
    ns: Ns<'_>,
    ifname: &str,
) -> Result<(Reflector, AttachedMode)> {
    let mode = r.attach(ns, ifname, XdpMode::Auto)?;
    Ok((r, mode))
}

#[cfg(test)]
mod identity_tests {
    use super::*;
    use crate::sys::Addr;

    fn key(s: &str) -> AddrKey {
        match s.parse::<IpAddr>().unwrap() {
            IpAddr::V4(v4) => addr_key_v4(v4.octets()),
            IpAddr::V6(v6) => v6.octets(),
        }
    }

    #[test]
    fn entries_hold_own_addresses_and_subnet_broadcasts() {
        let a = |s: &str, p| Addr {
            addr: s.parse().unwrap(),
            prefix_len: p,
        };
        let id = Identity {
            mac: [2, 0, 0, 0, 0, 1],
            addrs: vec![
                a("10.77.0.2", 24),
                a("192.0.2.9", 31),
                a("198.51.100.7", 32),
                a("fd77::2", 64),
                a("10.9.0.0", 16),
            ],
        };
        let e = id.entries();
        let want = [
            ("10.77.0.2", AddrKind::Own),
            ("10.77.0.255", AddrKind::Broadcast),
            ("10.77.0.0", AddrKind::Broadcast),
            ("192.0.2.9", AddrKind::Own),
            ("198.51.100.7", AddrKind::Own),
            ("fd77::2", AddrKind::Own),
            ("10.9.255.255", AddrKind::Broadcast),
            // The network address assigned as an address stays answerable.
            ("10.9.0.0", AddrKind::Own),
        ];
        for (k, v) in want {
            assert_eq!(e.get(&key(k)), Some(&v), "{k}");
        }
        assert_eq!(e.len(), want.len(), "/31 and /32 have no broadcast: {e:?}");
    }

    #[test]
    fn macs_parse_or_say_none() {
        assert_eq!(
            parse_mac("02:0a:ff:00:01:bb"),
            Some([2, 0x0a, 0xff, 0, 1, 0xbb])
        );
        for bad in [
            "",
            "02:0a:ff:00:01",
            "02:0a:ff:00:01:bb:cc",
            "2:0a:ff:00:01:bb",
            "zz:0a:ff:00:01:bb",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn limits_follow_the_user_space_burst() {
        assert_eq!(RateLimits::burst(10_000), 1000);
        assert_eq!(RateLimits::burst(50), 16);
        let g = gcra(Some(10_000));
        assert_eq!((g.interval_ns, g.tolerance_ns), (100_000, 999 * 100_000));
        assert_eq!(gcra(None), Gcra::default());
    }
}
