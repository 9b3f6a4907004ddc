//! sysfs as a network namespace sees it, for tests that walk it (the
//! kernel layer reads single attributes through `Sys::sysfs_read`). The
//! mechanism (a private mount table with the namespace's own sysfs on
//! /sys) is the kernel layer's: [`Netns::run_with_sysfs`].

use std::path::Path;

use anyhow::Result;

use crate::sys::Netns;

/// Runs `f` on a thread inside `ns` with a sysfs of that namespace on /sys.
pub(super) fn with_sysfs<T, F>(ns: &Netns, f: F) -> Result<T>
where
    F: FnOnce(&Path) -> Result<T> + Send,
    T: Send,
{
    ns.run_with_sysfs(f)
}
