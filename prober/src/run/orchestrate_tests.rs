//! A testbed run end to end against the recording fake, no root: the
//! testbed built, the knobs applied, the XDP router attached, the probe
//! step (a closure here: no sockets), the router detached, the knobs put
//! back and the testbed torn down, call by call; and the same undo, in
//! the same order, when a call fails half-way.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU8, Ordering},
};

use anyhow::Result;
use xdp_common::EGRESS_MAP;

use super::{Frame, Prepared, orchestrate};
use crate::{
    ebpf::{Loader, Reflector, Router, XdpAction, XdpMode},
    sys::{
        Ns, Sys, SysRef,
        fake::{Call, FakeSys},
    },
    testbed::{Testbed, Undo, VethLayout, build_veth},
    tune::Knobs,
};

const ID: &str = "orch";

/// Programs never loaded, with kernel ids 201, 202, ...
struct StandIns {
    sys: SysRef,
    next_id: u32,
}

impl Loader for StandIns {
    fn router(&mut self, pass_only: bool) -> Result<Router> {
        self.next_id += 1;
        Ok(Router::stand_in(self.sys.clone(), pass_only, self.next_id))
    }

    fn reflector(&mut self, _probe: u16, _stamp: u16, _reply_ifindex: u32) -> Result<Reflector> {
        self.next_id += 1;
        Ok(Reflector::stand_in(self.sys.clone(), self.next_id))
    }
}

fn ns(role: &str) -> String {
    format!("rtprobe-{ID}-{role}")
}

fn s(x: &str) -> String {
    x.to_string()
}

/// The fake kernel with the files the knobs read: the router's egress
/// veth's queue length and the sender's TSQ limit (the namespaces appear
/// when the testbed is built).
fn kernel() -> Arc<FakeSys> {
    let f = Arc::new(FakeSys::new());
    f.with_file(
        Ns::Named(&ns("router")),
        "sysfs:class/net/veth-rout/tx_queue_len",
        "1000",
    );
    f.with_file(
        Ns::Named(&ns("sender")),
        "sysctl:net.ipv4.tcp_limit_output_bytes",
        "1048576",
    );
    f
}

fn knobs() -> Knobs {
    let k: Knobs =
        toml::from_str("bottleneck = \"router\"\ntxqueuelen = 20\ntsq = 65536").expect("knobs");
    k.validate().expect("knobs validate");
    k
}

/// The calls that build the veth testbed, as `build_veth` makes them on a
/// fresh fake (their order is `testbed::tests`' business), and the layout
/// it gives (the fake numbers links in the order they are made).
fn build() -> (Vec<Call>, VethLayout) {
    let f = Arc::new(FakeSys::new());
    let mut undo = Undo::new(f.clone(), None);
    let layout = build_veth(f.as_ref(), ID, &mut undo).expect("build on the fake");
    let calls = f.changes();
    std::mem::forget(undo);
    (calls, layout)
}

/// Runs the orchestration on `f` with `probe` as its probe step; returns
/// its result and how many calls had been made when the step ran.
fn run(
    f: &Arc<FakeSys>,
    probe: impl for<'tb> FnOnce(&'tb Testbed, &mut Prepared<'tb>) -> Result<u32>,
) -> (Result<u32>, Option<usize>) {
    run_as(f, ID, probe)
}

/// [`run`] on a testbed with this ID (undo_tests.rs runs it too).
pub(super) fn run_as(
    f: &Arc<FakeSys>,
    id: &str,
    probe: impl for<'tb> FnOnce(&'tb Testbed, &mut Prepared<'tb>) -> Result<u32>,
) -> (Result<u32>, Option<usize>) {
    let knobs = knobs();
    let frame = Frame {
        knobs: &knobs,
        queue_csv: None,
        xdp_mode: XdpMode::Auto,
        xdp_action: XdpAction::Redirect,
    };
    let sys: SysRef = f.clone();
    let mut loader = StandIns {
        sys: sys.clone(),
        next_id: 200,
    };
    let at_probe = Mutex::new(None);
    let stop = AtomicU8::new(0);
    let r = orchestrate(
        sys,
        &frame,
        &stop,
        |sys| Testbed::veth_recorded(sys, id.into(), None),
        &mut loader,
        |tb, prepared| {
            *at_probe.lock().unwrap() = Some(f.calls().len());
            probe(tb, prepared)
        },
    );
    (r, at_probe.into_inner().unwrap())
}

/// Knobs on, router attached (both router veths, native), in this order.
fn set_up_changes() -> Vec<Call> {
    let (r, snd) = (ns("router"), ns("sender"));
    vec![
        Call::SysfsWrite(r.clone(), s("class/net/veth-rout/tx_queue_len"), s("20")),
        Call::SetSysctl(
            snd.clone(),
            s("net.ipv4.tcp_limit_output_bytes"),
            s("65536"),
        ),
        Call::DevmapInsert(r.clone(), s(EGRESS_MAP), s("veth-rin")),
        Call::XdpAttach(r.clone(), s("veth-rin"), 201, crate::sys::XdpFlags::Any),
        Call::DevmapInsert(r.clone(), s(EGRESS_MAP), s("veth-rout")),
        Call::XdpAttach(r.clone(), s("veth-rout"), 201, crate::sys::XdpFlags::Any),
    ]
}

/// Router off, egress map emptied, knobs back newest first, namespaces gone.
fn undo_changes(rin: u32, rout: u32) -> Vec<Call> {
    let (r, snd) = (ns("router"), ns("sender"));
    vec![
        Call::XdpDetach(r.clone(), s("veth-rin"), 201),
        Call::XdpDetach(r.clone(), s("veth-rout"), 201),
        Call::DevmapRemove(s(EGRESS_MAP), rin),
        Call::DevmapRemove(s(EGRESS_MAP), rout),
        Call::SetSysctl(
            snd.clone(),
            s("net.ipv4.tcp_limit_output_bytes"),
            s("1048576"),
        ),
        Call::SysfsWrite(r.clone(), s("class/net/veth-rout/tx_queue_len"), s("1000")),
        Call::DeleteNetns(ns("receiver")),
        Call::DeleteNetns(r),
        Call::DeleteNetns(snd),
    ]
}

#[test]
fn a_run_builds_tunes_attaches_probes_and_undoes_it_all_in_order() {
    let f = kernel();
    let (build_calls, layout) = build();
    let (r, at_probe) = run(&f, |tb, prepared| {
        // What the probe step sees: the router attached natively on both
        // router veths, the knobs in effect, the namespaces there.
        assert_eq!(prepared.xdp.attached_mode_name(), "native");
        assert!(prepared.applied.is_some());
        let router = Ns::Named(tb.router.as_ref().unwrap().name());
        let link = |d: &str| f.link_state(router, d).unwrap();
        assert_eq!(link("veth-rin").xdp.drv_prog_id, Some(201));
        assert_eq!(link("veth-rout").xdp.drv_prog_id, Some(201));
        assert_eq!(
            f.file(router, "sysfs:class/net/veth-rout/tx_queue_len"),
            Some(s("20"))
        );
        Ok(7)
    });
    assert_eq!(r.unwrap(), 7, "the probe step's result comes back");
    let at_probe = at_probe.expect("the probe step ran");
    let before: Vec<Call> = f.calls()[..at_probe]
        .iter()
        .filter(|c| c.is_change())
        .cloned()
        .collect();
    let after: Vec<Call> = f.calls()[at_probe..]
        .iter()
        .filter(|c| c.is_change())
        .cloned()
        .collect();
    let mut want_before = build_calls;
    want_before.extend(set_up_changes());
    assert_eq!(
        before, want_before,
        "build, knobs, XDP before the probe step"
    );
    assert_eq!(
        after,
        undo_changes(layout.router_in, layout.router_out),
        "detach, restore, teardown after it"
    );
    // The handles the probe step gets name the testbed's namespaces.
    let opened: Vec<Call> = f
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::OpenNetns(_)))
        .collect();
    assert_eq!(
        opened,
        ["sender", "receiver", "router"]
            .map(|r| Call::OpenNetns(ns(r)))
            .to_vec()
    );
    assert!(f.netns_list().is_empty(), "nothing left behind");
}

#[test]
fn a_failure_half_way_still_detaches_restores_and_tears_down_in_order() {
    let f = kernel();
    // The second attach (veth-rout) is refused: the probe step never runs.
    f.fail_when(|c| matches!(c, Call::XdpAttach(_, d, ..) if d == "veth-rout"));
    let (r, at_probe) = run(&f, |_, _| panic!("no probe step after a failed attach"));
    let e = r.unwrap_err();
    assert!(format!("{e:#}").contains("injected failure"), "{e:#}");
    assert_eq!(at_probe, None);

    let (mut want, layout) = build();
    let (rin, rout) = (layout.router_in, layout.router_out);
    want.extend(set_up_changes());
    // The refused attach is recorded, then its egress entry is taken back
    // at once; then everything else is undone as after a run, the knobs
    // after the router.
    want.push(Call::DevmapRemove(s(EGRESS_MAP), rout));
    let mut undo = undo_changes(rin, rout);
    undo.retain(|c| *c != Call::DevmapRemove(s(EGRESS_MAP), rout));
    undo.retain(|c| !matches!(c, Call::XdpDetach(_, d, _) if d == "veth-rout"));
    want.extend(undo);
    assert_eq!(f.changes(), want);
    assert!(f.netns_list().is_empty(), "nothing left behind");
}

#[test]
fn a_failing_probe_step_is_undone_like_a_finished_one() {
    let f = kernel();
    let (r, at_probe) = run(&f, |_, _| anyhow::bail!("the probe session failed"));
    assert_eq!(r.unwrap_err().to_string(), "the probe session failed");
    let at_probe = at_probe.expect("the probe step ran");
    let after: Vec<Call> = f.calls()[at_probe..]
        .iter()
        .filter(|c| c.is_change())
        .cloned()
        .collect();
    let layout = build().1;
    assert_eq!(after, undo_changes(layout.router_in, layout.router_out));
    assert!(f.netns_list().is_empty(), "nothing left behind");
}

#[test]
fn an_interrupt_before_the_build_touches_nothing() {
    let f = kernel();
    let knobs = knobs();
    let frame = Frame {
        knobs: &knobs,
        queue_csv: None,
        xdp_mode: XdpMode::Auto,
        xdp_action: XdpAction::Redirect,
    };
    let sys: SysRef = f.clone();
    let mut loader = StandIns {
        sys: sys.clone(),
        next_id: 200,
    };
    let stop = AtomicU8::new(0);
    stop.store(1, Ordering::SeqCst);
    let r = orchestrate(
        sys,
        &frame,
        &stop,
        |sys| Testbed::veth_recorded(sys, ID.into(), None),
        &mut loader,
        |_, _| Ok(0),
    );
    assert!(r.is_err());
    assert!(f.calls().is_empty(), "{:?}", f.calls());
}
