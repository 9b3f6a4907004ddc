//! Which XDP program is attached to an interface, and in which mode, as the
//! kernel reports it: one RTM_GETLINK request on a NETLINK_ROUTE socket,
//! reading the nested IFLA_XDP attributes (IFLA_XDP_ATTACHED and the
//! per-mode IFLA_XDP_{SKB,DRV,HW}_PROG_ID, Linux >= 4.13/4.19).
//!
//! The socket, and so the interface lookup, belongs to the calling
//! thread's network namespace: call these from inside `Netns::run`.

use anyhow::{Context, Result, bail};
use netlink_packet_core::{NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// XDP programs attached to one interface, by mode (kernel program ids).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpState {
    pub skb_prog_id: Option<u32>,
    pub drv_prog_id: Option<u32>,
    pub hw_prog_id: Option<u32>,
}

impl XdpState {
    pub fn is_empty(&self) -> bool {
        self.skb_prog_id.is_none() && self.drv_prog_id.is_none() && self.hw_prog_id.is_none()
    }
}

/// Asks the kernel which XDP programs are attached to `ifindex` (in the
/// calling thread's namespace).
pub fn xdp_state(ifindex: u32) -> Result<XdpState> {
    let mut link = LinkMessage::default();
    link.header.index = ifindex;
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetLink(link));
    req.header.flags = NLM_F_REQUEST;
    req.header.sequence_number = 1;
    req.finalize();
    let mut buf = vec![0u8; req.buffer_len()];
    req.serialize(&mut buf);

    let mut sock = Socket::new(NETLINK_ROUTE).context("open a NETLINK_ROUTE socket")?;
    sock.bind_auto().context("bind the netlink socket")?;
    sock.connect(&SocketAddr::new(0, 0))
        .context("connect the netlink socket")?;
    sock.send(&buf, 0).context("send RTM_GETLINK")?;

    // One RTM_NEWLINK (or an error) answers a non-dump request.
    let mut rx = vec![0u8; 64 * 1024];
    let n = sock
        .recv(&mut &mut rx[..], 0)
        .context("receive RTM_NEWLINK")?;
    let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rx[..n])
        .context("parse the kernel's RTM_NEWLINK")?;
    match msg.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => Ok(parse(&link)),
        NetlinkPayload::Error(e) => {
            Err(e.to_io()).with_context(|| format!("RTM_GETLINK for ifindex {ifindex}"))
        }
        other => bail!(
            "unexpected netlink answer to RTM_GETLINK: type {}",
            other.message_type()
        ),
    }
}

fn parse(link: &LinkMessage) -> XdpState {
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
