//! rtnetlink (NETLINK_ROUTE) helpers, run inside a chosen namespace. The
//! netlink socket belongs to the namespace of the thread that opens it, so
//! each call gets a thread inside the namespace with a small current-thread
//! tokio runtime driving the rtnetlink connection. Linux >= 2.6.
//! (IFLA_NET_NS_FD for moving links: Linux >= 3.0.)

use std::{future::Future, net::Ipv4Addr, os::fd::RawFd};

use anyhow::{Context, Result, anyhow};
use futures::TryStreamExt;
use netlink_packet_route::{
    address::AddressAttribute,
    link::{LinkAttribute, LinkFlags},
};
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};

use super::Netns;

/// Runs `f` with an rtnetlink handle opened inside `ns` (or in the host
/// namespace of the process when `ns` is None).
pub fn with_netlink<T, F, Fut>(ns: Option<&Netns>, f: F) -> Result<T>
where
    F: FnOnce(Handle) -> Fut + Send,
    Fut: Future<Output = Result<T>>,
    T: Send,
{
    let body = move || -> Result<T> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let (conn, handle, _) =
                rtnetlink::new_connection().context("open a NETLINK_ROUTE socket")?;
            let task = tokio::spawn(conn);
            let r = f(handle).await;
            task.abort();
            r
        })
    };
    match ns {
        Some(ns) => ns.run(body),
        None => std::thread::scope(|s| {
            s.spawn(body)
                .join()
                .map_err(|_| anyhow!("netlink thread panicked"))?
        }),
    }
}

/// What we need to know about a link.
#[derive(Debug, Clone)]
pub struct LinkInfo {
    pub index: u32,
    pub name: String,
    pub up: bool,
    pub mtu: Option<u32>,
    pub addrs: Vec<(Ipv4Addr, u8)>,
}

pub async fn link_by_name(h: &Handle, name: &str) -> Result<Option<LinkInfo>> {
    let mut links = h.link().get().match_name(name.to_string()).execute();
    let msg = match links.try_next().await {
        Ok(Some(m)) => m,
        Ok(None) => return Ok(None),
        // ENODEV for an unknown name.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("look up interface {name}")),
    };
    let index = msg.header.index;
    let up = msg.header.flags.contains(LinkFlags::Up);
    let mtu = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::Mtu(m) => Some(*m),
        _ => None,
    });
    let mut addrs = Vec::new();
    let mut s = h.address().get().set_link_index_filter(index).execute();
    while let Some(a) = s.try_next().await.context("list addresses")? {
        if a.header.index != index {
            continue;
        }
        for attr in &a.attributes {
            if let AddressAttribute::Local(std::net::IpAddr::V4(v4))
            | AddressAttribute::Address(std::net::IpAddr::V4(v4)) = attr
                && !addrs.contains(&(*v4, a.header.prefix_len))
            {
                addrs.push((*v4, a.header.prefix_len));
            }
        }
    }
    Ok(Some(LinkInfo {
        index,
        name: name.to_string(),
        up,
        mtu,
        addrs,
    }))
}

pub async fn require_link(h: &Handle, name: &str) -> Result<LinkInfo> {
    link_by_name(h, name)
        .await?
        .ok_or_else(|| anyhow!("interface {name} not found"))
}

pub async fn add_veth(h: &Handle, name: &str, peer: &str) -> Result<()> {
    h.link()
        .add(LinkVeth::new(name, peer).build())
        .execute()
        .await
        .with_context(|| format!("create veth pair {name}/{peer} (is the veth driver available?)"))
}

pub async fn set_up(h: &Handle, index: u32, up: bool) -> Result<()> {
    let b = LinkUnspec::new_with_index(index);
    let b = if up { b.up() } else { b.down() };
    h.link()
        .set(b.build())
        .execute()
        .await
        .with_context(|| format!("set link {index} {}", if up { "up" } else { "down" }))
}

/// Moves a link into the namespace behind `ns_fd`.
pub async fn move_to_netns(h: &Handle, index: u32, ns_fd: RawFd) -> Result<()> {
    h.link()
        .set(LinkUnspec::new_with_index(index).setns_by_fd(ns_fd).build())
        .execute()
        .await
        .with_context(|| format!("move link {index} to another network namespace"))
}

pub async fn add_addr(h: &Handle, index: u32, addr: Ipv4Addr, prefix: u8) -> Result<()> {
    match h.address().add(index, addr.into(), prefix).execute().await {
        Ok(()) => Ok(()),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => Ok(()),
        Err(e) => Err(e).with_context(|| format!("add address {addr}/{prefix}")),
    }
}

pub async fn add_default_route(h: &Handle, gw: Ipv4Addr) -> Result<()> {
    let r = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
        .gateway(gw)
        .build();
    h.route()
        .add(r)
        .execute()
        .await
        .with_context(|| format!("add default route via {gw}"))
}

/// Writes a sysctl under /proc/sys of the calling thread's network
/// namespace (call inside `Netns::run`).
pub fn write_sysctl(key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    std::fs::write(&path, value).with_context(|| format!("set sysctl {key}={value}"))
}

pub fn read_sysctl(key: &str) -> Result<String> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    Ok(std::fs::read_to_string(&path)
        .with_context(|| format!("read sysctl {key}"))?
        .trim()
        .to_string())
}
