//! A fleet's inventory (`rtprobe targets INVENTORY`): one TOML file that
//! names every host once, from which each host's peers file (the
//! `--targets` format of [`super::targets`]) and Prometheus' file_sd list
//! are written. Prometheus' `instance` (the prober, made from the file_sd
//! entry's `host` label) and the probers' `target` are then the same names,
//! so the pair matrix's rows and columns line up. Pure apart from reading
//! the file and resolving host names: every peers file is checked by the
//! targets file's own parser before anything is written.
//!
//! ```toml
//! [defaults]                  # every peers file's [defaults], as --targets reads it
//! interval = "100ms"
//! port = 8620
//!
//! [[host]]
//! name = "h1"                 # the peers' `target`, Prometheus' `instance`
//! address = "10.79.0.1"       # where its reflector answers: HOST[:PORT]
//! metrics = "10.81.0.1:9464"  # where Prometheus scrapes it [default: address's host, port 9464]
//! labels = { site = "fra1", rack = "r1" }
//! ```
//!
//! A host's labels describe it in both roles: file_sd gives them to its own
//! series as they are (`site`), its peers files give them to the series of
//! the pairs towards it with a `target_` prefix (`target_site`), so that a
//! series says where both ends stand and Prometheus keeps both.

use std::{
    collections::{BTreeMap, HashSet},
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Result, anyhow};
use serde::Deserialize;

use super::{
    located::{line_col, located_toml_error},
    remote::{ProtocolArg, RTPROBE_PORT, resolve},
    targets::{self, MAX_TARGETS},
};

/// The label of a file_sd entry that prometheus.yml turns into `instance`.
pub(crate) const HOST_LABEL: &str = "host";
/// What a host's labels are called in its peers' files.
pub(crate) const TARGET_LABEL_PREFIX: &str = "target_";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// Passed to every peers file as it is; the targets parser checks it.
    #[serde(default)]
    defaults: toml::Table,
    #[serde(default)]
    host: Vec<toml::Spanned<HostEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostEntry {
    name: String,
    address: String,
    metrics: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// One host of the fleet, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Host {
    pub(crate) name: String,
    /// Where its reflector answers (HOST[:PORT]), as its peers probe it.
    pub(crate) address: String,
    /// Where Prometheus scrapes its prober (HOST[:PORT]).
    pub(crate) metrics: String,
    pub(crate) labels: BTreeMap<String, String>,
}

/// A checked inventory.
#[derive(Debug)]
pub(crate) struct Inventory {
    path: PathBuf,
    defaults: toml::Table,
    pub(crate) hosts: Vec<Host>,
}

/// Reads and checks an inventory file.
pub(crate) fn read(path: &Path) -> Result<Inventory> {
    let bytes = crate::input::read_capped(path, "inventory", crate::input::MAX_CONFIG_BYTES)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow!("{}: is not UTF-8 text: write it as TOML", path.display()))?;
    parse(path, &text)
}

/// Checks an inventory's text (`path` names it in errors): each host on
/// its own, then every peers file it makes, by the targets parser.
pub(crate) fn parse(path: &Path, text: &str) -> Result<Inventory> {
    let file: File = toml::from_str(text).map_err(|e| located_toml_error(path, text, &e))?;
    if file.host.len() < 2 {
        return Err(anyhow!(
            "{}: {} [[host]]: a mesh needs at least 2 (each probes the others), e.g. [[host]] name = \"h1\" address = \"192.0.2.1\"",
            path.display(),
            file.host.len()
        ));
    }
    if file.host.len() > MAX_TARGETS + 1 {
        return Err(anyhow!(
            "{}: {} hosts: each would probe more than {MAX_TARGETS} peers, the most one rtprobe process probes",
            path.display(),
            file.host.len()
        ));
    }
    let mut hosts = Vec::with_capacity(file.host.len());
    let mut names = HashSet::new();
    for (i, h) in file.host.iter().enumerate() {
        let (line, _) = line_col(text, h.span().start);
        let e = h.get_ref();
        let at = |why: String| {
            anyhow!(
                "{}:{line}: [[host]] #{} ({:?}): {why}",
                path.display(),
                i + 1,
                e.name
            )
        };
        let host = check_host(e).map_err(at)?;
        if !names.insert(host.name.clone()) {
            return Err(at("name: given twice: give each host its own name".into()));
        }
        hosts.push(host);
    }
    let inventory = Inventory {
        path: path.to_path_buf(),
        defaults: file.defaults,
        hosts,
    };
    inventory.check_peers_files()?;
    Ok(inventory)
}

/// One host's own checks: its name as a target name, its labels as
/// Prometheus labels in both roles, its addresses.
fn check_host(e: &HostEntry) -> Result<Host, String> {
    targets::check_name(&e.name)?;
    for (k, v) in &e.labels {
        if k == HOST_LABEL || k.starts_with(TARGET_LABEL_PREFIX) {
            return Err(format!(
                "labels: {k:?} is rtprobe's ({HOST_LABEL:?} names the host in Prometheus' file_sd; \
                 {TARGET_LABEL_PREFIX}* are the host's labels in its peers' files): rename it"
            ));
        }
        targets::check_label(k, v)?;
        targets::check_label(&format!("{TARGET_LABEL_PREFIX}{k}"), v)?;
    }
    // The port does not matter here: the peers files' port is checked
    // with the defaults by the targets parser.
    resolve(&e.address, RTPROBE_PORT)
        .map_err(|e| format!("address: {e:#}").replace("--target ", ""))?;
    let metrics = match &e.metrics {
        Some(m) => {
            let m = m.trim();
            if m.is_empty() || m.contains(|c: char| c.is_whitespace() || c == '/') {
                return Err(format!(
                    "metrics: {m:?} is not HOST[:PORT]: give where Prometheus scrapes the prober, e.g. \"10.0.0.7:9464\""
                ));
            }
            m.to_string()
        }
        None => host_part(&e.address),
    };
    Ok(Host {
        name: e.name.clone(),
        address: e.address.trim().to_string(),
        metrics,
        labels: e.labels.clone(),
    })
}

/// HOST of HOST[:PORT], an IPv6 literal in brackets (Prometheus' form).
fn host_part(address: &str) -> String {
    let a = address.trim();
    if a.parse::<std::net::Ipv6Addr>().is_ok() {
        return format!("[{a}]");
    }
    if let Some(end) = a.strip_prefix('[').and_then(|r| r.find(']')) {
        return a[..end + 2].to_string();
    }
    a.split(':').next().unwrap_or(a).to_string()
}

/// What a peers file's targets take where its `[defaults]` say nothing:
/// the flags' defaults, as the mesh unit runs rtprobe.
fn base() -> targets::Base {
    targets::Base {
        protocol: ProtocolArg::Rtprobe,
        port: RTPROBE_PORT,
        tos: 0,
        size: super::plan::DEFAULT_SIZE,
        interval: super::plan::DEFAULT_INTERVAL,
        auth: false,
    }
}

impl Inventory {
    /// Every peers file is the defaults and a subset of the same
    /// `[[target]]` entries, so one file of all of them checks them all:
    /// each host is resolved once, not once per peer.
    fn check_peers_files(&self) -> Result<()> {
        let all = self.render(None, &self.hosts.iter().collect::<Vec<_>>());
        let what = PathBuf::from(format!(
            "{} (every [[host]] as a peers file's [[target]])",
            self.path.display()
        ));
        targets::parse(&what, &all, &base()).map(|_| ())
    }

    /// The host called `name`.
    pub(crate) fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// `host`'s peers file: every other host, in the `--targets` format.
    pub(crate) fn peers_toml(&self, host: &Host) -> String {
        let peers: Vec<&Host> = self.hosts.iter().filter(|h| h.name != host.name).collect();
        self.render(Some(host), &peers)
    }

    /// A targets file of `peers` with this inventory's defaults.
    fn render(&self, of: Option<&Host>, peers: &[&Host]) -> String {
        let mut s = String::new();
        if let Some(h) = of {
            let _ = writeln!(
                s,
                "# The peers of {}, written by `rtprobe targets` from {}: edit that file, not this one.\n",
                h.name,
                self.path.display()
            );
        }
        if !self.defaults.is_empty() {
            let mut t = toml::Table::new();
            t.insert("defaults".into(), toml::Value::Table(self.defaults.clone()));
            s += &toml::to_string(&t).unwrap_or_default();
            s.push('\n');
        }
        for p in peers {
            let _ = writeln!(
                s,
                "[[target]]\nname = {}\naddress = {}",
                quoted(&p.name),
                quoted(&p.address)
            );
            if !p.labels.is_empty() {
                let labels: Vec<String> = p
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{TARGET_LABEL_PREFIX}{k} = {}", quoted(v)))
                    .collect();
                let _ = writeln!(s, "labels = {{ {} }}", labels.join(", "));
            }
            s.push('\n');
        }
        s
    }

    /// Prometheus' file_sd list: one entry per host, its metrics address
    /// and its labels with `host` = its name. JSON, which YAML reads too:
    /// name the file .yml or .json.
    pub(crate) fn prometheus_sd(&self) -> String {
        let mut s = String::from("[\n");
        for (i, h) in self.hosts.iter().enumerate() {
            let mut labels = serde_json::Map::new();
            labels.insert(HOST_LABEL.into(), h.name.clone().into());
            for (k, v) in &h.labels {
                labels.insert(k.clone(), v.clone().into());
            }
            let entry = serde_json::json!({ "targets": [h.metrics], "labels": labels });
            let comma = if i + 1 < self.hosts.len() { "," } else { "" };
            let _ = writeln!(s, "  {entry}{comma}");
        }
        s + "]\n"
    }
}

/// A TOML basic string.
fn quoted(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use std::{net::SocketAddr, time::Duration};

    use super::*;

    const FLEET: &str = r#"
[defaults]
interval = "100ms"
size = 64
port = 8620

[[host]]
name = "h1"
address = "10.79.0.1"
metrics = "10.81.0.1:9464"
labels = { site = "lab", rack = "r1" }

[[host]]
name = "h2"
address = "10.79.0.2:8621"
labels = { site = "lab", rack = "r2" }

[[host]]
name = "h3"
address = "2001:db8::3"
"#;

    fn inv(text: &str) -> Result<Inventory> {
        parse(Path::new("inv.toml"), text)
    }

    #[test]
    fn each_peers_file_is_what_targets_reads_back() {
        let inv = inv(FLEET).unwrap();
        for h in &inv.hosts {
            let text = inv.peers_toml(h);
            let t = targets::parse(Path::new("peers.toml"), &text, &base()).unwrap();
            let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
            let want: Vec<&str> = inv
                .hosts
                .iter()
                .map(|p| p.name.as_str())
                .filter(|n| *n != h.name)
                .collect();
            assert_eq!(names, want, "{text}");
            for t in &t {
                assert_eq!(t.interval, Duration::from_millis(100));
                let peer = inv.host(&t.name).unwrap();
                for (k, v) in &peer.labels {
                    assert_eq!(t.labels[&format!("target_{k}")], *v, "{text}");
                }
                assert_eq!(t.labels.len(), peer.labels.len());
            }
        }
        let h3 = inv.peers_toml(inv.host("h3").unwrap());
        assert!(h3.starts_with("# The peers of h3"), "{h3}");
        let t = targets::parse(Path::new("p"), &h3, &base()).unwrap();
        assert_eq!(t[0].addr, "10.79.0.1:8620".parse::<SocketAddr>().unwrap());
        assert_eq!(t[1].addr, "10.79.0.2:8621".parse::<SocketAddr>().unwrap());
        let h1 = targets::parse(Path::new("p"), &inv.peers_toml(&inv.hosts[0]), &base()).unwrap();
        assert_eq!(
            h1[1].addr,
            "[2001:db8::3]:8620".parse::<SocketAddr>().unwrap()
        );
    }

    #[test]
    fn file_sd_names_each_host_as_its_peers_do() {
        let inv = inv(FLEET).unwrap();
        let sd: serde_json::Value = serde_json::from_str(&inv.prometheus_sd()).unwrap();
        let want = serde_json::json!([
            { "targets": ["10.81.0.1:9464"], "labels": { "host": "h1", "site": "lab", "rack": "r1" } },
            { "targets": ["10.79.0.2"], "labels": { "host": "h2", "site": "lab", "rack": "r2" } },
            { "targets": ["[2001:db8::3]"], "labels": { "host": "h3" } },
        ]);
        assert_eq!(sd, want);
        assert_eq!(host_part("[2001:db8::3]:8620"), "[2001:db8::3]");
        assert_eq!(host_part("db-1.example.net:8620"), "db-1.example.net");
    }

    /// The package's example /etc/rtprobe/targets.toml follows the same
    /// convention (target_* labels) and passes the targets parser.
    #[test]
    fn the_shipped_example_targets_file_parses() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/etc/rtprobe/targets.toml"
        );
        let t = targets::parse(
            Path::new(path),
            &std::fs::read_to_string(path).unwrap(),
            &base(),
        )
        .unwrap();
        assert!(
            t.iter()
                .all(|t| t.labels.keys().all(|k| k.starts_with(TARGET_LABEL_PREFIX))),
            "{t:?}"
        );
    }

    #[test]
    fn every_bad_inventory_is_one_line_naming_the_place() {
        let two =
            "[[host]]\nname='a'\naddress='192.0.2.1'\n[[host]]\nname='b'\naddress='192.0.2.2'\n";
        let cases = [
            (
                String::new(),
                "0 [[host]]: a mesh needs at least 2".to_string(),
            ),
            (
                "[[host]]\nname='a'\naddress='192.0.2.1'\n".into(),
                "1 [[host]]".into(),
            ),
            (
                format!("{two}[[host]]\nname='a'\naddress='192.0.2.3'\n"),
                "inv.toml:7: [[host]] #3 (\"a\"): name: given twice".into(),
            ),
            (
                format!("{two}[[host]]\nname='c d'\naddress='192.0.2.3'\n"),
                "inv.toml:7: [[host]] #3 (\"c d\"): name:".into(),
            ),
            (
                format!("{two}[[host]]\nname='c'\naddress='192.0.2.3'\nlabels={{host='x'}}\n"),
                "\"host\" is rtprobe's".into(),
            ),
            (
                format!(
                    "{two}[[host]]\nname='c'\naddress='192.0.2.3'\nlabels={{target_site='x'}}\n"
                ),
                "rename it".into(),
            ),
            (
                format!("{two}[[host]]\nname='c'\naddress='192.0.2.3'\nlabels={{job='x'}}\n"),
                "reserved".into(),
            ),
            (
                format!("{two}[[host]]\nname='c'\naddress='[2001:db8::1'\n"),
                "inv.toml:7: [[host]] #3 (\"c\"): address:".into(),
            ),
            (
                format!("{two}[[host]]\nname='c'\naddress='192.0.2.3'\nmetrics='http://x/'\n"),
                "metrics:".into(),
            ),
            (
                format!("{two}[[host]]\nname='c'\naddress='192.0.2.3'\ncolour=1\n"),
                "inv.toml:10:1: host[3].colour".into(),
            ),
            (
                format!("[defaults]\ninterval='2h'\n{two}"),
                "[defaults]: interval".into(),
            ),
            (
                format!("[defaults]\nsize=9000\n{two}"),
                "size: 9000 is out of range".into(),
            ),
        ];
        for (text, want) in cases {
            let e = format!("{:#}", inv(&text).unwrap_err());
            assert!(e.contains(&want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
            assert!(e.starts_with("inv.toml"), "names the file: {e}");
        }
    }
}
