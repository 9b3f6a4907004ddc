//! Hardware timestamps on CLOCK_REALTIME without phc2sys.
//!
//! A hardware timestamp (ts[2] of `scm_timestamping`) is on the NIC's PTP
//! hardware clock (PHC), while software stamps and the probe's own times
//! are on CLOCK_REALTIME. To put a hardware stamp next to a software one,
//! rtprobe samples the PHC against CLOCK_REALTIME during the run and maps
//! every hardware stamp through the measured offset.
//!
//! Kernel interfaces:
//! - `SIOCETHTOOL` / `ETHTOOL_GET_TS_INFO` (linux/ethtool.h, Linux >= 3.5,
//!   in [`crate::sys::ethtool`]): which `/dev/ptpN` belongs to an interface.
//! - `/dev/ptpN` with `PTP_SYS_OFFSET_EXTENDED` (linux/ptp_clock.h,
//!   Linux >= 5.0 and a driver with `gettimex64`; its `clockid` field needs
//!   Linux >= 6.12, older kernels require the same bytes to be zero, which
//!   is CLOCK_REALTIME), falling back to `PTP_SYS_OFFSET` (Linux >= 3.8).
//!
//! Everything past the two ioctls ([`PhcConverter`], [`sample_until`]) is
//! pure and is tested with a fake clock.

use std::{
    collections::VecDeque,
    fs::File,
    io,
    os::fd::AsRawFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::sys::ethtool;

/// The index N of the interface's PHC (`/dev/ptpN`), or None when it has
/// none (veth, loopback, NICs without hardware timestamping), in the
/// calling thread's network namespace (the caller enters it with
/// `Netns::run`).
pub(crate) fn phc_index(ifname: &str) -> Result<Option<u32>> {
    ethtool::phc_index(ifname)
}

const PTP_CLK_MAGIC: u8 = b'=';
const PTP_MAX_SAMPLES: usize = 25;

/// `struct ptp_clock_time` (linux/ptp_clock.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct PtpClockTime {
    sec: i64,
    nsec: u32,
    reserved: u32,
}

impl PtpClockTime {
    const ZERO: Self = Self {
        sec: 0,
        nsec: 0,
        reserved: 0,
    };

    /// Nanoseconds, or None for a time no kernel writes.
    fn ns(self) -> Option<i64> {
        if self.nsec >= 1_000_000_000 {
            return None;
        }
        self.sec
            .checked_mul(1_000_000_000)?
            .checked_add(i64::from(self.nsec))
    }
}

/// `struct ptp_sys_offset`: `n_samples` PHC reads interleaved with system
/// reads (sys, phc, sys, phc, ..., sys).
#[repr(C)]
struct PtpSysOffset {
    n_samples: u32,
    rsv: [u32; 3],
    ts: [PtpClockTime; 2 * PTP_MAX_SAMPLES + 1],
}

/// `struct ptp_sys_offset_extended`: `n_samples` (sys, phc, sys) triples,
/// each system read taken right around the PHC read in the driver.
#[repr(C)]
struct PtpSysOffsetExtended {
    n_samples: u32,
    /// Linux >= 6.12: which system clock; 0 = CLOCK_REALTIME, also what
    /// older kernels (which reserve these bytes) require.
    clockid: i32,
    rsv: [u32; 2],
    ts: [[PtpClockTime; 3]; PTP_MAX_SAMPLES],
}

/// `_IOW('=', 5, struct ptp_sys_offset)`.
const PTP_SYS_OFFSET: nix::sys::ioctl::ioctl_num_type =
    nix::request_code_write!(PTP_CLK_MAGIC, 5, std::mem::size_of::<PtpSysOffset>());
/// `_IOWR('=', 9, struct ptp_sys_offset_extended)`.
const PTP_SYS_OFFSET_EXTENDED: nix::sys::ioctl::ioctl_num_type = nix::request_code_readwrite!(
    PTP_CLK_MAGIC,
    9,
    std::mem::size_of::<PtpSysOffsetExtended>()
);

/// One PHC read bracketed by two CLOCK_REALTIME reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetSample {
    pub(crate) sys_before_ns: i64,
    pub(crate) phc_ns: i64,
    pub(crate) sys_after_ns: i64,
}

impl OffsetSample {
    /// How long the read took: the PHC was read somewhere inside this
    /// window, so the offset is known to ± half of it. None for a sample
    /// whose clocks went backwards.
    pub(crate) fn window_ns(&self) -> Option<i64> {
        self.sys_after_ns
            .checked_sub(self.sys_before_ns)
            .filter(|w| *w >= 0)
    }

    /// CLOCK_REALTIME minus PHC, taking the PHC read as the middle of the
    /// window.
    pub(crate) fn offset_ns(&self) -> Option<i64> {
        let mid = self.sys_before_ns.checked_add(self.window_ns()? / 2)?;
        mid.checked_sub(self.phc_ns)
    }
}

fn samples_from_extended(req: &PtpSysOffsetExtended) -> Vec<OffsetSample> {
    let n = (req.n_samples as usize).min(PTP_MAX_SAMPLES);
    req.ts[..n]
        .iter()
        .filter_map(|[b, p, a]| {
            Some(OffsetSample {
                sys_before_ns: b.ns()?,
                phc_ns: p.ns()?,
                sys_after_ns: a.ns()?,
            })
        })
        .collect()
}

fn samples_from_basic(req: &PtpSysOffset) -> Vec<OffsetSample> {
    let n = (req.n_samples as usize).min(PTP_MAX_SAMPLES);
    (0..n)
        .filter_map(|i| {
            Some(OffsetSample {
                sys_before_ns: req.ts[2 * i].ns()?,
                phc_ns: req.ts[2 * i + 1].ns()?,
                sys_after_ns: req.ts[2 * i + 2].ns()?,
            })
        })
        .collect()
}

/// Something that reads the PHC against CLOCK_REALTIME: [`PtpClock`], or a
/// fake in tests.
pub(crate) trait PhcSource {
    /// One batch of samples taken back to back.
    fn read(&mut self) -> io::Result<Vec<OffsetSample>>;
}

/// An open `/dev/ptpN`.
pub(crate) struct PtpClock {
    file: File,
    index: u32,
    samples_per_read: u32,
    /// Cleared once the kernel or driver refuses PTP_SYS_OFFSET_EXTENDED.
    extended: bool,
}

impl PtpClock {
    /// Opens `/dev/ptp{index}` read-only (the offset ioctls change nothing).
    pub(crate) fn open(index: u32) -> Result<Self> {
        let path = format!("/dev/ptp{index}");
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => bail!(
                "{path} does not exist: the interface's PHC is not visible here (is /dev the host's? does the driver register a PTP clock?); use software timestamps"
            ),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => bail!(
                "cannot open {path}: permission denied; run rtprobe as root or give it read access to {path}"
            ),
            Err(e) => return Err(e).with_context(|| format!("open {path}")),
        };
        Ok(Self {
            file,
            index,
            // A few reads per batch: the narrowest window of them is kept,
            // and each costs the driver only a register read or two.
            samples_per_read: 5,
            extended: true,
        })
    }

    /// One batch of offset samples.
    pub(crate) fn read_offsets(&mut self) -> io::Result<Vec<OffsetSample>> {
        let mut extended = self.extended;
        let r = read_falling_back(
            &mut extended,
            self.index,
            || self.read_extended(),
            || self.read_basic(),
        );
        self.extended = extended;
        r
    }

    fn read_extended(&self) -> io::Result<Vec<OffsetSample>> {
        let mut req = PtpSysOffsetExtended {
            n_samples: self.samples_per_read,
            clockid: libc::CLOCK_REALTIME,
            rsv: [0; 2],
            ts: [[PtpClockTime::ZERO; 3]; PTP_MAX_SAMPLES],
        };
        // SAFETY: req is a live ptp_sys_offset_extended of the size encoded
        // in the request number; the kernel writes only inside it.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                PTP_SYS_OFFSET_EXTENDED as _,
                &mut req as *mut PtpSysOffsetExtended,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(samples_from_extended(&req))
    }

    fn read_basic(&self) -> io::Result<Vec<OffsetSample>> {
        let mut req = PtpSysOffset {
            n_samples: self.samples_per_read,
            rsv: [0; 3],
            ts: [PtpClockTime::ZERO; 2 * PTP_MAX_SAMPLES + 1],
        };
        // SAFETY: as above, for ptp_sys_offset. The kernel copies results
        // back although the request is declared _IOW, hence `*mut`.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                PTP_SYS_OFFSET as _,
                &mut req as *mut PtpSysOffset,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(samples_from_basic(&req))
    }
}

/// PTP_SYS_OFFSET_EXTENDED while `extended` holds, else (and from the
/// first refusal on) PTP_SYS_OFFSET.
fn read_falling_back(
    extended: &mut bool,
    index: u32,
    read_extended: impl FnOnce() -> io::Result<Vec<OffsetSample>>,
    read_basic: impl FnOnce() -> io::Result<Vec<OffsetSample>>,
) -> io::Result<Vec<OffsetSample>> {
    if *extended {
        match read_extended() {
            // ENOTTY: kernel < 5.0; EOPNOTSUPP: driver without gettimex64;
            // EINVAL: a kernel refusing a field of the request.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL)
                ) =>
            {
                log::info!(
                    "/dev/ptp{index}: PTP_SYS_OFFSET_EXTENDED unavailable ({e}), using PTP_SYS_OFFSET"
                );
                *extended = false;
            }
            r => return r,
        }
    }
    read_basic()
}

impl PhcSource for PtpClock {
    fn read(&mut self) -> io::Result<Vec<OffsetSample>> {
        self.read_offsets()
    }
}

/// Samples kept by default: at one batch per 100 ms, the last ~7 minutes.
pub(crate) const DEFAULT_RING_SAMPLES: usize = 4096;
/// An offset this far from the current segment's prediction is a step of
/// one clock (a PTP servo or an admin setting the time), not drift: at
/// 100 ms sampling, 1 ms is 10 000 ppm, far beyond any oscillator.
pub(crate) const DEFAULT_STEP_THRESHOLD_NS: i64 = 1_000_000;

/// One kept sample: the offset (CLOCK_REALTIME - PHC) at a PHC time.
#[derive(Debug, Clone, Copy)]
struct Point {
    phc_ns: i64,
    offset_ns: i64,
}

/// Running least squares of offset against PHC time over one segment,
/// relative to the segment's first point so that f64 keeps nanoseconds.
#[derive(Debug, Clone, Copy, Default)]
struct Fit {
    origin: (i64, i64),
    n: u64,
    mean_x: f64,
    mean_y: f64,
    sxx: f64,
    sxy: f64,
}

impl Fit {
    fn starting_at(p: Point) -> Self {
        Self {
            origin: (p.phc_ns, p.offset_ns),
            ..Default::default()
        }
    }

    fn add(&mut self, p: Point) {
        // i128: the difference of two i64 need not fit in one.
        let x = (i128::from(p.phc_ns) - i128::from(self.origin.0)) as f64;
        let y = (i128::from(p.offset_ns) - i128::from(self.origin.1)) as f64;
        self.n += 1;
        // Welford's update: no large sums to cancel over days of samples.
        let dx = x - self.mean_x;
        self.mean_x += dx / self.n as f64;
        self.mean_y += (y - self.mean_y) / self.n as f64;
        self.sxx += dx * (x - self.mean_x);
        self.sxy += dx * (y - self.mean_y);
    }

    fn slope(&self) -> Option<f64> {
        (self.n >= 2 && self.sxx > 0.0).then(|| self.sxy / self.sxx)
    }
}

pub(crate) use crate::stats::report::PhcReport;

/// Converts PHC timestamps to CLOCK_REALTIME from offset samples taken over
/// the run.
///
/// Samples form segments: a sample whose offset is more than the step
/// threshold away from what the current segment predicts (or whose PHC
/// time does not advance) starts a new one. A stamp is converted with the
/// segment whose sampled PHC range holds it (the newest one if a backward
/// step makes ranges overlap), else with the nearest one; between two
/// samples the offset is interpolated linearly, outside them extrapolated
/// from the nearest two. A stamp taken between the last sample before a
/// step and the first after it may be converted with the wrong side: the
/// step's exact time is unknown.
///
/// Memory is bounded: only the last `ring_samples` samples are kept (the
/// drift fit and the window histogram are running summaries). A stamp
/// older than the oldest kept sample converts by extrapolation from the
/// oldest two, which is as good as the clocks' drift was stable; convert
/// stamps as they arrive, not at the end of a long run.
#[derive(Debug)]
pub(crate) struct PhcConverter {
    ring: VecDeque<Point>,
    ring_samples: usize,
    /// Absolute index of `ring[0]` among all points ever kept.
    base: u64,
    /// Absolute index of each segment's first point, oldest first; the
    /// first may have left the ring already.
    segments: VecDeque<u64>,
    step_threshold_ns: i64,
    fit: Fit,
    /// Fits of closed segments, pooled: (sxx, sxy).
    closed_sxx: f64,
    closed_sxy: f64,
    samples: u64,
    rejected_batches: u64,
    steps: u64,
    windows: hdrhistogram::Histogram<u64>,
    window_max_ns: Option<u64>,
    phc_index: Option<u32>,
}

impl Default for PhcConverter {
    fn default() -> Self {
        Self::new()
    }
}

impl PhcConverter {
    pub(crate) fn new() -> Self {
        Self::with_limits(DEFAULT_RING_SAMPLES, DEFAULT_STEP_THRESHOLD_NS)
    }

    /// `ring_samples` (at least 2) samples kept; `step_threshold_ns` is the
    /// prediction error that counts as a step.
    pub(crate) fn with_limits(ring_samples: usize, step_threshold_ns: i64) -> Self {
        let ring_samples = ring_samples.max(2);
        Self {
            ring: VecDeque::with_capacity(ring_samples),
            ring_samples,
            base: 0,
            segments: VecDeque::new(),
            step_threshold_ns: step_threshold_ns.max(0),
            fit: Fit::default(),
            closed_sxx: 0.0,
            closed_sxy: 0.0,
            samples: 0,
            rejected_batches: 0,
            steps: 0,
            // 3 significant digits, growing as needed: a few kB at most.
            windows: hdrhistogram::Histogram::new(3).expect("3 significant digits is valid"),
            window_max_ns: None,
            phc_index: None,
        }
    }

    /// Which /dev/ptpN the samples come from, for the report.
    pub(crate) fn set_phc_index(&mut self, index: u32) {
        self.phc_index = Some(index);
    }

    /// Takes one batch of samples, keeping the one with the narrowest read
    /// window (the least uncertain offset). A batch whose narrowest window
    /// is wider than the step threshold is rejected.
    pub(crate) fn add(&mut self, batch: &[OffsetSample]) {
        let best = batch
            .iter()
            .filter_map(|s| Some((s.window_ns()?, s.phc_ns, s.offset_ns()?)))
            .min_by_key(|(w, _, _)| *w);
        // A window wider than a step cannot tell a step from a preempted
        // read: such a batch would start (and end) a bogus segment.
        let Some((window_ns, phc_ns, offset_ns)) =
            best.filter(|(w, _, _)| *w <= self.step_threshold_ns)
        else {
            if !batch.is_empty() {
                self.rejected_batches += 1;
            }
            return;
        };
        self.samples += 1;
        let window = window_ns as u64;
        let _ = self.windows.record(window);
        self.window_max_ns = Some(self.window_max_ns.map_or(window, |m| m.max(window)));
        self.push(Point { phc_ns, offset_ns });
    }

    fn push(&mut self, p: Point) {
        let step = match self.ring.back() {
            None => None,
            Some(last) if p.phc_ns <= last.phc_ns => Some(true),
            Some(last) => {
                let slope = self.fit.slope().unwrap_or(0.0);
                let elapsed = (i128::from(p.phc_ns) - i128::from(last.phc_ns)) as f64;
                let predicted = last.offset_ns as f64 + slope * elapsed;
                Some((p.offset_ns as f64 - predicted).abs() > self.step_threshold_ns as f64)
            }
        };
        let index = self.base + self.ring.len() as u64;
        match step {
            None => {
                self.segments.push_back(index);
                self.fit = Fit::starting_at(p);
            }
            Some(true) => {
                self.steps += 1;
                self.segments.push_back(index);
                self.closed_sxx += self.fit.sxx;
                self.closed_sxy += self.fit.sxy;
                self.fit = Fit::starting_at(p);
            }
            Some(false) => {}
        }
        self.fit.add(p);
        if self.ring.len() == self.ring_samples {
            self.ring.pop_front();
            self.base += 1;
            while self.segments.len() >= 2 && self.segments[1] <= self.base {
                self.segments.pop_front();
            }
        }
        self.ring.push_back(p);
    }

    /// Ring index range of segment `k`.
    fn segment_range(&self, k: usize) -> (usize, usize) {
        let end = self.base + self.ring.len() as u64;
        let first = self.segments[k].max(self.base);
        let next = self.segments.get(k + 1).copied().unwrap_or(end);
        ((first - self.base) as usize, (next - self.base) as usize)
    }

    /// A PHC time as CLOCK_REALTIME ns; None before any sample, or when the
    /// result does not fit in i64.
    pub(crate) fn to_realtime(&self, phc_ns: i64) -> Option<i64> {
        if self.ring.is_empty() {
            return None;
        }
        let mut best: Option<(i128, (usize, usize))> = None;
        for k in (0..self.segments.len()).rev() {
            let (lo, hi) = self.segment_range(k);
            let (first, last) = (
                i128::from(self.ring[lo].phc_ns),
                i128::from(self.ring[hi - 1].phc_ns),
            );
            let p = i128::from(phc_ns);
            let dist = if p < first {
                first - p
            } else if p > last {
                p - last
            } else {
                0
            };
            // Newest first, strict `<`: on ties the newer segment wins.
            if best.is_none_or(|(d, _)| dist < d) {
                best = Some((dist, (lo, hi)));
            }
            if dist == 0 {
                break;
            }
        }
        let (_, (lo, hi)) = best?;
        self.interpolate(lo, hi, phc_ns)
    }

    fn interpolate(&self, lo: usize, hi: usize, phc_ns: i64) -> Option<i64> {
        let offset_ns = if hi - lo == 1 {
            i128::from(self.ring[lo].offset_ns)
        } else {
            // First point after the stamp; PHC times rise within a segment.
            let (mut l, mut r) = (lo, hi);
            while l < r {
                let mid = l + (r - l) / 2;
                if self.ring[mid].phc_ns <= phc_ns {
                    l = mid + 1;
                } else {
                    r = mid;
                }
            }
            let a = l.clamp(lo + 1, hi - 1) - 1;
            let (pa, pb) = (self.ring[a], self.ring[a + 1]);
            let num = (i128::from(pb.offset_ns) - i128::from(pa.offset_ns))
                .checked_mul(i128::from(phc_ns) - i128::from(pa.phc_ns))?;
            let den = i128::from(pb.phc_ns) - i128::from(pa.phc_ns);
            i128::from(pa.offset_ns) + div_round(num, den)
        };
        i64::try_from(i128::from(phc_ns) + offset_ns).ok()
    }

    /// What the run's samples said about the PHC.
    pub(crate) fn report(&self) -> PhcReport {
        let sxx = self.closed_sxx + self.fit.sxx;
        let sxy = self.closed_sxy + self.fit.sxy;
        PhcReport {
            phc_index: self.phc_index,
            samples: self.samples,
            rejected_batches: self.rejected_batches,
            read_window_max_ns: self.window_max_ns,
            read_window_median_ns: (self.samples > 0).then(|| {
                self.windows
                    .median_equivalent(self.windows.value_at_quantile(0.5))
            }),
            drift_ppb: (sxx > 0.0).then(|| sxy / sxx * 1e9),
            steps: self.steps,
        }
    }
}

/// `num / den` rounded to nearest; `den` > 0.
fn div_round(num: i128, den: i128) -> i128 {
    let half = den / 2;
    if num >= 0 {
        (num + half) / den
    } else {
        (num - half) / den
    }
}

/// What a sampler did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SamplerStats {
    pub(crate) reads: u64,
    pub(crate) errors: u64,
    pub(crate) last_error: Option<String>,
}

/// Reads `source` every `period` into `conv` until `stop` is set (checked
/// at least once a period; `Thread::unpark` wakes it at once). The first
/// read is immediate so stamps convert early in the run.
pub(crate) fn sample_until(
    source: &mut dyn PhcSource,
    period: Duration,
    conv: &Mutex<PhcConverter>,
    stop: &AtomicBool,
) -> SamplerStats {
    let mut stats = SamplerStats::default();
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now < next {
            std::thread::park_timeout(next - now);
            continue;
        }
        next += period;
        // After a long stall, sample on the period from now rather than
        // catching up with a burst.
        if next < now {
            next = now + period;
        }
        stats.reads += 1;
        match source.read() {
            Ok(batch) => conv
                .lock()
                // The converter stays consistent between calls: a panic
                // elsewhere while holding it does not corrupt it.
                .unwrap_or_else(|e| e.into_inner())
                .add(&batch),
            Err(e) => {
                if stats.errors == 0 {
                    log::warn!("reading the PHC: {e}");
                } else {
                    log::debug!("reading the PHC: {e}");
                }
                stats.errors += 1;
                stats.last_error = Some(e.to_string());
            }
        }
    }
    stats
}

/// [`sample_until`] on its own thread.
pub(crate) struct PhcSampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<SamplerStats>>,
}

impl PhcSampler {
    pub(crate) fn spawn(
        mut source: impl PhcSource + Send + 'static,
        period: Duration,
        conv: Arc<Mutex<PhcConverter>>,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("rtprobe-phc".into())
            .spawn(move || sample_until(&mut source, period, &conv, &flag))
            .context("spawn the PHC sampler thread")?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops sampling and waits for the thread.
    pub(crate) fn stop(mut self) -> Result<SamplerStats> {
        self.signal();
        match self.handle.take() {
            Some(h) => h
                .join()
                .map_err(|_| anyhow::anyhow!("the PHC sampler thread panicked")),
            None => Ok(SamplerStats::default()),
        }
    }

    fn signal(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = &self.handle {
            h.thread().unpark();
        }
    }
}

impl Drop for PhcSampler {
    /// A sampler dropped without `stop` ends too (without waiting).
    fn drop(&mut self) {
        self.signal();
    }
}

#[cfg(test)]
#[path = "phc_tests.rs"]
mod tests;
