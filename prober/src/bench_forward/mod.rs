//! Measuring the router hop itself: `rtprobe bench-forward` (forwarded
//! packets per second, drops and CPU per core for kernel forwarding and
//! each XDP mode, with probe latency under the rising load). The hidden
//! `rtprobe testbed` that keeps a testbed up for other tools is
//! `app::testbed`.

pub(crate) mod afxdp;
pub(crate) mod bounce;
pub(crate) mod cpu;
pub(crate) mod forward;
pub(crate) mod frame;
pub(crate) mod kinds;
pub(crate) mod links;
pub(crate) mod loadgen;
pub(crate) mod perf;
pub(crate) mod plan;
pub(crate) mod sink;
pub(crate) mod xdp;
