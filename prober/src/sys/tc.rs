//! The one place rtprobe runs `tc` (iproute2). Qdisc trees with options
//! (htb classes, u32 filters, fq_codel parameters) are what tc is for;
//! reading them back is done over netlink ([`super::netlink`]). Every call checks the
//! exit status and shows the command line and tc's message on error.
//!
//! Kernel interface: rtnetlink RTM_NEWQDISC/RTM_NEWTCLASS/RTM_NEWTFILTER
//! through tc. The command runs in the network namespace of the calling
//! thread (a child process inherits the namespaces of the thread that
//! forks it); [`super::Sys::tc`] runs it on the namespace's worker thread.

use std::process::{Command, Stdio};

use anyhow::{Context, Result};

use super::{Ns, Sys};

/// One tc invocation, as the words after `tc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TcCmd(pub(crate) Vec<String>);

impl TcCmd {
    pub(crate) fn new<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self(args.into_iter().map(Into::into).collect())
    }

    /// Parses "qdisc add dev X root ..." (tests and presets read better so).
    pub(crate) fn parse(line: &str) -> Self {
        Self(line.split_whitespace().map(str::to_string).collect())
    }

    pub(crate) fn line(&self) -> String {
        format!("tc {}", self.0.join(" "))
    }
}

impl std::fmt::Display for TcCmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line())
    }
}

/// How a failed tc call failed.
#[derive(Debug)]
pub(crate) struct TcError {
    pub(crate) cmd: String,
    pub(crate) status: Option<i32>,
    pub(crate) stderr: String,
}

impl TcError {
    /// The kernel does not know this qdisc kind (module missing).
    pub(crate) fn is_unknown_kind(&self) -> bool {
        let s = self.stderr.to_ascii_lowercase();
        s.contains("specified qdisc kind is unknown")
            || s.contains("specified qdisc not found")
            || s.contains("unknown qdisc")
            || s.contains("specified classifier kind is unknown")
            || s.contains("unknown filter")
    }
}

impl std::fmt::Display for TcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let msg = self.stderr.trim().replace('\n', " / ");
        match self.status {
            Some(c) => write!(f, "`{}` failed (exit {c}): {msg}", self.cmd),
            None => write!(f, "`{}` was killed: {msg}", self.cmd),
        }
    }
}

impl std::error::Error for TcError {}

/// Runs one tc command in the calling thread's network namespace.
pub(crate) fn run(cmd: &TcCmd) -> std::result::Result<String, TcError> {
    let out = Command::new("tc")
        .args(&cmd.0)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| TcError {
            cmd: cmd.line(),
            status: None,
            stderr: if e.kind() == std::io::ErrorKind::NotFound {
                "tc not found: install iproute2 (apt-get install iproute2)".into()
            } else {
                e.to_string()
            },
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(TcError {
            cmd: cmd.line(),
            status: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// The smallest valid command adding `kind` on lo.
fn probe_commands(kind: &str) -> Vec<TcCmd> {
    match kind {
        "u32" => vec![
            TcCmd::parse("qdisc add dev lo clsact"),
            TcCmd::parse(
                "filter add dev lo egress protocol ip prio 1 u32 match ip dport 5061 0xffff classid 1:1",
            ),
        ],
        "tbf" => vec![TcCmd::parse(
            "qdisc add dev lo root handle 1: tbf rate 1mbit burst 1600 limit 3000",
        )],
        k => vec![TcCmd::new([
            "qdisc", "add", "dev", "lo", "root", "handle", "1:", k,
        ])],
    }
}

/// Whether the kernel has each of `kinds` (qdisc kinds, "u32" for the
/// classifier): each is tried on lo of a scratch namespace made and
/// deleted through `sys`, so the user's interfaces are never touched.
pub(super) fn probe_kinds(sys: &dyn Sys, kinds: &[&str]) -> Result<Vec<(String, bool)>> {
    let name = format!("rtpq-{}-{:04x}", std::process::id(), rand::random::<u16>());
    sys.create_netns(&name)
        .context("create a scratch namespace to check qdiscs")?;
    let ns = Ns::Named(&name);
    let res = (|| {
        let mut out = Vec::new();
        for k in kinds {
            let mut ok = true;
            for c in probe_commands(k) {
                if let Err(e) = sys.tc(ns, &c) {
                    if e.downcast_ref::<TcError>()
                        .is_some_and(TcError::is_unknown_kind)
                    {
                        ok = false;
                        break;
                    }
                    return Err(e.context(format!("checking whether the kernel has {k}")));
                }
            }
            // Leave lo clean for the next kind.
            let _ = sys.tc(ns, &TcCmd::parse("qdisc del dev lo root"));
            let _ = sys.tc(ns, &TcCmd::parse("qdisc del dev lo clsact"));
            out.push((k.to_string(), ok));
        }
        Ok(out)
    })();
    sys.delete_netns(&name)?;
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kind_is_recognised() {
        let e = TcError {
            cmd: "tc qdisc add dev lo root fq_codel".into(),
            status: Some(2),
            stderr: "Error: Specified qdisc kind is unknown.\n".into(),
        };
        assert!(e.is_unknown_kind());
        assert!(e.to_string().contains("tc qdisc add dev lo root fq_codel"));
        let e = TcError {
            cmd: "tc qdisc add dev lo root tbf".into(),
            status: Some(1),
            stderr: "tbf: the \"rate\" parameter is mandatory.".into(),
        };
        assert!(!e.is_unknown_kind());
    }

    #[test]
    fn parse_and_line() {
        let c = TcCmd::parse("qdisc add dev eth0 root handle 1: pfifo limit 100");
        assert_eq!(c.0.len(), 10);
        assert_eq!(
            c.line(),
            "tc qdisc add dev eth0 root handle 1: pfifo limit 100"
        );
    }
}
