//! The two-namespace shape: namespaces A and B joined by one veth pair,
//! with the addresses the caller names on each side (B may hold many: a
//! fleet of targets), optionally A's veth prepared as the peer of a native
//! XDP program on B. `rtprobe testbed --pair` holds one for the root tests
//! and `cargo xtask bench`, so that they build their beds the way the
//! product builds its own, and `rtprobe cleanup` knows them.
//!
//! Kernel interfaces: those of [`super`] (namespaces, netlink links and
//! addresses, /proc/sys/net, ethtool features, all through
//! [`crate::sys::Sys`]); the readiness check sends UDP datagrams between
//! the namespaces through sockets made inside each.

use std::{
    net::{IpAddr, SocketAddr, UdpSocket},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{NS_PREFIX, Undo, ifindex_of, prepare_ns, record};
use crate::sys::{Addr, Netns, Ns, Offload, Sys, SysRef};

/// A's and B's ends of the veth pair.
pub(crate) const A_VETH: &str = "veth-a";
pub(crate) const B_VETH: &str = "veth-b";

/// The most addresses a `--b-addrs-file` may hold (a fleet of 1000
/// targets is the largest user; the cap keeps a wrong file from taking
/// minutes of netlink calls).
pub(crate) const MAX_FILE_ADDRS: usize = 65_536;

/// What to build.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PairSpec {
    /// Part of both namespace names (`rtprobe-ID-TAG-a`): which test or
    /// bench section a leftover belongs to.
    pub tag: Option<String>,
    pub a_addrs: Vec<Addr>,
    pub b_addrs: Vec<Addr>,
    /// A's veth as the peer of a native XDP program on B asks: GRO
    /// requested (XDP_TX/REDIRECT into a veth needs it on the receiving
    /// end) and TX checksumming off (locally sent UDP otherwise leaves
    /// with a partial checksum that native XDP does not fill in).
    pub xdp_peer: bool,
}

/// The pair once built.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PairLayout {
    pub a: String,
    pub b: String,
    pub a_ifindex: u32,
    pub b_ifindex: u32,
}

/// Parses `ADDR/LEN` (`10.77.0.1/24`, `fd77::1/64`).
pub(crate) fn parse_addr(s: &str) -> Result<Addr, String> {
    let s = s.trim();
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?}: give ADDR/LEN, e.g. 10.77.0.1/24 or fd77::1/64"))?;
    let addr: IpAddr = ip
        .parse()
        .map_err(|_| format!("{ip:?} is not an IPv4 or IPv6 address"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix_len = len
        .parse::<u8>()
        .ok()
        .filter(|l| *l <= max)
        .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?;
    Ok(Addr { addr, prefix_len })
}

/// Reads one `ADDR/LEN` a line (blank lines and `#` comments skipped).
pub(crate) fn read_addrs_file(path: &Path) -> Result<Vec<Addr>> {
    let bytes = crate::input::read_capped(path, "address file", crate::input::MAX_CONFIG_BYTES)?;
    let text = String::from_utf8(bytes)
        .with_context(|| format!("{} is not UTF-8 text", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let a =
            parse_addr(line).map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), n + 1))?;
        out.push(a);
    }
    if out.len() > MAX_FILE_ADDRS {
        bail!(
            "{} holds {} addresses; at most {MAX_FILE_ADDRS} are taken",
            path.display(),
            out.len()
        );
    }
    Ok(out)
}

/// Checks a tag for use in a namespace name.
pub(crate) fn check_tag(tag: &str) -> Result<()> {
    let ok = !tag.is_empty()
        && tag.len() <= 32
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok {
        bail!("--name {tag:?}: use 1 to 32 letters, digits, '-' or '_'");
    }
    Ok(())
}

/// The namespace names of pair `id`: `rtprobe-ID[-TAG]-a` and `-b`.
pub(crate) fn names(id: &str, tag: Option<&str>) -> (String, String) {
    let stem = match tag {
        Some(t) => format!("{NS_PREFIX}{id}-{t}"),
        None => format!("{NS_PREFIX}{id}"),
    };
    (format!("{stem}-a"), format!("{stem}-b"))
}

/// Builds A and B through `sys`, each namespace on `undo` (the veth goes
/// with them).
pub(crate) fn build_pair(
    sys: &dyn Sys,
    id: &str,
    spec: &PairSpec,
    undo: &mut Undo,
) -> Result<PairLayout> {
    if spec.a_addrs.is_empty() || spec.b_addrs.is_empty() {
        bail!(
            "a pair needs at least one address on each side (--a-addr, --b-addr or --b-addrs-file)"
        );
    }
    if let Some(x) = spec
        .a_addrs
        .iter()
        .find(|x| spec.b_addrs.iter().any(|y| y.addr == x.addr))
    {
        bail!(
            "{} is given to both A and B: give each side its own addresses",
            x.addr
        );
    }
    if let Some(t) = &spec.tag {
        check_tag(t)?;
    }
    let (a, b) = names(id, spec.tag.as_deref());
    let mut ipv6 = true;
    for ns in [&a, &b] {
        undo.create_netns(sys, ns)?;
        ipv6 &= prepare_ns(sys, ns)?;
    }
    let wants_v6 = spec
        .a_addrs
        .iter()
        .chain(&spec.b_addrs)
        .any(|x| x.addr.is_ipv6());
    if wants_v6 && !ipv6 {
        bail!("this kernel has no IPv6 (no /proc/sys/net/ipv6): give IPv4 addresses only");
    }
    let (an, bn) = (Ns::Named(&a), Ns::Named(&b));
    sys.add_veth(an, A_VETH, B_VETH)?;
    sys.move_link(an, B_VETH, bn)?;
    if spec.xdp_peer {
        // Off then on: on makes it requested (wanted), not merely on by
        // default, which is what a veth's XDP redirect target checks.
        sys.set_offload(an, A_VETH, Offload::Gro, false)?;
        sys.set_offload(an, A_VETH, Offload::Gro, true)?;
        sys.set_offload(an, A_VETH, Offload::TxCsum, false)?;
    }
    for (ns, dev, addrs) in [(an, A_VETH, &spec.a_addrs), (bn, B_VETH, &spec.b_addrs)] {
        for x in addrs {
            sys.add_addr(ns, dev, *x)?;
        }
        sys.set_up(ns, dev, true)?;
    }
    Ok(PairLayout {
        a_ifindex: ifindex_of(sys, an, A_VETH)?,
        b_ifindex: ifindex_of(sys, bn, B_VETH)?,
        a,
        b,
    })
}

/// A built pair. Dropping it removes both namespaces.
#[derive(Debug)]
pub(crate) struct VethPair {
    pub id: String,
    pub a: Netns,
    pub b: Netns,
    pub layout: PairLayout,
    pub spec: PairSpec,
    undo: Undo,
}

impl VethPair {
    /// Builds the pair, recorded in /run/rtprobe for `rtprobe cleanup`.
    pub fn new(sys: SysRef, spec: PairSpec) -> Result<Self> {
        super::require_root()?;
        record::mention_stale();
        let id = super::new_id();
        let rec = record::Record::new_kind(std::path::Path::new(record::RUN_DIR), &id, "pair")?;
        Self::recorded(sys, id, spec, Some(rec))
    }

    /// [`VethPair::new`] with the id and the record chosen by the caller.
    pub(crate) fn recorded(
        sys: SysRef,
        id: String,
        spec: PairSpec,
        rec: Option<record::Record>,
    ) -> Result<Self> {
        let mut undo = Undo::new(sys.clone(), rec);
        let layout = build_pair(sys.as_ref(), &id, &spec, &mut undo)?;
        Ok(Self {
            a: sys.open_netns(&layout.a)?,
            b: sys.open_netns(&layout.b)?,
            id,
            layout,
            spec,
            undo,
        })
    }

    /// Returns once, for each family both sides have, a datagram from A's
    /// first address of it reaches B's and one from B reaches A: the
    /// carrier is up on both ends (until the kernel's link watcher sees
    /// it, up to 1 s after "up", a veth drops what it is given) and the
    /// neighbours answer. Fails after `within`.
    pub fn wait_answering(&self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        for v6 in [false, true] {
            let first = |v: &[Addr]| v.iter().map(|x| x.addr).find(|ip| ip.is_ipv6() == v6);
            let (Some(a), Some(b)) = (first(&self.spec.a_addrs), first(&self.spec.b_addrs)) else {
                continue;
            };
            datagram_arrives(&self.a, a, &self.b, b, deadline)?;
            datagram_arrives(&self.b, b, &self.a, a, deadline)?;
        }
        Ok(())
    }

    /// Removes both namespaces now, reporting the first error.
    pub fn teardown(mut self) -> Result<()> {
        self.undo.run()
    }
}

/// Sends a datagram from `src` in `from` to `dst` in `to` every 100 ms
/// until one arrives, or fails at `deadline`.
fn datagram_arrives(
    from: &Netns,
    src: IpAddr,
    to: &Netns,
    dst: IpAddr,
    deadline: Instant,
) -> Result<()> {
    // Sockets stay in the namespace they were made in.
    let rx =
        to.run(|| UdpSocket::bind(SocketAddr::new(dst, 0)).with_context(|| format!("bind {dst}")))?;
    rx.set_read_timeout(Some(Duration::from_millis(100)))?;
    let port = rx.local_addr()?.port();
    let tx = from
        .run(|| UdpSocket::bind(SocketAddr::new(src, 0)).with_context(|| format!("bind {src}")))?;
    let mut buf = [0u8; 64];
    loop {
        // A send may fail while the neighbour is unresolved: try again.
        let _ = tx.send_to(b"rtprobe testbed", SocketAddr::new(dst, port));
        if let Ok((_, peer)) = rx.recv_from(&mut buf)
            && peer.ip() == src
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "no datagram from {src} in {} reached {dst} in {} within the deadline: \
                 the veth's carrier did not come up, or a route or firewall there drops it",
                from.name(),
                to.name()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sys::fake::{Call, FakeSys};

    fn h(s: &str) -> String {
        s.to_string()
    }

    fn addr(s: &str) -> Addr {
        parse_addr(s).unwrap()
    }

    fn spec() -> PairSpec {
        PairSpec {
            tag: Some(h("remote_e2e")),
            a_addrs: vec![addr("10.77.0.1/24"), addr("fd77::1/64")],
            b_addrs: vec![addr("10.77.0.2/24"), addr("fd77::2/64")],
            xdp_peer: true,
        }
    }

    #[test]
    fn pair_build_makes_these_calls_in_this_order_and_its_undo_removes_both() {
        let sys = Arc::new(FakeSys::new());
        let mut undo = Undo::new(sys.clone(), None);
        let l = build_pair(sys.as_ref(), "abc", &spec(), &mut undo).unwrap();
        let (a, b) = (h("rtprobe-abc-remote_e2e-a"), h("rtprobe-abc-remote_e2e-b"));
        assert_eq!((&l.a, &l.b), (&a, &b));
        let changes = sys.changes();
        // Each namespace is made and prepared (IPv6 sysctls, lo up) first.
        let prepared: Vec<_> = changes.iter().take(16).collect();
        assert_eq!(prepared[0], &Call::CreateNetns(a.clone()));
        assert_eq!(prepared[7], &Call::SetUp(a.clone(), h("lo"), true));
        assert_eq!(prepared[8], &Call::CreateNetns(b.clone()));
        assert_eq!(prepared[15], &Call::SetUp(b.clone(), h("lo"), true));
        let want = vec![
            Call::AddVeth(a.clone(), h(A_VETH), h(B_VETH)),
            Call::MoveLink(a.clone(), h(B_VETH), b.clone()),
            Call::SetOffload(a.clone(), h(A_VETH), Offload::Gro, false),
            Call::SetOffload(a.clone(), h(A_VETH), Offload::Gro, true),
            Call::SetOffload(a.clone(), h(A_VETH), Offload::TxCsum, false),
            Call::AddAddr(a.clone(), h(A_VETH), addr("10.77.0.1/24")),
            Call::AddAddr(a.clone(), h(A_VETH), addr("fd77::1/64")),
            Call::SetUp(a.clone(), h(A_VETH), true),
            Call::AddAddr(b.clone(), h(B_VETH), addr("10.77.0.2/24")),
            Call::AddAddr(b.clone(), h(B_VETH), addr("fd77::2/64")),
            Call::SetUp(b.clone(), h(B_VETH), true),
        ];
        assert_eq!(changes[16..], want[..]);
        drop(undo);
        let tail = sys.changes().split_off(changes.len());
        assert_eq!(
            tail,
            vec![Call::DeleteNetns(b.clone()), Call::DeleteNetns(a.clone())]
        );
        assert!(sys.netns_list().is_empty());
    }

    #[test]
    fn pair_build_failing_at_any_step_leaves_no_namespace() {
        let n = {
            let sys = Arc::new(FakeSys::new());
            let mut undo = Undo::new(sys.clone(), None);
            build_pair(sys.as_ref(), "abc", &spec(), &mut undo).unwrap();
            sys.changes().len()
        };
        for k in 0..n {
            let sys = Arc::new(FakeSys::new());
            let seen = std::sync::atomic::AtomicUsize::new(0);
            sys.fail_when(move |c| {
                c.is_change() && seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == k
            });
            let mut undo = Undo::new(sys.clone(), None);
            // An IPv6 sysctl that fails makes the IPv6 addresses an error.
            let err = build_pair(sys.as_ref(), "abc", &spec(), &mut undo).unwrap_err();
            assert!(
                format!("{err:#}").contains("injected failure") || err.to_string().contains("IPv6"),
                "step {k}: {err:#}"
            );
            drop(undo);
            assert!(sys.netns_list().is_empty(), "step {k}");
        }
    }

    #[test]
    fn pair_without_ipv6_addresses_and_without_xdp_peer_is_plain() {
        let sys = Arc::new(FakeSys::new());
        let mut undo = Undo::new(sys.clone(), None);
        let s = PairSpec {
            tag: None,
            a_addrs: vec![addr("10.91.250.1/16")],
            b_addrs: (1..=3).map(|i| addr(&format!("10.91.0.{i}/16"))).collect(),
            xdp_peer: false,
        };
        let l = build_pair(sys.as_ref(), "f00", &s, &mut undo).unwrap();
        assert_eq!(l.b, "rtprobe-f00-b");
        let calls = sys.changes();
        assert!(!calls.iter().any(|c| matches!(c, Call::SetOffload(..))));
        let on_b = calls
            .iter()
            .filter(|c| matches!(c, Call::AddAddr(ns, _, _) if *ns == l.b))
            .count();
        assert_eq!(on_b, 3);
    }

    #[test]
    fn a_pair_refuses_what_cannot_work_before_it_builds() {
        let sys = Arc::new(FakeSys::new());
        let mut undo = Undo::new(sys.clone(), None);
        let mut s = spec();
        s.b_addrs.clear();
        let e = build_pair(sys.as_ref(), "x", &s, &mut undo).unwrap_err();
        assert!(e.to_string().contains("--b-addr"), "{e}");
        let mut s = spec();
        s.b_addrs.push(addr("10.77.0.1/32"));
        let e = build_pair(sys.as_ref(), "x", &s, &mut undo).unwrap_err();
        assert!(e.to_string().contains("both A and B"), "{e}");
        let mut s = spec();
        s.tag = Some(h("a b"));
        assert!(build_pair(sys.as_ref(), "x", &s, &mut undo).is_err());
        assert!(sys.changes().is_empty());
    }

    #[test]
    fn addresses_parse_with_their_prefix_and_files_skip_comments() {
        assert_eq!(addr("fd77::2/64").to_string(), "fd77::2/64");
        assert!(parse_addr("10.0.0.1").unwrap_err().contains("ADDR/LEN"));
        assert!(parse_addr("10.0.0.1/33").unwrap_err().contains("0 to 32"));
        assert!(parse_addr("fd77::1/129").unwrap_err().contains("0 to 128"));
        assert!(parse_addr("nope/8").unwrap_err().contains("not an IPv4"));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("addrs");
        std::fs::write(&f, "# targets\n10.91.0.1/16\n\n10.91.0.2/16 # second\n").unwrap();
        assert_eq!(
            read_addrs_file(&f).unwrap(),
            vec![addr("10.91.0.1/16"), addr("10.91.0.2/16")]
        );
        std::fs::write(&f, "10.91.0.1/16\nbad\n").unwrap();
        let e = format!("{:#}", read_addrs_file(&f).unwrap_err());
        assert!(e.contains("addrs:2:"), "{e}");
    }

    #[test]
    fn a_pair_record_is_of_kind_pair_and_cleanup_names_its_namespaces() {
        let dir = tempfile::tempdir().unwrap();
        let sys = Arc::new(FakeSys::new());
        let mut rec = record::Record::new_kind(dir.path(), "dead02", "pair").unwrap();
        rec.start_time += 1;
        rec.save().unwrap();
        let mut undo = Undo::new(sys.clone(), Some(rec));
        build_pair(sys.as_ref(), "dead02", &spec(), &mut undo).unwrap();
        std::mem::forget(undo);
        let mut out = Vec::new();
        record::cleanup(sys.as_ref(), dir.path(), false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("testbed dead02 (pair")
                && text.contains("rtprobe-dead02-remote_e2e-a, rtprobe-dead02-remote_e2e-b"),
            "{text}"
        );
        assert!(sys.netns_list().is_empty());
    }
}
