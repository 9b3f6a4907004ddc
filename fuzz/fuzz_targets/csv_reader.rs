//! Fuzzes `rtprobe plot`'s CSV reader with arbitrary bytes: it must return
//! a run or a one-line error, never panic, and whatever numbers it accepts
//! must go through every statistic a figure is drawn from.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rtprobe::export::plot::{
    read::{ReadOptions, read_csv},
    stats,
};

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
                        assert_eq!(s.x.len(), s.values_ns.len());
                        let _ = stats::decimate_minmax(&s.x, &s.values_ns, 16);
                        let mut v = s.values_ns.clone();
                        v.sort_unstable();
                        if let Some(b) = stats::box_stats(&v) {
                            assert!(b.lower_whisker <= b.upper_whisker);
                        }
                        let _ = stats::cdf_points(&v, 16, true);
                        let _ = stats::percentile_curve(&v, 16);
                    }
                }
            }
            Err(e) => assert!(!e.to_string().contains('\n')),
        }
    }
});
