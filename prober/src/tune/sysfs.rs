//! sysfs as a network namespace sees it (for tests that walk it; the kernel
//! layer reads single attributes through `Sys::sysfs_read`).
//!
//! `/sys/class/net` lists the devices of the namespace that *mounted*
//! sysfs, not of the thread that reads it: a thread that `setns()`ed into
//! the sender namespace still sees the host's devices through the host's
//! /sys mount. So, as `ip netns exec` does, the thread first leaves the
//! shared mount table (`unshare(CLONE_NEWNS)`, allowed per thread because
//! it only unshares the thread's fs context), makes every mount private so
//! nothing propagates back to the host, and mounts a fresh sysfs on /sys,
//! which now belongs to the namespace. The thread's private mount table
//! dies with the thread (Netns::run joins it), leaving nothing behind.
//!
//! Kernel interface: unshare(2) CLONE_NEWNS, mount(2) of sysfs (in
//! `sys::private_sysfs`, shared with the kernel layer's workers), then plain
//! file I/O under /sys/class/net/DEV; Linux >= 3.8.

use std::path::Path;

use anyhow::Result;

use crate::sys::Netns;

/// Runs `f` on a thread inside `ns` with a sysfs of that namespace on /sys
/// (the mount is [`crate::sys::private_sysfs`], the kernel layer's own).
/// For code that walks sysfs freely; single attributes go through
/// [`crate::sys::Sys::sysfs_read`]/`sysfs_write`.
pub(super) fn with_sysfs<T, F>(ns: &Netns, f: F) -> Result<T>
where
    F: FnOnce(&Path) -> Result<T> + Send,
    T: Send,
{
    ns.run(|| {
        crate::sys::private_sysfs()?;
        f(Path::new("/sys"))
    })
}
