//! The two-namespace shape: namespaces A and B joined by one veth pair,
//! with the addresses the caller names on each side (B may hold many: a
//! fleet of targets), optionally A's veth prepared as the peer of a native
//! XDP program on B. `rtprobe testbed --pair` holds one for the root tests
//! and `cargo xtask bench`, so that they build their beds the way the
//! product builds its own, and `rtprobe cleanup` knows them.
//!
//! Kernel interfaces: those of [`super`] (namespaces, netlink links and
//! addresses, /proc/sys/net, ethtool features, all through
//! [`crate::sys::Sys`]); the readiness check pings across the veth
//! through a raw ICMP socket made inside A.

use std::{
    net::IpAddr,
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
    pub(crate) tag: Option<String>,
    pub(crate) a_addrs: Vec<Addr>,
    pub(crate) b_addrs: Vec<Addr>,
    /// A's veth as the peer of a native XDP program on B asks: GRO
    /// requested (XDP_TX/REDIRECT into a veth needs it on the receiving
    /// end) and TX checksumming off (locally sent UDP otherwise leaves
    /// with a partial checksum that native XDP does not fill in).
    pub(crate) xdp_peer: bool,
}

/// The pair once built.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PairLayout {
    pub(crate) a: String,
    pub(crate) b: String,
    pub(crate) a_ifindex: u32,
    pub(crate) b_ifindex: u32,
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
    pub(crate) id: String,
    /// A's namespace, held open (the readiness check pings from it).
    pub(crate) a: Netns,
    pub(crate) layout: PairLayout,
    pub(crate) spec: PairSpec,
    undo: Undo,
}

impl VethPair {
    /// Builds the pair, recorded in /run/rtprobe for `rtprobe cleanup`.
    pub(crate) fn new(sys: SysRef, spec: PairSpec) -> Result<Self> {
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
            id,
            layout,
            spec,
            undo,
        })
    }

    /// Returns once, for each family both sides have, B's first address
    /// of it answers an ICMP echo from A's: the carrier is up on both ends
    /// (until the kernel's link watcher sees it, up to 1 s after "up", a
    /// veth drops what it is given) and the neighbours answer. Fails after
    /// `within`.
    pub(crate) fn wait_answering(&self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        for v6 in [false, true] {
            let first = |v: &[Addr]| v.iter().map(|x| x.addr).find(|ip| ip.is_ipv6() == v6);
            let (Some(a), Some(b)) = (first(&self.spec.a_addrs), first(&self.spec.b_addrs)) else {
                continue;
            };
            echo_answered(&self.a, a, b, deadline)?;
        }
        Ok(())
    }

    /// Removes both namespaces now, reporting the first error.
    pub(crate) fn teardown(mut self) -> Result<()> {
        self.undo.run()
    }
}

/// Sends an ICMP echo request from `src` in `from` to `dst` every 100 ms
/// until its reply comes back (what ping shows: both ends' carriers up,
/// both neighbours resolved), or fails at `deadline`. ICMP rather than
/// UDP: root tests count the UDP datagrams their namespaces send.
fn echo_answered(from: &Netns, src: IpAddr, dst: IpAddr, deadline: Instant) -> Result<()> {
    // A socket stays in the namespace it was made in.
    let fd = from.run(|| icmp::socket(src))?;
    // The namespace is new: no other pinger's replies to tell apart.
    let id = (std::process::id() & 0xffff) as u16;
    for seq in 1u16.. {
        // A send may fail while the neighbour is unresolved: try again.
        let _ = icmp::send_echo(&fd, dst, id, seq);
        let until = Instant::now() + Duration::from_millis(100);
        while Instant::now() < until {
            if icmp::recv_reply(&fd, dst, id) {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    bail!(
        "{dst} did not answer ICMP echo from {src} in {} within the deadline: \
         the veth's carrier did not come up, or a route or firewall drops it",
        from.name()
    )
}

/// Raw ICMP and ICMPv6 echo through libc (root: raw sockets).
mod icmp {
    use std::{
        net::{IpAddr, SocketAddr},
        os::fd::{AsRawFd, FromRawFd, OwnedFd},
    };

    use anyhow::{Context, Result};

    /// A raw ICMP(v6) socket bound to `src`, reads timing out after 20 ms.
    pub(super) fn socket(src: IpAddr) -> Result<OwnedFd> {
        let (domain, proto) = match src {
            IpAddr::V4(_) => (libc::AF_INET, libc::IPPROTO_ICMP),
            IpAddr::V6(_) => (libc::AF_INET6, libc::IPPROTO_ICMPV6),
        };
        // SAFETY: plain socket(2); the fd goes into an OwnedFd at once.
        let fd = unsafe { libc::socket(domain, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("open a raw ICMP socket");
        }
        // SAFETY: fd is ours and open.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let (sa, len) = sockaddr(SocketAddr::new(src, 0));
        // SAFETY: sa lives through the call; len is its size.
        if unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_storage).cast(),
                len,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("bind {src}"));
        }
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 20_000,
        };
        // SAFETY: tv lives through the call; its size is passed.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        Ok(fd)
    }

    fn sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match a {
            SocketAddr::V4(a) => {
                // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
                let sin = unsafe {
                    &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
                };
                sin.sin_family = libc::AF_INET as u16;
                sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
                let sin6 = unsafe {
                    &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
                };
                sin6.sin6_family = libc::AF_INET6 as u16;
                sin6.sin6_addr.s6_addr = a.ip().octets();
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        (ss, len as libc::socklen_t)
    }

    /// The echo request (type 8, or 128 for ICMPv6 whose checksum the
    /// kernel fills in).
    pub(super) fn echo_request(v6: bool, id: u16, seq: u16) -> Vec<u8> {
        let mut m = vec![if v6 { 128 } else { 8 }, 0, 0, 0];
        m.extend_from_slice(&id.to_be_bytes());
        m.extend_from_slice(&seq.to_be_bytes());
        m.extend_from_slice(b"rtprobe testbed");
        if !v6 {
            let sum = checksum(&m);
            m[2..4].copy_from_slice(&sum.to_be_bytes());
        }
        m
    }

    fn checksum(b: &[u8]) -> u16 {
        let mut s: u32 = b
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum();
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }

    pub(super) fn send_echo(fd: &OwnedFd, dst: IpAddr, id: u16, seq: u16) -> std::io::Result<()> {
        let m = echo_request(dst.is_ipv6(), id, seq);
        let (sa, len) = sockaddr(SocketAddr::new(dst, 0));
        // SAFETY: m and sa live through the call; lengths are theirs.
        let n = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                m.as_ptr().cast(),
                m.len(),
                0,
                (&sa as *const libc::sockaddr_storage).cast(),
                len,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads one message (or times out): is it `dst`'s echo reply to `id`?
    pub(super) fn recv_reply(fd: &OwnedFd, dst: IpAddr, id: u16) -> bool {
        let mut buf = [0u8; 256];
        // SAFETY: buf outlives the call; its length is passed.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return false;
        }
        is_reply(&buf[..n as usize], dst, id)
    }

    /// An ICMPv4 raw socket reads the IP header too; an ICMPv6 one reads
    /// the message only (its source then is the socket's peer: checked
    /// through the reply's id alone, the namespace being ours).
    pub(super) fn is_reply(b: &[u8], dst: IpAddr, id: u16) -> bool {
        let msg = match dst {
            IpAddr::V4(d) => {
                let ihl = usize::from(b.first().map_or(0, |v| v & 0x0f)) * 4;
                if b.len() < ihl + 8 || ihl < 20 || b[12..16] != d.octets() {
                    return false;
                }
                &b[ihl..]
            }
            IpAddr::V6(_) => b,
        };
        let reply_type = if dst.is_ipv6() { 129 } else { 0 };
        msg.len() >= 8 && msg[0] == reply_type && msg[4..6] == id.to_be_bytes()
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
    fn echo_requests_carry_their_id_and_only_the_peers_reply_counts() {
        let v4 = icmp::echo_request(false, 0x1234, 7);
        assert_eq!(&v4[..1], &[8]);
        assert_eq!(&v4[4..8], &[0x12, 0x34, 0, 7]);
        // A correct ICMPv4 checksum sums (with itself) to 0xffff.
        let sum: u32 = v4
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum();
        assert_eq!((sum & 0xffff) + (sum >> 16), 0xffff);
        assert_eq!(icmp::echo_request(true, 1, 1)[0], 128);
        let dst: IpAddr = "10.77.0.2".parse().unwrap();
        let mut reply = vec![0x45u8; 20];
        reply[12..16].copy_from_slice(&[10, 77, 0, 2]);
        reply.extend_from_slice(&[0, 0, 0, 0, 0x12, 0x34, 0, 7]);
        assert!(icmp::is_reply(&reply, dst, 0x1234));
        assert!(!icmp::is_reply(&reply, dst, 0x1235), "another id");
        assert!(!icmp::is_reply(
            &reply,
            "10.77.0.3".parse().unwrap(),
            0x1234
        ));
        reply[20] = 8;
        assert!(
            !icmp::is_reply(&reply, dst, 0x1234),
            "a request, not a reply"
        );
        let v6: IpAddr = "fd77::2".parse().unwrap();
        assert!(icmp::is_reply(&[129, 0, 0, 0, 0, 1, 0, 1], v6, 1));
        assert!(!icmp::is_reply(&[128, 0, 0, 0, 0, 1, 0, 1], v6, 1));
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
