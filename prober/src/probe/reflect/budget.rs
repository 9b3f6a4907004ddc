//! How much a reflector may do a second, whatever arrives: the replies
//! themselves ([`RateLimits`], the one set of limits both reflectors
//! enforce: per source, over strangers, over known peers), and in the
//! user-space serve loop log lines ([`LineLimit`]) and TX stamps
//! ([`StampBudget`]).
//!
//! The turnaround (probe RX stamp to reply TX stamp) is sampled: at most
//! [`TX_STAMPS_PER_S`] replies a second are TX-stamped ([`StampBudget`]).
//! Every stamp is an error-queue message charged to the receive buffer the
//! probes arrive in; stamping every reply let a flood fill that buffer
//! with stamps (measured: a CPU-starved reflector received 387-447 k of
//! 570 k datagrams and a legitimate client lost 25-100 %; 572 k and 0 %
//! without stamps).

/// Replies a reflector sends a second, in three budgets; None: no limit.
/// Both reflectors take the same limits with the same meaning (the
/// user-space one in `tables.rs`, the in-kernel one as GCRA words in its
/// maps).
///
/// A source in the known-peers allowlist ([`super::Peers`]) draws from
/// budgets no other source can touch: its own bucket in a table of peers
/// only, then `peers_pps`. Every other source draws from its bucket, then
/// `global_pps`. So a flood from any number of strangers, forged or not,
/// spends the strangers' budget and nothing of the peers'; the peers'
/// total is capped too, so a wide allowlisted prefix cannot cost more than
/// `peers_pps` either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimits {
    /// Per source: an IPv4 address or an IPv6 /64 (`xdp_common::rate_key`),
    /// a known peer's as any other's.
    pub per_source_pps: Option<u32>,
    /// Over every source that is not a known peer.
    pub global_pps: Option<u32>,
    /// Over every known peer together.
    pub peers_pps: Option<u32>,
}

impl RateLimits {
    /// No limit at all: rtprobe's own testbed, whose reflector answers only
    /// the testbed's sender inside its namespaces, at whatever rate the run
    /// asks for.
    pub(crate) const NONE: RateLimits = RateLimits {
        per_source_pps: None,
        global_pps: None,
        peers_pps: None,
    };

    /// The bucket depth for `rate_pps`: a tenth of a second's worth, at
    /// least 16 (every bucket of both reflectors).
    pub(crate) fn burst(rate_pps: u32) -> u32 {
        (rate_pps / 10).max(16)
    }

    /// "at most 10000/s per IPv4 address or IPv6 /64 (bursts of 1000), ..."
    /// for the banners of both reflectors; the peers' cap only if there
    /// are `peers`.
    pub(crate) fn describe(&self, peers: bool) -> String {
        let one = |what: &str, pps: Option<u32>| match pps {
            Some(r) => format!("at most {r}/s {what} (bursts of {})", Self::burst(r)),
            None => format!("no limit {what}"),
        };
        let mut s = format!(
            "{}, {}",
            one("per IPv4 address or IPv6 /64", self.per_source_pps),
            one(
                if peers {
                    "over all sources but the known peers"
                } else {
                    "over all sources"
                },
                self.global_pps
            ),
        );
        if peers {
            s += &format!(", {}", one("over the known peers", self.peers_pps));
        }
        s
    }
}

/// Replies TX-stamped a second at most (for the turnaround): a client at
/// 1 kHz keeps every stamp; a flood adds at most this many error-queue
/// messages a second, whatever its rate.
pub(super) const TX_STAMPS_PER_S: u32 = 2000;
/// Stamps that may be taken at once after a quiet spell (0.1 s worth).
pub(super) const TX_STAMP_BURST: u32 = TX_STAMPS_PER_S / 10;

/// Lets at most `per_s` log lines through in each second and counts the
/// rest, so that a flood cannot turn the log into the bottleneck (or fill
/// the disk) while the log still says how much was held back.
#[derive(Debug, Clone)]
pub(crate) struct LineLimit {
    per_s: u32,
    window_start_ns: i64,
    shown: u32,
    held_back: u64,
}

impl LineLimit {
    pub(super) fn new(per_s: u32) -> Self {
        Self {
            per_s,
            window_start_ns: i64::MIN,
            shown: 0,
            held_back: 0,
        }
    }

    /// Starts a new window once a second has passed: returns how many
    /// lines the window that ended held back, if any (to be said first).
    pub(super) fn roll(&mut self, now_ns: i64) -> Option<u64> {
        if now_ns.saturating_sub(self.window_start_ns) < 1_000_000_000 {
            return None;
        }
        self.window_start_ns = now_ns;
        self.shown = 0;
        Some(std::mem::take(&mut self.held_back)).filter(|&k| k > 0)
    }

    /// Whether one more line may be shown in this window (call
    /// [`Self::roll`] first); a refused line is counted as held back.
    pub(super) fn admit(&mut self) -> bool {
        if self.shown < self.per_s {
            self.shown += 1;
            true
        } else {
            self.held_back += 1;
            false
        }
    }

    /// Lines held back and not yet reported (at exit).
    pub(super) fn take_held_back(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.held_back)).filter(|&k| k > 0)
    }
}

/// A token bucket of TX stamps: which replies get one. Shared by every
/// source (the point is to bound the reflector's own error queue, not to
/// be fair): under a flood the stamped replies are a sample of all.
#[derive(Debug, Clone)]
pub(crate) struct StampBudget {
    /// Time one stamp costs, ns.
    cost_ns: i64,
    /// Credit saved up to the burst, ns; `last_ns` is when it was.
    credit_ns: i64,
    cap_ns: i64,
    last_ns: Option<i64>,
}

impl StampBudget {
    /// `per_s` stamps a second after a first `burst`; `per_s` 0: none.
    pub(super) fn new(per_s: u32, burst: u32) -> Self {
        let cost_ns = if per_s == 0 {
            i64::MAX
        } else {
            1_000_000_000 / i64::from(per_s)
        };
        let cap_ns = cost_ns.saturating_mul(i64::from(burst.max(1)));
        Self {
            cost_ns,
            credit_ns: if per_s == 0 { 0 } else { cap_ns },
            cap_ns,
            last_ns: None,
        }
    }

    /// Whether a reply sent at `now_ns` may be stamped (and takes the stamp).
    pub(super) fn take(&mut self, now_ns: i64) -> bool {
        if let Some(last) = self.last_ns {
            // A clock stepped back refills nothing.
            let refill = now_ns.saturating_sub(last).max(0);
            self.credit_ns = self.credit_ns.saturating_add(refill).min(self.cap_ns);
        }
        self.last_ns = Some(now_ns);
        if self.credit_ns >= self.cost_ns {
            self.credit_ns -= self.cost_ns;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{super::testutil::NOW, *};

    /// How many of `count` replies at `pps` from `start_ns` get a stamp.
    fn stamped(b: &mut StampBudget, start_ns: i64, count: u64, pps: u64) -> u64 {
        let gap_ns = 1_000_000_000 / pps as i64;
        (0..count)
            .filter(|&i| b.take(start_ns + i as i64 * gap_ns))
            .count() as u64
    }

    #[test]
    fn stamp_budget_keeps_every_stamp_of_a_1khz_client() {
        let mut b = StampBudget::new(TX_STAMPS_PER_S, TX_STAMP_BURST);
        assert_eq!(stamped(&mut b, NOW, 10_000, 1000), 10_000);
        // Up to the budget itself, still every one.
        let mut b = StampBudget::new(TX_STAMPS_PER_S, TX_STAMP_BURST);
        assert_eq!(stamped(&mut b, NOW, 10_000, 2000), 10_000);
    }

    #[test]
    fn stamp_budget_holds_a_flood_to_its_rate_plus_the_burst() {
        // The hostile test's flood: 57 k replies/s for 5 s.
        let mut b = StampBudget::new(TX_STAMPS_PER_S, TX_STAMP_BURST);
        let got = stamped(&mut b, NOW, 285_000, 57_000);
        let most = u64::from(TX_STAMP_BURST) + 5 * u64::from(TX_STAMPS_PER_S);
        assert!(got <= most && got >= most - 2, "{got} of at most {most}");
        // A batch arriving at one instant: the burst, then nothing.
        let mut b = StampBudget::new(TX_STAMPS_PER_S, TX_STAMP_BURST);
        let at_once = (0..1000).filter(|_| b.take(NOW)).count();
        assert_eq!(at_once, TX_STAMP_BURST as usize);
    }

    #[test]
    fn stamp_budget_saves_up_only_a_burst_and_survives_clock_steps() {
        let mut b = StampBudget::new(1000, 10);
        assert_eq!((0..20).filter(|_| b.take(NOW)).count(), 10);
        // An hour of quiet buys the burst, not an hour of stamps.
        let later = NOW + 3_600_000_000_000;
        assert_eq!((0..20).filter(|_| b.take(later)).count(), 10);
        // The clock stepped back: nothing refilled, nothing panics.
        assert!(!b.take(NOW));
        assert!(!b.take(i64::MIN));
        assert!(b.take(i64::MIN + 1_000_000));
        // Back to the far future: a burst again, no overflow.
        assert_eq!((0..20).filter(|_| b.take(i64::MAX)).count(), 10);
        // No budget: no stamps.
        let mut none = StampBudget::new(0, 10);
        assert_eq!(stamped(&mut none, NOW, 1000, 1000), 0);
    }

    #[test]
    fn line_limit_shows_per_second_then_counts_the_rest() {
        let mut l = LineLimit::new(3);
        assert_eq!(l.roll(NOW), None);
        let shown = (0..10).filter(|_| l.admit()).count();
        assert_eq!(shown, 3);
        assert_eq!(l.roll(NOW + 999_999_999), None, "same second");
        assert!(!l.admit());
        assert_eq!(l.roll(NOW + 1_000_000_000), Some(8));
        assert!(l.admit());
        assert_eq!(l.take_held_back(), None);
        assert!(l.admit() && l.admit() && !l.admit());
        assert_eq!(l.take_held_back(), Some(1));
        assert_eq!(l.roll(NOW + 2_000_000_000), None, "already reported");
    }
}
