//! A target's address from what the user wrote (`--target`, a targets
//! file): HOST, HOST:PORT or an IPv6 literal, resolved to one socket
//! address. getaddrinfo(3) for names.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use anyhow::{Context, Result, bail};

/// HOST, HOST:PORT, an IPv4 literal, an IPv6 literal (`2001:db8::2`) or one
/// in brackets with a port (`[2001:db8::2]:862`). A name gives its first
/// IPv4 address, else its first IPv6 one.
pub(crate) fn resolve(target: &str, default_port: u16) -> Result<SocketAddr> {
    let t = target.trim();
    if t.is_empty() {
        bail!("--target is empty: give HOST or HOST:PORT, e.g. 192.0.2.7:862 or [2001:db8::2]:862");
    }
    let a = if let Ok(ip) = t.parse::<IpAddr>() {
        SocketAddr::new(ip, default_port)
    } else if let Ok(a) = t.parse::<SocketAddr>() {
        a
    } else if let Some(ip) = t
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|r| r.parse::<std::net::Ipv6Addr>().ok())
    {
        SocketAddr::new(IpAddr::V6(ip), default_port)
    } else if t.starts_with('[') || t.matches(':').count() > 1 {
        bail!(
            "--target {t}: not an IPv6 address with a port; write it as [2001:db8::2]:862 (or without the port)"
        );
    } else {
        let with_port = if t.contains(':') {
            t.to_string()
        } else {
            format!("{t}:{default_port}")
        };
        let addrs: Vec<SocketAddr> = with_port
            .to_socket_addrs()
            .with_context(|| {
                format!("--target {t}: cannot resolve it (give HOST[:PORT], e.g. 192.0.2.7:862)")
            })?
            .collect();
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or_else(|| addrs.first())
            .copied()
            .with_context(|| format!("--target {t} resolves to no address"))?
    };
    if a.port() == 0 {
        bail!("--target {t}: port 0 is not a usable UDP port");
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_resolve_with_and_without_port() {
        assert_eq!(
            resolve("192.0.2.7", 862).unwrap(),
            "192.0.2.7:862".parse().unwrap()
        );
        assert_eq!(
            resolve("192.0.2.7:9000", 862).unwrap(),
            "192.0.2.7:9000".parse().unwrap()
        );
        assert!(resolve("", 1).is_err());
        assert!(resolve("192.0.2.7:0", 1).is_err());
        assert!(resolve("[2001:db8::1]:0", 1).is_err());
        assert_eq!(
            resolve("[2001:db8::1]:9000", 1).unwrap(),
            "[2001:db8::1]:9000".parse().unwrap()
        );
        assert_eq!(
            resolve("[2001:db8::1]", 862).unwrap(),
            "[2001:db8::1]:862".parse().unwrap()
        );
        assert_eq!(
            resolve("2001:db8::1", 862).unwrap(),
            "[2001:db8::1]:862".parse().unwrap()
        );
        assert_eq!(resolve("::1", 5061).unwrap(), "[::1]:5061".parse().unwrap());
        assert!(
            resolve("[2001:db8::1:862", 1)
                .unwrap_err()
                .to_string()
                .contains("[2001:db8::2]:862")
        );
        assert!(resolve("localhost", 5061).unwrap().ip().is_loopback());
    }
}
