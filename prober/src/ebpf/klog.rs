//! The eBPF programs' own log of their rare paths (malformed frames, TTL
//! expiry, an egress the router may not use, a probe the reflector
//! refuses), through aya-log. Off unless the user asked for it (`rtprobe
//! -vv`): the programs are then loaded with `LOG_RARE = 0` and the verifier
//! prunes every log call, so the per-packet path pays nothing.

use std::{
    os::fd::AsFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use anyhow::{Context, Result};
use aya::Ebpf;
use aya_log::EbpfLogger;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns the programs' rare-path log on for programs loaded from now on.
pub(crate) fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// The value of the programs' `LOG_RARE` global.
pub(crate) fn global() -> u8 {
    ENABLED.load(Ordering::Relaxed).into()
}

/// Forwards an object's aya-log records to the `log` crate from a thread
/// of its own, until dropped (which flushes what is left).
pub(crate) struct KernelLog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl KernelLog {
    /// Starts forwarding to the `log` crate if the log is enabled; `None`
    /// otherwise.
    pub(crate) fn start(ebpf: &mut Ebpf, what: &'static str) -> Result<Option<Self>> {
        if global() == 0 {
            return Ok(None);
        }
        Self::start_with(ebpf, what, Box::new(log::logger())).map(Some)
    }

    /// Starts forwarding to `sink`.
    pub(crate) fn start_with(
        ebpf: &mut Ebpf,
        what: &'static str,
        sink: Box<dyn log::Log>,
    ) -> Result<Self> {
        let mut logger = EbpfLogger::init_with_logger(ebpf, sink)
            .with_context(|| format!("reading the {what}'s kernel log (aya-log)"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(format!("{what}-log"))
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    let mut fds = [PollFd::new(logger.as_fd(), PollFlags::POLLIN)];
                    // A timeout, not an endless wait, so that a drop is seen.
                    let _ = poll(&mut fds, PollTimeout::from(200u16));
                    logger.flush();
                }
                logger.flush();
            })
            .context("starting the kernel log thread")?;
        log::debug!("{what}: logging its rare paths (aya-log)");
        Ok(KernelLog {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for KernelLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // Bounded: the thread polls with a 200 ms timeout.
            let _ = t.join();
        }
    }
}
