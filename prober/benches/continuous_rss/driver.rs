//! Drives a continuous run's per-probe machinery at full speed without the
//! network: synthetic events (monotonic timestamps, a few % loss, some
//! reordering, late and duplicate TX stamps, duplicates, foreign datagrams,
//! late arrivals) go through the product's [`Collector`] — the matcher, the
//! run's statistics, the rotated CSV — and its live outputs (interval
//! histograms, the HDR interval log, the metrics registry served on a
//! loopback port, the progress figures), exactly as `rtprobe --forever`
//! wires them. What it decides to inject it tallies, so a caller can check
//! that every probe ends received, lost or counted under a named reason.

use std::{
    collections::BinaryHeap,
    path::{Path, PathBuf},
    sync::atomic::AtomicU8,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result};
use rtprobe::{
    export::{
        CsvWriter,
        live::Live,
        plan::{ContinuousPlan, Rotate, Rotation},
    },
    model::meta::RunMeta,
    probe::{
        Collector, ProbeConfig, TimestampSource, cmsg::TxKind, matcher::Event, matcher::Expect,
        matcher::NoHwClocks,
    },
    stats::Summary,
};

/// What to drive and where the outputs go.
pub struct Plan {
    pub probes: u64,
    /// Simulated probe interval (1 ms: 86.4 M probes are 24 h).
    pub interval_ns: i64,
    /// Directory for the CSV (rotated), and the HDR log.
    pub dir: PathBuf,
    pub rotate_bytes: u64,
    pub keep: u32,
    /// RSS samples taken over the run (evenly spaced in probes).
    pub samples: u32,
}

/// What the driver injected, by kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Injected {
    pub send_failed: u64,
    /// Lost on the way out: never arrived.
    pub forward_lost: u64,
    /// Arrived, the echo never came back.
    pub return_lost: u64,
    /// Arrived only after the matcher's timeout.
    pub late_arrivals: u64,
    /// Arrived a few intervals late (reordering, within the timeout).
    pub delayed: u64,
    pub duplicate_arrivals: u64,
    /// Software TX stamps delivered after the timeout.
    pub late_tx: u64,
    pub duplicate_tx: u64,
    /// TX stamps delivered before their send event.
    pub early_tx: u64,
    pub foreign: u64,
}

pub struct Outcome {
    pub driven: u64,
    pub injected: Injected,
    pub summary: Summary,
    pub late_arrivals: u64,
    pub output_error: Option<String>,
    pub csv_rows: u64,
    pub rotations: u64,
    /// (probes driven so far, VmRSS MiB).
    pub rss: Vec<(u64, f64)>,
    pub wall: Duration,
    pub files: usize,
    pub bytes: u64,
    pub hdr_log_bytes: u64,
    pub progress_calls: u64,
}

impl Outcome {
    /// RSS at the first sample at or past a third of the probes.
    pub fn rss_at_third(&self) -> Option<f64> {
        self.rss
            .iter()
            .find(|(n, _)| *n >= self.driven / 3)
            .map(|&(_, r)| r)
    }

    pub fn rss_end(&self) -> Option<f64> {
        self.rss.last().map(|&(_, r)| r)
    }

    /// Highest RSS from the third on.
    pub fn rss_peak_after_third(&self) -> Option<f64> {
        self.rss
            .iter()
            .filter(|(n, _)| *n >= self.driven / 3)
            .map(|&(_, r)| r)
            .reduce(f64::max)
    }
}

/// VmRSS of this process, MiB.
pub fn vm_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// xorshift64*: deterministic, cheap, good enough for picking faults.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// True with probability `per_million` / 1e6.
    fn chance(&mut self, per_million: u64) -> bool {
        self.next() % 1_000_000 < per_million
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// An event held back to be delivered later (reordered, late).
struct Held {
    at_ns: i64,
    n: u64,
    ev: Event,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.at_ns, self.n) == (o.at_ns, o.n)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    // Min-heap on delivery time.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at_ns, o.n).cmp(&(self.at_ns, self.n))
    }
}

/// Matcher timeout of the driven run (rtprobe's default is 1 s too).
const TIMEOUT_NS: i64 = 1_000_000_000;
/// Probes whose events go to the collector in one batch (an I/O wake-up).
const BATCH: u64 = 64;

#[allow(clippy::too_many_lines)]
pub fn drive(plan: &Plan) -> Result<Outcome> {
    std::fs::create_dir_all(&plan.dir).with_context(|| format!("create {}", plan.dir.display()))?;
    let cfg = ProbeConfig {
        size: 64,
        interval: Duration::from_nanos(plan.interval_ns as u64),
        count: None,
        duration: None,
        tos: 0,
        port: 5061,
        timestamps: TimestampSource::Software,
        timeout: Duration::from_nanos(TIMEOUT_NS as u64),
        flow: 0,
        spin: None,
        busy_poll: false,
        no_warm_up: false,
        rt: Default::default(),
        kernel_reflector: false,
    };
    let rotation = Rotation {
        when: Rotate::Bytes(plan.rotate_bytes),
        keep: plan.keep,
    };
    let hdr_path = plan.dir.join("run.hlog");
    let cont = ContinuousPlan {
        forever: true,
        rotation: Some(rotation),
        report_every: Some(Duration::from_secs(10)),
        metrics_listen: Some("127.0.0.1:0".parse().expect("a socket address")),
        metrics_token_file: None,
        metrics_series: Default::default(),
        hdr_log: Some(hdr_path.clone()),
    };
    let meta = RunMeta {
        version: env!("CARGO_PKG_VERSION").into(),
        testbed: "synthetic".into(),
        reflector: "user".into(),
        size: cfg.size as u32,
        interval_ns: plan.interval_ns as u64,
        port: cfg.port,
        timestamps_requested: "software".into(),
        ..Default::default()
    };
    let progress_calls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let pc = progress_calls.clone();
    let mut live = Live::new(
        &cont,
        Box::new(|_line: &str| {}),
        Box::new(move |p| {
            // What the progress bar would show, formatted as it is there.
            std::hint::black_box(p.message());
            pc.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }),
    )?;
    let csv_path = plan.dir.join("out.csv");
    let mut csv = CsvWriter::create_rotated(&csv_path, &meta, Some(rotation))?;
    let mut observer =
        live.main_observer(cfg.flow_labels("synthetic"), cfg.kernel_reflector, &meta)?;
    let stop = AtomicU8::new(0);
    let expect = Expect {
        tx: true,
        tx_hw: false,
        echo_tx: true,
        echo_tx_hw: false,
    };
    let t0 = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let mut c = Collector::new(&cfg, expect, std::sync::Arc::new(NoHwClocks), t0);

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut inj = Injected::default();
    let mut held: BinaryHeap<Held> = BinaryHeap::new();
    let mut held_n = 0u64;
    let mut batch: Vec<Event> = Vec::with_capacity(BATCH as usize * 8);
    let sample_every = (plan.probes / u64::from(plan.samples.max(1))).max(1);
    let mut rss = Vec::new();
    let started = Instant::now();
    let mut now = t0;
    for seq in 0..plan.probes {
        let t = t0 + seq as i64 * plan.interval_ns;
        // Held-back events due before this probe's send go first, after
        // the collector has seen the time move on to when they come.
        while let Some(h) = held.peek().filter(|h| h.at_ns <= t) {
            now = now.max(h.at_ns);
            c.on_events(batch.drain(..));
            c.drain(now, false, &mut csv, &mut observer, &stop);
            batch.push(held.pop().expect("peeked").ev);
        }
        let mut hold = |at_ns: i64, ev: Event| {
            held_n += 1;
            held.push(Held {
                at_ns,
                n: held_n,
                ev,
            });
        };
        let send_ns = t + 2_000 + rng.below(3_000) as i64;
        if rng.chance(100) {
            inj.send_failed += 1;
            batch.push(Event::SendFailed {
                seq,
                sched_ns: t,
                send_ns,
            });
            now = send_ns;
        } else {
            let opt_id = seq as u32;
            let tx_sched = send_ns + 1_000;
            let tx_sw = tx_sched + 3_000 + rng.below(2_000) as i64;
            let sent = Event::Sent {
                seq,
                opt_id,
                sched_ns: t,
                send_ns,
            };
            let tx = |kind, ts_ns| Event::TxTimestamp {
                opt_id,
                kind,
                ts_ns,
            };
            if rng.chance(20_000) {
                // The error queue was read before the send was recorded.
                inj.early_tx += 1;
                batch.push(tx(TxKind::Sched, tx_sched));
                batch.push(sent);
            } else {
                batch.push(sent);
                batch.push(tx(TxKind::Sched, tx_sched));
            }
            if rng.chance(300) {
                inj.late_tx += 1;
                hold(t + TIMEOUT_NS + 200_000_000, tx(TxKind::Software, tx_sw));
            } else {
                batch.push(tx(TxKind::Software, tx_sw));
                if rng.chance(1_000) {
                    inj.duplicate_tx += 1;
                    batch.push(tx(TxKind::Software, tx_sw + 7_000));
                }
            }
            // One-way ~40 µs with a tail; the echo comes back as long again.
            let one_way = 30_000 + rng.below(20_000) as i64 + (rng.below(1_000) as i64).pow(2) / 10;
            let rx = tx_sw + one_way;
            let arrived = Event::Arrived {
                seq,
                sw_ns: Some(rx),
                hw_ns: None,
                user_ns: rx + 4_000,
                echo_send_ns: Some(rx + 8_000),
            };
            let echo_tx = Event::EchoTx {
                opt_id,
                kind: TxKind::Software,
                ts_ns: rx + 12_000,
            };
            let back = rx + 12_000 + one_way;
            let echoed = Event::Echoed {
                seq,
                sw_ns: Some(back),
                hw_ns: None,
                user_ns: back + 4_000,
                reflector: None,
            };
            if rng.chance(20_000) {
                inj.forward_lost += 1;
            } else if rng.chance(200) {
                // Given up as lost first; the echo is not sent for it.
                inj.late_arrivals += 1;
                hold(t + TIMEOUT_NS + 200_000_000, arrived);
            } else if rng.chance(10_000) {
                // A few intervals late: reordered, within the timeout.
                inj.delayed += 1;
                let extra = 2 * plan.interval_ns + rng.below(3 * plan.interval_ns as u64) as i64;
                hold(rx + extra, arrived);
                hold(rx + extra + 12_000, echo_tx);
                if rng.chance(5_000) {
                    inj.return_lost += 1;
                } else {
                    hold(back + extra, echoed);
                }
            } else {
                batch.push(arrived);
                if rng.chance(1_000) {
                    inj.duplicate_arrivals += 1;
                    batch.push(arrived);
                }
                batch.push(echo_tx);
                if rng.chance(5_000) {
                    inj.return_lost += 1;
                } else {
                    batch.push(echoed);
                }
            }
            now = back + 4_000;
        }
        if rng.chance(100) {
            inj.foreign += 1;
            batch.push(Event::Foreign);
        }
        if (seq + 1) % BATCH == 0 || seq + 1 == plan.probes {
            c.on_events(batch.drain(..));
            c.drain(now, false, &mut csv, &mut observer, &stop);
        }
        // Sampled while the run is live: the end-of-run flush frees the
        // matcher, which would hide a leak in it.
        if ((seq + 1) % sample_every == 0 || seq + 1 == plan.probes)
            && let Some(r) = vm_rss_mib()
        {
            rss.push((seq + 1, r));
        }
    }
    // The end of the run: what is still held back arrives, then everything
    // still in flight is finalized.
    c.on_events(batch.drain(..));
    while let Some(h) = held.pop() {
        now = now.max(h.at_ns);
        c.drain(now, false, &mut csv, &mut observer, &stop);
        c.on_events([h.ev]);
    }
    c.drain(now + TIMEOUT_NS, true, &mut csv, &mut observer, &stop);
    let (stats, late_arrivals, output_error) = c.finish(&mut csv, &mut observer, &stop);
    let wall = started.elapsed();
    drop(observer);
    drop(live);
    let csv_rows = csv.rows();
    let rotations = csv.rotations();
    drop(csv);
    let (files, bytes) = dir_usage(&plan.dir)?;
    let hdr_log_bytes = std::fs::metadata(&hdr_path).map_or(0, |m| m.len());
    Ok(Outcome {
        driven: plan.probes,
        injected: inj,
        summary: stats.summary(),
        late_arrivals,
        output_error,
        csv_rows,
        rotations,
        rss,
        wall,
        files,
        bytes,
        hdr_log_bytes,
        progress_calls: progress_calls.load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// Files in `dir` and their total size.
pub fn dir_usage(dir: &Path) -> Result<(usize, u64)> {
    let mut n = 0;
    let mut bytes = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let m = e?.metadata()?;
        if m.is_file() {
            n += 1;
            bytes += m.len();
        }
    }
    Ok((n, bytes))
}
