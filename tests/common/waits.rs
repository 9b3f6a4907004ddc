//! What a process's threads are blocked on, seen from outside: each
//! thread's current system call (`/proc/PID/task/TID/syscall`) and, for a
//! wait, the file descriptors it waits on (a poll(2) set read from
//! `/proc/PID/mem`, an epoll set from `/proc/PID/fdinfo`, or the socket
//! of a blocking receive). The wake-up tests use it to show that nobody
//! sleeps on a probe socket while probes go out: a thread asleep there
//! would be woken from inside every send.

use std::{collections::BTreeSet, fs, os::unix::fs::FileExt};

/// x86_64 system call numbers of the waits looked at.
const POLL: u64 = 7;
const PPOLL: u64 = 271;
const SELECT: u64 = 23;
const PSELECT6: u64 = 270;
const EPOLL_WAIT: u64 = 232;
const EPOLL_PWAIT: u64 = 281;
const EPOLL_PWAIT2: u64 = 441;
const READ: u64 = 0;
const RECVFROM: u64 = 45;
const RECVMSG: u64 = 47;
const RECVMMSG: u64 = 299;

/// One blocked thread: its name and the descriptors it waits on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub thread: String,
    pub syscall: u64,
    pub fds: BTreeSet<i32>,
}

/// The system call a thread is in: its number and arguments, or None when
/// it runs in user space (or has ended).
fn syscall_of(pid: u32, tid: &str) -> Option<(u64, Vec<u64>)> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    let mut it = text.split_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    if nr < 0 {
        return None;
    }
    let args = it
        .take(6)
        .filter_map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .collect::<Vec<_>>();
    (args.len() == 6).then_some((nr as u64, args))
}

/// The descriptors in the poll(2) set at `addr` (`n` entries).
fn poll_fds(pid: u32, addr: u64, n: u64) -> Option<BTreeSet<i32>> {
    let mem = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; (n.min(4096) * 8) as usize];
    mem.read_exact_at(&mut buf, addr).ok()?;
    Some(
        buf.as_chunks::<8>()
            .0
            .iter()
            .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .filter(|fd| *fd >= 0)
            .collect(),
    )
}

/// The descriptors set in the select(2) read set at `addr` (`nfds` bits).
fn select_fds(pid: u32, addr: u64, nfds: u64) -> Option<BTreeSet<i32>> {
    if addr == 0 {
        return Some(BTreeSet::new());
    }
    let mem = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; nfds.min(1024).div_ceil(8) as usize];
    mem.read_exact_at(&mut buf, addr).ok()?;
    Some(
        (0..nfds.min(1024) as i32)
            .filter(|&fd| buf[(fd / 8) as usize] & (1 << (fd % 8)) != 0)
            .collect(),
    )
}

/// The descriptors registered in epoll instance `epfd` of `pid`.
fn epoll_fds(pid: u32, epfd: u64) -> BTreeSet<i32> {
    fs::read_to_string(format!("/proc/{pid}/fdinfo/{epfd}"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            l.strip_prefix("tfd:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// What the thread `tid` of `pid` waits on, if it is blocked in a wait
/// or a receive. The call is read again after its set: a thread that left
/// it meanwhile is not reported.
fn wait_of(pid: u32, tid: &str) -> Option<Wait> {
    let (nr, args) = syscall_of(pid, tid)?;
    let fds = match nr {
        POLL | PPOLL => poll_fds(pid, args[0], args[1])?,
        SELECT | PSELECT6 => select_fds(pid, args[1], args[0])?,
        EPOLL_WAIT | EPOLL_PWAIT | EPOLL_PWAIT2 => epoll_fds(pid, args[0]),
        READ | RECVFROM | RECVMSG | RECVMMSG => BTreeSet::from([args[0] as i32]),
        _ => return None,
    };
    if syscall_of(pid, tid)? != (nr, args) {
        return None;
    }
    let thread = fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .ok()?
        .trim()
        .to_string();
    Some(Wait {
        thread,
        syscall: nr,
        fds,
    })
}

/// Every thread of `pid` blocked in a wait or a receive, now.
pub fn waits(pid: u32) -> Vec<Wait> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| wait_of(pid, e.file_name().to_str()?))
        .collect()
}

/// A UDP socket of a process: its descriptor and whether it is connected
/// (a peer address set: the sender's sockets are, a reflector's are not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpSocket {
    pub fd: i32,
    pub connected: bool,
}

/// The UDP sockets of `pid`, in every named network namespace and the
/// current one (`ss`, which names each socket's process and descriptor).
pub fn udp_sockets(pid: u32) -> Vec<UdpSocket> {
    let out = super::sh("ss -Huapn 2>/dev/null; ip -all netns exec ss -Huapn 2>/dev/null");
    let owner = format!("pid={pid},fd=");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let at = l.find(&owner)?;
            let fd = l[at + owner.len()..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()?;
            // State, queues, local, peer: "ESTAB 0 0 a:p b:q users:...".
            let peer = l.split_whitespace().nth(4)?;
            Some(UdpSocket {
                fd,
                connected: !peer.ends_with(":*"),
            })
        })
        .collect()
}

/// The thread of `pid` named `name`, if it has one now.
pub fn has_thread(pid: u32, name: &str) -> bool {
    fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| {
        d.filter_map(|e| e.ok())
            .any(|e| fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == name))
    })
}
