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
pub fn phc_index(ifname: &str) -> Result<Option<u32>> {
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
pub struct OffsetSample {
    pub sys_before_ns: i64,
    pub phc_ns: i64,
    pub sys_after_ns: i64,
}

impl OffsetSample {
    /// How long the read took: the PHC was read somewhere inside this
    /// window, so the offset is known to ± half of it. None for a sample
    /// whose clocks went backwards.
    pub fn window_ns(&self) -> Option<i64> {
        self.sys_after_ns
            .checked_sub(self.sys_before_ns)
            .filter(|w| *w >= 0)
    }

    /// CLOCK_REALTIME minus PHC, taking the PHC read as the middle of the
    /// window.
    pub fn offset_ns(&self) -> Option<i64> {
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
pub trait PhcSource {
    /// One batch of samples taken back to back.
    fn read(&mut self) -> io::Result<Vec<OffsetSample>>;
}

/// An open `/dev/ptpN`.
pub struct PtpClock {
    file: File,
    index: u32,
    samples_per_read: u32,
    /// Cleared once the kernel or driver refuses PTP_SYS_OFFSET_EXTENDED.
    extended: bool,
}

impl PtpClock {
    /// Opens `/dev/ptp{index}` read-only (the offset ioctls change nothing).
    pub fn open(index: u32) -> Result<Self> {
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
    pub fn read_offsets(&mut self) -> io::Result<Vec<OffsetSample>> {
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
pub const DEFAULT_RING_SAMPLES: usize = 4096;
/// An offset this far from the current segment's prediction is a step of
/// one clock (a PTP servo or an admin setting the time), not drift: at
/// 100 ms sampling, 1 ms is 10 000 ppm, far beyond any oscillator.
pub const DEFAULT_STEP_THRESHOLD_NS: i64 = 1_000_000;

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

pub use crate::stats::report::PhcReport;

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
pub struct PhcConverter {
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
    pub fn new() -> Self {
        Self::with_limits(DEFAULT_RING_SAMPLES, DEFAULT_STEP_THRESHOLD_NS)
    }

    /// `ring_samples` (at least 2) samples kept; `step_threshold_ns` is the
    /// prediction error that counts as a step.
    pub fn with_limits(ring_samples: usize, step_threshold_ns: i64) -> Self {
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
    pub fn set_phc_index(&mut self, index: u32) {
        self.phc_index = Some(index);
    }

    /// Takes one batch of samples, keeping the one with the narrowest read
    /// window (the least uncertain offset). A batch whose narrowest window
    /// is wider than the step threshold is rejected.
    pub fn add(&mut self, batch: &[OffsetSample]) {
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
    pub fn to_realtime(&self, phc_ns: i64) -> Option<i64> {
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
    pub fn report(&self) -> PhcReport {
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
pub struct SamplerStats {
    pub reads: u64,
    pub errors: u64,
    pub last_error: Option<String>,
}

/// Reads `source` every `period` into `conv` until `stop` is set (checked
/// at least once a period; `Thread::unpark` wakes it at once). The first
/// read is immediate so stamps convert early in the run.
pub fn sample_until(
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
pub struct PhcSampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<SamplerStats>>,
}

impl PhcSampler {
    pub fn spawn(
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
    pub fn stop(mut self) -> Result<SamplerStats> {
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
mod tests {
    use super::*;

    #[test]
    fn struct_layouts_match_the_kernel() {
        use std::mem::size_of;
        assert_eq!(size_of::<PtpClockTime>(), 16);
        // 16-byte header + 51 times.
        assert_eq!(size_of::<PtpSysOffset>(), 16 + 51 * 16);
        assert_eq!(size_of::<PtpSysOffset>(), 832);
        // 16-byte header + 25 x 3 times.
        assert_eq!(size_of::<PtpSysOffsetExtended>(), 16 + 75 * 16);
        assert_eq!(size_of::<PtpSysOffsetExtended>(), 1216);
    }

    #[test]
    fn ioctl_numbers_match_the_kernel() {
        // Fields of the generic encoding: dir(2) size(14) type(8) nr(8).
        let fields = |r: u32| (r >> 30, (r >> 16) & 0x3fff, (r >> 8) & 0xff, r & 0xff);
        // _IOW = write (1): size 832 = 0x340.
        assert_eq!(fields(PTP_SYS_OFFSET as u32), (1, 832, 0x3d, 5));
        // _IOWR = read|write (3): size 1216 = 0x4c0.
        assert_eq!(fields(PTP_SYS_OFFSET_EXTENDED as u32), (3, 1216, 0x3d, 9));
        // Values printed by a C program including linux/ptp_clock.h on
        // x86_64; aarch64 uses the same generic encoding.
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            assert_eq!(PTP_SYS_OFFSET as u32, 0x4340_3d05);
            assert_eq!(PTP_SYS_OFFSET_EXTENDED as u32, 0xc4c0_3d09);
        }
    }

    fn t(ns: i64) -> PtpClockTime {
        PtpClockTime {
            sec: ns.div_euclid(1_000_000_000),
            nsec: ns.rem_euclid(1_000_000_000) as u32,
            reserved: 0,
        }
    }

    #[test]
    fn basic_samples_interleave_sys_and_phc() {
        let mut req = PtpSysOffset {
            n_samples: 3,
            rsv: [0; 3],
            ts: [PtpClockTime::ZERO; 2 * PTP_MAX_SAMPLES + 1],
        };
        // sys, phc, sys, phc, sys, phc, sys
        let times = [
            100,
            5_000_000_001,
            300,
            5_000_000_002,
            400,
            5_000_000_003,
            410,
        ];
        for (slot, ns) in req.ts.iter_mut().zip(times) {
            *slot = t(ns);
        }
        let s = samples_from_basic(&req);
        assert_eq!(
            s,
            vec![
                OffsetSample {
                    sys_before_ns: 100,
                    phc_ns: 5_000_000_001,
                    sys_after_ns: 300
                },
                OffsetSample {
                    sys_before_ns: 300,
                    phc_ns: 5_000_000_002,
                    sys_after_ns: 400
                },
                OffsetSample {
                    sys_before_ns: 400,
                    phc_ns: 5_000_000_003,
                    sys_after_ns: 410
                },
            ]
        );
        // A kernel claiming more samples than fit is cut to the array.
        req.n_samples = 1000;
        assert_eq!(samples_from_basic(&req).len(), PTP_MAX_SAMPLES);
    }

    #[test]
    fn extended_samples_are_triples_and_bad_times_dropped() {
        let mut req = PtpSysOffsetExtended {
            n_samples: 2,
            clockid: 0,
            rsv: [0; 2],
            ts: [[PtpClockTime::ZERO; 3]; PTP_MAX_SAMPLES],
        };
        req.ts[0] = [t(10), t(-7), t(30)];
        req.ts[1] = [
            t(40),
            PtpClockTime {
                sec: 1,
                nsec: 1_000_000_000,
                reserved: 0,
            },
            t(50),
        ];
        let s = samples_from_extended(&req);
        assert_eq!(
            s,
            vec![OffsetSample {
                sys_before_ns: 10,
                phc_ns: -7,
                sys_after_ns: 30
            }]
        );
        assert_eq!(s[0].window_ns(), Some(20));
        assert_eq!(s[0].offset_ns(), Some(27));
        assert_eq!(
            PtpClockTime {
                sec: i64::MAX,
                nsec: 0,
                reserved: 0
            }
            .ns(),
            None
        );
    }

    #[test]
    fn open_missing_device_says_what_to_do() {
        let e = PtpClock::open(987_654).err().expect("no such PHC");
        let msg = format!("{e:#}");
        assert!(msg.contains("/dev/ptp987654"), "{msg}");
    }

    #[test]
    fn loopback_has_no_phc_and_bad_names_fail() {
        // A read-only ethtool query in the test's own namespace.
        match phc_index("lo") {
            Ok(idx) => assert_eq!(idx, None),
            // Sandboxes without a usable lo are not what this tests.
            Err(e) => eprintln!("skipped: {e:#}"),
        }
        assert!(phc_index("").is_err());
        assert!(phc_index("this-name-is-far-too-long").is_err());
    }

    /// A PHC whose time is `phc_of(realtime)`; each read takes `per_read`
    /// samples with the windows `widths` cycles through, the PHC read at
    /// `frac` of the window, and the clock moves `period_ns` per read.
    struct FakePhc {
        now_ns: i64,
        period_ns: i64,
        widths: Vec<i64>,
        next_width: usize,
        per_read: usize,
        frac: fn(usize) -> f64,
        phc_of: Box<dyn Fn(i64) -> i64 + Send>,
    }

    impl FakePhc {
        fn new(phc_of: impl Fn(i64) -> i64 + Send + 'static) -> Self {
            Self {
                now_ns: 1_700_000_000_000_000_000,
                period_ns: 100_000_000,
                widths: vec![2_000],
                next_width: 0,
                per_read: 1,
                frac: |_| 0.5,
                phc_of: Box::new(phc_of),
            }
        }
    }

    impl PhcSource for FakePhc {
        fn read(&mut self) -> io::Result<Vec<OffsetSample>> {
            let start = self.now_ns;
            let mut out = Vec::new();
            let mut at = start;
            for i in 0..self.per_read {
                let w = self.widths[self.next_width % self.widths.len()];
                self.next_width += 1;
                let read_at = at + (w as f64 * (self.frac)(i)) as i64;
                out.push(OffsetSample {
                    sys_before_ns: at,
                    phc_ns: (self.phc_of)(read_at),
                    sys_after_ns: at + w,
                });
                at += w;
            }
            self.now_ns = start + self.period_ns;
            Ok(out)
        }
    }

    fn feed(conv: &mut PhcConverter, phc: &mut FakePhc, reads: usize) {
        for _ in 0..reads {
            conv.add(&phc.read().unwrap());
        }
    }

    const T0: i64 = 1_700_000_000_000_000_000;

    #[test]
    fn no_samples_no_conversion() {
        let mut c = PhcConverter::new();
        assert_eq!(c.to_realtime(123), None);
        // Clocks going backwards inside a read: nothing usable.
        c.add(&[OffsetSample {
            sys_before_ns: 10,
            phc_ns: 5,
            sys_after_ns: 9,
        }]);
        c.add(&[]);
        assert_eq!(c.to_realtime(123), None);
        let r = c.report();
        assert_eq!((r.samples, r.rejected_batches), (0, 1));
        assert_eq!(r.read_window_max_ns, None);
        assert_eq!(r.read_window_median_ns, None);
        assert_eq!(r.drift_ppb, None);
        // One sample: a constant offset.
        c.add(&[OffsetSample {
            sys_before_ns: 1_000,
            phc_ns: 10,
            sys_after_ns: 1_010,
        }]);
        assert_eq!(c.to_realtime(20), Some(1_015));
    }

    #[test]
    fn constant_offset() {
        // A PHC on TAI: 37 s (and a bit) ahead of CLOCK_REALTIME.
        let off = 37_000_000_123;
        let mut phc = FakePhc::new(move |rt| rt + off);
        let mut c = PhcConverter::new();
        c.set_phc_index(3);
        feed(&mut c, &mut phc, 50);
        for rt in [
            T0 - 10_000_000_000, // before the first sample
            T0 + 1_000,
            T0 + 1_234_567_891,
            T0 + 60_000_000_000, // after the last
        ] {
            assert_eq!(c.to_realtime(rt + off), Some(rt), "at {rt}");
        }
        let r = c.report();
        assert_eq!(r.phc_index, Some(3));
        assert_eq!(r.samples, 50);
        assert_eq!(r.steps, 0);
        assert_eq!(r.read_window_max_ns, Some(2_000));
        assert_eq!(r.read_window_median_ns, Some(2_000));
        assert!(r.drift_ppb.unwrap().abs() < 1e-3, "{r:?}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["phc_index"], 3);
        assert_eq!(json["steps"], 0);
    }

    /// The PHC runs 50 ppm slow: phc = rt - 50e-6 * (rt - T0) + offset.
    fn slow_50ppm(rt: i64) -> i64 {
        rt - (rt - T0) / 20_000 - 5_000_000_000
    }

    #[test]
    fn drift_is_interpolated_and_reported() {
        let mut phc = FakePhc::new(slow_50ppm);
        let mut c = PhcConverter::new();
        feed(&mut c, &mut phc, 100);
        // Halfway between samples 10 and 11, and at an odd place between
        // 70 and 71: linear truth, linear interpolation.
        for rt in [
            T0 + 1_050_000_000,
            T0 + 7_012_345_678,
            T0 + 9_950_000_000,
            T0 + 12_000_000_000,
        ] {
            let got = c.to_realtime(slow_50ppm(rt)).unwrap();
            assert!((got - rt).abs() <= 3, "at {rt}: off by {} ns", got - rt);
        }
        // Offset against PHC time: 50e-6 / (1 - 50e-6) = 50 002.5 ppb.
        let drift = c.report().drift_ppb.unwrap();
        assert!((drift - 50_000.0).abs() < 500.0, "drift {drift} ppb");
        assert_eq!(c.report().steps, 0);
    }

    #[test]
    fn a_step_starts_a_segment() {
        // 50 ppm slow, then stepped forward by 0.5 s at rt = T0 + 5.05 s
        // (between samples 50 and 51).
        let step_at = T0 + 5_050_000_000;
        let truth = move |rt: i64| slow_50ppm(rt) + if rt >= step_at { 500_000_000 } else { 0 };
        let mut phc = FakePhc::new(truth);
        let mut c = PhcConverter::new();
        feed(&mut c, &mut phc, 100);
        let r = c.report();
        assert_eq!(r.steps, 1);
        for rt in [
            T0 + 1_000_000,
            T0 + 2_555_555_555,
            T0 + 4_950_000_000,
            T0 + 5_150_000_000,
            T0 + 8_765_432_100,
            T0 + 11_000_000_000,
        ] {
            let got = c.to_realtime(truth(rt)).unwrap();
            assert!((got - rt).abs() <= 3, "at {rt}: off by {} ns", got - rt);
        }
        // Drift is fitted within segments: the step does not leak into it.
        let drift = r.drift_ppb.unwrap();
        assert!((drift - 50_000.0).abs() < 500.0, "drift {drift} ppb");

        // A step backwards (PHC times repeat): stamps after it convert
        // with the newer segment; so does a stamp from before it whose PHC
        // time came again after it (the documented ambiguity).
        let back_at = T0 + 3_050_000_000;
        let truth = move |rt: i64| rt - if rt >= back_at { 2_000_000_000 } else { 0 };
        let mut phc = FakePhc::new(truth);
        let mut c = PhcConverter::new();
        feed(&mut c, &mut phc, 60);
        assert_eq!(c.report().steps, 1);
        for rt in [T0 + 3_500_000_000, T0 + 5_000_000_000, T0 + 1_000_000_000] {
            assert_eq!(c.to_realtime(truth(rt)), Some(rt), "at {rt}");
        }
        let rt = T0 + 2_000_000_000;
        assert_eq!(c.to_realtime(truth(rt)), Some(rt + 2_000_000_000));
    }

    /// xorshift64*: deterministic test randomness without a seeded RNG API.
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    #[test]
    fn narrowest_window_is_kept() {
        // A wide read whose PHC value came late in its window, and a narrow
        // one: the narrow one decides the offset.
        let mut c = PhcConverter::new();
        c.add(&[
            OffsetSample {
                sys_before_ns: 1_000_000,
                phc_ns: 1_090_000,
                sys_after_ns: 1_100_000,
            },
            OffsetSample {
                sys_before_ns: 1_100_000,
                phc_ns: 1_100_050,
                sys_after_ns: 1_100_100,
            },
        ]);
        assert_eq!(c.to_realtime(1_100_050), Some(1_100_050));
        assert_eq!(c.report().read_window_max_ns, Some(100));

        // Random widths and random read points in each window; the PHC is
        // the realtime clock plus 1 s.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let widths: Vec<i64> = (0..500)
            .map(|_| 200 + (rng(&mut seed) % 20_000) as i64)
            .collect();
        let mut phc = FakePhc::new(|rt| rt + 1_000_000_000);
        phc.per_read = 5;
        phc.widths = widths.clone();
        phc.frac = |i| [0.1, 0.9, 0.5, 0.3, 0.7][i];
        let mut c = PhcConverter::new();
        feed(&mut c, &mut phc, 100);
        let narrowest: Vec<i64> = widths.chunks(5).map(|b| *b.iter().min().unwrap()).collect();
        let r = c.report();
        assert_eq!(r.samples, 100);
        assert_eq!(
            r.read_window_max_ns,
            Some(*narrowest.iter().max().unwrap() as u64)
        );
        let mut sorted = narrowest.clone();
        sorted.sort_unstable();
        let median = sorted[49] as f64;
        let got = r.read_window_median_ns.unwrap() as f64;
        assert!(
            (got - median).abs() <= median * 0.002 + 1.0,
            "{got} vs {median}"
        );
        // Every converted stamp is within half the worst kept window.
        let bound = *narrowest.iter().max().unwrap() / 2 + 1;
        // Stamps inside the sampled span (extrapolation would scale the
        // errors of the last two samples).
        for k in 0..290 {
            let rt = T0 + 1_000_000 + k * 33_333_333;
            let err = c.to_realtime(rt + 1_000_000_000).unwrap() - rt;
            assert!(err.abs() <= bound, "off by {err} ns (bound {bound})");
        }
    }

    #[test]
    fn ring_is_bounded() {
        let mut phc = FakePhc::new(slow_50ppm);
        let mut c = PhcConverter::with_limits(1_000, DEFAULT_STEP_THRESHOLD_NS);
        feed(&mut c, &mut phc, 100_000);
        assert_eq!(c.ring.len(), 1_000);
        assert_eq!(c.segments.len(), 1);
        let r = c.report();
        assert_eq!(r.samples, 100_000);
        assert_eq!(r.steps, 0);
        // Recent stamps interpolate; a stamp from the start of the run,
        // long out of the ring, extrapolates (exact here: the drift was
        // constant).
        for rt in [T0 + 9_999_950_000_000, T0 + 100_000] {
            let got = c.to_realtime(slow_50ppm(rt)).unwrap();
            assert!((got - rt).abs() <= 5, "at {rt}: off by {} ns", got - rt);
        }

        // Steps every sample: segments leave with their points.
        let mut c = PhcConverter::with_limits(16, 1_000);
        for i in 0..10_000i64 {
            let sys = i * 100_000_000;
            let phc = sys + if i % 2 == 0 { 0 } else { 5_000_000 };
            c.add(&[OffsetSample {
                sys_before_ns: sys,
                phc_ns: phc,
                sys_after_ns: sys,
            }]);
        }
        assert_eq!(c.ring.len(), 16);
        assert!(c.segments.len() <= 16);
        assert_eq!(c.report().steps, 9_999);
    }

    #[test]
    fn extreme_stamps_do_not_panic() {
        let mut phc = FakePhc::new(slow_50ppm);
        let mut c = PhcConverter::new();
        feed(&mut c, &mut phc, 3);
        for p in [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX - 1, i64::MAX] {
            let _ = c.to_realtime(p);
        }
        // Samples at the ends of i64.
        c.add(&[OffsetSample {
            sys_before_ns: i64::MIN,
            phc_ns: i64::MAX,
            sys_after_ns: i64::MAX,
        }]);
        c.add(&[OffsetSample {
            sys_before_ns: i64::MAX,
            phc_ns: i64::MIN,
            sys_after_ns: i64::MAX,
        }]);
        for p in [i64::MIN, 0, i64::MAX] {
            let _ = c.to_realtime(p);
        }
        // Valid samples at both ends of the PHC range: differences beyond
        // i64 in the fit, the step check and the interpolation.
        let mut c = PhcConverter::new();
        for phc in [i64::MIN + 10, i64::MAX - 10, i64::MAX - 5] {
            c.add(&[OffsetSample {
                sys_before_ns: phc,
                phc_ns: phc,
                sys_after_ns: phc,
            }]);
        }
        assert_eq!(c.report().samples, 3);
        for p in [i64::MIN, -1, 0, i64::MAX - 7, i64::MAX] {
            assert_eq!(c.to_realtime(p), Some(p), "at {p}");
        }
        let _ = c.report();
    }

    #[test]
    fn preempted_reads_are_rejected_not_steps() {
        let mut phc = FakePhc::new(|rt| rt + 7);
        let mut c = PhcConverter::new();
        feed(&mut c, &mut phc, 10);
        // Every read of this batch took 3 ms and the PHC value came at the
        // end: taken, it would look like a 1.5 ms step.
        phc.widths = vec![3_000_000];
        phc.frac = |_| 1.0;
        feed(&mut c, &mut phc, 1);
        phc.widths = vec![2_000];
        phc.frac = |_| 0.5;
        feed(&mut c, &mut phc, 10);
        let r = c.report();
        assert_eq!((r.samples, r.rejected_batches, r.steps), (20, 1, 0));
        assert_eq!(r.read_window_max_ns, Some(2_000));
        assert_eq!(c.to_realtime(T0 + 1_050_000_007), Some(T0 + 1_050_000_000));
    }

    fn sample(ns: i64) -> io::Result<Vec<OffsetSample>> {
        Ok(vec![OffsetSample {
            sys_before_ns: ns,
            phc_ns: ns,
            sys_after_ns: ns,
        }])
    }

    #[test]
    fn extended_read_falls_back_once_refused() {
        let mut ext = true;
        // Extended works: the basic ioctl is not tried.
        let r = read_falling_back(&mut ext, 0, || sample(1), || panic!("basic"));
        assert_eq!(r.unwrap()[0].phc_ns, 1);
        assert!(ext);
        // Refused (old kernel, driver without gettimex64, EINVAL): basic,
        // and from then on basic only.
        for errno in [libc::ENOTTY, libc::EOPNOTSUPP, libc::EINVAL] {
            let mut ext = true;
            let r = read_falling_back(
                &mut ext,
                0,
                || Err(io::Error::from_raw_os_error(errno)),
                || sample(2),
            );
            assert_eq!(r.unwrap()[0].phc_ns, 2);
            assert!(!ext);
        }
        let mut ext = false;
        let r = read_falling_back(&mut ext, 0, || panic!("extended"), || sample(3));
        assert_eq!(r.unwrap()[0].phc_ns, 3);
        // Other errors are the caller's: no fallback.
        let mut ext = true;
        let r = read_falling_back(
            &mut ext,
            0,
            || Err(io::Error::from_raw_os_error(libc::EIO)),
            || panic!("basic"),
        );
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
        assert!(ext);
    }

    /// Fails every read with ENODEV, counting the reads.
    struct Failing(Arc<std::sync::atomic::AtomicU64>);
    impl PhcSource for Failing {
        fn read(&mut self) -> io::Result<Vec<OffsetSample>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(io::Error::from_raw_os_error(libc::ENODEV))
        }
    }

    /// Waits (up to 10 s, for a loaded machine) until `done` holds.
    fn wait_for(done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn sampler_feeds_the_converter_until_stopped() {
        let conv = Arc::new(Mutex::new(PhcConverter::new()));
        let mut phc = FakePhc::new(|rt| rt + 42);
        phc.period_ns = 1_000_000;
        let s = PhcSampler::spawn(phc, Duration::from_millis(1), conv.clone()).unwrap();
        wait_for(|| conv.lock().unwrap().report().samples >= 3);
        let stats = s.stop().unwrap();
        let samples = conv.lock().unwrap().report().samples;
        assert_eq!(stats.reads, samples);
        assert_eq!(stats.errors, 0);
        assert_eq!(conv.lock().unwrap().to_realtime(T0 + 42), Some(T0));

        // Errors are counted, and a long period does not delay the stop:
        // after its first read the sampler waits an hour, unless unparked.
        let conv = Mutex::new(PhcConverter::new());
        let stop = AtomicBool::new(false);
        let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut source = Failing(reads.clone());
        let started = Instant::now();
        let stats = std::thread::scope(|sc| {
            let h = sc.spawn(|| sample_until(&mut source, Duration::from_secs(3600), &conv, &stop));
            wait_for(|| reads.load(Ordering::SeqCst) == 1);
            stop.store(true, Ordering::SeqCst);
            h.thread().unpark();
            h.join().unwrap()
        });
        assert!(started.elapsed() < Duration::from_secs(60));
        assert_eq!((stats.reads, stats.errors), (1, 1));
        assert!(stats.last_error.unwrap().contains("No such device"));
        assert_eq!(conv.lock().unwrap().report().samples, 0);
    }
}
