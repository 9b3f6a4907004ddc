//! Named network namespaces, as `ip netns` makes them: a bind mount of
//! `/proc/thread-self/ns/net` on `/run/netns/NAME`, so `ip netns exec` and
//! `ip netns list` see them too. Code runs inside one on a dedicated thread
//! (setns(2) only changes the calling thread). Kernel interfaces: unshare(2),
//! setns(2), mount(2); Linux >= 3.8.

use std::{
    fs::File,
    os::fd::{AsFd, BorrowedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use nix::{
    mount::{MntFlags, MsFlags, mount, umount2},
    sched::{CloneFlags, setns, unshare},
};

pub(crate) const NETNS_RUN_DIR: &str = "/run/netns";

/// A named network namespace that this process created; deleted on drop.
#[derive(Debug)]
pub(crate) struct Netns {
    name: String,
    path: PathBuf,
    file: File,
    owned: bool,
}

impl Netns {
    /// Creates `/run/netns/NAME` holding a fresh network namespace.
    pub(crate) fn create(name: &str) -> Result<Self> {
        if name.is_empty() || name.contains('/') || name.len() > 200 {
            bail!("invalid namespace name {name:?}");
        }
        ensure_run_dir()?;
        let path = Path::new(NETNS_RUN_DIR).join(name);
        if path.exists() {
            bail!("network namespace {name} already exists: remove it with `ip netns del {name}`");
        }
        File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let p = path.clone();
        // A new thread so that unshare() does not move this thread.
        let res = std::thread::spawn(move || -> Result<()> {
            unshare(CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET)")?;
            mount(
                Some("/proc/thread-self/ns/net"),
                &p,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .with_context(|| format!("bind mount of the new namespace on {}", p.display()))?;
            Ok(())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("namespace creation thread panicked"))?;
        if let Err(e) = res {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        let file = File::open(&path).with_context(|| format!("open {}", path.display()))?;
        Ok(Self {
            name: name.to_string(),
            path,
            file,
            owned: true,
        })
    }

    /// Opens an existing named namespace without taking ownership.
    pub(crate) fn open(name: &str) -> Result<Self> {
        let path = Path::new(NETNS_RUN_DIR).join(name);
        let file =
            File::open(&path).with_context(|| format!("network namespace {name} not found"))?;
        Ok(Self {
            name: name.to_string(),
            path,
            file,
            owned: false,
        })
    }

    /// A handle named `name` on this process's own namespace, not owned:
    /// what the fake kernel hands out for the namespaces of its model.
    #[cfg(test)]
    pub(crate) fn stand_in(name: &str) -> Result<Self> {
        let path = PathBuf::from("/proc/self/ns/net");
        let file = File::open(&path).context("open this process's network namespace")?;
        Ok(Self {
            name: name.to_string(),
            path,
            file,
            owned: false,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// /run/netns/NAME.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Runs `f` on a new thread that has entered this namespace and returns
    /// its result. Sockets and netlink connections made inside stay in the
    /// namespace after the thread ends.
    pub(crate) fn run<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> Result<T> + Send,
        T: Send,
    {
        std::thread::scope(|s| {
            s.spawn(|| {
                enter(self.file.as_fd())
                    .with_context(|| format!("cannot enter network namespace {}", self.name))?;
                f()
            })
            .join()
            .map_err(|_| anyhow::anyhow!("thread in namespace {} panicked", self.name))?
        })
    }

    /// Enters this namespace on the calling thread. For threads that live
    /// in one namespace for good (sender, reflector).
    pub(crate) fn enter_current_thread(&self) -> Result<()> {
        enter(self.file.as_fd())
            .with_context(|| format!("cannot enter network namespace {}", self.name))
    }

    /// Runs `f` on a thread inside this namespace with a sysfs of the
    /// namespace on /sys, for code that walks sysfs freely (single
    /// attributes go through [`super::Sys::sysfs_read`]/`sysfs_write`).
    ///
    /// `/sys/class/net` lists the devices of the namespace that *mounted*
    /// sysfs, not of the thread that reads it: a thread that `setns()`ed
    /// into the sender namespace still sees the host's devices through the
    /// host's /sys mount. So, as `ip netns exec` does, the thread first
    /// leaves the shared mount table (`unshare(CLONE_NEWNS)`, allowed per
    /// thread because it only unshares the thread's fs context), makes
    /// every mount private so nothing propagates back to the host, and
    /// mounts a fresh sysfs on /sys, which now belongs to the namespace
    /// ([`super::private_sysfs`], the kernel layer's workers' own). The
    /// thread's private mount table dies with the thread ([`Netns::run`]
    /// joins it), leaving nothing behind. Kernel interface: unshare(2)
    /// CLONE_NEWNS, mount(2) of sysfs; Linux >= 3.8.
    #[cfg(test)]
    pub(crate) fn run_with_sysfs<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce(&Path) -> Result<T> + Send,
        T: Send,
    {
        self.run(|| {
            super::private_sysfs()?;
            f(Path::new("/sys"))
        })
    }

    /// Leaves the namespace in place when this handle drops (its deletion
    /// is someone else's job: the testbed's undo list, `rtprobe cleanup`).
    pub(crate) fn disown(mut self) {
        self.owned = false;
    }

    fn remove(&mut self) -> Result<()> {
        if !self.owned {
            return Ok(());
        }
        self.owned = false;
        remove(&self.name)
    }
}

/// Enters the network namespace open at `ns` (/run/netns/NAME,
/// /proc/PID/ns/net) on the calling thread, for good: for threads that
/// live in one namespace and hold no [`Netns`] (a duplicated handle, a
/// path of another process's namespace). setns(2) CLONE_NEWNET.
pub(crate) fn enter(ns: BorrowedFd<'_>) -> nix::Result<()> {
    setns(ns, CloneFlags::CLONE_NEWNET)
}

/// The kernel layer's name of a named namespace (not of `Netns::current`).
impl<'a> From<&'a Netns> for super::Ns<'a> {
    fn from(n: &'a Netns) -> Self {
        super::Ns::Named(n.name())
    }
}

/// Deletes the named namespace `name` (what `ip netns del` does).
pub(crate) fn remove(name: &str) -> Result<()> {
    // A namespace worker of the kernel layer would keep it alive.
    super::release_worker(name);
    let path = Path::new(NETNS_RUN_DIR).join(name);
    // Lazy unmount: the namespace itself dies with its last user.
    let _ = umount2(&path, MntFlags::MNT_DETACH);
    std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            log::warn!("could not delete network namespace {}: {e:#}", self.name);
        }
    }
}

/// Makes /run/netns a shared mount point, as iproute2 does, so mounts made
/// below it propagate to other mount namespaces.
fn ensure_run_dir() -> Result<()> {
    std::fs::create_dir_all(NETNS_RUN_DIR).with_context(|| format!("create {NETNS_RUN_DIR}"))?;
    let rec_shared = MsFlags::MS_SHARED | MsFlags::MS_REC;
    if mount(
        None::<&str>,
        NETNS_RUN_DIR,
        None::<&str>,
        rec_shared,
        None::<&str>,
    )
    .is_err()
    {
        mount(
            Some(NETNS_RUN_DIR),
            NETNS_RUN_DIR,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .with_context(|| format!("bind mount {NETNS_RUN_DIR} on itself"))?;
        mount(
            None::<&str>,
            NETNS_RUN_DIR,
            None::<&str>,
            rec_shared,
            None::<&str>,
        )
        .with_context(|| format!("make {NETNS_RUN_DIR} shared"))?;
    }
    Ok(())
}

/// Names of the namespaces in /run/netns (what `ip netns list` shows).
pub fn list() -> Vec<String> {
    std::fs::read_dir(NETNS_RUN_DIR)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
