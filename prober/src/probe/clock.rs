//! Clocks and the pacer's sleep. The schedule runs on CLOCK_MONOTONIC, so
//! a step of the wall clock (settimeofday, an NTP step) neither bursts nor
//! stalls the sending; the stamps recorded stay on CLOCK_REALTIME, the
//! clock of the kernel's software timestamps, through [`RealtimeMap`].
//!
//! Kernel interfaces: clock_gettime(2) and clock_nanosleep(2) with
//! TIMER_ABSTIME on CLOCK_REALTIME and CLOCK_MONOTONIC (any Linux).

fn now_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; both clocks used here always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Now on CLOCK_REALTIME, in ns.
#[inline]
pub(crate) fn realtime_ns() -> i64 {
    now_ns(libc::CLOCK_REALTIME)
}

/// Now on CLOCK_MONOTONIC, in ns.
#[inline]
pub(crate) fn monotonic_ns() -> i64 {
    now_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time the calling thread has used, in ns.
pub(crate) fn thread_cpu_ns() -> i64 {
    now_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn sleep_until_on(clock: libc::clockid_t, t_ns: i64) {
    let ts = libc::timespec {
        tv_sec: t_ns.div_euclid(1_000_000_000),
        tv_nsec: t_ns.rem_euclid(1_000_000_000),
    };
    loop {
        // SAFETY: valid timespec; no remainder pointer needed with TIMER_ABSTIME.
        let r =
            unsafe { libc::clock_nanosleep(clock, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
        if r != libc::EINTR {
            break;
        }
    }
}

/// Sleeps until the absolute CLOCK_MONOTONIC time `t_ns` (no drift: the
/// schedule is absolute, not a chain of relative sleeps).
pub(crate) fn sleep_until_monotonic(t_ns: i64) {
    sleep_until_on(libc::CLOCK_MONOTONIC, t_ns)
}

/// The clocks the pacer reads and sleeps on; a fake in tests.
pub(crate) trait PaceClock {
    fn monotonic_ns(&self) -> i64;
    fn realtime_ns(&self) -> i64;
    /// Sleeps until the absolute CLOCK_MONOTONIC time `t_ns`.
    fn sleep_until_monotonic(&self, t_ns: i64);
}

/// The system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemClock;

impl PaceClock for SystemClock {
    #[inline]
    fn monotonic_ns(&self) -> i64 {
        monotonic_ns()
    }
    #[inline]
    fn realtime_ns(&self) -> i64 {
        realtime_ns()
    }
    fn sleep_until_monotonic(&self, t_ns: i64) {
        sleep_until_monotonic(t_ns)
    }
}

/// An offset change larger than this between two measurements is counted
/// as a step of the wall clock; anything smaller is NTP slewing (at most
/// 500 ppm, 50 µs per 100 ms) or the measurement's own noise.
pub(crate) const STEP_NS: i64 = 1_000_000;

/// Puts CLOCK_MONOTONIC times on CLOCK_REALTIME: realtime = monotonic +
/// offset, the offset measured at the start and again every `every_ns` of
/// monotonic time, so a step of the wall clock shows in the stamps within
/// that period while the schedule itself never sees it.
#[derive(Debug, Clone)]
pub(crate) struct RealtimeMap {
    offset_ns: i64,
    measured_at_ns: i64,
    every_ns: i64,
    steps: u64,
}

impl RealtimeMap {
    pub(crate) fn new(c: &impl PaceClock, every_ns: i64) -> Self {
        let (offset_ns, measured_at_ns) = Self::measure(c);
        Self {
            offset_ns,
            measured_at_ns,
            every_ns,
            steps: 0,
        }
    }

    /// The offset from the narrowest of three monotonic-realtime-monotonic
    /// readings (the realtime read taken as the middle of the two), so a
    /// preemption between the reads does not skew it.
    fn measure(c: &impl PaceClock) -> (i64, i64) {
        let mut best: Option<(i64, i64, i64)> = None;
        for _ in 0..3 {
            let m1 = c.monotonic_ns();
            let r = c.realtime_ns();
            let m2 = c.monotonic_ns();
            let width = m2 - m1;
            if best.is_none_or(|(w, _, _)| width < w) {
                best = Some((width, r - (m1 + width / 2), m2));
            }
        }
        let (_, offset, at) = best.expect("three readings");
        (offset, at)
    }

    /// The CLOCK_REALTIME time of the CLOCK_MONOTONIC time `mono_ns`.
    #[inline]
    pub(crate) fn to_realtime(&self, mono_ns: i64) -> i64 {
        mono_ns + self.offset_ns
    }

    /// Re-measures the offset if `every_ns` has passed since the last
    /// measurement (`now_ns` is monotonic). Returns whether it was due.
    pub(crate) fn refresh(&mut self, c: &impl PaceClock, now_ns: i64) -> bool {
        if now_ns - self.measured_at_ns < self.every_ns {
            return false;
        }
        let (offset, at) = Self::measure(c);
        if (offset - self.offset_ns).abs() > STEP_NS {
            self.steps += 1;
        }
        self.offset_ns = offset;
        self.measured_at_ns = at;
        true
    }

    #[cfg(test)]
    pub(crate) fn offset_ns(&self) -> i64 {
        self.offset_ns
    }

    /// Steps of the wall clock seen so far (offset changes over [`STEP_NS`]).
    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }
}

#[cfg(test)]
pub(crate) mod fake {
    use std::cell::Cell;

    use super::PaceClock;

    /// A fake clock: every read advances monotonic time by `tick_ns` (so a
    /// spin ends), sleeps return `wake_late_ns` after their target, and the
    /// wall clock is monotonic + `offset_ns`, which a test may step.
    #[derive(Debug)]
    pub(crate) struct FakeClock {
        pub(crate) mono: Cell<i64>,
        pub(crate) offset_ns: Cell<i64>,
        pub(crate) tick_ns: i64,
        pub(crate) wake_late_ns: Cell<i64>,
        pub(crate) sleeps: Cell<u64>,
    }

    impl FakeClock {
        pub(crate) fn new(start_ns: i64, offset_ns: i64, tick_ns: i64) -> Self {
            Self {
                mono: Cell::new(start_ns),
                offset_ns: Cell::new(offset_ns),
                tick_ns,
                wake_late_ns: Cell::new(0),
                sleeps: Cell::new(0),
            }
        }

        /// Steps the wall clock (monotonic time goes on as before).
        pub(crate) fn step_realtime(&self, by_ns: i64) {
            self.offset_ns.set(self.offset_ns.get() + by_ns);
        }
    }

    impl PaceClock for FakeClock {
        fn monotonic_ns(&self) -> i64 {
            let t = self.mono.get() + self.tick_ns;
            self.mono.set(t);
            t
        }
        fn realtime_ns(&self) -> i64 {
            self.mono.get() + self.offset_ns.get()
        }
        fn sleep_until_monotonic(&self, t_ns: i64) {
            self.sleeps.set(self.sleeps.get() + 1);
            let woke = t_ns.max(self.mono.get()) + self.wake_late_ns.get();
            self.mono.set(woke);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fake::FakeClock, *};

    #[test]
    fn monotonic_sleep_does_not_return_early() {
        let t = monotonic_ns() + 2_000_000;
        sleep_until_monotonic(t);
        assert!(monotonic_ns() >= t);
        // A time in the past returns at once.
        sleep_until_monotonic(t - 1_000_000_000);
    }

    #[test]
    fn system_offset_puts_monotonic_on_the_wall_clock() {
        let m = RealtimeMap::new(&SystemClock, 100_000_000);
        let (mono, real) = (monotonic_ns(), realtime_ns());
        // Both reads are within a few µs of each other, scheduling aside.
        assert!((m.to_realtime(mono) - real).abs() < 5_000_000);
    }

    #[test]
    fn offset_follows_a_step_at_the_next_refresh() {
        let c = FakeClock::new(1_000_000_000, 5_000_000_000_000, 10);
        let mut m = RealtimeMap::new(&c, 100_000_000);
        // The realtime read is taken half-way through the narrowest pair.
        assert_eq!(m.offset_ns(), 5_000_000_000_000 - 5);
        assert_eq!(m.to_realtime(2_000_000_000), 5_002_000_000_000 - 5);
        c.step_realtime(-3_000_000_000);
        // Not due yet: the stamps keep the old offset for up to one period.
        assert!(!m.refresh(&c, c.mono.get()));
        assert_eq!(m.steps(), 0);
        c.mono.set(c.mono.get() + 100_000_000);
        assert!(m.refresh(&c, c.mono.get()));
        assert_eq!(m.offset_ns(), 4_997_000_000_000 - 5);
        assert_eq!(m.steps(), 1);
        // Slewing-sized changes are not steps.
        c.step_realtime(40_000);
        c.mono.set(c.mono.get() + 100_000_000);
        assert!(m.refresh(&c, c.mono.get()));
        assert_eq!(m.steps(), 1);
        assert_eq!(m.offset_ns(), 4_997_000_040_000 - 5);
    }
}
