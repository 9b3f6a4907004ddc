//! The reflectors' counters (`rtprobe reflect`, with or without
//! `--kernel`), published as deltas of their cumulative counts.

use super::{labels::OutcomeLabels, registry::Metrics};
use crate::stats::{XdpCounters, report::ReflectorCounters};

impl Metrics {
    /// Brings the reflector's counters up to `now` (cumulative counts; `last`
    /// is what was published before, updated in place).
    pub fn reflector_update(&self, last: &mut ReflectorCounters, now: &ReflectorCounters) {
        let outcomes = [
            ("reflected", last.reflected, now.reflected),
            ("not_for_us", last.not_for_us, now.not_for_us),
            ("bad_source", last.bad_source, now.bad_source),
            ("malformed", last.malformed, now.malformed),
            ("rate_limited", last.rate_limited, now.rate_limited),
            ("global_limited", last.global_limited, now.global_limited),
            (
                "peer_rate_limited",
                last.peer_rate_limited,
                now.peer_rate_limited,
            ),
            (
                "peer_global_limited",
                last.peer_global_limited,
                now.peer_global_limited,
            ),
            // A part of "reflected", as the in-kernel reflector counts it.
            ("peer_reflected", last.peer_reflected, now.peer_reflected),
            ("auth_failed", last.auth_failed, now.auth_failed),
            ("send_error", last.send_errors, now.send_errors),
        ];
        for (outcome, before, after) in outcomes {
            let c = self.reflector_datagrams.get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            });
            c.inc_by(after.saturating_sub(before));
        }
        self.reflector_sessions
            .inc_by(now.sessions.saturating_sub(last.sessions));
        *last = now.clone();
    }

    /// Brings the in-kernel reflector's frame counters up to `now`
    /// (cumulative, by outcome; `last` is what was published before,
    /// updated in place). Every outcome is published, zero or not, so a
    /// scrape shows which exist.
    pub(crate) fn kernel_reflector_update(&self, last: &mut XdpCounters, now: &XdpCounters) {
        for (outcome, c) in now {
            let before = last.get(outcome).map_or(0, |b| b.packets);
            self.kernel_reflector_frames
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.clone(),
                })
                .inc_by(c.packets.saturating_sub(before));
        }
        last.clone_from(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflector_counts_are_published_as_deltas_of_cumulative_counts() {
        let m = Metrics::for_reflector();
        let mut last = ReflectorCounters::default();
        let now = ReflectorCounters {
            sessions: 2,
            reflected: 500,
            not_for_us: 4,
            bad_source: 5,
            malformed: 7,
            rate_limited: 1,
            global_limited: 9,
            peer_reflected: 20,
            auth_failed: 3,
            send_errors: 0,
            ..Default::default()
        };
        m.reflector_update(&mut last, &now);
        m.reflector_update(&mut last, &now); // nothing new: unchanged
        m.reflector_update(
            &mut last,
            &ReflectorCounters {
                reflected: 510,
                ..now.clone()
            },
        );
        assert_eq!(last.reflected, 510);
        let text = m.openmetrics();
        for line in [
            "rtprobe_reflector_datagrams_total{outcome=\"reflected\"} 510",
            "rtprobe_reflector_datagrams_total{outcome=\"malformed\"} 7",
            "rtprobe_reflector_datagrams_total{outcome=\"not_for_us\"} 4",
            "rtprobe_reflector_datagrams_total{outcome=\"bad_source\"} 5",
            "rtprobe_reflector_datagrams_total{outcome=\"auth_failed\"} 3",
            "rtprobe_reflector_datagrams_total{outcome=\"global_limited\"} 9",
            "rtprobe_reflector_datagrams_total{outcome=\"peer_reflected\"} 20",
            "rtprobe_reflector_datagrams_total{outcome=\"peer_rate_limited\"} 0",
            "rtprobe_reflector_datagrams_total{outcome=\"send_error\"} 0",
            "rtprobe_reflector_sessions_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn kernel_reflector_frames_are_a_counter_family_by_outcome() {
        use crate::stats::summary::PacketsBytes;
        let m = Metrics::for_reflector();
        let counts = |reflected: u64, bad: u64| -> XdpCounters {
            [
                ("reflected_rtprobe", reflected),
                ("bad_source", bad),
                ("global_limited", 0),
            ]
            .into_iter()
            .map(|(k, packets)| {
                (
                    k.to_string(),
                    PacketsBytes {
                        packets,
                        bytes: packets * 64,
                    },
                )
            })
            .collect()
        };
        let mut last = XdpCounters::new();
        m.kernel_reflector_update(&mut last, &counts(100, 3));
        m.kernel_reflector_update(&mut last, &counts(100, 3)); // nothing new
        m.kernel_reflector_update(&mut last, &counts(250, 10));
        let text = m.openmetrics();
        for line in [
            "# TYPE rtprobe_kernel_reflector_frames counter",
            "rtprobe_kernel_reflector_frames_total{outcome=\"reflected_rtprobe\"} 250",
            "rtprobe_kernel_reflector_frames_total{outcome=\"bad_source\"} 10",
            "rtprobe_kernel_reflector_frames_total{outcome=\"global_limited\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        // The user-space reflector's family is there too, and apart.
        m.reflector_update(
            &mut ReflectorCounters::default(),
            &ReflectorCounters {
                reflected: 1,
                ..Default::default()
            },
        );
        let text = m.openmetrics();
        assert!(text.contains("rtprobe_reflector_datagrams_total{outcome=\"reflected\"} 1"));
        assert!(
            text.contains(
                "rtprobe_kernel_reflector_frames_total{outcome=\"reflected_rtprobe\"} 250"
            )
        );
    }
}
