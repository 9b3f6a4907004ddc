//! Child processes: the programs rtprobe runs rather than re-implements
//! (`perf stat` for the bench's counters, `stress-ng` for the CPU stress;
//! `tc` has its own module, [`super::tc`]). Two shapes: run a program to
//! its end and take its output ([`output`]), or start one in the
//! background with no standard streams and stop it later ([`Background`]:
//! SIGTERM, a grace period, then SIGKILL; also on drop).
//!
//! Kernel interface: fork/exec (std::process), kill(2); any Linux.

use std::{
    ffi::OsStr,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// Runs `program` with `args` to its end and returns its status, stdout
/// and stderr; the error is the one of starting it (not found, denied).
pub(crate) fn output<S: AsRef<OsStr>>(
    program: impl AsRef<OsStr>,
    args: &[S],
) -> std::io::Result<Output> {
    Command::new(program).args(args).output()
}

/// A program running in the background, its standard streams on
/// /dev/null. Stopped by [`Background::stop`] or, failing that, on drop.
#[derive(Debug)]
pub(crate) struct Background {
    child: Option<Child>,
}

impl Background {
    /// Starts `program` with `args`; the error is the one of starting it.
    pub(crate) fn spawn<S: AsRef<OsStr>>(
        program: impl AsRef<OsStr>,
        args: &[S],
    ) -> std::io::Result<Self> {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Self { child: Some(child) })
    }

    /// Its process id; None once stopped.
    #[cfg(test)]
    pub(crate) fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Asks the program to stop (SIGTERM), waits up to `grace` for it,
    /// then kills it (SIGKILL) and reaps it. A second call does nothing.
    /// The error is one of waiting for it.
    pub(crate) fn stop(&mut self, grace: Duration) -> std::io::Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        let pid = Pid::from_raw(c.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        loop {
            if c.try_wait()?.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_returns_the_status_and_streams() {
        let o = output("sh", &["-c", "echo out; echo err >&2; exit 3"]).unwrap();
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(o.stdout, b"out\n");
        assert_eq!(o.stderr, b"err\n");
        assert!(output("rtprobe-no-such-program", &["x"]).is_err());
    }

    #[test]
    fn background_stops_on_sigterm_and_twice_is_nothing() {
        let mut b = Background::spawn("sleep", &["30"]).unwrap();
        let pid = Pid::from_raw(b.id().unwrap() as i32);
        let t = Instant::now();
        b.stop(Duration::from_secs(5)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        // Reaped: signal 0 finds no such process.
        assert!(kill(pid, None).is_err());
        assert_eq!(b.id(), None);
        b.stop(Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn background_is_killed_after_its_grace() {
        // A shell that ignores SIGTERM: the grace runs out, SIGKILL ends it.
        let mut b = Background::spawn("sh", &["-c", "trap '' TERM; exec sleep 30"]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        b.stop(Duration::from_millis(200)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
