//! The pages `/metrics` answers with: rendered at most once per
//! [`RENDER_EVERY`] per format and shared by every reader, so that N
//! scrapes at once cost one page, not N; and at most [`PAGES_PER_FORMAT`]
//! pages of a format alive at once, whoever holds them.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use hyper::body::Bytes;

use super::{format::Format, registry::Metrics};

/// A page is served again, rather than rendered anew, for this long:
/// scrapers that come within it (Prometheus servers of an HA pair, a
/// burst of clients) share one render.
pub(super) const RENDER_EVERY: Duration = Duration::from_secs(1);
/// Most pages of one format alive at once: the one being served and one
/// older that slow readers may still hold. While both are held a scrape
/// gets the newer of them instead of a new render: memory stays bounded,
/// and the page is no older than the longest a connection lives (10 s).
pub(super) const PAGES_PER_FORMAT: usize = 2;

/// The rendered pages of one server (used on its one thread).
pub(super) struct Pages {
    metrics: Arc<Metrics>,
    /// The newest page of each format ([`Format`] as the index) and when
    /// it was rendered.
    newest: [Option<(Instant, Arc<Page>)>; 2],
    /// Pages of each format alive (held by `newest` or by a reader).
    alive: [Arc<AtomicUsize>; 2],
}

/// One rendered exposition; counted alive until its last reader drops it.
struct Page {
    text: String,
    alive: Arc<AtomicUsize>,
}

impl Drop for Page {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A reader's share of a page, as the response body holds it.
struct Shared(Arc<Page>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.text.as_bytes()
    }
}

impl Pages {
    pub(super) fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            newest: [None, None],
            alive: [Arc::default(), Arc::default()],
        }
    }

    /// The page a scrape in `format` gets at `now`: the newest one if it
    /// is recent, or if rendering another would exceed
    /// [`PAGES_PER_FORMAT`]; a new render otherwise.
    pub(super) fn page(&mut self, format: Format, now: Instant) -> Bytes {
        let i = format as usize;
        let alive = &self.alive[i];
        let renew = match &self.newest[i] {
            None => true,
            Some((at, page)) => {
                now.saturating_duration_since(*at) >= RENDER_EVERY
                    // Replacing a page nobody reads frees it.
                    && (Arc::strong_count(page) == 1
                        || alive.load(Ordering::Relaxed) < PAGES_PER_FORMAT)
            }
        };
        if renew {
            // The old page goes first, so that it is freed before the
            // new one is rendered when nobody reads it.
            self.newest[i] = None;
            alive.fetch_add(1, Ordering::Relaxed);
            let page = Arc::new(Page {
                text: self.metrics.encode(format),
                alive: alive.clone(),
            });
            self.newest[i] = Some((now, page));
        }
        let (_, page) = self.newest[i].as_ref().expect("rendered above");
        Bytes::from_owner(Shared(page.clone()))
    }

    /// Pages alive now, of both formats.
    #[cfg(test)]
    pub(super) fn alive(&self) -> usize {
        self.alive.iter().map(|a| a.load(Ordering::Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::metrics::FlowLabels;

    /// One render per format per window, shared; at most two pages of a
    /// format alive however many readers hold them; a page nobody reads
    /// is replaced, not kept.
    #[test]
    fn readers_share_pages_and_pages_are_bounded() {
        let m = Arc::new(Metrics::new());
        let mut f = m.flow(FlowLabels::new("t", 0, 0, 64), false);
        let mut pages = Pages::new(m.clone());
        let t0 = Instant::now();
        let a = pages.page(Format::Prometheus, t0);
        let b = pages.page(Format::Prometheus, t0 + Duration::from_millis(999));
        assert_eq!(a.as_ptr(), b.as_ptr(), "one render in the window");
        assert_eq!(pages.alive(), 1);
        let om = pages.page(Format::OpenMetrics, t0);
        assert!(om.ends_with(b"# EOF\n") && !a.ends_with(b"# EOF\n"));
        assert_eq!(pages.alive(), 2);
        // After the window, a new render; the old page lives on with its readers.
        f.observe(&crate::model::record::ProbeRecord::default());
        let c = pages.page(Format::Prometheus, t0 + RENDER_EVERY);
        assert_ne!(a.as_ptr(), c.as_ptr());
        assert_ne!(a, c, "the new page has the new count");
        assert_eq!(pages.alive(), 3);
        // Two text pages are held: the newest is served again, however old.
        let d = pages.page(Format::Prometheus, t0 + 10 * RENDER_EVERY);
        assert_eq!(c.as_ptr(), d.as_ptr());
        assert_eq!(pages.alive(), 3);
        // The readers of the old page let go: the next render replaces it.
        drop((a, b));
        assert_eq!(pages.alive(), 2);
        let e = pages.page(Format::Prometheus, t0 + 10 * RENDER_EVERY);
        assert_ne!(c.as_ptr(), e.as_ptr());
        assert_eq!(pages.alive(), 3, "c's readers hold it, e is new, om");
        // A newest page nobody reads is replaced in place.
        drop((c, d, e));
        assert_eq!(pages.alive(), 2);
        let g = pages.page(Format::Prometheus, t0 + 20 * RENDER_EVERY);
        drop(g);
        assert_eq!(pages.alive(), 2);
    }
}
