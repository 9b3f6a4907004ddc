//! The allocator's side of a long run's memory. glibc gives each thread
//! that allocates its own arena (up to 8 per CPU) and keeps memory freed
//! by short-lived peaks (a burst of in-flight probes after a stall, a
//! rotation's buffers, interval histograms) in them, so a `--forever`
//! run's RSS would show the worst moment of each arena so far rather than
//! what the run holds. Measured with `cargo xtask bench --only continuous`
//! (docs/BENCHMARKS.md): RSS rose by 6 MiB in 67 s with the defaults and
//! stayed within a band with two arenas and a trim every 10 s.

/// At most this many arenas: rtprobe's threads allocate little, and
/// mostly the collector.
const ARENAS: i32 = 2;

/// Caps the number of arenas. Call before any thread starts.
pub(crate) fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a glibc tunable; M_ARENA_MAX takes any
    // positive count. It is called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// Returns the heap's free pages to the kernel.
pub(crate) fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes no pointers and only madvises free chunks
    // inside glibc's own arenas; it is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
