//! Reading qdiscs back over rtnetlink (RTM_GETQDISC dump): kind, handle,
//! parent and the queue statistics (TCA_STATS2: qlen, backlog, drops).
//! Used to snapshot the root qdisc before a knob changes it, to verify the
//! restore, and by the queue sampler, which must not fork `tc` every few
//! milliseconds next to a latency measurement.
//!
//! Kernel interface: NETLINK_ROUTE socket, RTM_GETQDISC with NLM_F_DUMP
//! (Linux >= 2.6; TCA_STATS2 since 2.6.x). A netlink socket talks to the
//! network namespace it was created in: create it inside `Netns::run` or on
//! a thread that entered the namespace.

use anyhow::{Context, Result, bail};
use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcAttribute, TcHandle, TcMessage, TcStats2},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use serde::Serialize;

/// One qdisc as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QdiscInfo {
    pub ifindex: u32,
    pub kind: String,
    /// "1:" style, "0:" for the kernel's default qdiscs.
    pub handle: String,
    /// "root" or "1:1" style.
    pub parent: String,
    pub qlen: u32,
    pub backlog_bytes: u32,
    pub drops: u32,
    pub overlimits: u32,
    pub requeues: u32,
    pub sent_bytes: u64,
    pub sent_packets: u64,
}

impl QdiscInfo {
    pub fn is_root(&self) -> bool {
        self.parent == "root"
    }

    /// Default qdiscs the kernel attaches by itself have handle 0:
    /// (noqueue, pfifo_fast, mq and its children, fq_codel as default_qdisc).
    pub fn is_kernel_default(&self) -> bool {
        self.handle == "0:"
    }
}

fn fmt_handle(h: &TcHandle) -> String {
    if *h == TcHandle::ROOT {
        "root".into()
    } else if h.minor == 0 {
        format!("{:x}:", h.major)
    } else {
        format!("{:x}:{:x}", h.major, h.minor)
    }
}

/// A netlink route socket bound in the namespace it was created in.
pub struct RouteSocket {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl RouteSocket {
    pub fn new() -> Result<Self> {
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

    /// All qdiscs of interface `ifindex` in this socket's namespace.
    pub fn qdiscs(&mut self, ifindex: u32) -> Result<Vec<QdiscInfo>> {
        self.seq = self.seq.wrapping_add(1);
        let mut msg = TcMessage::default();
        msg.header.index = ifindex as i32;
        let mut req = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::from(RouteNetlinkMessage::GetQueueDiscipline(msg)),
        );
        req.header.flags = NLM_F_DUMP | NLM_F_REQUEST;
        req.header.sequence_number = self.seq;
        req.finalize();
        let mut out = vec![0u8; req.buffer_len()];
        req.serialize(&mut out);
        self.sock.send(&out, 0).context("send RTM_GETQDISC")?;

        let mut found = Vec::new();
        loop {
            let n = self
                .sock
                .recv(&mut &mut self.buf[..], 0)
                .context("receive the RTM_GETQDISC dump")?;
            let mut off = 0;
            while off < n {
                let m: NetlinkMessage<RouteNetlinkMessage> =
                    NetlinkMessage::deserialize(&self.buf[off..n])
                        .context("parse a netlink qdisc message")?;
                let len = m.header.length as usize;
                if m.header.sequence_number == self.seq {
                    match m.payload {
                        NetlinkPayload::Done(_) => return Ok(found),
                        NetlinkPayload::Error(e) => {
                            if let Some(code) = e.code {
                                bail!(
                                    "RTM_GETQDISC failed: {}",
                                    std::io::Error::from_raw_os_error(-code.get())
                                );
                            }
                        }
                        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewQueueDiscipline(
                            q,
                        )) if q.header.index as u32 == ifindex => {
                            found.push(qdisc_info(&q));
                        }
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                off += nl_align(len);
            }
        }
    }
}

fn nl_align(len: usize) -> usize {
    (len + 3) & !3
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

/// The root qdisc of `ifindex` (None if the device has none, e.g. down).
pub fn root_qdisc(ifindex: u32) -> Result<Option<QdiscInfo>> {
    Ok(RouteSocket::new()?
        .qdiscs(ifindex)?
        .into_iter()
        .find(|q| q.is_root()))
}

/// ifindex of `ifname` in the calling thread's namespace.
pub fn ifindex(ifname: &str) -> Result<u32> {
    nix::net::if_::if_nametoindex(ifname)
        .map_err(|_| crate::error::Error::InterfaceNotFound(ifname.to_string()).into())
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
