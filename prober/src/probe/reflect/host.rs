//! [`Host`]: the one home of a serving user-space reflector, for `rtprobe
//! reflect` (`app/reflect.rs`) and for the STAMP reflector at a testbed
//! run's receiver (`run/`). It owns the sockets, the [`Core`], the thread
//! that runs [`serve`] and the stop flag, and gives the [`ServeReport`]
//! back on join. (The probe engine's in-process reflector runs a `Core`
//! inline in its I/O loop instead: `probe/engine/io.rs`.)

use std::{
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result};

use super::{
    Counters,
    decide::{Core, Policy},
    report::ServeReport,
    serve::serve,
};
use crate::probe::socket::ProbeSocket;

/// What a serving reflector tells its host's owner while it runs, on the
/// serving thread; it comes back with the report. `()` hears nothing.
pub(crate) trait Watch: Send + 'static {
    /// A "new session ... from ..." line (rate-limited by [`serve`]).
    fn session_line(&mut self, _line: &str) {}
    /// The counters, about four times a second and once at the end.
    fn tick(&mut self, _counters: &Counters) {}
}

impl Watch for () {}

/// A user-space reflector answering on its sockets in a thread of its
/// own until its stop flag is set (or its duration passes).
pub(crate) struct Host<W: Watch = ()> {
    stop: Arc<AtomicU8>,
    thread: JoinHandle<(Result<ServeReport>, W)>,
}

impl Host<()> {
    /// Answers on `socks` as `policy` says, hearing nothing, until
    /// [`Host::stop`].
    pub(crate) fn start(socks: Vec<ProbeSocket>, policy: Policy) -> Result<Self> {
        Host::start_with(socks, policy, Arc::new(AtomicU8::new(0)), None, ())
    }
}

impl<W: Watch> Host<W> {
    /// Answers on `socks` as `policy` says until `stop` is set (by
    /// [`Host::stop`] or by whoever else holds it) or `duration` passes;
    /// `watch` hears the session lines and the counters.
    pub(crate) fn start_with(
        socks: Vec<ProbeSocket>,
        policy: Policy,
        stop: Arc<AtomicU8>,
        duration: Option<Duration>,
        mut watch: W,
    ) -> Result<Self> {
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rtprobe-reflect".into())
            .spawn(move || {
                let mut core = Core::new(policy);
                // Both hooks are the watch's: they take turns at it.
                let w = std::cell::RefCell::new(&mut watch);
                let report = serve(
                    &socks,
                    &mut core,
                    &s,
                    duration,
                    |line| w.borrow_mut().session_line(line),
                    |c| w.borrow_mut().tick(c),
                );
                (report, watch)
            })
            .context("spawn the reflector thread")?;
        Ok(Self { stop, thread })
    }

    /// Sets the stop flag and waits for the report.
    pub(crate) fn stop(self) -> Result<(ServeReport, W)> {
        self.stop.store(1, Ordering::SeqCst);
        self.join()
    }

    /// Waits until the reflector stops (its flag set elsewhere, or its
    /// duration over): its report, and the watch back.
    pub(crate) fn join(self) -> Result<(ServeReport, W)> {
        let (report, watch) = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the reflector thread panicked"))?;
        Ok((report?, watch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::wire::ProtocolArg;

    #[derive(Default)]
    struct Ticks(u32);

    impl Watch for Ticks {
        fn tick(&mut self, _: &Counters) {
            self.0 += 1;
        }
    }

    #[test]
    fn a_host_stops_on_its_flag_and_gives_the_watch_back() {
        let policy = Policy::unlimited(ProtocolArg::Stamp);
        let stop = Arc::new(AtomicU8::new(0));
        let host = Host::start_with(Vec::new(), policy, stop, None, Ticks::default()).unwrap();
        let (report, ticks) = host.stop().unwrap();
        assert_eq!(report.counters.datagrams, 0);
        assert!(ticks.0 >= 1, "the last tick comes at the end");
    }

    #[test]
    fn a_host_with_a_duration_ends_by_itself() {
        let policy = Policy::unlimited(ProtocolArg::Rtprobe);
        let stop = Arc::new(AtomicU8::new(0));
        let d = Some(Duration::from_millis(30));
        let host = Host::start_with(Vec::new(), policy, stop.clone(), d, ()).unwrap();
        let (report, ()) = host.join().unwrap();
        assert!(report.duration_s >= 0.03, "{}", report.duration_s);
        assert_eq!(stop.load(Ordering::SeqCst), 0);
        let (report, ()) = Host::start(Vec::new(), Policy::unlimited(ProtocolArg::Stamp))
            .unwrap()
            .stop()
            .unwrap();
        assert_eq!(report.counters.reflected, 0);
    }
}
