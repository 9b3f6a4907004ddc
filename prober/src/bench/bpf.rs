//! The few raw bpf(2) calls the bench's two tiny XDP programs need (the
//! load generator and the receiver's sink), which are assembled in Rust
//! rather than built as eBPF objects because each is a dozen instructions
//! whose constants (MAC addresses, ifindex, rate) change per run.
//!
//! Kernel interfaces: bpf(2) BPF_PROG_LOAD of BPF_PROG_TYPE_XDP (Linux >=
//! 4.8), BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES (>= 5.18),
//! BPF_LINK_CREATE for XDP (>= 5.9), JMP32 instructions (>= 5.1).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::Result;

const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_TEST_RUN: libc::c_int = 10;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;
/// XDP_FLAGS_DRV_MODE (linux/if_link.h).
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

pub const FUNC_GET_PRANDOM_U32: i32 = 7;
pub const FUNC_REDIRECT: i32 = 23;

pub const XDP_DROP: i32 = 1;
pub const XDP_PASS: i32 = 2;

/// Opcodes used (linux/bpf_common.h, linux/bpf.h).
pub mod op {
    pub const MOV64_IMM: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
    pub const MOV64_REG: u8 = 0xbf; // BPF_ALU64 | BPF_MOV | BPF_X
    pub const ADD64_IMM: u8 = 0x07; // BPF_ALU64 | BPF_ADD | BPF_K
    pub const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
    pub const LDX_H: u8 = 0x69; // BPF_LDX | BPF_MEM | BPF_H
    pub const LDX_B: u8 = 0x71; // BPF_LDX | BPF_MEM | BPF_B
    pub const LD_IMM64: u8 = 0x18; // BPF_LD | BPF_DW | BPF_IMM (two slots)
    pub const STX_DW: u8 = 0x7b; // BPF_STX | BPF_MEM | BPF_DW
    pub const ST_H: u8 = 0x6a; // BPF_ST | BPF_MEM | BPF_H
    pub const JGT_REG: u8 = 0x2d; // BPF_JMP | BPF_JGT | BPF_X
    pub const JNE_IMM: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
    pub const JGT32_IMM: u8 = 0x26; // BPF_JMP32 | BPF_JGT | BPF_K (unsigned)
    pub const CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
    pub const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT
}

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfInsn {
    pub code: u8,
    /// dst_reg in the low nibble, src_reg in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

pub fn ins(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> BpfInsn {
    BpfInsn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

/// The leading part of `union bpf_attr` for BPF_PROG_LOAD; the rest of the
/// 128 bytes passed must be zero.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    _rest: [u8; 56],
}

/// The leading part of `union bpf_attr` for BPF_PROG_TEST_RUN.
#[repr(C)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _rest: [u8; 52],
}

/// The leading part of `union bpf_attr` for BPF_LINK_CREATE.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    _rest: [u8; 112],
}

fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: attr is a live, fully initialised bpf_attr prefix of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Loads an XDP program; the error carries the verifier's log.
pub fn load_xdp(name: &str, insns: &[BpfInsn]) -> Result<OwnedFd> {
    let license = c"GPL";
    let mut log = vec![0u8; 8192];
    let mut prog_name = [0u8; 16];
    let n = name.len().min(15);
    prog_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: 0,
        prog_name,
        prog_ifindex: 0,
        expected_attach_type: 0,
        _rest: [0; 56],
    };
    let fd = bpf(BPF_PROG_LOAD, &mut attr).map_err(|e| {
        let msg = String::from_utf8_lossy(&log);
        anyhow::anyhow!(
            "BPF_PROG_LOAD of {name} failed ({e}): is this root with BPF enabled? verifier: {}",
            msg.trim_matches(char::from(0)).trim()
        )
    })?;
    // SAFETY: the kernel just returned this fd and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Runs `prog` on `repeat` live copies of `frame` (what the program
/// redirects is transmitted).
pub fn test_run_live(prog: &OwnedFd, frame: &[u8], repeat: u32, batch: u32) -> std::io::Result<()> {
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        retval: 0,
        data_size_in: frame.len() as u32,
        data_size_out: 0,
        data_in: frame.as_ptr() as u64,
        data_out: 0,
        repeat,
        duration: 0,
        ctx_size_in: 0,
        ctx_size_out: 0,
        ctx_in: 0,
        ctx_out: 0,
        flags: BPF_F_TEST_XDP_LIVE_FRAMES,
        cpu: 0,
        batch_size: batch,
        _rest: [0; 52],
    };
    bpf(BPF_PROG_TEST_RUN, &mut attr).map(drop)
}

/// Attaches an XDP program to `ifindex` (in the calling thread's
/// namespace) through a BPF link; closing the returned fd detaches it.
pub fn attach_xdp(prog: &OwnedFd, ifindex: u32, flags: u32) -> std::io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags,
        _rest: [0; 112],
    };
    let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
    // SAFETY: the kernel just returned this fd and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_layouts_match_the_kernel() {
        assert_eq!(std::mem::size_of::<BpfInsn>(), 8);
        assert_eq!(std::mem::size_of::<ProgLoadAttr>(), 128);
        assert_eq!(std::mem::size_of::<TestRunAttr>(), 128);
        assert_eq!(std::mem::size_of::<LinkCreateAttr>(), 128);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(std::mem::offset_of!(TestRunAttr, batch_size), 72);
        assert_eq!(ins(op::STX_DW, 2, 5, 8, 0).regs, 0x52);
    }
}
