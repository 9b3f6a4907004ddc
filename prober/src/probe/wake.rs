//! How the sender gets to a deadline: a timer sleep that ends a margin
//! before it, then a spin on the clock. The margin is learned while
//! running: a histogram of how late clock_nanosleep(2) returns on this
//! machine, right now, and the margin its high percentile, so most
//! wake-ups land before the deadline and the spin absorbs the rest,
//! without spinning longer than the machine needs. Pure apart from the
//! clock it is given ([`PaceClock`]).

use hdrhistogram::Histogram;

use super::clock::PaceClock;
use crate::stats::{Latency, Pacing};

/// The wake-up latency the margin covers. Above p99: with a p99 margin,
/// by construction about 1 % of the wake-ups come after the deadline, which
/// puts the send error's own p99 at the edge of the wake-up tail (measured:
/// p99 send error 216 µs with a learned p99 margin, 8.8 µs with a margin
/// above the wake-up p99, at 1 ms with SCHED_FIFO on a loaded 2-vCPU VM).
pub(crate) const QUANTILE: f64 = 0.995;
/// The margin before anything is learned: the fixed spin rtprobe used
/// before, a typical VM wake-up latency.
pub(crate) const INITIAL_MARGIN_NS: i64 = 50_000;
/// Never less: a spin this short costs nothing and covers the clock reads
/// between waking up and sending.
pub(crate) const MIN_MARGIN_NS: i64 = 5_000;
/// Largest margin for a sender without real-time priority. There a late
/// wake-up is the scheduler running someone else, and a longer spin only
/// makes the thread look CPU-bound so it is scheduled later still: on this
/// project's 2-vCPU VM under load the margin climbed to half the interval
/// and cost 30 % of a CPU for a p99 send error of 6.9 ms, against 6.5 ms
/// and 0.5 % with a 50 µs spin.
pub(crate) const NON_RT_MAX_MARGIN_NS: i64 = 100_000;
/// Wake-ups per learning window. The margin is the quantile over the last
/// one or two windows (2-4 s at 1 ms), so it follows the machine's load
/// both ways instead of keeping the worst it ever saw.
pub(crate) const WINDOW: u64 = 2000;
/// Below this many wake-ups the quantile means nothing: the margin is the
/// larger of the initial value and the latest wake-up seen.
pub(crate) const MIN_SAMPLES: u64 = 32;
/// The quantile is recomputed every this many wake-ups (a few µs each).
pub(crate) const UPDATE_EVERY: u64 = 16;

fn new_hist() -> Histogram<u64> {
    // 1 ns .. 10 s at 2 significant digits (1 %): a few KiB.
    Histogram::new_with_bounds(1, 10_000_000_000, 2).expect("static histogram bounds are valid")
}

/// The early-wake margin, learned from the observed lateness of
/// TIMER_ABSTIME wake-ups. Pure.
#[derive(Debug, Clone)]
pub(crate) struct WakeMargin {
    cur: Histogram<u64>,
    prev: Histogram<u64>,
    scratch: Histogram<u64>,
    min_ns: i64,
    max_ns: i64,
    margin_ns: i64,
    since_update: u64,
}

impl WakeMargin {
    /// A margin for a sender with this interval: at least
    /// [`MIN_MARGIN_NS`], at most half the interval (a longer spin is
    /// `--busy-poll`, which starves the receive side on a small machine and
    /// runs into the kernel's RT throttling under SCHED_FIFO).
    pub(crate) fn new(interval_ns: i64) -> Self {
        Self::with_cap(interval_ns, i64::MAX)
    }

    /// As [`WakeMargin::new`], never above `cap_ns` either.
    pub(crate) fn with_cap(interval_ns: i64, cap_ns: i64) -> Self {
        let max_ns = (interval_ns / 2).min(cap_ns).max(MIN_MARGIN_NS);
        Self {
            cur: new_hist(),
            prev: new_hist(),
            scratch: new_hist(),
            min_ns: MIN_MARGIN_NS,
            max_ns,
            margin_ns: INITIAL_MARGIN_NS.clamp(MIN_MARGIN_NS, max_ns),
            since_update: 0,
        }
    }

    /// How long before a deadline to stop sleeping.
    pub(crate) fn margin_ns(&self) -> i64 {
        self.margin_ns
    }

    /// One wake-up that came `late_ns` after the time it was asked for.
    pub(crate) fn observe(&mut self, late_ns: i64) {
        let _ = self.cur.record(late_ns.max(1) as u64);
        let seen = self.cur.len() + self.prev.len();
        if seen < MIN_SAMPLES {
            self.margin_ns = self.margin_ns.max(late_ns).clamp(self.min_ns, self.max_ns);
            return;
        }
        self.since_update += 1;
        if self.since_update >= UPDATE_EVERY || seen == MIN_SAMPLES {
            self.since_update = 0;
            self.scratch.reset();
            let _ = self.scratch.add(&self.prev);
            let _ = self.scratch.add(&self.cur);
            let q = self.scratch.value_at_quantile(QUANTILE) as i64;
            self.margin_ns = q.clamp(self.min_ns, self.max_ns);
        }
        if self.cur.len() >= WINDOW {
            std::mem::swap(&mut self.cur, &mut self.prev);
            self.cur.reset();
        }
    }
}

/// How the sender waits for a deadline.
#[derive(Debug, Clone)]
pub(crate) enum WakeMode {
    /// Sleep until a learned margin before the deadline, then spin.
    Adaptive(Box<WakeMargin>),
    /// Sleep until a fixed time before the deadline (`--spin`), then spin.
    Fixed(i64),
    /// Spin all the time (`--busy-poll`).
    BusyPoll,
}

/// Waits for deadlines and keeps the account of what that cost.
#[derive(Debug)]
pub(crate) struct Waiter {
    mode: WakeMode,
    /// Every wake-up's lateness, for the report.
    late: Histogram<u64>,
    overslept: u64,
    spin_ns: i64,
    waits: u64,
    margin_max_ns: i64,
}

impl Waiter {
    pub(crate) fn new(mode: WakeMode) -> Self {
        Self {
            mode,
            late: new_hist(),
            overslept: 0,
            spin_ns: 0,
            waits: 0,
            margin_max_ns: 0,
        }
    }

    /// The sleep ends this long before a deadline (i64::MAX: never sleeps).
    pub(crate) fn margin_ns(&self) -> i64 {
        match &self.mode {
            WakeMode::Adaptive(m) => m.margin_ns(),
            WakeMode::Fixed(ns) => *ns,
            WakeMode::BusyPoll => i64::MAX,
        }
    }

    /// Waits until the monotonic time `due_ns` and returns the monotonic
    /// time it got there (later than `due_ns` if the sleep overslept).
    /// `on_wake(left_ns)` runs after a sleep that ended `left_ns` before
    /// the deadline, in place of as much of the spin: the margin stays
    /// the timer's own (what it runs costs no CPU the spin would not
    /// have), so it must fit in `left_ns` or do nothing.
    pub(crate) fn wait(
        &mut self,
        c: &impl PaceClock,
        due_ns: i64,
        on_wake: &mut dyn FnMut(i64),
    ) -> i64 {
        let margin = self.margin_ns();
        if margin != i64::MAX {
            self.margin_max_ns = self.margin_max_ns.max(margin);
        }
        self.waits += 1;
        let mut now = c.monotonic_ns();
        if due_ns - now > margin {
            let target = due_ns - margin;
            c.sleep_until_monotonic(target);
            now = c.monotonic_ns();
            let late_ns = now - target;
            let _ = self.late.record(late_ns.max(1) as u64);
            if now > due_ns {
                self.overslept += 1;
            } else {
                on_wake(due_ns - now);
                now = c.monotonic_ns();
            }
            if let WakeMode::Adaptive(m) = &mut self.mode {
                m.observe(late_ns);
            }
        }
        let spin_from = now;
        while now < due_ns {
            std::hint::spin_loop();
            now = c.monotonic_ns();
        }
        self.spin_ns += now - spin_from;
        now
    }

    /// The report: `elapsed_ns` of sending, `probes` sent in it,
    /// `thread_cpu_ns` the sender thread used, `clock_steps` of the wall
    /// clock seen.
    pub(crate) fn report(
        &self,
        elapsed_ns: i64,
        probes: u64,
        thread_cpu_ns: Option<i64>,
        clock_steps: u64,
    ) -> Pacing {
        let pct = |ns: i64| {
            if elapsed_ns > 0 {
                100.0 * ns as f64 / elapsed_ns as f64
            } else {
                0.0
            }
        };
        let mode = match self.mode {
            WakeMode::Adaptive(_) => "adaptive",
            WakeMode::Fixed(_) => "fixed",
            WakeMode::BusyPoll => "busy-poll",
        };
        let margin = |ns: i64| (ns != i64::MAX).then_some(ns.max(0) as u64);
        Pacing {
            mode: mode.into(),
            margin_ns: margin(self.margin_ns()),
            margin_max_ns: margin(self.margin_ns()).map(|_| self.margin_max_ns.max(0) as u64),
            wake_late_ns: Latency::from_hist(&self.late),
            overslept: self.overslept,
            spin_ns_per_probe: if probes > 0 {
                self.spin_ns as f64 / probes as f64
            } else {
                0.0
            },
            spin_cpu_pct: pct(self.spin_ns),
            sender_cpu_pct: thread_cpu_ns.map(pct),
            clock_steps,
            waits: None,
            cpu_dma_latency_us: None,
            warm_up_ns_per_probe: None,
            send_failures: 0,
            reader: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::clock::fake::FakeClock;

    #[test]
    fn starts_sane_and_learns_a_high_percentile() {
        let mut m = WakeMargin::new(1_000_000);
        assert_eq!(m.margin_ns(), INITIAL_MARGIN_NS);
        // Before enough samples, one late wake-up widens the margin at once.
        m.observe(80_000);
        assert_eq!(m.margin_ns(), 80_000);
        m.observe(10_000);
        assert_eq!(m.margin_ns(), 80_000, "not narrowed on a few samples");
        // 98 % of wake-ups 20 µs late, 2 % 120 µs: p99.5 is the slow ones.
        for i in 0..1000 {
            m.observe(if i % 50 == 0 { 120_000 } else { 20_000 });
        }
        let got = m.margin_ns();
        assert!((119_000..=121_000).contains(&got), "margin {got}");
        // Only 0.2 % slow: p99.5 is the common case.
        let mut m = WakeMargin::new(1_000_000);
        for i in 0..1000 {
            m.observe(if i % 500 == 0 { 120_000 } else { 20_000 });
        }
        let got = m.margin_ns();
        assert!((19_800..=20_200).contains(&got), "margin {got}");
    }

    #[test]
    fn capped_for_a_sender_without_real_time_priority() {
        let mut m = WakeMargin::with_cap(1_000_000, NON_RT_MAX_MARGIN_NS);
        for _ in 0..5000 {
            m.observe(400_000);
        }
        assert_eq!(m.margin_ns(), NON_RT_MAX_MARGIN_NS);
        // A cap never goes below the floor.
        assert_eq!(
            WakeMargin::with_cap(1_000_000, 1).margin_ns(),
            MIN_MARGIN_NS
        );
    }

    #[test]
    fn clamped_to_a_few_us_and_half_the_interval() {
        let mut m = WakeMargin::new(1_000_000);
        for _ in 0..200 {
            m.observe(300);
        }
        assert_eq!(m.margin_ns(), MIN_MARGIN_NS);
        for _ in 0..5000 {
            m.observe(3_000_000);
        }
        assert_eq!(m.margin_ns(), 500_000);
        // A 20 µs interval: the initial margin is cut to half of it.
        assert_eq!(WakeMargin::new(20_000).margin_ns(), 10_000);
        // Below twice the minimum: the minimum.
        assert_eq!(WakeMargin::new(4_000).margin_ns(), MIN_MARGIN_NS);
    }

    #[test]
    fn forgets_a_busy_spell_after_two_windows() {
        let mut m = WakeMargin::new(1_000_000);
        for _ in 0..WINDOW {
            m.observe(200_000);
        }
        assert!(m.margin_ns() >= 198_000);
        for _ in 0..2 * WINDOW + UPDATE_EVERY {
            m.observe(15_000);
        }
        let got = m.margin_ns();
        assert!((14_800..=15_200).contains(&got), "margin {got}");
    }

    #[test]
    fn waits_by_sleeping_then_spinning() {
        // Wake-ups 30 µs late, reads 100 ns apart.
        let c = FakeClock::new(0, 0, 100);
        c.wake_late_ns.set(30_000);
        let mut w = Waiter::new(WakeMode::Fixed(50_000));
        let got = w.wait(&c, 1_000_000, &mut |_| {});
        assert!((1_000_000..1_000_200).contains(&got), "sent at {got}");
        assert_eq!(c.sleeps.get(), 1);
        // Slept until 950 µs, woke at 980 µs, spun 20 µs.
        let r = w.report(1_000_000, 1, Some(100_000), 0);
        assert_eq!(r.overslept, 0);
        assert!((19_800.0..20_300.0).contains(&r.spin_ns_per_probe));
        assert!((1.98..2.03).contains(&r.spin_cpu_pct));
        assert_eq!(r.sender_cpu_pct, Some(10.0));
        assert_eq!(r.margin_ns, Some(50_000));
        // 30 µs at 2 significant digits.
        assert!((29_900..=30_400).contains(&r.wake_late_ns.p50.unwrap()));
        // A wake-up later than the margin oversleeps the deadline.
        c.wake_late_ns.set(80_000);
        let got = w.wait(&c, 2_000_000, &mut |_| {});
        assert!(got > 2_000_000);
        assert_eq!(w.report(2_000_000, 2, None, 0).overslept, 1);
        // Already past the deadline: no sleep, no spin.
        let sleeps = c.sleeps.get();
        w.wait(&c, 0, &mut |_| {});
        assert_eq!(c.sleeps.get(), sleeps);
    }

    #[test]
    fn adaptive_learns_the_fake_machines_latency() {
        let c = FakeClock::new(0, 0, 100);
        c.wake_late_ns.set(70_000);
        let mut w = Waiter::new(WakeMode::Adaptive(Box::new(WakeMargin::new(1_000_000))));
        let mut late = 0;
        for n in 1..=100 {
            let due = n * 1_000_000;
            let got = w.wait(&c, due, &mut |_| {});
            if got > due + 1_000 {
                late += 1;
            }
        }
        // Only the first wake-up, with the 50 µs initial margin, was late.
        assert_eq!(late, 1);
        let r = w.report(100_000_000, 100, None, 0);
        assert_eq!(r.mode, "adaptive");
        assert_eq!(r.overslept, 1);
        assert!((69_000..=71_000).contains(&r.margin_ns.unwrap()));
        // The spin is what is left of the margin after waking: ~0 here.
        assert!(r.spin_ns_per_probe < 1_000.0, "{}", r.spin_ns_per_probe);
        let busy = Waiter::new(WakeMode::BusyPoll);
        assert_eq!(busy.report(1, 0, None, 0).margin_ns, None);
    }

    #[test]
    fn work_on_waking_takes_the_spins_place_and_an_oversleep_skips_it() {
        // Wake-ups 30 µs late; the work after each costs 5 µs (50 reads)
        // and is done only with at least 10 µs left.
        let c = FakeClock::new(0, 0, 100);
        c.wake_late_ns.set(30_000);
        let mut w = Waiter::new(WakeMode::Adaptive(Box::new(WakeMargin::new(1_000_000))));
        let (mut woken, mut late, mut lefts) = (0, 0, Vec::new());
        for n in 1..=200 {
            let due = n * 1_000_000;
            let got = w.wait(&c, due, &mut |left_ns| {
                lefts.push(left_ns);
                if left_ns >= 10_000 {
                    woken += 1;
                    for _ in 0..50 {
                        c.monotonic_ns();
                    }
                }
            });
            late += i64::from(got > due + 1_000);
        }
        // The margin is the timer's: after the first wake-ups (50 µs
        // margin, 20 µs to spare) only the clock reads are left to spin.
        let m = w.margin_ns();
        assert!((30_000..=30_500).contains(&m), "margin {m}");
        assert!(
            lefts.iter().all(|&l| l >= 0),
            "called only ahead of the deadline"
        );
        assert!(
            (1..200).contains(&woken),
            "the work ran only where it fit: {woken}"
        );
        assert_eq!(late, 0, "the work never made a send late");
        let r = w.report(200_000_000, 200, None, 0);
        assert!((29_900..=30_400).contains(&r.wake_late_ns.p50.unwrap()));
        // A sleep that ends past the deadline sends at once: no work first.
        c.wake_late_ns.set(80_000);
        let mut ran = false;
        w.wait(&c, 201_000_000, &mut |_| ran = true);
        assert!(!ran);
    }
}
