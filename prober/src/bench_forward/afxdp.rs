//! AF_XDP forwarding for `bench-forward --bounce afxdp`, with nothing but
//! libc: one XSK socket per receive queue, its UMEM (4096 frames of 2048 B,
//! page-aligned), the four rings mmap'ed from the socket, and a loop that
//! takes each received frame, swaps its MACs (as `bench_bounce` does) and
//! puts the same UMEM frame on the TX ring; completed frames go back to the
//! fill ring. `bench_xsk` (XSKMAP indexed by `rx_queue_index`) steers the
//! frames here.
//!
//! Rings: the kernel and this process share a producer and a consumer
//! index (free-running u32, the slot is `index & (size - 1)`); the side
//! that produces writes descriptors, then publishes its index with Release;
//! the other side reads the index with Acquire before reading descriptors.
//!
//! Kernel interfaces (linux/if_xdp.h): socket(AF_XDP) (4.18), SOL_XDP
//! XDP_UMEM_REG, ring sizes, XDP_MMAP_OFFSETS with the `flags` word and
//! XDP_USE_NEED_WAKEUP (5.4), bind(sockaddr_xdp) in XDP_COPY mode (veth has
//! no zero-copy), sendto(2) to kick TX, poll(2) to wait for RX.
//!
//! These socket, mmap and ring calls stay here rather than behind
//! `sys::Sys`: they are the object the bench measures (a user-space
//! forwarder's per-frame cost), so they must be the plain syscalls a real
//! AF_XDP program makes, with no trait call or recording layer in between,
//! and there is nothing in them a fake could usefully stand in for.

use std::{
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
    ptr::NonNull,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        mpsc,
    },
};

use anyhow::{Context, Result, bail};

/// UMEM frames per socket and their size.
pub(crate) const FRAMES: u32 = 4096;
pub(crate) const FRAME_SIZE: u32 = 2048;
/// Fill and completion rings hold every frame; RX and TX half of them.
const FILL_SIZE: u32 = FRAMES;
const COMP_SIZE: u32 = FRAMES;
const RX_SIZE: u32 = FRAMES / 2;
const TX_SIZE: u32 = FRAMES / 2;
/// Descriptors handled per turn of the loop.
const BATCH: u32 = 64;

/// Entries the producer may still write. Indexes are free-running u32. Pure.
pub(crate) fn free_entries(size: u32, producer: u32, consumer: u32) -> u32 {
    size - producer.wrapping_sub(consumer)
}

/// Entries the consumer may read. Pure.
pub(crate) fn ready_entries(producer: u32, consumer: u32) -> u32 {
    producer.wrapping_sub(consumer)
}

/// The slot of an index in a ring of `size` (a power of two). Pure.
pub(crate) fn slot(index: u32, size: u32) -> usize {
    (index & (size - 1)) as usize
}

fn errno_ctx(what: &str) -> anyhow::Error {
    anyhow::Error::new(std::io::Error::last_os_error()).context(what.to_string())
}

/// One mmap'ed ring of descriptors of type `T` (u64 addresses for fill and
/// completion, `xdp_desc` for RX and TX).
struct Ring<T> {
    map: NonNull<libc::c_void>,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut T,
    size: u32,
}

// SAFETY: the ring is used by the one thread that owns its socket; the
// pointers point into a mapping that lives as long as the Ring.
unsafe impl<T> Send for Ring<T> {}

impl<T> Ring<T> {
    fn map(fd: BorrowedFd<'_>, off: &libc::xdp_ring_offset, size: u32, pgoff: u64) -> Result<Self> {
        let map_len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        // SAFETY: a fresh shared mapping of the socket's ring; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                pgoff as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(errno_ctx(&format!(
                "mmap an AF_XDP ring (offset {pgoff:#x})"
            )));
        }
        let base = p.cast::<u8>();
        // SAFETY: the offsets come from XDP_MMAP_OFFSETS and lie inside the mapping.
        unsafe {
            Ok(Ring {
                map: NonNull::new(p).context("mmap returned null")?,
                map_len,
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                flags: base.add(off.flags as usize).cast(),
                descs: base.add(off.desc as usize).cast(),
                size,
            })
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: aligned u32 inside the live mapping, shared with the kernel.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: as above.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    fn desc(&self, index: u32) -> *mut T {
        // SAFETY: the slot is below `size`, inside the mapping.
        unsafe { self.descs.add(slot(index, self.size)) }
    }

    /// Producer side: how many of `want` can be written from index `prod`.
    fn reserve(&self, want: u32) -> (u32, u32) {
        let prod = self.producer().load(Ordering::Relaxed);
        let cons = self.consumer().load(Ordering::Acquire);
        (prod, want.min(free_entries(self.size, prod, cons)))
    }

    fn submit(&self, prod: u32, n: u32) {
        self.producer()
            .store(prod.wrapping_add(n), Ordering::Release);
    }

    /// Consumer side: up to `want` ready entries from index `cons`.
    fn peek(&self, want: u32) -> (u32, u32) {
        let cons = self.consumer().load(Ordering::Relaxed);
        let prod = self.producer().load(Ordering::Acquire);
        (cons, want.min(ready_entries(prod, cons)))
    }

    fn release(&self, cons: u32, n: u32) {
        self.consumer()
            .store(cons.wrapping_add(n), Ordering::Release);
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.map.as_ptr(), self.map_len) };
    }
}

/// One AF_XDP socket bound to one queue, with its UMEM and rings.
pub(crate) struct Xsk {
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    umem: NonNull<u8>,
    umem_len: usize,
    /// Last, so the rings and UMEM are unmapped before the socket closes.
    fd: OwnedFd,
}

// SAFETY: the socket and its mappings are used by one thread at a time.
unsafe impl Send for Xsk {}

fn setsockopt<T>(fd: BorrowedFd<'_>, opt: libc::c_int, v: &T, what: &str) -> Result<()> {
    // SAFETY: `v` is a valid T of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(errno_ctx(what));
    }
    Ok(())
}

/// The four rings of one socket.
struct Rings {
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
}

/// A fresh AF_XDP socket.
fn open_xdp_socket() -> Result<OwnedFd> {
    // SAFETY: plain syscall.
    let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(errno_ctx(
            "socket(AF_XDP) (needs Linux >= 4.18 with CONFIG_XDP_SOCKETS)",
        ));
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The UMEM: an anonymous, page-aligned, populated mapping of `len` bytes.
fn map_umem(len: usize) -> Result<NonNull<u8>> {
    // SAFETY: a fresh anonymous mapping (page-aligned); checked below.
    let area = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    if area == libc::MAP_FAILED {
        return Err(errno_ctx("mmap the AF_XDP UMEM"));
    }
    NonNull::new(area.cast::<u8>()).context("mmap returned null")
}

/// Registers the UMEM with the socket and sizes its four rings.
fn register_umem(fd: BorrowedFd<'_>, umem: NonNull<u8>, umem_len: usize) -> Result<()> {
    // SAFETY: all-zero is a valid xdp_umem_reg.
    let mut reg: libc::xdp_umem_reg = unsafe { std::mem::zeroed() };
    reg.addr = umem.as_ptr() as u64;
    reg.len = umem_len as u64;
    reg.chunk_size = FRAME_SIZE;
    setsockopt(fd, libc::XDP_UMEM_REG, &reg, "XDP_UMEM_REG")?;
    setsockopt(
        fd,
        libc::XDP_UMEM_FILL_RING,
        &FILL_SIZE,
        "XDP_UMEM_FILL_RING",
    )?;
    setsockopt(
        fd,
        libc::XDP_UMEM_COMPLETION_RING,
        &COMP_SIZE,
        "XDP_UMEM_COMPLETION_RING",
    )?;
    setsockopt(fd, libc::XDP_RX_RING, &RX_SIZE, "XDP_RX_RING")?;
    setsockopt(fd, libc::XDP_TX_RING, &TX_SIZE, "XDP_TX_RING")
}

/// Where the kernel put each ring's indexes, flags and descriptors.
fn mmap_offsets(fd: BorrowedFd<'_>) -> Result<libc::xdp_mmap_offsets> {
    // SAFETY: all-zero is a valid xdp_mmap_offsets.
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
    // SAFETY: `off` is writable for `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            libc::XDP_MMAP_OFFSETS,
            (&mut off as *mut libc::xdp_mmap_offsets).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(errno_ctx("XDP_MMAP_OFFSETS"));
    }
    if len as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
        bail!("this kernel's AF_XDP rings have no flags word (needs Linux >= 5.4)");
    }
    Ok(off)
}

fn map_rings(fd: BorrowedFd<'_>, off: &libc::xdp_mmap_offsets) -> Result<Rings> {
    let fill = Ring::<u64>::map(fd, &off.fr, FILL_SIZE, libc::XDP_UMEM_PGOFF_FILL_RING)?;
    let comp = Ring::<u64>::map(fd, &off.cr, COMP_SIZE, libc::XDP_UMEM_PGOFF_COMPLETION_RING)?;
    let rx = Ring::map(fd, &off.rx, RX_SIZE, libc::XDP_PGOFF_RX_RING as u64)?;
    let tx = Ring::map(fd, &off.tx, TX_SIZE, libc::XDP_PGOFF_TX_RING as u64)?;
    Ok(Rings { fill, comp, rx, tx })
}

/// Binds the socket to one queue of an interface, in copy mode.
fn bind_queue(fd: BorrowedFd<'_>, ifindex: u32, queue: u32) -> Result<()> {
    let sa = libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: libc::XDP_COPY | libc::XDP_USE_NEED_WAKEUP,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: 0,
    };
    // SAFETY: a valid sockaddr_xdp of the size passed.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_xdp).cast(),
            std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(errno_ctx(&format!(
            "bind the AF_XDP socket to queue {queue} of interface {ifindex} (copy mode)"
        )));
    }
    Ok(())
}

impl Xsk {
    /// Creates a socket bound to queue `queue` of `ifindex` (in the calling
    /// thread's network namespace), in copy mode, its fill ring full.
    pub(crate) fn bind(ifindex: u32, queue: u32) -> Result<Self> {
        let fd = open_xdp_socket()?;
        let umem_len = (FRAMES * FRAME_SIZE) as usize;
        let umem = map_umem(umem_len)?;
        let fdb = fd.as_fd();
        let rings = (|| -> Result<_> {
            register_umem(fdb, umem, umem_len)?;
            let rings = map_rings(fdb, &mmap_offsets(fdb)?)?;
            bind_queue(fdb, ifindex, queue)?;
            Ok(rings)
        })()
        .inspect_err(|_| {
            // SAFETY: the area mapped above, not yet owned by an Xsk.
            unsafe { libc::munmap(umem.as_ptr().cast(), umem_len) };
        })?;
        let Rings { fill, comp, rx, tx } = rings;
        let xsk = Xsk {
            fill,
            comp,
            rx,
            tx,
            umem,
            umem_len,
            fd,
        };
        xsk.fill_every_frame();
        Ok(xsk)
    }

    /// Every frame starts in the fill ring.
    fn fill_every_frame(&self) {
        let (prod, n) = self.fill.reserve(FRAMES);
        for i in 0..n {
            // SAFETY: a reserved slot.
            unsafe { *self.fill.desc(prod.wrapping_add(i)) = u64::from(i * FRAME_SIZE) };
        }
        self.fill.submit(prod, n);
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Returns completed TX frames to the fill ring.
    fn recycle(&self) -> u32 {
        let (cons, n) = self.comp.peek(COMP_SIZE);
        if n == 0 {
            return 0;
        }
        // The fill ring holds every frame, so it always has room for them.
        let (prod, room) = self.fill.reserve(n);
        for i in 0..room {
            // SAFETY: a ready completion slot and a reserved fill slot.
            unsafe {
                *self.fill.desc(prod.wrapping_add(i)) = *self.comp.desc(cons.wrapping_add(i));
            }
        }
        self.fill.submit(prod, room);
        self.comp.release(cons, room);
        room
    }

    /// Moves up to BATCH received frames to TX with their MACs swapped.
    /// Returns how many.
    fn bounce(&self) -> u32 {
        let (cons, ready) = self.rx.peek(BATCH);
        if ready == 0 {
            return 0;
        }
        let (prod, n) = self.tx.reserve(ready);
        for i in 0..n {
            // SAFETY: a ready RX slot and a reserved TX slot; the frame's
            // address and length come from the kernel and lie in the UMEM.
            unsafe {
                let d = *self.rx.desc(cons.wrapping_add(i));
                if d.len >= 12 && (d.addr as usize) + (d.len as usize) <= self.umem_len {
                    let p = self.umem.as_ptr().add(d.addr as usize);
                    std::ptr::swap_nonoverlapping(p, p.add(6), 6);
                }
                *self.tx.desc(prod.wrapping_add(i)) = d;
            }
        }
        self.tx.submit(prod, n);
        self.rx.release(cons, n);
        n
    }

    /// Asks the kernel to send what the TX ring holds.
    fn kick(&self) -> Result<()> {
        // SAFETY: sendto with no data, as the AF_XDP docs prescribe.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => {}
                _ => return Err(e).context("sendto on the AF_XDP socket"),
            }
        }
        Ok(())
    }

    /// Waits up to 1 ms for received frames.
    fn wait_rx(&self) {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 1) };
    }

    /// Bounces frames until `halt`, adding what it sent back to `forwarded`.
    pub(crate) fn run(&self, halt: &AtomicBool, forwarded: &AtomicU64) -> Result<()> {
        while !halt.load(Ordering::Relaxed) {
            self.recycle();
            let n = self.bounce();
            if n > 0 {
                forwarded.fetch_add(u64::from(n), Ordering::Relaxed);
            }
            let tx_pending = ready_entries(
                self.tx.producer().load(Ordering::Relaxed),
                self.tx.consumer().load(Ordering::Acquire),
            ) > 0;
            // In copy mode only sendto(2) transmits, so every batch is
            // kicked (the kernel keeps the TX ring's NEED_WAKEUP set).
            if tx_pending {
                self.kick()?;
            }
            if n == 0 && !tx_pending {
                if self.fill.needs_wakeup() {
                    // Lets a driver that waits for fill-ring entries look again.
                    self.kick()?;
                }
                self.wait_rx();
            } else if n == 0 {
                // TX full or draining: give the kernel a moment.
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        Ok(())
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        // SAFETY: the UMEM mapped in `bind`, unmapped once (the rings unmap
        // themselves, then `fd` closes).
        unsafe { libc::munmap(self.umem.as_ptr().cast(), self.umem_len) };
    }
}

/// One forwarding thread per queue, each with its socket; stopped and
/// joined on drop (their sockets close with them, which also takes them
/// out of the XSKMAP).
pub(crate) struct Forwarders {
    halt: Arc<AtomicBool>,
    forwarded: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<Result<()>>>,
    /// Kernel thread ids, in queue order (for their CPU time).
    pub(crate) tids: Vec<i32>,
}

/// What a started thread reports: its queue, thread id and socket.
type Started = Result<(u32, i32, RawFd)>;

impl Forwarders {
    /// Starts a thread per queue `0..queues`: it enters the network
    /// namespace at `netns_path`, pins itself to CPU `queue % cpus`, takes
    /// SCHED_FIFO `rt_priority` if given, binds a socket to its queue of
    /// `ifindex` and forwards. `register` gets each (queue, socket) to put in
    /// the XSKMAP while the threads run.
    pub(crate) fn start(
        netns_path: &Path,
        ifindex: u32,
        queues: u32,
        rt_priority: Option<u8>,
        mut register: impl FnMut(u32, BorrowedFd<'_>) -> Result<()>,
    ) -> Result<Self> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut me = Forwarders {
            halt: Arc::new(AtomicBool::new(false)),
            forwarded: Arc::new(AtomicU64::new(0)),
            threads: Vec::new(),
            tids: Vec::new(),
        };
        let (tx, rx) = mpsc::channel::<Started>();
        for queue in 0..queues {
            let (halt, forwarded, tx) = (me.halt.clone(), me.forwarded.clone(), tx.clone());
            let path = netns_path.to_path_buf();
            let t = std::thread::Builder::new()
                .name(format!("xsk-q{queue}"))
                .spawn(move || -> Result<()> {
                    let setup = (|| -> Result<Xsk> {
                        let f = std::fs::File::open(&path)
                            .with_context(|| format!("open {}", path.display()))?;
                        crate::sys::netns::enter(f.as_fd())
                            .context("enter the DUT's network namespace")?;
                        crate::sys::rt::pin_to_cpu(queue as usize % cpus)
                            .context("pin an AF_XDP thread")?;
                        if let Some(p) = rt_priority {
                            super::links::set_fifo(0, p)?;
                        }
                        Xsk::bind(ifindex, queue)
                    })();
                    let xsk = match setup {
                        Ok(x) => x,
                        Err(e) => {
                            let _ = tx.send(Err(anyhow::anyhow!("{e:#}")));
                            return Err(e);
                        }
                    };
                    let tid = nix::unistd::gettid().as_raw();
                    let _ = tx.send(Ok((queue, tid, xsk.fd().as_raw_fd())));
                    drop(tx);
                    xsk.run(&halt, &forwarded)
                })
                .context("spawn an AF_XDP thread")?;
            me.threads.push(t);
        }
        drop(tx);
        let mut tids = vec![0; queues as usize];
        for _ in 0..queues {
            let (queue, tid, fd) = rx
                .recv()
                .map_err(|_| anyhow::anyhow!("an AF_XDP thread ended while starting"))??;
            // SAFETY: the socket stays open while its thread runs, and the
            // threads run until `me` is stopped or dropped.
            register(queue, unsafe { BorrowedFd::borrow_raw(fd) })?;
            tids[queue as usize] = tid;
        }
        me.tids = tids;
        Ok(me)
    }

    /// Frames sent back so far.
    pub(crate) fn forwarded(&self) -> u64 {
        self.forwarded.load(Ordering::Relaxed)
    }

    /// Stops and joins the threads; the first error of one of them.
    pub(crate) fn stop(mut self) -> Result<u64> {
        self.halt.store(true, Ordering::Relaxed);
        let mut first = Ok(());
        for t in self.threads.drain(..) {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("an AF_XDP thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first.map(|()| self.forwarded())
    }
}

impl Drop for Forwarders {
    fn drop(&mut self) {
        self.halt.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_index_arithmetic() {
        // Empty and full.
        assert_eq!(free_entries(8, 0, 0), 8);
        assert_eq!(ready_entries(0, 0), 0);
        assert_eq!(free_entries(8, 8, 0), 0);
        assert_eq!(ready_entries(8, 0), 8);
        // Across the u32 wrap: producer wrapped, consumer not yet.
        let cons = u32::MAX - 2;
        let prod = cons.wrapping_add(5);
        assert_eq!(prod, 2);
        assert_eq!(ready_entries(prod, cons), 5);
        assert_eq!(free_entries(8, prod, cons), 3);
        assert_eq!(free_entries(8, cons.wrapping_add(8), cons), 0);
        // Slots wrap with the mask.
        assert_eq!(slot(cons, 8), 5);
        assert_eq!(slot(prod, 8), 2);
        assert_eq!(slot(8, 8), 0);
        assert_eq!(slot(4095, 4096), 4095);
        assert_eq!(slot(4096, 4096), 0);
    }

    #[test]
    fn uapi_layouts() {
        // linux/if_xdp.h: sizes the kernel checks against optlen.
        assert_eq!(std::mem::size_of::<libc::xdp_desc>(), 16);
        assert_eq!(std::mem::size_of::<libc::sockaddr_xdp>(), 16);
        assert_eq!(std::mem::size_of::<libc::xdp_ring_offset>(), 32);
        assert_eq!(std::mem::size_of::<libc::xdp_mmap_offsets>(), 128);
        assert!(std::mem::size_of::<libc::xdp_umem_reg>() >= 24);
        assert_eq!(libc::SOL_XDP, 283);
        assert_eq!(libc::XDP_PGOFF_TX_RING, 0x8000_0000);
        assert_eq!(libc::XDP_UMEM_PGOFF_COMPLETION_RING, 0x1_8000_0000);
    }
}
