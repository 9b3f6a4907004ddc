//! Probing a reflector on another host (`--target`), the probe protocol
//! (`--protocol`), STAMP authentication (`--auth-key`), and the
//! `rtprobe reflect` command's options. Pure: no sockets.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Result, bail};

pub(crate) use crate::probe::wire::ProtocolArg;
pub(crate) use crate::probe::{
    remote::resolve,
    wire::{RTPROBE_PORT, STAMP_PORT},
};

/// Shortest key accepted from a key file: RFC 4868 §2.1.1 wants the
/// HMAC-SHA-256 key as long as its output.
pub(crate) const MIN_KEY_BYTES: usize = 32;

/// Remote target and protocol options of a probe run.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, serde::Serialize, serde::Deserialize)]
#[command(next_help_heading = "Remote target and protocol")]
pub(crate) struct RemoteOptions {
    /// Probe a reflector on another host instead of building a testbed: `rtprobe reflect` there,
    /// or any STAMP reflector with --protocol stamp. HOST[:PORT], IPv4 or IPv6
    /// ([2001:db8::2]:862); the port defaults to --port (862 with --protocol stamp). Needs no
    /// root with software timestamps.
    /// Repeat it to probe several reflectors from one process (each its own socket, sequence
    /// space and statistics; sends spread over the interval); --targets FILE names them.
    #[arg(long, value_name = "HOST[:PORT]")]
    #[serde(
        default,
        serialize_with = "none_if_empty",
        deserialize_with = "one_or_many"
    )]
    pub(crate) target: Vec<String>,

    /// Probe every reflector listed in this TOML file: each [[target]] has a name, address and
    /// optionally labels, protocol, port, tos, size and interval ([defaults] for all). SIGHUP
    /// (or a change of the file) reloads it, at most once a second; a target that cannot be
    /// opened is reported and tried again while the others are probed. A file that fails its
    /// checks exits with status 78 at the start and changes nothing on a reload. See
    /// docs/REMOTE.md.
    #[arg(long, value_name = "FILE", conflicts_with = "target")]
    pub(crate) targets: Option<PathBuf>,

    /// Probe protocol, on testbed runs and with --target [default: rtprobe]. With stamp the
    /// default port is 862.
    #[arg(long, value_enum)]
    pub(crate) protocol: Option<ProtocolArg>,

    /// STAMP authenticated mode (RFC 8762 §4.2.2, 112-byte packets, HMAC-SHA-256): the key is
    /// this file's bytes (at least 32). The reflector needs the same key.
    #[arg(long, value_name = "FILE")]
    pub(crate) auth_key: Option<PathBuf>,
}

impl RemoteOptions {
    pub(crate) fn protocol(&self) -> ProtocolArg {
        self.protocol.unwrap_or_default()
    }

    /// The UDP port probes go to: the target's own, else `--port` unless
    /// left at rtprobe's default with STAMP, which then uses 862.
    pub(crate) fn port(&self, port_arg: u16) -> u16 {
        if self.protocol() == ProtocolArg::Stamp && port_arg == RTPROBE_PORT {
            STAMP_PORT
        } else {
            port_arg
        }
    }

    /// Whether the run probes remote reflectors (`--target` or `--targets`)
    /// instead of building a testbed.
    pub(crate) fn is_remote(&self) -> bool {
        !self.target.is_empty() || self.targets.is_some()
    }
}

/// No `--target` is an unset option (null), as every other one: a merge
/// leaves the file's targets alone, and the key is still known.
fn none_if_empty<S: serde::Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    if v.is_empty() {
        s.serialize_none()
    } else {
        serde::Serialize::serialize(v, s)
    }
}

/// `target = "HOST"` (as scenario files wrote it) or `target = ["A", "B"]`.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match serde::Deserialize::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// Reads an HMAC key file: every byte of it is the key (a trailing newline
/// too: `head -c 32 /dev/urandom > key` gives none). Never logged.
pub(crate) fn read_key(path: &Path) -> Result<crate::probe::stamp::HmacKey> {
    let bytes = crate::input::read_capped(path, "key file", crate::input::MAX_KEY_BYTES)?;
    if bytes.len() < MIN_KEY_BYTES {
        bail!(
            "key file {} holds {} bytes: give at least {MIN_KEY_BYTES} (e.g. head -c 32 /dev/urandom > {})",
            path.display(),
            bytes.len(),
            path.display()
        );
    }
    crate::probe::stamp::HmacKey::new(&bytes).map_err(|e| anyhow::anyhow!("{e}"))
}

/// `--rate-limit 1000/s`, `1000`: datagrams per second from one source.
pub(crate) fn parse_rate(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let n = t.strip_suffix("/s").unwrap_or(t);
    match n.trim().parse::<u32>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(format!(
            "invalid rate {s:?}: give datagrams per second from one source, e.g. 10000/s"
        )),
    }
}

/// `rtprobe reflect`.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[command(
    after_help = "Runs until Ctrl-C or SIGTERM (or --duration), prints one line per new \
    client session (at most 10 a second, then a count of the rest) and the counters on exit.\n\n\
    Examples:\n  \
    rtprobe reflect --listen 0.0.0.0:5061\n  \
    rtprobe reflect --protocol stamp --listen 192.0.2.7:862 --json reflector.json\n  \
    rtprobe reflect --protocol stamp --auth-key stamp.key --rate-limit 2000/s\n  \
    rtprobe reflect --protocol stamp --listen [::]:862 --listen 0.0.0.0:862\n  \
    rtprobe reflect --peers /etc/rtprobe/targets.toml --peer 10.1.0.0/16\n\n\
    Then on the other host: rtprobe --target 192.0.2.7 [--protocol stamp]\n\
    or over IPv6: rtprobe --target [2001:db8::7]:862 --protocol stamp"
)]
pub(crate) struct ReflectArgs {
    /// Address and port to answer on (repeatable; IPv6 as [::]:862) [default: 0.0.0.0 and [::]
    /// on the protocol's port, 5061 for rtprobe, 862 for stamp; IPv4 alone on a host without
    /// IPv6]. The port must be free. Ports below 1024 need root or CAP_NET_BIND_SERVICE.
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) listen: Vec<std::net::SocketAddr>,

    /// Protocol to answer [default: rtprobe].
    #[arg(long, value_enum)]
    pub(crate) protocol: Option<ProtocolArg>,

    /// Stop after this long, e.g. 10min [default: until Ctrl-C or SIGTERM].
    #[arg(long, value_parser = crate::model::units::parse_duration)]
    #[serde(default, with = "crate::model::units::humane_duration::option")]
    pub(crate) duration: Option<Duration>,

    /// Write the counters (and the session list) as JSON to this file on exit (checked
    /// writable at start).
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,

    /// STAMP authenticated mode: answer only 112-byte packets whose HMAC-SHA-256 matches this
    /// key file (at least 32 bytes).
    #[arg(long, value_name = "FILE")]
    pub(crate) auth_key: Option<PathBuf>,

    /// Most datagrams per second answered from one source, e.g. 10000/s: one IPv4 address, or
    /// one IPv6 /64 (one host's addresses: rotating them buys nothing; hosts sharing a /64
    /// share this limit); a known peer has its own bucket at the same rate; the rest are
    /// counted as rate-limited [default: 10000/s].
    #[arg(long, value_name = "N/s", value_parser = parse_rate)]
    pub(crate) rate_limit: Option<u32>,

    /// Most replies per second over every source that is not a known peer, together (the rest
    /// are dropped, counted as global-limited): bounds what a flood from many forged sources
    /// gets, in both reflectors [default: 100000/s].
    #[arg(long, value_name = "N/s", value_parser = parse_rate)]
    pub(crate) global_rate_limit: Option<u32>,

    /// A known peer: probes from this address or prefix (e.g. 192.0.2.7, 10.1.0.0/16,
    /// 2001:db8::/48; repeatable) draw from budgets of their own, which no flood from other
    /// sources can spend: a bucket per peer at --rate-limit and --peers-rate-limit over all
    /// peers, in both reflectors. Peers are told by source address, which can be forged: a
    /// flood forging a peer's address costs that peer, not the others.
    #[arg(long, value_name = "PREFIX")]
    #[serde(default)]
    pub(crate) peer: Vec<crate::probe::reflect::Prefix>,

    /// Known peers from a targets file, as `rtprobe --targets FILE` reads it (a fleet's own
    /// peers file): every target's address is a known peer (see --peer). Read at start.
    #[arg(long, value_name = "FILE")]
    pub(crate) peers: Option<PathBuf>,

    /// Most replies per second to all known peers together (--peer, --peers): the peers' own
    /// budget, apart from --global-rate-limit's [default: 100000/s].
    #[arg(long, value_name = "N/s", value_parser = parse_rate)]
    pub(crate) peers_rate_limit: Option<u32>,

    /// STAMP: answer statelessly (the reply's sequence number is the sender's) instead of
    /// counting per session (RFC 8762 §4.3; stateful lets the sender split loss by direction).
    #[arg(long)]
    #[serde(default)]
    pub(crate) stateless: bool,

    /// Also attach rtprobe's in-kernel XDP reflector to the interface of the (single, IPv4 or
    /// IPv6) --listen address, so the kernel answers before any socket (needs CAP_BPF,
    /// CAP_NET_ADMIN and CAP_PERFMON, or root; without them, or if the attach fails, it stops
    /// with the reason). It answers only unicast probes to that interface's MAC and addresses
    /// from unicast sources, within the same limits as the user-space reflector.
    #[arg(long)]
    #[serde(default)]
    pub(crate) kernel: bool,

    /// No line per new session and no advice (e.g. on a veth's peer): only the lines saying what
    /// runs, warnings and errors.
    #[arg(short, long)]
    #[serde(default)]
    pub(crate) quiet: bool,

    /// Serve Prometheus/OpenMetrics metrics at http://ADDR:PORT/metrics while reflecting:
    /// datagrams by outcome (reflected, not-for-us, bad-source, malformed, rate-limited,
    /// global-limited, auth-failed; known peers' apart) and sessions; with --kernel also the
    /// in-kernel reflector's frames by outcome. Port 0 picks a free one (printed). Anyone who
    /// reaches ADDR may scrape: bind a management address, or add --metrics-token-file.
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(default)]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,

    /// Answer /metrics only to requests with `Authorization: Bearer TOKEN`, TOKEN being this
    /// file's content (as `rtprobe --metrics-token-file`); others get 401.
    #[arg(long, value_name = "FILE", requires = "metrics_listen")]
    #[serde(default)]
    pub(crate) metrics_token_file: Option<std::path::PathBuf>,
}

/// Default rate limit per source.
pub(crate) const DEFAULT_RATE_LIMIT_PPS: u32 = 10_000;
/// Default cap on either reflector's replies over all sources but the
/// known peers: ten sources at the full per-source rate (about 1.2 Gbit/s
/// of 1500-byte replies), far below what XDP could send.
pub(crate) const DEFAULT_GLOBAL_RATE_LIMIT_PPS: u32 = 100_000;
/// Default cap on the replies to all known peers together: as much again,
/// reserved for them (a 100-host fleet probing every 1 ms is 100 000/s).
pub(crate) const DEFAULT_PEERS_RATE_LIMIT_PPS: u32 = 100_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_defaults_to_862_unless_a_port_was_chosen() {
        let o = RemoteOptions {
            protocol: Some(ProtocolArg::Stamp),
            ..Default::default()
        };
        assert_eq!(o.port(RTPROBE_PORT), 862);
        assert_eq!(o.port(4000), 4000);
        assert_eq!(RemoteOptions::default().port(RTPROBE_PORT), 5061);
    }

    #[test]
    fn rates_and_keys() {
        assert_eq!(parse_rate("2000/s"), Ok(2000));
        assert_eq!(parse_rate("7"), Ok(7));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("fast").is_err());
        let dir = std::env::temp_dir().join(format!("rtprobe-key-{}", std::process::id()));
        std::fs::write(&dir, b"short").unwrap();
        assert!(
            read_key(&dir)
                .unwrap_err()
                .to_string()
                .contains("at least 32")
        );
        std::fs::write(&dir, [7u8; 32]).unwrap();
        assert!(read_key(&dir).is_ok());
        let _ = std::fs::remove_file(&dir);
    }
}
