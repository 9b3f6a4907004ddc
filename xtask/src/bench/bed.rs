//! The benches' two-namespace bed: A and B joined by one veth, built and
//! held by `rtprobe testbed --pair` (the product's own testbed code:
//! netlink through its `sys` layer, recorded for `rtprobe cleanup`), so
//! that the pair, flood and fleet sections and the root tests build their
//! beds one way. The holder removes the bed when its stdin closes.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::run::Ctx;

/// Two namespaces A and B joined by one veth, built and held by
/// `rtprobe testbed --pair` (the product's testbed code, through netlink)
/// with the addresses and options given: the bed of the pair, flood and
/// fleet sections. It answers across the veth in both families it has
/// once made; dropping it closes the holder's stdin, which removes both
/// namespaces (so does the holder if xtask dies).
pub(super) struct Bed {
    pub(super) a: String,
    pub(super) b: String,
    pub(super) vb: String,
    holder: Child,
}

/// Namespaces and interfaces (A's, B's) from the holder's JSON line.
fn bed_names(line: &str) -> Result<[String; 4]> {
    let j: Value = serde_json::from_str(line)
        .with_context(|| format!("rtprobe testbed --pair printed {line:?}"))?;
    let field = |k: &str| {
        j[k].as_str()
            .map(str::to_string)
            .with_context(|| format!("no {k} in the testbed line {line:?}"))
    };
    Ok([
        field("a_ns")?,
        field("b_ns")?,
        field("a_if")?,
        field("b_if")?,
    ])
}

impl Bed {
    /// `rtprobe testbed --pair --name NAME ARGS...`, once it has printed
    /// its line.
    pub(super) fn new(ctx: &Ctx, name: &str, args: &[&str]) -> Result<Bed> {
        let mut holder = Command::new(&ctx.bin)
            .args(["testbed", "--pair", "--name", name])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("start rtprobe testbed --pair")?;
        let mut line = String::new();
        let stdout = holder.stdout.take().context("the testbed's stdout")?;
        let read = BufReader::new(stdout).read_line(&mut line);
        if !matches!(read, Ok(n) if n > 0) {
            let o = holder.wait_with_output()?;
            bail!(
                "rtprobe testbed --pair {args:?} failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        let [a, b, _, vb] = match bed_names(&line) {
            Ok(n) => n,
            Err(e) => {
                drop(holder.stdin.take());
                let _ = holder.wait();
                return Err(e);
            }
        };
        Ok(Bed { a, b, vb, holder })
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // Closing its stdin tells the holder to tear the pair down.
        drop(self.holder.stdin.take());
        if let Ok(st) = self.holder.wait()
            && !st.success()
        {
            let mut err = String::new();
            if let Some(mut e) = self.holder.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            eprintln!(
                "bench: rtprobe testbed --pair ended with {st}: {}",
                err.trim()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bed_is_named_by_the_holders_line() {
        let line = r#"{"id":"c930c9","a_ns":"rtprobe-c930c9-bench-pair-a","b_ns":"rtprobe-c930c9-bench-pair-b","a_if":"veth-a","b_if":"veth-b","a_addrs":["10.78.0.1/24"],"b_addrs":["10.78.0.2/24"],"b_file_addrs":0}"#;
        assert_eq!(
            bed_names(line).unwrap(),
            [
                "rtprobe-c930c9-bench-pair-a",
                "rtprobe-c930c9-bench-pair-b",
                "veth-a",
                "veth-b"
            ]
        );
        let e = bed_names(r#"{"a_ns":"x"}"#).unwrap_err().to_string();
        assert!(e.contains("no b_ns"), "{e}");
        assert!(bed_names("Error: not root").is_err());
    }
}
