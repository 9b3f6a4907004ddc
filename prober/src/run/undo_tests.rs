//! The exact undo after a failure at each step of a run's set-up, against
//! the recording fake: the testbed build, each knob's apply, each XDP
//! attach (and its device map entry), and a restore. After the injected
//! failure the recorded changes take back exactly what was changed before
//! it, newest first, and nothing more; a failed restore does not stop the
//! restores after it.

use std::sync::Arc;

use anyhow::Result;

use super::orchestrate_tests::run_as;
use crate::{
    sys::{
        Ns, Sys,
        fake::{Call, FakeSys},
    },
    testbed::{Undo, build_veth},
};

const ID: &str = "undo";

fn ns(role: &str) -> String {
    format!("rtprobe-{ID}-{role}")
}

const TXQ: &str = "class/net/veth-rout/tx_queue_len";
const TSQ: &str = "net.ipv4.tcp_limit_output_bytes";

/// The fake kernel with the files the knobs read (the router's egress
/// queue length, the sender's TSQ limit) at these values.
fn kernel() -> Arc<FakeSys> {
    let f = Arc::new(FakeSys::new());
    f.with_file(Ns::Named(&ns("router")), &format!("sysfs:{TXQ}"), "1000");
    f.with_file(
        Ns::Named(&ns("sender")),
        &format!("sysctl:{TSQ}"),
        "1048576",
    );
    f
}

/// What the knobs read before they change it: (namespace, call) -> value.
fn before(c: &Call) -> Option<&'static str> {
    match c {
        Call::SysfsWrite(n, p, _) if *n == ns("router") && p == TXQ => Some("1000"),
        Call::SetSysctl(n, k, _) if *n == ns("sender") && k == TSQ => Some("1048576"),
        _ => None,
    }
}

/// How many changes the build makes (a fresh fake, nothing failing).
fn build_len() -> usize {
    let f = Arc::new(FakeSys::new());
    let mut undo = Undo::new(f.clone(), None);
    build_veth(f.as_ref(), ID, &mut undo).expect("build on the fake");
    let n = f.changes().len();
    std::mem::forget(undo);
    n
}

/// Runs the orchestration on `f` with a probe step that changes nothing;
/// returns its result and how many calls had been made when the step ran.
fn run(f: &Arc<FakeSys>) -> (Result<u32>, Option<usize>) {
    run_as(f, ID, |_, _| Ok(7))
}

/// The changes of an undisturbed run: those up to its probe step (the
/// set-up) and those after it (the undo), and the router's ifindexes by
/// device name.
struct Undisturbed {
    set_up: Vec<Call>,
    undo: Vec<Call>,
    ifindex: Vec<(String, u32)>,
}

fn undisturbed() -> Undisturbed {
    let f = kernel();
    let (r, at_probe) = run(&f);
    assert_eq!(r.unwrap(), 7);
    let at_probe = at_probe.expect("the probe step ran");
    let changes =
        |calls: &[Call]| -> Vec<Call> { calls.iter().filter(|c| c.is_change()).cloned().collect() };
    let calls = f.calls();
    // The fake numbers links in the order they are made, and so does a
    // second build on a fresh fake.
    let g = Arc::new(FakeSys::new());
    let mut undo = Undo::new(g.clone(), None);
    let l = build_veth(g.as_ref(), ID, &mut undo).expect("build on the fake");
    std::mem::forget(undo);
    Undisturbed {
        set_up: changes(&calls[..at_probe]),
        undo: changes(&calls[at_probe..]),
        ifindex: vec![
            ("veth-rin".into(), l.router_in),
            ("veth-rout".into(), l.router_out),
        ],
    }
}

impl Undisturbed {
    /// What takes back each of `done`, newest first: a namespace is
    /// deleted (with everything made inside it), a knob's value put back,
    /// an XDP program detached, a device map entry removed.
    fn undo_of(&self, done: &[Call]) -> Vec<Call> {
        let ifindex = |dev: &str| {
            self.ifindex
                .iter()
                .find(|(d, _)| d == dev)
                .map(|(_, i)| *i)
                .expect("a router veth")
        };
        done.iter()
            .rev()
            .filter_map(|c| match c {
                Call::CreateNetns(n) => Some(Call::DeleteNetns(n.clone())),
                Call::SysfsWrite(n, p, _) => {
                    before(c).map(|v| Call::SysfsWrite(n.clone(), p.clone(), v.into()))
                }
                Call::SetSysctl(n, k, _) => {
                    before(c).map(|v| Call::SetSysctl(n.clone(), k.clone(), v.into()))
                }
                Call::DevmapInsert(_, map, dev) => {
                    Some(Call::DevmapRemove(map.clone(), ifindex(dev)))
                }
                Call::XdpAttach(n, dev, id, _) => {
                    Some(Call::XdpDetach(n.clone(), dev.clone(), *id))
                }
                _ => None,
            })
            .collect()
    }

    /// Fails set-up step `k` (0-based, of [`Undisturbed::set_up`]) and
    /// checks the run: an error naming the injected failure, no probe
    /// step, the steps before `k`, the failed one, then exactly their undo.
    fn fail_step(&self, k: usize) {
        let step = &self.set_up[k];
        let f = kernel();
        f.fail_nth_change(k + 1);
        let (r, at_probe) = run(&f);
        let e = r.expect_err(&format!("step {k} ({step:?}) failed"));
        assert!(
            format!("{e:#}").contains("injected failure"),
            "step {k} ({step:?}): {e:#}"
        );
        assert_eq!(at_probe, None, "step {k} ({step:?}): no probe step");
        let mut want = self.set_up[..=k].to_vec();
        want.extend(self.undo_of(&self.set_up[..k]));
        assert_eq!(f.changes(), want, "failure at step {k} ({step:?})");
        assert!(f.netns_list().is_empty(), "step {k}: nothing left behind");
    }

    /// The steps of the set-up that `keep` selects.
    fn steps(&self, keep: impl Fn(&Call) -> bool) -> Vec<usize> {
        (0..self.set_up.len())
            .filter(|&k| keep(&self.set_up[k]))
            .collect()
    }
}

/// The IPv6 sysctls of a fresh namespace are best effort (a kernel
/// without IPv6 gives an IPv4-only testbed): their failure stops nothing.
fn best_effort(c: &Call) -> bool {
    matches!(c, Call::SetSysctl(_, k, _) if k.starts_with("net.ipv6.conf.") && !k.ends_with(".forwarding"))
}

#[test]
fn the_undisturbed_run_undoes_its_set_up() {
    let u = undisturbed();
    assert_eq!(
        u.set_up.len(),
        build_len() + 6,
        "build, 2 knobs, 2 attaches"
    );
    // After the probe step the router goes first, then the knobs newest
    // first, then the namespaces: the reverse of the set-up except inside
    // the router, which detaches both veths (in attach order) before it
    // empties its egress map.
    let mut want = u.undo_of(&u.set_up);
    let xdp: Vec<Call> = want.drain(..4).collect();
    assert!(matches!(
        xdp[..],
        [
            Call::XdpDetach(..),
            Call::DevmapRemove(..),
            Call::XdpDetach(..),
            Call::DevmapRemove(..)
        ]
    ));
    let mut router = vec![
        xdp[2].clone(),
        xdp[0].clone(),
        xdp[3].clone(),
        xdp[1].clone(),
    ];
    router.extend(want);
    assert_eq!(u.undo, router);
}

#[test]
fn a_failure_at_each_build_step_deletes_the_namespaces_made_before_it() {
    let u = undisturbed();
    let n = build_len();
    let steps = u.steps(|c| !best_effort(c));
    let build: Vec<usize> = steps.into_iter().filter(|&k| k < n).collect();
    assert!(build.len() > 20, "{build:?}");
    for k in build {
        u.fail_step(k);
    }
}

#[test]
fn a_failure_at_each_knob_s_apply_restores_the_knobs_before_it() {
    let u = undisturbed();
    let knobs = u.steps(|c| before(c).is_some());
    assert_eq!(knobs, [build_len(), build_len() + 1]);
    for k in knobs {
        u.fail_step(k);
    }
}

#[test]
fn a_failure_at_each_xdp_step_detaches_what_was_attached_before_it() {
    let u = undisturbed();
    let xdp = u.steps(|c| matches!(c, Call::DevmapInsert(..) | Call::XdpAttach(..)));
    assert_eq!(xdp.len(), 4);
    for k in xdp {
        u.fail_step(k);
    }
}

#[test]
fn a_failed_restore_stops_none_of_the_restores_after_it() {
    let u = undisturbed();
    for k in 0..u.undo.len() {
        let step = &u.undo[k];
        let f = kernel();
        f.fail_nth_change(u.set_up.len() + k + 1);
        let (r, at_probe) = run(&f);
        assert!(at_probe.is_some(), "the probe step ran");
        let e = r.expect_err(&format!("restore {k} ({step:?}) failed"));
        assert!(
            format!("{e:#}").contains("injected failure"),
            "restore {k} ({step:?}): {e:#}"
        );
        let mut want = u.set_up.clone();
        want.extend(u.undo.iter().cloned());
        assert_eq!(f.changes(), want, "failed restore {k} ({step:?})");
    }
}

#[test]
fn a_failed_ipv6_sysctl_gives_an_ipv4_testbed_and_no_error() {
    let f = kernel();
    f.fail_nth_when(1, best_effort);
    let (r, at_probe) = run(&f);
    assert_eq!(r.unwrap(), 7);
    assert!(at_probe.is_some());
    let v6 = |c: &Call| matches!(c, Call::AddAddr(_, _, a) if a.addr.is_ipv6());
    assert!(!f.changes().iter().any(v6), "{:?}", f.changes());
    assert!(f.netns_list().is_empty(), "nothing left behind");
}
