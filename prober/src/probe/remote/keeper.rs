//! The targets of a running session besides their probes, on a thread of
//! their own so that the probing never waits for them: the reloads of a
//! targets file (SIGHUP or a change of the file, at most one a second), the
//! targets that failed to open (resolve, socket, connect) and are tried
//! again with a backoff, and the status probes and reports of the targets
//! taken out. Whatever it opens is warmed up here; the probing loop only
//! swaps the legs between two rounds ([`Change`]), and the targets that
//! did not change keep their schedule.
//!
//! Kernel interfaces: none of its own (the sockets through `setup.rs`,
//! RLIMIT_NOFILE through [`super::open_files_for`]).

use std::{
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU8, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{
    OnOpenError, OpenErrors, Prepared, Reloads, RemoteLeg,
    setup::{OpenFailure, WarmUp, in_parallel, open_files_for, prepare, trailer},
    verdict::{never_opened, outcome},
};
use crate::{
    probe::{SessionOutcome, engine, stamp::ClockSync},
    sys::Netns,
};

/// Reloads closer together than this are one reload: a storm of SIGHUPs
/// costs one read of the file a second.
pub(super) const RELOAD_MIN_GAP: Duration = Duration::from_secs(1);
/// The first retry of a target that failed to open; each failure doubles it.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Most target errors logged a second; the rest are counted in one line.
const ERROR_LINES_PER_S: u32 = 10;
/// How often the thread looks for work.
const TICK: Duration = Duration::from_millis(50);

/// Why a target leaves the probing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Removal {
    /// It is no longer in the file.
    Removed,
    /// It is, changed: it starts anew under the same name.
    Changed,
}

/// What the probing loop applies between two rounds.
pub(super) struct Change {
    /// Targets taken out, by name.
    pub(super) remove: Vec<(String, Removal)>,
    /// Targets to start: opened, warmed up, with their failed opens before.
    pub(super) add: Vec<(RemoteLeg, Prepared, OpenErrors)>,
    /// A reload of the file (its summary line), or retries that opened.
    pub(super) reload: bool,
    /// Targets failing to open after this change (tried again).
    pub(super) failing: usize,
}

/// A target taken out of the probing, for its status probe and report.
pub(super) struct Retiring {
    pub(super) leg: RemoteLeg,
    pub(super) p: Prepared,
    pub(super) collected: engine::Collected,
    pub(super) sent: u64,
    pub(super) errors: OpenErrors,
}

/// What the probing loop and the keeper's thread share.
#[derive(Default)]
pub(super) struct Link {
    change: Mutex<Option<Change>>,
    ready: AtomicBool,
    retiring: Mutex<Vec<Retiring>>,
    done: AtomicBool,
}

impl Link {
    /// A change waits: the round pauses to apply it.
    pub(super) fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    pub(super) fn take(&self) -> Option<Change> {
        let c = self.change.lock().ok()?.take();
        self.ready.store(false, Ordering::SeqCst);
        c
    }

    fn publish(&self, c: Change) {
        if let Ok(mut slot) = self.change.lock() {
            *slot = Some(c);
            self.ready.store(true, Ordering::SeqCst);
        }
    }

    fn pending(&self) -> bool {
        self.change.lock().map(|c| c.is_some()).unwrap_or(true)
    }

    pub(super) fn retire(&self, r: Retiring) {
        if let Ok(mut v) = self.retiring.lock() {
            v.push(r);
        }
    }

    /// The session ends: the keeper finishes what was handed to it.
    pub(super) fn close(&self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// A target that failed to open, and when it is tried again.
pub(super) struct Failing {
    pub(super) leg: RemoteLeg,
    pub(super) errors: OpenErrors,
    backoff: Duration,
    next_try: Instant,
}

/// A target to open, with its failed opens so far and the last wait
/// between two of them (zero: its first try).
pub(super) struct Attempt {
    pub(super) leg: RemoteLeg,
    pub(super) errors: OpenErrors,
    pub(super) waited: Duration,
}

impl Attempt {
    pub(super) fn first(leg: RemoteLeg) -> Self {
        Self {
            leg,
            errors: OpenErrors::default(),
            waited: Duration::ZERO,
        }
    }
}

/// What the keeper hands back at the end of the session.
pub(super) struct Kept {
    /// Targets taken out during the run, with their outcomes.
    pub(super) retired: Vec<(RemoteLeg, SessionOutcome)>,
    /// Targets that never opened (still failing, or removed while failing).
    pub(super) never_opened: Vec<(RemoteLeg, SessionOutcome)>,
}

/// Where targets are opened and how their failures are told.
pub(super) struct Opener<'a> {
    pub(super) ns: Option<&'a Netns>,
    pub(super) local_clock: ClockSync,
    pub(super) on_error: &'a OnOpenError<'a>,
    pub(super) stop: &'a AtomicU8,
    log: Mutex<LogBudget>,
}

impl<'a> Opener<'a> {
    pub(super) fn new(
        ns: Option<&'a Netns>,
        local_clock: ClockSync,
        on_error: &'a OnOpenError<'a>,
        stop: &'a AtomicU8,
    ) -> Self {
        Self {
            ns,
            local_clock,
            on_error,
            stop,
            log: Mutex::new(LogBudget::default()),
        }
    }

    /// Opens `legs` in parallel: those that opened, and those that failed
    /// (reported, with their next try set).
    pub(super) fn open_all(
        &self,
        tries: Vec<Attempt>,
        mode: WarmUp,
    ) -> (Vec<(RemoteLeg, Prepared, OpenErrors)>, Vec<Failing>) {
        let tried = in_parallel(&tries, |a| {
            prepare(&a.leg, self.ns, &self.local_clock, mode, self.stop)
        });
        let (mut opened, mut failed) = (Vec::new(), Vec::new());
        for (a, r) in tries.into_iter().zip(tried) {
            match r {
                Ok(p) => opened.push((a.leg, p, a.errors)),
                Err(f) => failed.push(self.failed(a, &f)),
            }
        }
        (opened, failed)
    }

    /// Counts and reports a failed open; the next try comes after twice
    /// the last wait, from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`].
    fn failed(&self, a: Attempt, f: &OpenFailure) -> Failing {
        let Attempt {
            leg,
            mut errors,
            waited,
        } = a;
        let why = format!("{:#}", f.error);
        errors.count += 1;
        errors.last = Some(why.clone());
        (self.on_error)(&leg, f.step, &why);
        let backoff = (waited * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF);
        let line = format!(
            "target {}: {why} (step {}, failure {}); tried again in {} s",
            leg.label(),
            f.step.key(),
            errors.count,
            backoff.as_secs()
        );
        if let Ok(mut log) = self.log.lock() {
            log.line(&line);
        }
        Failing {
            leg,
            errors,
            backoff,
            next_try: Instant::now() + backoff,
        }
    }

    /// The report of a target that never opened.
    fn never_opened(&self, f: Failing) -> (RemoteLeg, SessionOutcome) {
        let o = never_opened(&f.leg, &self.local_clock, &f.errors, self.stop);
        (f.leg, o)
    }
}

/// At most [`ERROR_LINES_PER_S`] error lines a second.
#[derive(Default)]
struct LogBudget {
    second: Option<Instant>,
    lines: u32,
    held: u64,
}

impl LogBudget {
    fn line(&mut self, line: &str) {
        self.roll();
        if self.lines < ERROR_LINES_PER_S {
            self.lines += 1;
            log::warn!("{line}");
        } else {
            self.held += 1;
        }
    }

    /// A new second: says how many lines the last one held back.
    fn roll(&mut self) {
        let now = Instant::now();
        if self
            .second
            .is_some_and(|s| now - s < Duration::from_secs(1))
        {
            return;
        }
        if self.held > 0 {
            log::warn!(
                "{} more target errors in the last second (each target's count: rtprobe_target_errors_total, and `errors` in the JSON)",
                self.held
            );
        }
        *self = Self {
            second: Some(now),
            ..Self::default()
        };
    }
}

/// The session's targets as the keeper sees them: open (probed, or
/// handed over to be) and failing.
pub(super) struct Keeper<'a> {
    open: Vec<RemoteLeg>,
    failing: Vec<Failing>,
    reloads: Option<&'a Reloads<'a>>,
    opener: &'a Opener<'a>,
    retired: Vec<(RemoteLeg, SessionOutcome)>,
    never_opened: Vec<(RemoteLeg, SessionOutcome)>,
}

impl<'a> Keeper<'a> {
    pub(super) fn new(
        open: Vec<RemoteLeg>,
        failing: Vec<Failing>,
        reloads: Option<&'a Reloads<'a>>,
        opener: &'a Opener<'a>,
    ) -> Self {
        Self {
            open,
            failing,
            reloads,
            opener,
            retired: Vec::new(),
            never_opened: Vec::new(),
        }
    }

    fn generation(&self) -> u64 {
        self.reloads
            .map_or(0, |r| r.generation.load(Ordering::SeqCst))
    }

    /// Serves `link` until it is closed: reloads (at most one a second),
    /// retries, and the reports of the targets taken out.
    pub(super) fn run(mut self, link: &Link) -> Result<Kept> {
        let mut seen = self.generation();
        let mut last_reload: Option<Instant> = None;
        while !link.done.load(Ordering::SeqCst) {
            self.retire(link)?;
            if !link.pending() {
                let due = self.generation() != seen
                    && last_reload.is_none_or(|t| t.elapsed() >= RELOAD_MIN_GAP);
                let change = if due {
                    // Taken before the read: a request during it reloads again.
                    seen = self.generation();
                    last_reload = Some(Instant::now());
                    self.reload()
                } else {
                    self.retry_due()
                };
                if let Some(c) = change {
                    link.publish(c);
                }
            }
            std::thread::sleep(TICK);
        }
        self.retire(link)?;
        let opener = self.opener;
        let mut never_opened = self.never_opened;
        never_opened.extend(self.failing.into_iter().map(|f| opener.never_opened(f)));
        Ok(Kept {
            retired: self.retired,
            never_opened,
        })
    }

    /// The status probes (in parallel) and reports of the targets taken out.
    fn retire(&mut self, link: &Link) -> Result<()> {
        let batch = match link.retiring.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(_) => return Ok(()),
        };
        if batch.is_empty() {
            return Ok(());
        }
        let stop = self.opener.stop;
        let trailers = in_parallel(&batch, |r| trailer(&r.leg, &r.p, r.sent, stop));
        for (r, t) in batch.into_iter().zip(trailers) {
            let clock = &self.opener.local_clock;
            let mut o = outcome(&r.leg, r.p, r.collected, r.sent, t, clock, stop)?;
            if let Some(f) = o.remote.as_mut() {
                f.set_open_errors(&r.errors);
            }
            self.retired.push((r.leg, o));
        }
        Ok(())
    }

    /// Targets whose next try has come, opened again.
    fn retry_due(&mut self) -> Option<Change> {
        let now = Instant::now();
        if !self.failing.iter().any(|f| f.next_try <= now) {
            return None;
        }
        let (due, wait): (Vec<Failing>, Vec<Failing>) = std::mem::take(&mut self.failing)
            .into_iter()
            .partition(|f| f.next_try <= now);
        self.failing = wait;
        let tries = due
            .into_iter()
            .map(|f| Attempt {
                leg: f.leg,
                errors: f.errors,
                waited: f.backoff,
            })
            .collect();
        let (opened, failed) = self.opener.open_all(tries, WarmUp::Reload);
        self.failing.extend(failed);
        if opened.is_empty() {
            return None;
        }
        for (l, _, e) in &opened {
            log::warn!(
                "target {}: opened after {} failed tries; probing it",
                l.label(),
                e.count
            );
            self.open.push(l.clone());
        }
        Some(Change {
            remove: Vec::new(),
            add: opened,
            reload: false,
            failing: self.failing.len(),
        })
    }

    /// Reads the targets again and works out the change: targets that did
    /// not change go on, removed and changed ones are taken out, new and
    /// changed ones opened (a failure to open is that target's, retried).
    /// A file that fails its checks, or that needs more open files than
    /// the limit allows, changes nothing.
    fn reload(&mut self) -> Option<Change> {
        let r = self.reloads?;
        let total = self.open.len() + self.failing.len();
        let list = match (r.read)() {
            Ok(l) => l,
            Err(e) => {
                log::warn!("reload: {e:#}; the {total} targets go on unchanged");
                return None;
            }
        };
        // Sockets at the peak: the new ones open while the old still are
        // (a target that changed has two for a moment).
        let fresh = list
            .iter()
            .filter(|l| !self.open.iter().any(|o| o.same_as(l)))
            .count();
        if let Err(e) = open_files_for(self.open.len() + fresh) {
            log::warn!("reload: {e:#}; the {total} targets go on unchanged");
            return None;
        }
        let (remove, to_open) = self.diff(list);
        let (opened, failed) = self.opener.open_all(to_open, WarmUp::Reload);
        let failed_now = failed.len();
        self.failing.extend(failed);
        self.open.extend(opened.iter().map(|(l, _, _)| l.clone()));
        if remove.is_empty() && opened.is_empty() {
            let added = match failed_now {
                0 => String::new(),
                n => format!(", {n} added but failing to open (tried again)"),
            };
            let failing = match self.failing.len() {
                0 => String::new(),
                n => format!("; {n} failing to open in all"),
            };
            log::warn!(
                "reload: the {} targets probed go on unchanged{added}{failing}",
                self.open.len(),
            );
            return None;
        }
        Some(Change {
            remove,
            add: opened,
            reload: true,
            failing: self.failing.len(),
        })
    }

    /// Splits the new list against the targets held: the ones to take
    /// out, and the ones to open (with their failed opens so far). Keeps
    /// the unchanged ones, drops removed failing ones into the report.
    fn diff(&mut self, list: Vec<RemoteLeg>) -> (Vec<(String, Removal)>, Vec<Attempt>) {
        let mut old_open = std::mem::take(&mut self.open);
        let mut old_failing = std::mem::take(&mut self.failing);
        let (mut remove, mut to_open) = (Vec::new(), Vec::new());
        let name_of = |l: &RemoteLeg| l.label();
        for l in list {
            if let Some(i) = old_open.iter().position(|o| o.name == l.name) {
                let o = old_open.swap_remove(i);
                if o.same_as(&l) {
                    self.open.push(o);
                } else {
                    remove.push((name_of(&o), Removal::Changed));
                    to_open.push(Attempt::first(l));
                }
            } else if let Some(i) = old_failing.iter().position(|f| f.leg.name == l.name) {
                let f = old_failing.swap_remove(i);
                if f.leg.same_as(&l) {
                    self.failing.push(f);
                } else {
                    // Changed while failing: tried at once, as written now.
                    to_open.push(Attempt {
                        errors: f.errors,
                        ..Attempt::first(l)
                    });
                }
            } else {
                to_open.push(Attempt::first(l));
            }
        }
        remove.extend(old_open.iter().map(|o| (name_of(o), Removal::Removed)));
        for f in old_failing {
            log::warn!(
                "target {}: removed; it never opened ({} failed tries, the last: {})",
                f.leg.label(),
                f.errors.count,
                f.errors.last.as_deref().unwrap_or("-")
            );
            let n = self.opener.never_opened(f);
            self.never_opened.push(n);
        }
        (remove, to_open)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::{
        probe::wire::ProtocolArg,
        probe::{ProbeConfig, TimestampSource, remote::Target},
    };

    fn leg(name: &str, addr: &str) -> RemoteLeg {
        RemoteLeg {
            target: Target {
                addr: addr.parse().unwrap(),
                protocol: ProtocolArg::Rtprobe,
                key: None,
                stateless_reflector: false,
                shared_clock: false,
            },
            cfg: ProbeConfig {
                size: 64,
                interval: Duration::from_millis(100),
                count: None,
                duration: None,
                tos: 0,
                port: 5061,
                timestamps: TimestampSource::Software,
                timeout: Duration::from_secs(1),
                flow: 0,
                spin: None,
                busy_poll: false,
                no_warm_up: false,
                rt: Default::default(),
                kernel_reflector: false,
            },
            name: Some(name.into()),
            labels: Default::default(),
            host: None,
        }
    }

    fn clock() -> ClockSync {
        ClockSync {
            synchronized: false,
            max_error_ns: 0,
            tai_offset_s: 0,
        }
    }

    #[test]
    fn a_reload_keeps_the_unchanged_and_takes_out_the_removed_and_changed() {
        let stop = AtomicU8::new(0);
        let opener = Opener::new(None, clock(), &|_, _, _| {}, &stop);
        let open = vec![
            leg("a", "192.0.2.1:5061"),
            leg("b", "192.0.2.2:5061"),
            leg("gone", "192.0.2.3:5061"),
        ];
        let mut k = Keeper::new(open, Vec::new(), None, &opener);
        let list = vec![
            leg("a", "192.0.2.1:5061"),
            leg("b", "192.0.2.9:5061"),
            leg("new", "192.0.2.4:5061"),
        ];
        let (remove, to_open) = k.diff(list);
        assert_eq!(
            remove,
            [
                ("b".to_string(), Removal::Changed),
                ("gone".to_string(), Removal::Removed)
            ]
        );
        let names: Vec<_> = to_open.iter().map(|a| a.leg.label()).collect();
        assert_eq!(names, ["b", "new"]);
        let kept: Vec<_> = k.open.iter().map(RemoteLeg::label).collect();
        assert_eq!(kept, ["a"], "the unchanged target goes on as it was");
    }

    #[test]
    fn a_storm_of_reload_requests_reads_the_file_at_most_once_a_second() {
        let stop = AtomicU8::new(0);
        let opener = Opener::new(None, clock(), &|_, _, _| {}, &stop);
        let reads = AtomicU64::new(0);
        let generation = AtomicU64::new(0);
        let read = || -> Result<Vec<RemoteLeg>> {
            reads.fetch_add(1, Ordering::SeqCst);
            Ok(vec![leg("a", "192.0.2.1:5061")])
        };
        let reloads = Reloads {
            generation: &generation,
            read: &read,
        };
        let k = Keeper::new(
            vec![leg("a", "192.0.2.1:5061")],
            Vec::new(),
            Some(&reloads),
            &opener,
        );
        let link = Link::default();
        let t0 = Instant::now();
        std::thread::scope(|sc| {
            let h = sc.spawn(|| k.run(&link));
            // 250 requests over 2.5 s.
            for _ in 0..250 {
                generation.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
            link.close();
            h.join().unwrap().unwrap();
        });
        let secs = t0.elapsed().as_secs_f64();
        let n = reads.load(Ordering::SeqCst);
        assert!(n >= 1, "the requests are read at all");
        assert!(
            n as f64 <= secs.ceil() + 1.0,
            "{n} reads in {secs:.1} s: at most one a second"
        );
        assert!(!link.ready(), "an unchanged file changes nothing: no pause");
    }

    #[test]
    fn error_lines_are_at_most_ten_a_second_and_the_rest_counted() {
        let mut b = LogBudget::default();
        for i in 0..25 {
            b.line(&format!("target t{i}: unreachable"));
        }
        assert_eq!((b.lines, b.held), (10, 15));
    }
}
