//! Clocks and the pacer's sleep. CLOCK_REALTIME throughout, because it is
//! the clock of the kernel's software timestamps (clock_nanosleep(2) with
//! TIMER_ABSTIME; any Linux).

/// Now on CLOCK_REALTIME, in ns.
#[inline]
pub fn realtime_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Sleeps until the absolute CLOCK_REALTIME time `t_ns` (no drift: the
/// schedule is absolute, not a chain of relative sleeps).
pub fn sleep_until(t_ns: i64) {
    let ts = libc::timespec {
        tv_sec: t_ns.div_euclid(1_000_000_000),
        tv_nsec: t_ns.rem_euclid(1_000_000_000),
    };
    loop {
        // SAFETY: valid timespec; no remainder pointer needed with TIMER_ABSTIME.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_REALTIME,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if r != libc::EINTR {
            break;
        }
    }
}

/// Waits until `t_ns`: a timer sleep up to `spin_ns` before it, then a busy
/// spin for the last stretch, which removes most of the timer wake-up latency.
pub fn wait_until(t_ns: i64, spin_ns: i64) {
    let now = realtime_ns();
    if t_ns - now > spin_ns {
        sleep_until(t_ns - spin_ns);
    }
    while realtime_ns() < t_ns {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_until_does_not_return_early() {
        let t = realtime_ns() + 2_000_000;
        wait_until(t, 200_000);
        assert!(realtime_ns() >= t);
        // A time in the past returns at once.
        wait_until(t - 1_000_000_000, 200_000);
    }
}
