//! One synchronous NETLINK_ROUTE socket and the typed requests rtprobe
//! makes on it: links (get, veth add, delete, up/down, MTU, move to another
//! namespace), addresses (IPv4 and IPv6), routes (dump, add), qdisc dumps
//! and the XDP state of a link. Every request carries its own sequence
//! number and is answered by an ack, an error or a dump ending in DONE;
//! answers with another sequence number are skipped.
//!
//! Kernel interface: NETLINK_ROUTE, RTM_{GET,NEW,DEL,SET}LINK, RTM_{GET,NEW}ADDR,
//! RTM_{GET,NEW}ROUTE, RTM_GETQDISC; Linux >= 2.6 (IFLA_NET_NS_FD >= 3.0,
//! per-mode IFLA_XDP_*_PROG_ID >= 4.19). The socket talks to the network
//! namespace it was created in; [`super::LinuxSys`] creates one per namespace
//! on a thread that lives in it.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::RawFd,
};

use anyhow::{Context, Result, anyhow};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressHeaderFlags, AddressMessage},
    link::{
        InfoData, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, LinkXdp, XdpAttached,
    },
    route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage},
    tc::{TcAttribute, TcHandle, TcMessage, TcStats2},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use rtnetlink::{LinkUnspec, LinkVeth};

use super::{Addr, Link, QdiscInfo, Route, XdpState};

/// A netlink error answer, with the errno the kernel gave.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub(crate) struct NlError {
    pub(crate) what: String,
    pub(crate) source: std::io::Error,
}

impl NlError {
    pub(crate) fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// Is `e` a netlink error with this errno?
pub(crate) fn is_errno(e: &anyhow::Error, errno: i32) -> bool {
    e.chain()
        .any(|c| c.downcast_ref::<NlError>().and_then(NlError::errno) == Some(errno))
}

/// A NETLINK_ROUTE socket bound in the namespace it was created in.
pub(crate) struct NlSocket {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl NlSocket {
    pub(crate) fn new() -> Result<Self> {
        let mut sock = Socket::new(NETLINK_ROUTE).context("open a NETLINK_ROUTE socket")?;
        sock.bind_auto().context("bind the netlink socket")?;
        sock.connect(&SocketAddr::new(0, 0))
            .context("connect the netlink socket")?;
        Ok(Self {
            sock,
            seq: 0,
            buf: vec![0; 64 * 1024],
        })
    }

    /// Sends one request and collects the answer: the inner messages of a
    /// dump (until DONE), or of a single request (until its ack, which
    /// every non-dump request asks for).
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1).max(1);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | flags | if dump { 0 } else { NLM_F_ACK };
        req.header.sequence_number = self.seq;
        req.finalize();
        let mut out = vec![0u8; req.buffer_len()];
        req.serialize(&mut out);
        self.sock
            .send(&out, 0)
            .with_context(|| format!("send netlink request ({})", what()))?;
        let mut found = Vec::new();
        loop {
            let n = self
                .sock
                .recv(&mut &mut self.buf[..], 0)
                .with_context(|| format!("receive the netlink answer ({})", what()))?;
            let mut off = 0;
            while off < n {
                let m: NetlinkMessage<RouteNetlinkMessage> =
                    NetlinkMessage::deserialize(&self.buf[off..n])
                        .with_context(|| format!("parse a netlink answer ({})", what()))?;
                let len = m.header.length as usize;
                if m.header.sequence_number == self.seq {
                    match m.payload {
                        NetlinkPayload::Done(_) => return Ok(found),
                        NetlinkPayload::Error(e) => match e.code {
                            Some(_) => {
                                return Err(NlError {
                                    what: what(),
                                    source: e.to_io(),
                                }
                                .into());
                            }
                            // An ack: the end of a non-dump request.
                            None => return Ok(found),
                        },
                        NetlinkPayload::InnerMessage(inner) => found.push(inner),
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                off += (len + 3) & !3;
            }
        }
    }

    fn change(&mut self, msg: RouteNetlinkMessage, flags: u16, what: String) -> Result<()> {
        self.request(msg, flags, &|| what.clone()).map(drop)
    }

    /// The link called `name`, None when there is none.
    pub(crate) fn link(&mut self, name: &str) -> Result<Option<Link>> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(RouteNetlinkMessage::GetLink(msg), 0, &|| {
            format!("look up interface {name}")
        }) {
            Ok(v) => Ok(v.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(link_of(&l)),
                _ => None,
            })),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The link with this index, None when there is none.
    pub(crate) fn link_by_index(&mut self, index: u32) -> Result<Option<(Link, XdpState)>> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        match self.request(RouteNetlinkMessage::GetLink(msg), 0, &|| {
            format!("RTM_GETLINK for ifindex {index}")
        }) {
            Ok(v) => Ok(v.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some((link_of(&l), xdp_of(&l))),
                _ => None,
            })),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn require_link(&mut self, name: &str) -> Result<Link> {
        self.link(name)?
            .ok_or_else(|| crate::error::Error::InterfaceNotFound(name.to_string()).into())
    }

    pub(crate) fn add_veth(&mut self, name: &str, peer: &str) -> Result<()> {
        self.change(
            RouteNetlinkMessage::NewLink(LinkVeth::new(name, peer).build()),
            NLM_F_CREATE | NLM_F_EXCL,
            format!("create veth pair {name}/{peer} (is the veth driver available?)"),
        )
    }

    /// A veth pair whose ends have `queues` TX and RX queues each (what
    /// `ip link add NAME numtxqueues Q numrxqueues Q type veth peer name
    /// PEER numtxqueues Q numrxqueues Q` asks for).
    pub(crate) fn add_veth_queues(&mut self, name: &str, peer: &str, queues: u32) -> Result<()> {
        let mut m = LinkVeth::new(name, peer).build();
        let q = [
            LinkAttribute::NumTxQueues(queues),
            LinkAttribute::NumRxQueues(queues),
        ];
        m.attributes.extend(q.clone());
        let mut peer_set = false;
        for a in &mut m.attributes {
            if let LinkAttribute::LinkInfo(infos) = a {
                for i in infos {
                    if let LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(p))) = i {
                        p.attributes.extend(q.clone());
                        peer_set = true;
                    }
                }
            }
        }
        if !peer_set {
            return Err(anyhow!(
                "veth {name}/{peer}: the request has no peer to give {queues} queues"
            ));
        }
        self.change(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL,
            format!("create veth pair {name}/{peer} with {queues} queues (is the veth driver available?)"),
        )
    }

    #[cfg(test)]
    pub(crate) fn delete_link(&mut self, name: &str) -> Result<()> {
        let index = self.require_link(name)?.index;
        self.change(
            RouteNetlinkMessage::DelLink(LinkUnspec::new_with_index(index).build()),
            0,
            format!("delete interface {name}"),
        )
    }

    pub(crate) fn set_up(&mut self, name: &str, up: bool) -> Result<()> {
        let index = self.require_link(name)?.index;
        let b = LinkUnspec::new_with_index(index);
        let b = if up { b.up() } else { b.down() };
        self.change(
            RouteNetlinkMessage::SetLink(b.build()),
            0,
            format!("set {name} {}", if up { "up" } else { "down" }),
        )
    }

    pub(crate) fn set_mtu(&mut self, name: &str, mtu: u32) -> Result<()> {
        let index = self.require_link(name)?.index;
        self.change(
            RouteNetlinkMessage::SetLink(LinkUnspec::new_with_index(index).mtu(mtu).build()),
            0,
            format!("set the MTU of {name} to {mtu}"),
        )
    }

    /// Moves a link into the namespace behind `ns_fd`.
    pub(crate) fn move_link(&mut self, name: &str, ns_fd: RawFd) -> Result<()> {
        let index = self.require_link(name)?.index;
        self.change(
            RouteNetlinkMessage::SetLink(
                LinkUnspec::new_with_index(index).setns_by_fd(ns_fd).build(),
            ),
            0,
            format!("move {name} to another network namespace"),
        )
    }

    /// IPv4 and IPv6 addresses of `name`.
    pub(crate) fn addrs(&mut self, name: &str) -> Result<Vec<Addr>> {
        let index = self.require_link(name)?.index;
        let msgs = self.request(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
            &|| format!("list the addresses of {name}"),
        )?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewAddress(a) = m else {
                continue;
            };
            if a.header.index != index {
                continue;
            }
            // IFA_LOCAL is the interface's own address on point-to-point
            // links; IFA_ADDRESS otherwise (and for IPv6 always).
            let local = a.attributes.iter().find_map(|x| match x {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let addr = local.or_else(|| {
                a.attributes.iter().find_map(|x| match x {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })
            });
            if let Some(addr) = addr {
                let e = Addr {
                    addr,
                    prefix_len: a.header.prefix_len,
                };
                if !out.contains(&e) {
                    out.push(e);
                }
            }
        }
        Ok(out)
    }

    /// Adds an address; one that is already there is fine. IPv6 addresses
    /// skip duplicate address detection (they are being given back, or
    /// are private to a namespace), so routes through them work at once.
    pub(crate) fn add_addr(&mut self, name: &str, a: Addr) -> Result<()> {
        let index = self.require_link(name)?.index;
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        msg.header.prefix_len = a.prefix_len;
        match a.addr {
            IpAddr::V4(v4) => {
                msg.header.family = AddressFamily::Inet;
                msg.attributes.push(AddressAttribute::Local(a.addr));
                msg.attributes.push(AddressAttribute::Address(a.addr));
                if a.prefix_len < 31 {
                    let brd = Ipv4Addr::from(u32::from(v4) | (u32::MAX >> a.prefix_len));
                    msg.attributes.push(AddressAttribute::Broadcast(brd));
                }
            }
            IpAddr::V6(_) => {
                msg.header.family = AddressFamily::Inet6;
                msg.header.flags = AddressHeaderFlags::Nodad;
                msg.attributes.push(AddressAttribute::Local(a.addr));
                msg.attributes.push(AddressAttribute::Address(a.addr));
            }
        }
        match self.change(
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            format!("add address {}/{} to {name}", a.addr, a.prefix_len),
        ) {
            Err(e) if is_errno(&e, libc::EEXIST) => Ok(()),
            r => r,
        }
    }

    /// Unicast routes of the main table (IPv4 and IPv6).
    pub(crate) fn routes(&mut self) -> Result<Vec<Route>> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut msg = RouteMessage::default();
            msg.header.address_family = family;
            let msgs = self.request(RouteNetlinkMessage::GetRoute(msg), NLM_F_DUMP, &|| {
                "list the routes".to_string()
            })?;
            for m in msgs {
                let RouteNetlinkMessage::NewRoute(r) = m else {
                    continue;
                };
                if let Some(route) = self.route_of(&r)? {
                    out.push(route);
                }
            }
        }
        Ok(out)
    }

    fn route_of(&mut self, r: &RouteMessage) -> Result<Option<Route>> {
        let table = r
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(r.header.table.into());
        if table != u32::from(RouteHeader::RT_TABLE_MAIN) || u8::from(r.header.kind) != 1 {
            return Ok(None);
        }
        let ip = |a: &RouteAddress| match a {
            RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
            RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
            _ => None,
        };
        let v6 = r.header.address_family == AddressFamily::Inet6;
        let unspecified = if v6 {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        let mut route = Route {
            dst: unspecified,
            prefix_len: r.header.destination_prefix_length,
            gateway: None,
            dev: None,
            metric: None,
            protocol: r.header.protocol.into(),
            scope: r.header.scope.into(),
            pref_src: None,
        };
        for a in &r.attributes {
            match a {
                RouteAttribute::Destination(d) => route.dst = ip(d).unwrap_or(unspecified),
                RouteAttribute::Gateway(g) => route.gateway = ip(g),
                RouteAttribute::PrefSource(s) => route.pref_src = ip(s),
                RouteAttribute::Priority(p) => route.metric = Some(*p),
                RouteAttribute::Oif(i) => {
                    route.dev = self.link_by_index(*i)?.map(|(l, _)| l.name);
                }
                _ => {}
            }
        }
        Ok(Some(route))
    }

    /// Adds a route to the main table; one that is already there is fine.
    pub(crate) fn add_route(&mut self, route: &Route) -> Result<()> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = if route.dst.is_ipv6() {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        msg.header.destination_prefix_length = route.prefix_len;
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.protocol = route.protocol.into();
        msg.header.scope = route.scope.into();
        msg.header.kind = 1u8.into();
        if route.prefix_len > 0 {
            msg.attributes
                .push(RouteAttribute::Destination(route.dst.into()));
        }
        if let Some(g) = route.gateway {
            msg.attributes.push(RouteAttribute::Gateway(g.into()));
        }
        if let Some(s) = route.pref_src {
            msg.attributes.push(RouteAttribute::PrefSource(s.into()));
        }
        if let Some(m) = route.metric {
            msg.attributes.push(RouteAttribute::Priority(m));
        }
        if let Some(dev) = &route.dev {
            let index = self.require_link(dev)?.index;
            msg.attributes.push(RouteAttribute::Oif(index));
        }
        match self.change(
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            format!("add route {route}"),
        ) {
            Err(e) if is_errno(&e, libc::EEXIST) => Ok(()),
            r => r,
        }
    }

    /// All qdiscs of interface `ifindex`.
    pub(crate) fn qdiscs(&mut self, ifindex: u32) -> Result<Vec<QdiscInfo>> {
        let mut msg = TcMessage::default();
        msg.header.index = ifindex as i32;
        let msgs = self.request(
            RouteNetlinkMessage::GetQueueDiscipline(msg),
            NLM_F_DUMP,
            &|| "RTM_GETQDISC".to_string(),
        )?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewQueueDiscipline(q) if q.header.index as u32 == ifindex => {
                    Some(qdisc_info(&q))
                }
                _ => None,
            })
            .collect())
    }

    /// Which XDP programs are attached to `ifindex`.
    pub(crate) fn xdp_state(&mut self, ifindex: u32) -> Result<XdpState> {
        self.link_by_index(ifindex)?
            .map(|(_, x)| x)
            .ok_or_else(|| anyhow!("RTM_GETLINK for ifindex {ifindex}: no such device"))
    }
}

fn link_of(l: &LinkMessage) -> Link {
    let mut link = Link {
        index: l.header.index,
        name: String::new(),
        up: l.header.flags.contains(LinkFlags::Up),
        mtu: None,
    };
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Mtu(m) => link.mtu = Some(*m),
            _ => {}
        }
    }
    link
}

pub(crate) fn xdp_of(link: &LinkMessage) -> XdpState {
    let mut st = XdpState::default();
    let (mut attached, mut prog_id) = (XdpAttached::None, None);
    for attr in &link.attributes {
        if let LinkAttribute::Xdp(xdp) = attr {
            for x in xdp {
                match *x {
                    LinkXdp::SkbProgId(id) if id != 0 => st.skb_prog_id = Some(id),
                    LinkXdp::DrvProgId(id) if id != 0 => st.drv_prog_id = Some(id),
                    LinkXdp::HwProgId(id) if id != 0 => st.hw_prog_id = Some(id),
                    LinkXdp::Attached(a) => attached = a,
                    LinkXdp::ProgId(id) if id != 0 => prog_id = Some(id),
                    _ => {}
                }
            }
        }
    }
    // Kernels before 4.19 report only the mode and one id.
    if st.is_empty() {
        match attached {
            XdpAttached::SocketBuffer => st.skb_prog_id = prog_id,
            XdpAttached::Driver => st.drv_prog_id = prog_id,
            XdpAttached::Hardware => st.hw_prog_id = prog_id,
            _ => {}
        }
    }
    st
}

pub(crate) fn fmt_handle(h: &TcHandle) -> String {
    if *h == TcHandle::ROOT {
        "root".into()
    } else if h.minor == 0 {
        format!("{:x}:", h.major)
    } else {
        format!("{:x}:{:x}", h.major, h.minor)
    }
}

fn qdisc_info(q: &TcMessage) -> QdiscInfo {
    let mut i = QdiscInfo {
        ifindex: q.header.index as u32,
        kind: String::new(),
        handle: fmt_handle(&q.header.handle),
        parent: fmt_handle(&q.header.parent),
        qlen: 0,
        backlog_bytes: 0,
        drops: 0,
        overlimits: 0,
        requeues: 0,
        sent_bytes: 0,
        sent_packets: 0,
    };
    let mut have_stats2 = false;
    for a in &q.attributes {
        match a {
            TcAttribute::Kind(k) => i.kind = k.clone(),
            TcAttribute::Stats2(v) => {
                for s in v {
                    match s {
                        TcStats2::Queue(qs) => {
                            have_stats2 = true;
                            i.qlen = qs.qlen;
                            i.backlog_bytes = qs.backlog;
                            i.drops = qs.drops;
                            i.overlimits = qs.overlimits;
                            i.requeues = qs.requeues;
                        }
                        TcStats2::Basic(b) => {
                            i.sent_bytes = b.bytes;
                            i.sent_packets = b.packets as u64;
                        }
                        _ => {}
                    }
                }
            }
            TcAttribute::Stats(s) if !have_stats2 => {
                i.qlen = s.qlen;
                i.backlog_bytes = s.backlog;
                i.drops = s.drops;
                i.overlimits = s.overlimits;
                i.sent_bytes = s.bytes;
                i.sent_packets = s.packets as u64;
            }
            _ => {}
        }
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_format_like_tc() {
        assert_eq!(fmt_handle(&TcHandle::ROOT), "root");
        assert_eq!(
            fmt_handle(&TcHandle {
                major: 0x10,
                minor: 0
            }),
            "10:"
        );
        assert_eq!(
            fmt_handle(&TcHandle {
                major: 1,
                minor: 0x14
            }),
            "1:14"
        );
        assert_eq!(fmt_handle(&TcHandle { major: 0, minor: 0 }), "0:");
    }
}
