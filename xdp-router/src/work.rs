//! `xdp_router_work`: the router with a fixed amount of extra work per
//! frame, for `rtprobe bench-forward --work` (the XDP thesis's per-packet
//! work axis). It does `WORK_ACCESSES` memory accesses (see `busy`) and
//! then exactly what `xdp_router` does; `xdp_router` itself is untouched.
//! Kernel interfaces: those of the router, plus a per-CPU array for the
//! scratch words. Minimum kernel: 5.4.

use aya_ebpf::{
    macros::{map, xdp},
    maps::PerCpuArray,
    programs::XdpContext,
};

use crate::busy::{self, Scratch};

/// Memory accesses per frame, set by userspace at load time (1..=12800).
#[unsafe(no_mangle)]
static WORK_ACCESSES: u32 = 1;

#[map(name = "WORK_SCRATCH")]
static WORK_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

#[xdp]
pub fn xdp_router_work(ctx: XdpContext) -> u32 {
    if let Some(s) = WORK_SCRATCH.get_ptr_mut(0) {
        // SAFETY: WORK_ACCESSES is a read-only global; volatile so the
        // compiler does not fold it to its initial value.
        busy::touch(s, unsafe { core::ptr::read_volatile(&WORK_ACCESSES) });
    }
    match crate::try_router(&ctx) {
        Ok(action) | Err(action) => action,
    }
}
