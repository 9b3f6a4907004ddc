//! Load generators for `bench-forward`, run on threads inside the sender
//! namespace:
//!
//! - `xdp`: the kernel's XDP live-frame mode of BPF_PROG_TEST_RUN
//!   (BPF_F_TEST_XDP_LIVE_FRAMES, Linux >= 5.18), the mechanism
//!   xdp-trafficgen uses. The `bench_loadgen` program (Rust, in
//!   `xdp-router/src/bench.rs`) returns `bpf_redirect(sender veth)`, so the
//!   kernel builds each frame in a page pool and hands it straight to the
//!   veth's ndo_xdp_xmit: no socket, no skb, millions of frames per second
//!   per core. (xdp-trafficgen itself only makes IPv6 with hop limit 1,
//!   which no router forwards.)
//! - `socket`: plain UDP sendmmsg(2) (Linux >= 3.0), what a user-space
//!   sender costs.
//!
//! Both pace themselves to an offered rate (or run flat out) and count
//! what they handed to the kernel.
//!
//! Why the program thins the stream itself: every BPF_PROG_TEST_RUN call
//! sets up and tears down a page pool, which waits for an RCU grace period
//! (milliseconds on a busy VM), so the generator must make few, long calls;
//! a lower offered rate is then a random subset of the full-speed stream,
//! spread evenly over time.

use std::{
    net::SocketAddrV4,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::xdp::BenchProgram;

/// A loaded live-frame generator for one egress interface. Create it and
/// run it on a thread inside the egress interface's namespace.
pub(crate) struct XdpLiveGen {
    prog: BenchProgram,
    frame: Vec<u8>,
}

impl XdpLiveGen {
    /// Loads the program that redirects to `ifindex` (in the calling
    /// thread's namespace) a random `keep` share (0..=1) of the frames.
    pub(crate) fn load(ifindex: u32, frame: Vec<u8>, keep: f64) -> Result<Self> {
        let prog = BenchProgram::loadgen(ifindex, &frame, keep)
            .context("loading the XDP load-generator program")?;
        Ok(Self { prog, frame })
    }

    /// Runs the program on `n` copies of the frame (what is kept is
    /// redirected to the egress veth). Returns `n`, or 0 if a signal
    /// interrupted the call.
    pub(crate) fn inject(&self, n: u32) -> Result<u32> {
        // Live mode reports no return value; whether the frames went out
        // shows in the interface counters.
        Ok(if self.prog.run_live(&self.frame, n)? {
            n
        } else {
            0
        })
    }
}

/// How fast a generator offers load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Offered {
    /// As fast as it can.
    Max,
    /// About this many packets per second.
    Pps(f64),
}

/// A paced XDP load: the rate to keep and the first guess of the share
/// of program runs that achieves it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LiveTarget {
    pub(crate) pps: f64,
    pub(crate) keep: f64,
}

/// Runs the live-frame generator for `duration` in long calls (the
/// per-call set-up costs an RCU grace period): each call is sized to last
/// about 200 ms (100 ms when paced) from the rate the previous one
/// achieved, and never much past the end. Paced (`target`), it measures
/// the rate actually kept after each call with `measure` (a packet
/// counter) and corrects the kept share, reloading the program: dropping
/// a frame is cheaper than sending it, so runs per second depend on the
/// share. Returns how many frames the program ran on.
pub(crate) fn run_live(
    ifindex: u32,
    frame: &[u8],
    target: Option<LiveTarget>,
    duration: Duration,
    stop: &AtomicBool,
    mut measure: impl FnMut() -> Result<u64>,
) -> Result<u64> {
    let call_secs = if target.is_some() { 0.1 } else { 0.2 };
    let mut keep = target.map_or(1.0, |t| t.keep.clamp(1e-6, 1.0));
    let mut live = XdpLiveGen::load(ifindex, frame.to_vec(), keep)?;
    let start = Instant::now();
    let mut repeat: u32 = 1 << 16;
    let mut runs = 0u64;
    let mut last = if target.is_some() { measure()? } else { 0 };
    while !stop.load(Ordering::Relaxed) {
        let left = duration.saturating_sub(start.elapsed()).as_secs_f64();
        if left <= 0.0 {
            break;
        }
        let t0 = Instant::now();
        runs += u64::from(live.inject(repeat)?);
        let secs = t0.elapsed().as_secs_f64().max(1e-6);
        log::trace!("live frames: {repeat} runs in {secs:.3} s, keep {keep:.4}");
        let per_sec = f64::from(repeat) / secs;
        repeat = next_repeat(per_sec, left - secs, call_secs);
        if let Some(t) = target {
            let now = measure()?;
            let kept_pps = now.saturating_sub(last) as f64 / t0.elapsed().as_secs_f64();
            last = now;
            let next = corrected_keep(keep, t.pps, kept_pps);
            if (next - keep).abs() > keep * 0.02 {
                keep = next;
                live = XdpLiveGen::load(ifindex, frame.to_vec(), keep)?;
            }
        }
    }
    Ok(runs)
}

/// The kept share for the next call: scaled by how far the last call was
/// from the target rate. Pure.
pub(crate) fn corrected_keep(keep: f64, target_pps: f64, achieved_pps: f64) -> f64 {
    if achieved_pps <= 0.0 {
        return (keep * 2.0).min(1.0);
    }
    (keep * target_pps / achieved_pps).clamp(1e-6, 1.0)
}

/// The repeat count of the next live-frame call at `per_sec` runs per
/// second with `left_secs` of the step left. Pure.
pub(crate) fn next_repeat(per_sec: f64, left_secs: f64, call_secs: f64) -> u32 {
    (per_sec * left_secs.min(call_secs).max(0.0)).clamp(1024.0, f64::from(1u32 << 26)) as u32
}

/// How many packets to send now, `sent` packets and `elapsed` into a run at
/// `rate`: None when ahead of the schedule. At most `chunk`.
pub(crate) fn due_now(rate: Offered, elapsed: Duration, sent: u64, chunk: u32) -> Option<u32> {
    match rate {
        Offered::Max => Some(chunk),
        Offered::Pps(pps) => {
            let due = (pps * elapsed.as_secs_f64()) as u64;
            let behind = due.saturating_sub(sent);
            (behind > 0).then(|| behind.min(u64::from(chunk)) as u32)
        }
    }
}

/// Runs `send(n) -> sent` until `stop` or `duration`, keeping to `rate`.
/// `chunk` is the most packets per call. Adds what was sent to `count`.
pub(crate) fn pace_load(
    rate: Offered,
    duration: Duration,
    chunk: u32,
    stop: &AtomicBool,
    count: &AtomicU64,
    mut send: impl FnMut(u32) -> Result<u32>,
) -> Result<()> {
    let start = Instant::now();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let elapsed = start.elapsed();
        if elapsed >= duration {
            break;
        }
        let Some(n) = due_now(rate, elapsed, sent, chunk) else {
            // Ahead of the schedule: a short sleep, not a spin, so the CPU
            // goes to the router under test.
            std::thread::sleep(Duration::from_micros(50));
            continue;
        };
        let k = send(n)?;
        sent += u64::from(k);
        count.fetch_add(u64::from(k), Ordering::Relaxed);
    }
    Ok(())
}

/// A UDP socket generator: `sendmmsg` of `batch` datagrams with `payload`
/// bytes each to `dst`. Create it inside the sender namespace.
pub(crate) struct SocketGen {
    fd: OwnedFd,
    bufs: Vec<Vec<u8>>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` only point into the heap
// buffers of `bufs` and `iovs`, which the generator owns, never resizes after
// `new` and shares with no one; moving it to another thread moves them along
// (a Vec's heap buffer does not move when the Vec does).
unsafe impl Send for SocketGen {}

impl SocketGen {
    pub(crate) fn new(dst: SocketAddrV4, payload: usize, batch: usize) -> Result<Self> {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").context("bind the load socket")?;
        s.connect(dst)
            .with_context(|| format!("connect the load socket to {dst}"))?;
        // SAFETY: the fd comes from a socket we own and hand over.
        let fd = unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(s)) };
        let mut g = Self {
            fd,
            bufs: (0..batch).map(|_| vec![0x5a; payload]).collect(),
            iovs: Vec::with_capacity(batch),
            // SAFETY: all-zero mmsghdr is valid.
            hdrs: (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect(),
        };
        for b in &mut g.bufs {
            g.iovs.push(libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            });
        }
        for (h, iov) in g.hdrs.iter_mut().zip(g.iovs.iter_mut()) {
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
        }
        Ok(g)
    }

    /// Sends up to `n` datagrams (at most the batch) in one sendmmsg.
    pub(crate) fn send(&mut self, n: u32) -> Result<u32> {
        let n = (n as usize).min(self.hdrs.len());
        // SAFETY: the headers point into our own buffers.
        let r = unsafe { libc::sendmmsg(self.fd.as_raw_fd(), self.hdrs.as_mut_ptr(), n as u32, 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                // A full queue or an ICMP error reported back: try again.
                Some(libc::ENOBUFS | libc::EAGAIN | libc::ECONNREFUSED | libc::EINTR) => Ok(0),
                _ => Err(e).context("sendmmsg on the load socket"),
            };
        }
        Ok(r as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offered_rate_schedule() {
        let ms = Duration::from_millis;
        let r = Offered::Pps(20_000.0);
        assert_eq!(due_now(r, ms(0), 0, 64), None);
        // 100 ms in: 2000 due; behind by 2000 but at most a chunk.
        assert_eq!(due_now(r, ms(100), 0, 64), Some(64));
        assert_eq!(due_now(r, ms(100), 1990, 64), Some(10));
        assert_eq!(due_now(r, ms(100), 2000, 64), None);
        assert_eq!(due_now(Offered::Max, ms(0), 1 << 40, 32), Some(32));
    }

    #[test]
    fn kept_share_follows_the_target() {
        // Half the target reached: keep twice as much.
        assert!((corrected_keep(0.1, 100_000.0, 50_000.0) - 0.2).abs() < 1e-12);
        // Over the target: keep less.
        assert!((corrected_keep(0.5, 100_000.0, 200_000.0) - 0.25).abs() < 1e-12);
        // Never above everything, never zero.
        assert_eq!(corrected_keep(0.8, 100_000.0, 10_000.0), 1.0);
        assert!(corrected_keep(0.001, 1.0, 1e12) > 0.0);
        // Nothing got through: grow.
        assert_eq!(corrected_keep(0.3, 100.0, 0.0), 0.6);
    }

    #[test]
    fn live_calls_last_about_the_call_time() {
        assert_eq!(next_repeat(1_000_000.0, 5.0, 0.2), 200_000);
        // Near the end of the step: only what is left.
        assert_eq!(next_repeat(1_000_000.0, 0.05, 0.2), 50_000);
        // Never below a floor (the set-up cost must be spread) nor absurdly high.
        assert_eq!(next_repeat(1_000_000.0, -1.0, 0.2), 1024);
        assert_eq!(next_repeat(1e12, 5.0, 0.2), 1 << 26);
    }

    #[test]
    fn stop_is_honoured_at_once() {
        let stop = AtomicBool::new(true);
        let count = AtomicU64::new(0);
        pace_load(Offered::Max, Duration::from_secs(5), 64, &stop, &count, Ok).unwrap();
        assert_eq!(
            count.load(Ordering::Relaxed),
            0,
            "a stop request is honoured at once"
        );
    }
}
