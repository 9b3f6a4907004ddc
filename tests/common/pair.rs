//! Two namespaces joined by a veth pair, `rtprobe reflect` in one and
//! `rtprobe --target` in the other, and a sender of UDP datagrams with
//! forged source addresses: the pieces the remote and hostile-network
//! end-to-end tests share.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use super::*;

pub const A_IP: &str = "10.77.0.1";
pub const B_IP: &str = "10.77.0.2";
/// The same pair over IPv6 (unique-local, no DAD: usable at once).
pub const A_IP6: &str = "fd77::1";
pub const B_IP6: &str = "fd77::2";

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Two namespaces joined by a veth pair: A (sender) 10.77.0.1 and
/// fd77::1, B (reflector) 10.77.0.2 and fd77::2, as `rtprobe testbed
/// --pair` builds and holds them (the product's own testbed code, through
/// netlink). Removed on drop: the holder's stdin closes and it tears the
/// pair down; if the test process dies, the closed pipe does the same.
pub struct Pair {
    pub a: String,
    pub b: String,
    pub va: String,
    pub vb: String,
    holder: Child,
}

/// The test's name (libtest names each test's thread after it) as a tag
/// for the namespace names: whose a leftover is.
fn test_tag() -> String {
    let name = std::thread::current()
        .name()
        .unwrap_or("test")
        .rsplit("::")
        .next()
        .unwrap_or("test")
        .to_string();
    let tag: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let start = tag.len().saturating_sub(32);
    tag[start..].to_string()
}

impl Pair {
    pub fn new() -> Pair {
        use std::io::BufRead;
        let mut holder = Command::new(bin())
            .args(["testbed", "--pair", "--name", &test_tag()])
            .args([
                "--a-addr",
                &format!("{A_IP}/24"),
                "--a-addr",
                &format!("{A_IP6}/64"),
            ])
            .args([
                "--b-addr",
                &format!("{B_IP}/24"),
                "--b-addr",
                &format!("{B_IP6}/64"),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rtprobe testbed --pair");
        // It prints its line once both families answer across the veth
        // (the carrier is up: until then a veth drops what it is given).
        let mut line = String::new();
        let read = std::io::BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line);
        if !matches!(read, Ok(n) if n > 0) {
            let out = holder.wait_with_output().expect("wait for rtprobe testbed");
            panic!(
                "rtprobe testbed --pair failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let j: serde_json::Value = serde_json::from_str(&line).expect("the testbed's JSON line");
        let field = |k: &str| {
            j[k].as_str()
                .unwrap_or_else(|| panic!("{k} in {line}"))
                .to_string()
        };
        Pair {
            a: field("a_ns"),
            b: field("b_ns"),
            va: field("a_if"),
            vb: field("b_if"),
            holder,
        }
    }

    /// Drops the UDP datagrams leaving `dev` (in `ns`) whose byte at
    /// `offset` from the IP header has its low 4 bits zero: a u32 filter
    /// classifies them into an HTB class whose leaf is a blackhole qdisc
    /// (no tc action modules needed).
    pub fn drop_low_nibble_zero(&self, ns: &str, dev: &str, offset: u32) {
        sh_ok(&format!(
            "ip netns exec {ns} sh -c 'tc qdisc add dev {dev} root handle 1: htb default 10 && \
             tc class add dev {dev} parent 1: classid 1:10 htb rate 10gbit && \
             tc class add dev {dev} parent 1: classid 1:20 htb rate 10gbit && \
             tc qdisc add dev {dev} parent 1:20 handle 20: blackhole && \
             tc filter add dev {dev} parent 1: protocol ip u32 match ip protocol 17 0xff \
             match u8 0 0x0f at {offset} flowid 1:20' 2>/dev/null"
        ));
    }

    pub fn clear_filters(&self) {
        for (ns, dev) in [(&self.a, &self.va), (&self.b, &self.vb)] {
            let _ = sh(&format!(
                "ip netns exec {ns} tc qdisc del dev {dev} root 2>/dev/null"
            ));
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        // Closing its stdin tells the holder to tear the pair down.
        drop(self.holder.stdin.take());
        if let Ok(status) = self.holder.wait()
            && !status.success()
        {
            let mut err = String::new();
            if let Some(mut e) = self.holder.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            eprintln!("rtprobe testbed --pair ended with {status}: {err}");
        }
    }
}

/// `rtprobe reflect` in namespace B; stopped with SIGTERM by [`Reflector::stop`]
/// (killed on drop if a test fails first).
pub struct Reflector {
    child: Option<Child>,
    json: PathBuf,
    /// Its stderr so far, kept by a thread that drains it to the end.
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

/// The line `rtprobe reflect` prints once its sockets are bound and, with
/// `--kernel`, its XDP program attached: from then on it answers.
const READY_LINE: &str = "rtprobe reflect: answering ";

/// How long a reflector may take to say it is ready: a deadline, not a
/// speed (an XDP load and attach takes some 100s of ms on a quiet machine;
/// CI saw more than 10 s with the machine's CPUs busy with builds).
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

impl Reflector {
    /// Starts it and returns once it has said it answers (panics if it
    /// exits first or stays silent for [`READY_WITHIN`]).
    pub fn start(p: &Pair, args: &[&str]) -> Reflector {
        Self::start_as(p, &[], args)
    }

    /// [`Reflector::start`] under `wrapper` (a command that execs the
    /// rest, such as `setpriv --reuid=65534 ...`); its JSON goes to a
    /// directory anyone may write.
    pub fn start_as(p: &Pair, wrapper: &[&str], args: &[&str]) -> Reflector {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        sh_ok(&format!("chmod 777 {}", dir.path().display()));
        let json = dir.path().join("reflector.json");
        let started = std::time::Instant::now();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &p.b])
            .args(wrapper)
            .arg(bin())
            .arg("reflect")
            .args(["--json", json.to_str().unwrap()])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rtprobe reflect");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<bool>();
        let pipe = child.stderr.take().unwrap();
        let kept = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(pipe);
            let mut line = String::new();
            while lines.read_line(&mut line).unwrap_or(0) > 0 {
                if line.starts_with(READY_LINE) {
                    let _ = ready_tx.send(true);
                }
                kept.lock().unwrap().push_str(&line);
                line.clear();
            }
            let _ = ready_tx.send(false);
        });
        let mut r = Reflector {
            child: Some(child),
            json,
            stderr,
            stderr_reader: Some(stderr_reader),
            _dir: dir,
        };
        match ready_rx.recv_timeout(READY_WITHIN) {
            Ok(true) => {
                eprintln!("reflector ready after {:?}", started.elapsed());
                r
            }
            Ok(false) => {
                let status = r.child.as_mut().unwrap().wait();
                panic!(
                    "rtprobe reflect {args:?} ended before it was ready ({status:?}): {}",
                    r.stderr_text()
                )
            }
            Err(_) => panic!(
                "rtprobe reflect {args:?} not ready within {READY_WITHIN:?}: {}",
                r.stderr_text()
            ),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// What it has written to stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// SIGTERM, wait, and the counters it wrote.
    pub fn stop(self) -> (serde_json::Value, String) {
        let (json, out, _) = self.end(Some("TERM"));
        (json, out)
    }

    /// Sends `signal` (or nothing: it ends by itself, `--duration`), waits
    /// for the process to exit: the counters it wrote, its output, and
    /// the time from the signal (or this call) to its exit.
    pub fn end(mut self, signal: Option<&str>) -> (serde_json::Value, String, std::time::Duration) {
        let mut child = self.child.take().unwrap();
        let t0 = std::time::Instant::now();
        if let Some(sig) = signal {
            sh_ok(&format!("kill -{sig} {}", child.id()));
        }
        // Reaped as soon as it exits: the pipes are read after.
        let status = child.wait().unwrap();
        let took = t0.elapsed();
        let o = std::process::Output {
            status,
            stdout: child
                .stdout
                .take()
                .map(|mut s| {
                    let mut v = Vec::new();
                    std::io::Read::read_to_end(&mut s, &mut v).unwrap();
                    v
                })
                .unwrap_or_default(),
            stderr: Vec::new(),
        };
        if let Some(t) = self.stderr_reader.take() {
            let _ = t.join();
        }
        let out = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            self.stderr_text()
        );
        assert!(o.status.success(), "rtprobe reflect failed: {out}");
        let j = std::fs::read_to_string(&self.json).unwrap_or_else(|e| panic!("{e}: {out}"));
        (serde_json::from_str(&j).unwrap(), out, took)
    }
}

impl Drop for Reflector {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `rtprobe --target` in namespace A as user nobody (no privileges).
pub fn target(p: &Pair, args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    sh_ok(&format!("chmod 777 {}", dir.path().display()));
    let csv = dir.path().join("out.csv");
    let json = dir.path().join("out.json");
    let drops_before = udp_buffer_drops(&p.a) + udp_buffer_drops(&p.b);
    let o = Command::new("ip")
        .args(["netns", "exec", &p.a, "runuser", "-u", "nobody", "--"])
        .arg(bin())
        .args(["--quiet", "--out", csv.to_str().unwrap(), "--json"])
        .arg(&json)
        .args(args)
        .output()
        .expect("run rtprobe --target");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    // The CSV is created before the first probe, so even a failed run has one.
    assert!(csv.exists(), "no CSV written: {stderr}");
    let (meta, rows) = read_csv(&csv);
    let json = read_summary(&json);
    Run {
        kernel_drops: udp_buffer_drops(&p.a) + udp_buffer_drops(&p.b) - drops_before,
        code: o.status.code().unwrap_or(-1),
        stdout,
        stderr,
        json,
        meta,
        rows,
    }
}

pub fn rss_kib(pid: u32) -> u64 {
    // The reflector runs under `ip netns exec`, which execs it: same pid.
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Makes every address of `range` (e.g. `10.78.0.0/16`) an address of
/// namespace A (a `local` route on lo) and routes it from B through A: a
/// reply to a forged source from that range goes back to the test's own
/// namespace and nowhere else.
pub fn own_range(p: &Pair, range: &str) {
    sh_ok(&format!(
        "ip -n {a} route add local {range} dev lo && ip -n {b} route add {range} via {A_IP}",
        a = p.a,
        b = p.b
    ));
}

/// One forged datagram: source address and port, UDP payload.
pub struct Forged {
    pub src: SocketAddrV4,
    pub payload: Vec<u8>,
}

/// Sends `count` UDP datagrams to `dst` from inside namespace `ns` through
/// a raw IPv4 socket (the IP header is ours, so the source is whatever
/// `forge(i)` says), `pps` a second (0: as fast as it goes). Returns how
/// many the kernel took; stops early after `max_s` seconds.
pub fn send_forged(
    ns: &str,
    dst: SocketAddrV4,
    count: u32,
    pps: u32,
    max_s: f64,
    forge: impl Fn(u32) -> Forged + Sync,
) -> u64 {
    use std::time::Instant;
    let ns_file = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&ns_file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            // SAFETY: plain socket(2) call; the fd is closed below.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
            assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
            // SAFETY: fd is ours and open; from here the OwnedFd closes it.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let to = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: dst.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*dst.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            let start = Instant::now();
            let mut sent = 0u64;
            for i in 0..count {
                if pps > 0 {
                    let due = start + std::time::Duration::from_secs_f64(i as f64 / pps as f64);
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                }
                if start.elapsed().as_secs_f64() > max_s {
                    break;
                }
                let f = forge(i);
                let frame = ipv4_udp(f.src, dst, &f.payload);
                // SAFETY: frame and to outlive the call; lengths are theirs.
                let n = unsafe {
                    libc::sendto(
                        fd.as_raw_fd(),
                        frame.as_ptr().cast(),
                        frame.len(),
                        0,
                        (&to as *const libc::sockaddr_in).cast(),
                        std::mem::size_of::<libc::sockaddr_in>() as u32,
                    )
                };
                if n == frame.len() as isize {
                    sent += 1;
                }
            }
            sent
        })
        .join()
        .expect("forging thread")
    })
}

/// An IPv4 header (no options, TTL 64) and a UDP header with a correct
/// checksum in front of `payload`.
pub fn ipv4_udp(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let total = 20 + udp_len;
    let mut f = Vec::with_capacity(total);
    f.extend_from_slice(&[
        0x45,
        0,
        (total >> 8) as u8,
        total as u8,
        0,
        0,
        0x40,
        0,
        64,
        17,
        0,
        0,
    ]);
    f.extend_from_slice(&src.ip().octets());
    f.extend_from_slice(&dst.ip().octets());
    let ip_sum = !fold(sum16(&f[..20]));
    f[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    f.extend_from_slice(&src.port().to_be_bytes());
    f.extend_from_slice(&dst.port().to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&src.ip().octets());
    pseudo.extend_from_slice(&dst.ip().octets());
    pseudo.extend_from_slice(&[0, 17, (udp_len >> 8) as u8, udp_len as u8]);
    let mut udp_sum = !fold(sum16(&pseudo) + sum16(&f[20..]));
    if udp_sum == 0 {
        udp_sum = 0xffff;
    }
    f[26..28].copy_from_slice(&udp_sum.to_be_bytes());
    f
}

fn sum16(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// Where forged sources come from: give it to [`own_range`].
pub const FORGED_RANGE: &str = "10.64.0.0/10";

/// The `i`-th address of [`FORGED_RANGE`] (host bytes .1 to .254; over
/// 4 M distinct): forged sources that [`own_range`] routes back to A.
pub fn forged_source(i: u32) -> Ipv4Addr {
    let host = i % 254 + 1;
    let mid = (i / 254) % 256;
    let top = 64 + (i / (254 * 256)) % 64;
    Ipv4Addr::new(10, top as u8, mid as u8, host as u8)
}

/// Runs `f` on a thread inside namespace `ns`.
pub fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("namespace thread")
    })
}

pub fn mac_of(ns: &str, dev: &str) -> [u8; 6] {
    let s = sh_ok(&format!(
        "ip netns exec {ns} cat /sys/class/net/{dev}/address"
    ));
    let mut m = [0u8; 6];
    for (b, p) in m.iter_mut().zip(s.trim().split(':')) {
        *b = u8::from_str_radix(p, 16).unwrap();
    }
    m
}

/// A packet socket on `dev` of the calling thread's namespace, reading
/// every frame (ETH_P_ALL), with a 50 ms receive timeout.
pub fn packet_socket(dev: &str) -> (OwnedFd, libc::sockaddr_ll) {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); the fd goes into an OwnedFd at once.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
    assert!(
        fd >= 0,
        "packet socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fd is ours and open.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(dev).unwrap();
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert!(ifindex > 0, "{dev}");
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex as i32;
    sll.sll_halen = 6;
    // SAFETY: sll lives through the call; its size is passed.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    // SAFETY: tv lives through the call; its size is passed.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    (fd, sll)
}

/// One probe frame sent from A's veth: Ethernet to `dst_mac`, IPv4/UDP
/// from `src:sport` to `dst` (the reflector's port).
pub struct Frame {
    pub name: &'static str,
    pub dst_mac: [u8; 6],
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
}

/// Sends each frame `each` times from A's veth with `payload` to UDP
/// `port`, and returns the replies seen there within 700 ms: UDP over IPv4
/// from `port`, sent by another MAC than A's (broadcast and multicast
/// replies included: a packet socket sees every frame), each with its
/// destination port (the probe's source port) and the whole frame.
pub fn send_frames_and_catch_replies(
    p: &Pair,
    port: u16,
    frames: &[Frame],
    payload: &[u8],
    each: usize,
) -> Vec<(u16, Vec<u8>)> {
    use std::{
        os::fd::AsRawFd,
        time::{Duration, Instant},
    };
    let mac_a = mac_of(&p.a, &p.va);
    let va = p.va.clone();
    in_ns(&p.a, || {
        let (fd, sll) = packet_socket(&va);
        for f in frames {
            let mut frame = Vec::new();
            frame.extend_from_slice(&f.dst_mac);
            frame.extend_from_slice(&mac_a);
            frame.extend_from_slice(&0x0800u16.to_be_bytes());
            frame.extend_from_slice(&ipv4_udp(
                SocketAddrV4::new(f.src, f.sport),
                SocketAddrV4::new(f.dst, port),
                payload,
            ));
            for _ in 0..each {
                // SAFETY: frame and sll live through the call.
                let n = unsafe {
                    libc::sendto(
                        fd.as_raw_fd(),
                        frame.as_ptr().cast(),
                        frame.len(),
                        0,
                        (&sll as *const libc::sockaddr_ll).cast(),
                        std::mem::size_of::<libc::sockaddr_ll>() as u32,
                    )
                };
                let err = std::io::Error::last_os_error();
                assert_eq!(n, frame.len() as isize, "{err}");
            }
        }
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        let deadline = Instant::now() + Duration::from_millis(700);
        while Instant::now() < deadline {
            // SAFETY: buf outlives the call; its length is passed.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 42 {
                continue;
            }
            let f = &buf[..n as usize];
            if f[12..14] == [0x08, 0x00]
                && f[23] == 17
                && f[34..36] == port.to_be_bytes()
                && f[6..12] != mac_a
            {
                got.push((u16::from_be_bytes([f[36], f[37]]), f.to_vec()));
            }
        }
        got
    })
}
