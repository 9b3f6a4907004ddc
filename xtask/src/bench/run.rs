//! Running rtprobe and the peers: the probe runs the sections share,
//! a testbed held for the peers, servers in namespaces.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

pub(super) struct Ctx {
    pub(super) bin: PathBuf,
    pub(super) out: PathBuf,
    pub(super) rt_priority: Option<u8>,
    /// The fastest interval the rate test sustained (the memory test uses it).
    pub(super) best_interval_us: std::cell::Cell<Option<u64>>,
}

impl Ctx {
    /// Runs a probe and returns its JSON summary.
    pub(super) fn probe(&self, name: &str, args: &[&str]) -> Result<Value> {
        self.probe_rt(name, args, self.rt_priority)
    }

    pub(super) fn probe_rt(&self, name: &str, args: &[&str], rt: Option<u8>) -> Result<Value> {
        self.probe_on(name, "off", args, rt)
    }

    /// As [`probe_rt`](Self::probe_rt) with the XDP router in `xdp_mode`.
    pub(super) fn probe_on(
        &self,
        name: &str,
        xdp_mode: &str,
        args: &[&str],
        rt: Option<u8>,
    ) -> Result<Value> {
        self.run_probe(name, xdp_mode, args, rt, Path::new("/dev/null"))
    }

    /// As [`probe_on`](Self::probe_on), keeping the per-probe CSV as
    /// `{name}.csv` and returning its text too (the stamps the summary
    /// does not combine, such as the user-space send time).
    pub(super) fn probe_csv(
        &self,
        name: &str,
        xdp_mode: &str,
        args: &[&str],
        rt: Option<u8>,
    ) -> Result<(Value, String)> {
        let csv = self.out.join(format!("{name}.csv"));
        let summary = self.run_probe(name, xdp_mode, args, rt, &csv)?;
        let text =
            std::fs::read_to_string(&csv).with_context(|| format!("read {}", csv.display()))?;
        Ok((summary, text))
    }

    fn run_probe(
        &self,
        name: &str,
        xdp_mode: &str,
        args: &[&str],
        rt: Option<u8>,
        csv: &Path,
    ) -> Result<Value> {
        let json = self.out.join(format!("{name}.json"));
        let mut c = Command::new(&self.bin);
        c.args(["--quiet", "--xdp-mode", xdp_mode, "--out"])
            .arg(csv)
            .arg("--json")
            .arg(&json)
            .args(args);
        if let Some(p) = rt {
            c.args(["--rt-priority", &p.to_string(), "--mlockall"]);
        }
        let o = c
            .output()
            .with_context(|| format!("run {}", self.bin.display()))?;
        std::fs::write(self.out.join(format!("{name}.txt")), &o.stdout)?;
        if !o.status.success() {
            bail!(
                "rtprobe {name} failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        let text =
            std::fs::read_to_string(&json).with_context(|| format!("read {}", json.display()))?;
        Ok(serde_json::from_str(&text)?)
    }
}

/// rtprobe's round trips in µs from a run's per-probe CSV, like for like
/// with ping's: from the user-space send (`send_ns`, taken just before
/// sendmmsg, where ping reads the clock before its sendmsg) to the echo's
/// kernel software RX stamp (`echo_ns`, where ping's SO_TIMESTAMP ends).
/// With `minus_turnaround` the reflector's turnaround (`turnaround_ns`) is
/// taken out. Probes without the stamps needed are left out.
pub(super) fn user_start_rtts_us(csv: &str, minus_turnaround: bool) -> Vec<f64> {
    // The file starts with `# rtprobe-meta:` comment lines.
    let mut lines = csv.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (Some(send), Some(echo), Some(turn)) =
        (col("send_ns"), col("echo_ns"), col("turnaround_ns"))
    else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let at = |i: usize| f.get(i).and_then(|v| v.parse::<i64>().ok());
            let rtt_ns = at(echo)? - at(send)?;
            let ns = if minus_turnaround {
                rtt_ns - at(turn)?
            } else {
                rtt_ns
            };
            Some(ns as f64 / 1000.0)
        })
        .collect()
}

/// A testbed held by `rtprobe testbed`; torn down when dropped (stdin closes).
pub(super) struct HeldTestbed {
    child: Child,
    info: Value,
}

impl HeldTestbed {
    pub(super) fn start(bin: &Path, xdp_mode: &str) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(["testbed", "--xdp-mode", xdp_mode])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start `rtprobe testbed`")?;
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().context("testbed stdout")?)
            .read_line(&mut line)
            .context("read the testbed line")?;
        let info: Value = serde_json::from_str(line.trim())
            .with_context(|| format!("`rtprobe testbed` printed no testbed ({:?})", line.trim()))?;
        Ok(Self { child, info })
    }

    pub(super) fn s(&self, k: &str) -> String {
        self.info[k].as_str().unwrap_or_default().to_string()
    }
}

impl Drop for HeldTestbed {
    fn drop(&mut self) {
        // Closing stdin makes it tear the testbed down and exit.
        drop(self.child.stdin.take());
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server started in a namespace; killed when dropped.
pub(super) struct Server(pub(super) Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` with sh -c; fails with its stderr.
pub(super) fn sh(cmd: &str) -> Result<()> {
    let o = Command::new("sh").args(["-c", cmd]).output()?;
    if !o.status.success() {
        bail!(
            "`{cmd}` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

pub(super) fn in_ns(ns: &str, prog: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, prog]);
    c
}

pub(super) fn have(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

pub(super) fn output_text(mut c: Command, what: &str) -> Result<String> {
    let o = c.output().with_context(|| format!("run {what}"))?;
    if !o.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_start_round_trips_from_the_csv() {
        let csv = "# rtprobe-meta: {}\n\
                   seq,send_ns,echo_ns,rtt_ns,turnaround_ns\n\
                   0,1000,11000,8000,2000\n\
                   1,5000,,,\n\
                   2,9000,16500,5000,\n";
        assert_eq!(user_start_rtts_us(csv, false), [10.0, 7.5]);
        // Only the probe with a turnaround has a figure without it.
        assert_eq!(user_start_rtts_us(csv, true), [8.0]);
        assert!(user_start_rtts_us("seq,rtt_ns\n0,5\n", false).is_empty());
        assert!(user_start_rtts_us("", false).is_empty());
    }
}
