//! Fuzzes what `rtprobe run --check FILE` does with a scenario file: parse
//! and validate it (`Scenario::parse`, every cell through the one
//! validator), expand the matrix into cells and print the plan. It must
//! never panic: every bad file is a one-line error.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rtprobe::scenario::{Scenario, plan};

fuzz_target!(|data: &[u8]| {
    // The loader refuses non-UTF-8 text before the parser sees it.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Scenario::parse(Path::new("fuzz.toml"), text) {
        Ok(sc) => {
            let out_dir = Path::new("out");
            let cells = sc.cells(out_dir);
            // Without --set every cell of the matrix is kept.
            let matrix = sc.axes.sizes.len()
                * sc.axes.intervals.len()
                * sc.axes.xdp_modes.len()
                * sc.sets.len();
            assert_eq!(cells.len(), matrix);
            assert!(!cells.is_empty(), "an empty matrix must be an error");
            let _ = plan(&sc, &cells, out_dir, &[]);
        }
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(!msg.contains('\n'), "error of more than one line: {msg}");
        }
    }
});
