//! Per-packet work for the bench variants (`xdp_router_work` in the
//! router's object, `bench_bounce` in `xdp-bench`): the XDP thesis's
//! "memory accesses per packet" axis. Each access is one volatile
//! read-modify-write of a word in a per-CPU scratch area, so the compiler
//! can neither fold nor vectorise it and the verifier sees a loop bounded
//! by a read-only global (a constant after load).

/// Words in the scratch area: 512 bytes, eight cache lines, so the
/// accesses stay in L1 (the thesis's work is CPU, not memory bandwidth).
pub const SCRATCH_WORDS: usize = 64;

/// Most accesses per packet the loaders accept (the thesis's maximum).
pub const MAX_ACCESSES: u32 = 12_800;

#[repr(C)]
pub struct Scratch {
    pub words: [u64; SCRATCH_WORDS],
}

/// `n` read-modify-writes spread over the scratch words.
#[inline(always)]
pub fn touch(scratch: *mut Scratch, n: u32) {
    let n = if n > MAX_ACCESSES { MAX_ACCESSES } else { n };
    let mut i: u32 = 0;
    while i < n {
        let idx = (i as usize) & (SCRATCH_WORDS - 1);
        // SAFETY: scratch points to a live per-CPU map value (checked by the
        // caller) and idx < SCRATCH_WORDS.
        unsafe {
            let w = (*scratch).words.as_mut_ptr().add(idx);
            w.write_volatile(w.read_volatile().wrapping_add(1));
        }
        i += 1;
    }
}
