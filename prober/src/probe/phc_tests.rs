//! Unit tests of `phc.rs` (kept apart so that the module itself stays short).

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
