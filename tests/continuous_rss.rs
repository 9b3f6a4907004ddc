//! The continuous-run memory bench's driver (prober/benches/continuous_rss)
//! accounts for every probe it drives: each ends received or lost, and
//! every fault it injected shows up under its own name in the run's
//! statistics. Without this its RSS figure could come from a run that
//! silently dropped work.

// The test reads the counts, not every figure the bench prints.
#[allow(dead_code)]
#[path = "../prober/benches/continuous_rss/driver.rs"]
mod driver;

#[test]
fn every_driven_probe_is_received_lost_or_named() {
    let dir = tempfile::tempdir().unwrap();
    let plan = driver::Plan {
        probes: 300_000,
        interval_ns: 1_000_000,
        dir: dir.path().to_path_buf(),
        rotate_bytes: 4 << 20,
        keep: 2,
        samples: 30,
    };
    let o = driver::drive(&plan).unwrap();
    let s = &o.summary;
    let i = o.injected;
    assert_eq!(o.output_error, None);
    assert_eq!(s.sent, o.driven, "one record per driven probe");
    assert_eq!(s.received + s.lost, s.sent);
    assert_eq!(
        s.lost,
        i.send_failed + i.forward_lost + i.late_arrivals,
        "{i:?}"
    );
    assert_eq!(o.late_arrivals, i.late_arrivals);
    assert_eq!(s.echo_lost, i.return_lost);
    assert_eq!(s.duplicates, i.duplicate_arrivals);
    assert_eq!(s.foreign_packets, i.foreign);
    assert_eq!(s.tx_timestamp_late, i.late_tx);
    assert_eq!(s.tx_timestamp_duplicates, i.duplicate_tx);
    assert_eq!(s.unaccounted, 0);
    // Reordering is what delayed arrivals cause (a delayed one can still
    // come first when its successors were lost or delayed too).
    assert!(
        s.reordered > 0 && s.reordered <= i.delayed,
        "{} of {}",
        s.reordered,
        i.delayed
    );
    // Every kind of fault was exercised.
    for (name, n) in [
        ("send failed", i.send_failed),
        ("forward lost", i.forward_lost),
        ("return lost", i.return_lost),
        ("late arrivals", i.late_arrivals),
        ("late TX", i.late_tx),
        ("duplicate TX", i.duplicate_tx),
        ("early TX", i.early_tx),
        ("foreign", i.foreign),
    ] {
        assert!(n > 0, "no {name} injected");
    }
    // The CSV took every record and rotated, keeping 2 rotated files + the
    // current one, besides the HDR log.
    assert_eq!(o.csv_rows, o.driven);
    assert!(o.rotations > 2, "{} rotations", o.rotations);
    assert_eq!(o.files, 4);
    assert!(o.hdr_log_bytes > 0);
    assert!(o.progress_calls > 0);
    assert!(o.rss_at_third().is_some() && o.rss_end().is_some());
}
