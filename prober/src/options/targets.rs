//! Many targets from one process: `--target` given more than once, or a
//! targets file (`--targets FILE`, TOML) that gives each target a name,
//! labels, protocol, TOS, size and interval, with file-level defaults.
//! Pure apart from reading the file and resolving host names: the same
//! checks run for `--targets` at start, on every reload (SIGHUP) and in
//! `run --check`-style validation, and every refusal is one line naming
//! the file, line and field.
//!
//! ```toml
//! [defaults]                 # every field optional; the flags' values otherwise
//! protocol = "rtprobe"       # or "stamp"
//! port = 5061
//! tos = 0
//! size = 64
//! interval = "100ms"
//! labels = { site = "fra1" }
//!
//! [[target]]
//! name = "db-1"              # unique; [A-Za-z0-9_.:-], at most 64 bytes
//! address = "192.0.2.7"      # HOST[:PORT] as --target takes it
//! labels = { rack = "r7" }   # added to (and over) the default labels
//! ```

use std::{
    collections::{BTreeMap, HashSet},
    net::{IpAddr, SocketAddr},
    path::Path,
    time::Duration,
};

use anyhow::{Result, anyhow};
use serde::Deserialize;

use super::{
    located::line_col,
    plan::{MAX_INTERVAL, MAX_PAYLOAD_1500, MAX_PAYLOAD_1500_IPV6, MIN_INTERVAL},
    remote::{ProtocolArg, resolve},
};
use crate::probe::{packet::HEADER_LEN, stamp};

/// Most targets one process probes.
pub(crate) const MAX_TARGETS: usize = 10_000;
/// Longest target name (it becomes a metrics label value and a CSV cell).
const MAX_NAME_BYTES: usize = 64;
/// Longest label value.
const MAX_LABEL_VALUE_BYTES: usize = 256;

/// One target, every field decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TargetSpec {
    /// Unique within the run: the CSV's `target` cell, the metrics' `target` label.
    pub(crate) name: String,
    /// Its address; for a host name the unspecified address with the port
    /// (the name is resolved when the target is opened: see `host`).
    pub(crate) addr: SocketAddr,
    /// HOST:PORT as written when the address is a host name.
    pub(crate) host: Option<String>,
    pub(crate) protocol: ProtocolArg,
    pub(crate) tos: u8,
    pub(crate) size: usize,
    pub(crate) interval: Duration,
    /// Extra metrics labels (valid Prometheus names, none reserved).
    pub(crate) labels: BTreeMap<String, String>,
}

/// What a target takes when neither its entry nor the file's `[defaults]`
/// says: the command line's options.
#[derive(Debug, Clone)]
pub(crate) struct Base {
    pub(crate) protocol: ProtocolArg,
    /// `--port` as given (STAMP's 862 replaces rtprobe's default port).
    pub(crate) port: u16,
    pub(crate) tos: u8,
    pub(crate) size: usize,
    pub(crate) interval: Duration,
    /// STAMP's authenticated mode is on (`--auth-key`): longer packets.
    pub(crate) auth: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fields {
    protocol: Option<ProtocolArg>,
    port: Option<u16>,
    tos: Option<u8>,
    size: Option<usize>,
    interval: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// A `[[target]]`: its own fields, then what [`Fields`] takes (written
/// out, not flattened, so that serde's errors keep the field's line).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: Option<String>,
    address: String,
    protocol: Option<ProtocolArg>,
    port: Option<u16>,
    tos: Option<u8>,
    size: Option<usize>,
    interval: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

impl Entry {
    fn fields(&self) -> Fields {
        Fields {
            protocol: self.protocol,
            port: self.port,
            tos: self.tos,
            size: self.size,
            interval: self.interval.clone(),
            labels: self.labels.clone(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: Fields,
    #[serde(default)]
    target: Vec<toml::Spanned<Entry>>,
}

/// The targets of a remote run, each with its name, address and probe
/// options (the flags' values where the targets file says nothing): None
/// on a testbed run. Reads the targets file.
pub(crate) fn of(
    remote: &super::remote::RemoteOptions,
    probe: &crate::probe::ProbeConfig,
) -> Result<Option<Vec<TargetSpec>>> {
    let base = Base {
        protocol: remote.protocol(),
        port: probe.port,
        tos: probe.tos,
        size: probe.size,
        interval: probe.interval,
        auth: remote.auth_key.is_some(),
    };
    match (&remote.targets, remote.target.is_empty()) {
        (Some(file), _) => read_file(file, &base).map(Some),
        (None, false) => from_flags(&remote.target, &base).map(Some),
        (None, true) => Ok(None),
    }
}

/// Reads and checks a targets file.
pub(crate) fn read_file(path: &Path, base: &Base) -> Result<Vec<TargetSpec>> {
    let bytes = read_regular(path, crate::input::MAX_CONFIG_BYTES)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow!("{}: is not UTF-8 text: write it as TOML", path.display()))?;
    parse(path, &text, base)
}

/// The bytes of a targets file, which must be a regular file: it is read
/// again on every reload of a run that never ends, so the open never
/// waits (O_NONBLOCK: a FIFO's open would wait for a writer) and the type
/// is checked on the opened file (fstat), not on the path.
fn read_regular(path: &Path, cap_bytes: u64) -> Result<Vec<u8>> {
    use std::{io::Read, os::unix::fs::OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            anyhow!(
                "cannot read targets file {}: {e}: check the path",
                path.display()
            )
        })?;
    let md = file
        .metadata()
        .map_err(|e| anyhow!("targets file {}: {e}", path.display()))?;
    if !md.is_file() {
        let kind = {
            use std::os::unix::fs::FileTypeExt;
            let t = md.file_type();
            match () {
                _ if t.is_dir() => "a directory",
                _ if t.is_fifo() => "a FIFO",
                _ if t.is_socket() => "a socket",
                _ if t.is_char_device() || t.is_block_device() => "a device",
                _ => "not a regular file",
            }
        };
        return Err(anyhow!(
            "targets file {} is {kind}: give a regular file (it is read again on every reload)",
            path.display()
        ));
    }
    if md.len() > cap_bytes {
        return Err(anyhow!(
            "targets file {}: {} bytes, over the {cap_bytes}-byte limit: check that this is the right file",
            path.display(),
            md.len()
        ));
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    file.take(cap_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| anyhow!("cannot read targets file {}: {e}", path.display()))?;
    if bytes.len() as u64 > cap_bytes {
        return Err(anyhow!(
            "targets file {}: over the {cap_bytes}-byte limit: check that this is the right file",
            path.display()
        ));
    }
    Ok(bytes)
}

/// Checks a targets file's text (`path` names it in errors).
pub(crate) fn parse(path: &Path, text: &str, base: &Base) -> Result<Vec<TargetSpec>> {
    let file: File =
        toml::from_str(text).map_err(|e| super::located::located_toml_error(path, text, &e))?;
    let at = |span: std::ops::Range<usize>, what: String| {
        let (l, _) = line_col(text, span.start);
        anyhow!("{}:{l}: {what}", path.display())
    };
    let defaults = apply(base, &file.defaults, &BTreeMap::new())
        .map_err(|e| anyhow!("{}: [defaults]: {e}", path.display()))?;
    if file.target.is_empty() {
        return Err(anyhow!(
            "{}: no [[target]] in the file: add one per reflector, e.g. [[target]] name = \"b\" address = \"192.0.2.7\"",
            path.display()
        ));
    }
    if file.target.len() > MAX_TARGETS {
        return Err(anyhow!(
            "{}: {} targets: at most {MAX_TARGETS} per process; split them over several rtprobe processes",
            path.display(),
            file.target.len()
        ));
    }
    let mut out = Vec::with_capacity(file.target.len());
    for (i, t) in file.target.iter().enumerate() {
        let span = t.span();
        let e = t.get_ref();
        let name = e
            .name
            .clone()
            .unwrap_or_else(|| e.address.trim().to_string());
        let who = format!("[[target]] #{} ({name:?})", i + 1);
        let spec = target(&name, &e.address, &defaults, &e.fields())
            .map_err(|why| at(span.clone(), format!("{who}: {why}")))?;
        out.push(spec);
    }
    check_unique(&out).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok(out)
}

/// `--target` given once or more: each named by its HOST[:PORT] as given.
pub(crate) fn from_flags(targets: &[String], base: &Base) -> Result<Vec<TargetSpec>> {
    let defaults =
        apply(base, &Fields::default(), &BTreeMap::new()).map_err(|e| anyhow!("--target {e}"))?;
    let out = targets
        .iter()
        .map(|t| target(t.trim(), t, &defaults, &Fields::default()))
        .collect::<Result<Vec<_>, String>>()
        .map_err(|e| anyhow!("--target {e}"))?;
    check_unique(&out)?;
    Ok(out)
}

/// The file's defaults laid over the flags' values; checked on their own
/// so that a bad default is blamed on `[defaults]`.
fn apply(
    base: &Base,
    f: &Fields,
    parent_labels: &BTreeMap<String, String>,
) -> Result<Base2, String> {
    let protocol = f.protocol.unwrap_or(base.protocol);
    let port = f.port.unwrap_or(base.port);
    let port = if protocol == ProtocolArg::Stamp && port == super::remote::RTPROBE_PORT {
        super::remote::STAMP_PORT
    } else {
        port
    };
    if port == 0 {
        return Err("port: 0 is not a usable UDP port".into());
    }
    let interval = match &f.interval {
        Some(s) => crate::model::units::parse_duration(s).map_err(|e| format!("interval: {e}"))?,
        None => base.interval,
    };
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
        return Err(format!(
            "interval: {interval:?} is out of range: give 1us to 1h"
        ));
    }
    let mut labels = parent_labels.clone();
    for (k, v) in &f.labels {
        check_label(k, v)?;
        labels.insert(k.clone(), v.clone());
    }
    Ok(Base2 {
        base: Base {
            protocol,
            port: f.port.unwrap_or(base.port),
            tos: f.tos.unwrap_or(base.tos),
            size: f.size.unwrap_or(base.size),
            interval,
            auth: base.auth,
        },
        resolved_port: port,
        labels,
    })
}

/// Defaults with their labels, after `[defaults]`.
struct Base2 {
    base: Base,
    resolved_port: u16,
    labels: BTreeMap<String, String>,
}

fn target(name: &str, address: &str, d: &Base2, f: &Fields) -> Result<TargetSpec, String> {
    check_name(name)?;
    let b = apply(&d.base, f, &d.labels)?;
    let (addr, host) = endpoint(address, b.resolved_port).map_err(|e| format!("address: {e}"))?;
    let min = match (b.base.protocol, b.base.auth) {
        (ProtocolArg::Rtprobe, _) => HEADER_LEN,
        (ProtocolArg::Stamp, false) => stamp::UNAUTH_LEN_BYTES,
        (ProtocolArg::Stamp, true) => stamp::AUTH_LEN_BYTES,
    };
    // A host name's family is known when it resolves: the IPv6 bound
    // is checked then.
    let max = if addr.is_ipv6() {
        MAX_PAYLOAD_1500_IPV6
    } else {
        MAX_PAYLOAD_1500
    };
    let size = b.base.size;
    if !(min..=max).contains(&size) {
        return Err(format!(
            "size: {size} is out of range for {} probes to {addr}: give {min} to {max} bytes",
            b.base.protocol.name()
        ));
    }
    Ok(TargetSpec {
        name: name.to_string(),
        addr,
        host,
        protocol: b.base.protocol,
        tos: b.base.tos,
        size,
        interval: b.base.interval,
        labels: b.labels,
    })
}

/// A target's address as written: an IP address (a port optional) is
/// taken as it is; a host name is kept, with its port, to be resolved
/// when the target is opened, so a name that does not resolve (DNS down,
/// a host not yet in it) is that target's error, tried again, and not
/// the whole file's. Malformed addresses are refused here.
fn endpoint(address: &str, port: u16) -> Result<(SocketAddr, Option<String>), String> {
    let t = address.trim();
    if t.parse::<IpAddr>().is_ok()
        || t.parse::<SocketAddr>().is_ok()
        || (t.starts_with('[') && t.ends_with(']'))
    {
        return resolve(t, port)
            .map(|a| (a, None))
            .map_err(|e| format!("{e:#}").replace("--target ", ""));
    }
    if t.starts_with('[') || t.matches(':').count() > 1 {
        return Err(format!(
            "{t:?} is not an IPv6 address with a port: write it as [2001:db8::2]:862 (or without the port)"
        ));
    }
    let (host, port) = match t.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("{t:?}: {p:?} is not a UDP port (1-65535)"))?,
        ),
        None => (t, port),
    };
    let ok = |c: char| c.is_ascii_alphanumeric() || "-._".contains(c);
    if host.is_empty() || host.len() > 253 || !host.chars().all(ok) {
        return Err(format!(
            "{t:?} is neither an IP address nor a host name: give HOST[:PORT], e.g. 192.0.2.7:862 or db-1.example.net"
        ));
    }
    if port == 0 {
        return Err(format!("{t:?}: port 0 is not a usable UDP port"));
    }
    let addr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), port);
    Ok((addr, Some(format!("{host}:{port}"))))
}

pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "_.:-[]".contains(c);
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.chars().all(ok) {
        return Err(format!(
            "name: {:?} is not a target name: use 1 to {MAX_NAME_BYTES} of A-Z a-z 0-9 _ . : - [ ]",
            name.escape_debug().to_string()
        ));
    }
    Ok(())
}

/// A Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`, not `__*`), none of
/// rtprobe's own.
pub(crate) fn check_label(k: &str, v: &str) -> Result<(), String> {
    let mut chars = k.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "labels: {k:?} is not a Prometheus label name: use letters, digits and _, not starting with a digit"
        ));
    }
    crate::export::metrics::labels::check_user_label(k).map_err(|e| format!("labels: {e}"))?;
    if v.len() > MAX_LABEL_VALUE_BYTES {
        return Err(format!(
            "labels: the value of {k:?} is {} bytes: at most {MAX_LABEL_VALUE_BYTES}",
            v.len()
        ));
    }
    Ok(())
}

fn check_unique(targets: &[TargetSpec]) -> Result<()> {
    let mut seen = HashSet::new();
    for t in targets {
        if !seen.insert(t.name.as_str()) {
            return Err(anyhow!(
                "target name {:?} is given twice: give each target its own name",
                t.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Base {
        Base {
            protocol: ProtocolArg::Rtprobe,
            port: 5061,
            tos: 0,
            size: 64,
            interval: Duration::from_millis(10),
            auth: false,
        }
    }

    fn parse_str(text: &str) -> Result<Vec<TargetSpec>> {
        parse(Path::new("t.toml"), text, &base())
    }

    #[test]
    fn defaults_and_entries_combine() {
        let t = parse_str(
            r#"
[defaults]
interval = "100ms"
labels = { site = "fra", rack = "r1" }

[[target]]
name = "a"
address = "192.0.2.1"
labels = { rack = "r7" }

[[target]]
address = "192.0.2.2:900"
protocol = "stamp"
tos = 184
size = 100
"#,
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].addr, "192.0.2.1:5061".parse().unwrap());
        assert_eq!(t[0].interval, Duration::from_millis(100));
        assert_eq!(t[0].labels["rack"], "r7");
        assert_eq!(t[0].labels["site"], "fra");
        assert_eq!(t[1].name, "192.0.2.2:900");
        assert_eq!(
            (t[1].protocol, t[1].tos, t[1].size),
            (ProtocolArg::Stamp, 184, 100)
        );
        // STAMP's default port replaces rtprobe's.
        let s = parse_str("[[target]]\nname='s'\naddress='192.0.2.3'\nprotocol='stamp'\n").unwrap();
        assert_eq!(s[0].addr.port(), 862);
    }

    /// Issue 24: a label named after one rtprobe emits (`source` gave
    /// `source="spoofed",source="software"`, which Prometheus refuses) is
    /// refused in one line naming it, for every such name.
    #[test]
    fn labels_that_rtprobe_emits_are_refused() {
        for name in crate::export::metrics::labels::RESERVED {
            let e = parse_str(&format!(
                "[[target]]\nname='a'\naddress='192.0.2.1'\nlabels={{ {name}='x' }}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                e.contains(&format!("labels: \"{name}\" is reserved")) && !e.contains('\n'),
                "{name}: {e}"
            );
        }
        assert!(
            parse_str("[[target]]\nname='a'\naddress='192.0.2.1'\nlabels={site='x'}\n").is_ok()
        );
    }

    #[test]
    fn every_bad_file_is_one_line_naming_the_place() {
        let cases = [
            ("", "no [[target]]"),
            ("[[target]]\nname='a'\n", "address"),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\ncolour=1\n",
                "colour",
            ),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\n\n[[target]]\nname='b'\naddress='192.0.2.2'\nlabels={target='x'}\n",
                "t.toml:5: [[target]] #2 (\"b\"): labels: \"target\" is reserved",
            ),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\nlabels={'1x'='y'}\n",
                "not a Prometheus label name",
            ),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\nlabels={__x='y'}\n",
                "reserved",
            ),
            ("[[target]]\nname='a b'\naddress='192.0.2.1'\n", "name:"),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\n[[target]]\nname='a'\naddress='192.0.2.2'\n",
                "given twice",
            ),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\nsize=8\n",
                "t.toml:1: [[target]] #1 (\"a\"): size: 8 is out of range",
            ),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\nprotocol='stamp'\nsize=40\n",
                "size: 40",
            ),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\ninterval='0s'\n",
                "interval",
            ),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\ninterval='soon'\n",
                "invalid duration",
            ),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\ntos=300\n",
                "t.toml:4",
            ),
            (
                "[[target]]\nname='a'\naddress='192.0.2.1'\nprotocol='ping'\n",
                "t.toml:4:10: target[1].protocol",
            ),
            ("[[target]]\nname='a'\naddress='[2001:db8::1'\n", "IPv6"),
            (
                "[defaults]\nsize='big'\n[[target]]\naddress='192.0.2.1'\n",
                "size",
            ),
            (
                "[defaults]\ninterval='2h'\n[[target]]\naddress='192.0.2.1'\n",
                "[defaults]: interval",
            ),
            ("target = 3", "target"),
            ("[[target]\n", "t.toml:1"),
        ];
        for (text, want) in cases {
            let e = format!("{:#}", parse_str(text).unwrap_err());
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
            assert!(e.starts_with("t.toml"), "names the file: {e}");
        }
    }

    #[test]
    fn a_host_name_is_resolved_when_opened_and_a_bad_address_refused_now() {
        let t = parse_str(
            "[[target]]\nname='n'\naddress='db-1.example.invalid'\n[[target]]\nname='p'\naddress='db-2.example.invalid:7000'\n[[target]]\nname='ip'\naddress='192.0.2.1:9'\n",
        )
        .unwrap();
        assert_eq!(t[0].host.as_deref(), Some("db-1.example.invalid:5061"));
        assert_eq!(t[0].addr.port(), 5061);
        assert_eq!(t[1].host.as_deref(), Some("db-2.example.invalid:7000"));
        assert_eq!((t[2].host.as_deref(), t[2].addr.port()), (None, 9));
        for bad in ["a b", "host:port", "host:0", "[2001:db8::1", "1:2:3", ""] {
            let text = format!("[[target]]\nname='x'\naddress='{bad}'\n");
            let e = format!("{:#}", parse_str(&text).unwrap_err());
            assert!(e.contains("address"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_targets_file_that_is_not_a_regular_file_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let t = std::time::Instant::now();
        let e = format!("{:#}", read_file(&fifo, &base()).unwrap_err());
        assert!(e.contains("is a FIFO"), "{e}");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "no wait for a writer"
        );
        let e = format!("{:#}", read_file(dir.path(), &base()).unwrap_err());
        assert!(e.contains("is a directory"), "{e}");
        let e = format!(
            "{:#}",
            read_file(Path::new("/dev/null"), &base()).unwrap_err()
        );
        assert!(e.contains("is a device"), "{e}");
    }

    #[test]
    fn flags_name_each_target_by_its_address() {
        let t = from_flags(&["192.0.2.1".into(), "192.0.2.1:7000".into()], &base()).unwrap();
        assert_eq!(t[0].name, "192.0.2.1");
        assert_eq!(t[1].addr.port(), 7000);
        let e = from_flags(&["192.0.2.1".into(), "192.0.2.1".into()], &base()).unwrap_err();
        assert!(format!("{e}").contains("given twice"));
    }
}
