//! Queue occupancy over time (the bufferbloat report's plots): every
//! interval, the backlog and length of each qdisc on the bottleneck, one
//! CSV row per qdisc per sample, next to the run's CSV:
//!
//! ```text
//! t_ns,handle,parent,kind,qlen_pkts,backlog_bytes,drops,overlimits,requeues,sent_bytes,sent_pkts
//! 1763771234000000000,1:,root,htb,87,131718,12,3501,0,92837465,61400
//! ```
//!
//! `t_ns` is CLOCK_REALTIME, the clock of the probe CSV, so both line up.
//! The counters are cumulative as the kernel keeps them.
//!
//! Kernel interface: RTM_GETQDISC dumps over a netlink socket made by the
//! sampling thread after it entered the bottleneck's namespace (the kernel
//! layer's [`crate::sys::netlink::NlSocket`], not its worker); no `tc`
//! process per sample. Its own socket because a sample through the
//! namespace's worker ([`crate::sys::Sys::qdiscs`]: a channel round trip
//! and a link lookup each time) measured 255-272 µs against 21-37 µs on
//! the thread's own socket (debug build, veth with htb, 5000 dumps, three
//! rounds): a tenth to a quarter of a 1 ms sampling interval.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, anyhow};

use crate::model::knobs::QueueSamplerApplied;
use crate::sys::{Netns, netlink::NlSocket};

pub(crate) const HEADER: &str = "t_ns,handle,parent,kind,qlen_pkts,backlog_bytes,drops,overlimits,requeues,sent_bytes,sent_pkts";

pub(crate) struct QueueSampler {
    path: PathBuf,
    interval: Duration,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<u64>>>,
    samples: Option<u64>,
}

/// Starts sampling `dev` in `ns` every `interval` into `path`.
pub(crate) fn start(
    ns: &Netns,
    dev: &str,
    interval: Duration,
    path: &Path,
) -> Result<QueueSampler> {
    if interval < Duration::from_millis(1) {
        anyhow::bail!("queue sample interval must be at least 1ms");
    }
    let file = File::create(path).with_context(|| {
        format!(
            "cannot create {}: check the directory exists and is writable",
            path.display()
        )
    })?;
    // The thread lives in the namespace for good, so it opens its own
    // handle (the fd keeps the namespace alive, not its name).
    let handle = Netns::open(ns.name())?;
    let dev = dev.to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let thread = std::thread::Builder::new()
        .name("queue-sampler".into())
        .spawn(move || -> Result<u64> {
            let setup = (|| -> Result<(NlSocket, u32)> {
                handle.enter_current_thread()?;
                let mut sock = NlSocket::new()?;
                let idx = sock.require_link(&dev)?.index;
                Ok((sock, idx))
            })();
            let (mut sock, idx) = match setup {
                Ok(v) => {
                    let _ = ready_tx.send(Ok(()));
                    v
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    let _ = ready_tx.send(Err(e));
                    return Err(anyhow!(msg));
                }
            };
            sample_loop(&mut sock, idx, file, interval, &st)
        })
        .context("spawn the queue sampler")?;
    match ready_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            let _ = thread.join();
            return Err(e.context("queue sampler"));
        }
        Err(_) => {
            let r = thread.join();
            return Err(match r {
                Ok(Err(e)) => e,
                _ => anyhow!("the queue sampler thread died"),
            });
        }
    }
    Ok(QueueSampler {
        path: path.to_path_buf(),
        interval,
        stop,
        thread: Some(thread),
        samples: None,
    })
}

/// Writes the CSV header, then one row per qdisc of link `idx` every
/// `interval` (on an absolute schedule) until `stop`; returns the number
/// of samples.
fn sample_loop(
    sock: &mut NlSocket,
    idx: u32,
    file: File,
    interval: Duration,
    stop: &AtomicBool,
) -> Result<u64> {
    let mut out = BufWriter::new(file);
    writeln!(out, "{HEADER}")?;
    let t0 = Instant::now();
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let t_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        for q in sock.qdiscs(idx)? {
            writeln!(
                out,
                "{t_ns},{},{},{},{},{},{},{},{},{},{}",
                q.handle,
                q.parent,
                q.kind,
                q.qlen,
                q.backlog_bytes,
                q.drops,
                q.overlimits,
                q.requeues,
                q.sent_bytes,
                q.sent_packets
            )?;
        }
        n += 1;
        // Absolute schedule: sample n+1 is due at t0 + (n+1) * interval.
        let next = interval * (n as u32);
        let now = t0.elapsed();
        if next > now {
            std::thread::sleep(next - now);
        }
    }
    out.flush()?;
    Ok(n)
}

impl QueueSampler {
    /// Stops sampling and flushes the CSV; returns the number of samples.
    pub(crate) fn stop(&mut self) -> Result<u64> {
        if let Some(n) = self.samples {
            return Ok(n);
        }
        self.stop.store(true, Ordering::Relaxed);
        let n = match self.thread.take() {
            Some(h) => h
                .join()
                .map_err(|_| anyhow!("the queue sampler thread panicked"))??,
            None => 0,
        };
        self.samples = Some(n);
        Ok(n)
    }

    pub(crate) fn metadata(&self) -> QueueSamplerApplied {
        QueueSamplerApplied {
            csv: self.path.display().to_string(),
            interval: crate::model::units::fmt_duration(self.interval),
            samples: self.samples,
        }
    }
}

impl Drop for QueueSampler {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            log::warn!("queue sampler: {e:#}");
        }
    }
}
