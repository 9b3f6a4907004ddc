//! Fuzzes `rtprobe plot`'s CSV reader with arbitrary bytes: it must return
//! a run or a one-line error, never panic, and whatever numbers it accepts
//! must go through every statistic a figure is drawn from.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rtprobe::export::plot::{dist as stats_dist, read::read_csv, run_data::ReadOptions, stats};

fuzz_target!(|data: &[u8]| {
    for allow_truncated in [false, true] {
        let opts = ReadOptions {
            allow_truncated,
            // Both ways: the stage columns are only parsed when asked for.
            stages: allow_truncated,
            ..Default::default()
        };
        match read_csv("fuzz.csv", data, &opts) {
            Ok(run) => {
                let rows: u64 = run.flows.iter().map(|f| f.rows).sum();
                assert_eq!(rows, run.rows);
                for f in &run.flows {
                    for s in [&f.one_way, &f.rtt].into_iter().flatten() {
                        let cols = s.time.finish();
                        assert_eq!(cols.iter().map(|c| c.n).sum::<u64>(), s.dist.n());
                        // The exact samples, and the same through the
                        // HDR histogram the long runs use.
                        let mut binned = stats_dist::Dist::new(0);
                        let exact = s.dist.clone().finish();
                        for (v, c) in exact.pairs() {
                            binned.record_n(v, c);
                        }
                        for v in [exact, binned.finish()] {
                            if let Some(b) = stats::box_stats_of(&v) {
                                assert!(b.lower_whisker <= b.upper_whisker);
                            }
                            let _ = stats::cdf_points_of(&v, 16, true);
                            let _ = stats::percentile_curve_of(&v, 16);
                        }
                    }
                }
            }
            Err(e) => assert!(!e.to_string().contains('\n')),
        }
    }
});
