//! The old per-call rtnetlink helper: a thread inside the namespace with a
//! current-thread tokio runtime for one closure. Only `bench::links` still
//! uses it (bench is being rewritten); everything else goes through
//! [`crate::sys::Sys`], whose namespace worker keeps one netlink socket
//! for the whole run. Linux >= 2.6.

use std::future::Future;

use anyhow::{Context, Result, anyhow};
use rtnetlink::Handle;

use super::Netns;

/// Runs `f` with an rtnetlink handle opened inside `ns` (or in the host
/// namespace of the process when `ns` is None).
pub fn with_netlink<T, F, Fut>(ns: Option<&Netns>, f: F) -> Result<T>
where
    F: FnOnce(Handle) -> Fut + Send,
    Fut: Future<Output = Result<T>>,
    T: Send,
{
    let body = move || -> Result<T> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let (conn, handle, _) =
                rtnetlink::new_connection().context("open a NETLINK_ROUTE socket")?;
            let task = tokio::spawn(conn);
            let r = f(handle).await;
            task.abort();
            r
        })
    };
    match ns {
        Some(ns) => ns.run(body),
        None => std::thread::scope(|s| {
            s.spawn(body)
                .join()
                .map_err(|_| anyhow!("netlink thread panicked"))?
        }),
    }
}
