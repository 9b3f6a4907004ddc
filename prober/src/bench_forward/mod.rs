//! Measuring the router hop itself: `rtprobe bench-forward` (forwarded
//! packets per second, drops and CPU per core for kernel forwarding and
//! each XDP mode, with probe latency under the rising load). The hidden
//! `rtprobe testbed` that keeps a testbed up for other tools is
//! `app::testbed`.

pub mod afxdp;
pub mod bounce;
pub mod cpu;
pub mod forward;
pub mod frame;
pub mod kinds;
pub mod links;
pub mod loadgen;
pub mod perf;
pub mod plan;
pub mod sink;
pub mod xdp;
