//! The per-probe CSV: one row per probe sent, header first, streamed and
//! flushed as the run goes so an interrupted run still leaves a valid file.
//!
//! Layout:
//! ```text
//! # rtprobe-meta: {"version":"0.1.0","xdp_mode_requested":"native",...}
//! seq,flow,size,sched_ns,send_ns,tx_ns,rx_ns,echo_ns,one_way_ns,rtt_ns,tx_src,rx_src,echo_src,ts_source,lost,turnaround_ns,start_src,tx_sched_ns,...,return_ns
//! 0,0,64,1763771234000000000,1763771234000001200,...,sw,sw,sw,sw,0,8210,sched,...
//! ```
//! All stamps are CLOCK_REALTIME nanoseconds (the clock of the kernel's
//! software timestamps; hardware stamps converted from the NIC's PHC);
//! `one_way_ns`, `rtt_ns` and the stage columns are differences. An empty
//! cell means "not available" (lost probe, missing timestamp). See [`HEADER`]
//! for the column order and [`ProbeRecord`] for each column's meaning.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context, Result};

use super::{plan::Rotation, rotate::Rotated};
use crate::model::{
    meta::RunMeta,
    record::{ProbeRecord, RecordSink, TsSource},
};

/// The first line of the CSV starts with this, followed by the [`RunMeta`] JSON.
pub const META_PREFIX: &str = "# rtprobe-meta: ";

/// The CSV header, in column order. The first sixteen columns are the
/// layout of rtprobe before the stamp chain (same names, same meaning for
/// `tx_ns`, `rx_ns`, `echo_ns`); the chain's stamps and stages follow.
pub const HEADER: [&str; 34] = [
    "seq",
    "flow",
    "size",
    "sched_ns",
    "send_ns",
    "tx_ns",
    "rx_ns",
    "echo_ns",
    "one_way_ns",
    "rtt_ns",
    "tx_src",
    "rx_src",
    "echo_src",
    "ts_source",
    "lost",
    "turnaround_ns",
    "start_src",
    "tx_sched_ns",
    "tx_hw_ns",
    "rx_hw_ns",
    "rx_user_ns",
    "echo_send_ns",
    "echo_tx_sched_ns",
    "echo_tx_ns",
    "echo_tx_hw_ns",
    "echo_hw_ns",
    "echo_user_ns",
    "stack_ns",
    "sender_queue_ns",
    "driver_ns",
    "path_ns",
    "receiver_ns",
    "reflector_ns",
    "return_ns",
];

/// Rows gathered before they are handed to the kernel in one write.
const BUF_BYTES: usize = 64 * 1024;

/// Streams [`ProbeRecord`]s to a CSV file, flushed by the caller a few
/// times a second so an interrupted run leaves every row written so far.
///
/// With a [`Rotation`] the file is rotated by size or age (see
/// [`super::rotate`]); every file starts with the metadata and header.
/// When a write fails (disk full) the writer keeps every whole row the
/// kernel took and cuts off a torn last one; when the file disappears it
/// stops with the rows handed over. Every later call returns the same
/// error, which names the file, what it holds and where it stops:
/// "out.csv: disk full after 42000 rows, the rows written are whole (CSV
/// ends at probe 41999: No space left on device (os error 28))".
pub struct CsvWriter {
    path: PathBuf,
    /// The metadata and header lines every file starts with.
    head: String,
    out: Option<File>,
    /// Rows not yet handed to the kernel, whole rows only, so that what
    /// the file holds always ends on a row this writer knows.
    buf: Vec<u8>,
    /// Where each row in `buf` ends, and its seq: after a short write the
    /// rows that made it whole are known without parsing.
    buf_rows: Vec<(usize, u64)>,
    /// (device, inode) of the file being written, to notice it removed.
    id: (u64, u64),
    rotated: Option<Rotated>,
    opened: Instant,
    /// Rows taken, in all files.
    rows: u64,
    /// Rows in the current file, and its bytes (head included).
    file_rows: u64,
    file_bytes: u64,
    /// What the last successful flush put in the kernel's hands.
    flushed_bytes: u64,
    flushed_rows: u64,
    flushed_seq: Option<u64>,
    rotations: u64,
    failed: Option<String>,
    line: String,
    /// Rows end with the target's name (a run with several targets).
    target_column: bool,
}

impl CsvWriter {
    pub fn create(path: &Path, meta: &RunMeta) -> Result<Self> {
        Self::create_rotated(path, meta, None)
    }

    /// A CSV that starts a new file as `rotation` says (None: never).
    pub fn create_rotated(path: &Path, meta: &RunMeta, rotation: Option<Rotation>) -> Result<Self> {
        Self::create_with(path, meta, rotation, false)
    }

    /// The CSV of a run with several targets: [`HEADER`] and a last
    /// column, `target`, the name of the target each row is of.
    pub(crate) fn create_for_targets(
        path: &Path,
        meta: &RunMeta,
        rotation: Option<Rotation>,
    ) -> Result<Self> {
        Self::create_with(path, meta, rotation, true)
    }

    fn create_with(
        path: &Path,
        meta: &RunMeta,
        rotation: Option<Rotation>,
        target_column: bool,
    ) -> Result<Self> {
        let head = format!(
            "{META_PREFIX}{}\n{}{}\n",
            serde_json::to_string(meta)?,
            HEADER.join(","),
            if target_column { ",target" } else { "" }
        );
        let rotated = rotation.map(|r| Rotated::new(path, r));
        if let Some(r) = &rotated {
            r.clear_earlier_run().with_context(|| {
                format!(
                    "cannot remove the rotated files of an earlier run next to {}",
                    path.display()
                )
            })?;
        }
        let mut w = Self {
            path: path.to_path_buf(),
            head,
            out: None,
            buf: Vec::with_capacity(BUF_BYTES + 512),
            buf_rows: Vec::with_capacity(BUF_BYTES / 64),
            id: (0, 0),
            rotated,
            opened: Instant::now(),
            rows: 0,
            file_rows: 0,
            file_bytes: 0,
            flushed_bytes: 0,
            flushed_rows: 0,
            flushed_seq: None,
            rotations: 0,
            failed: None,
            line: String::with_capacity(256),
            target_column,
        };
        w.open().with_context(|| {
            format!(
                "cannot create {}: check the directory exists and is writable",
                path.display()
            )
        })?;
        Ok(w)
    }

    /// Creates the file at `path` and writes the head.
    fn open(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let mut out = File::create(&self.path)?;
        let md = out.metadata()?;
        out.write_all(self.head.as_bytes())?;
        self.id = (md.dev(), md.ino());
        self.out = Some(out);
        self.opened = Instant::now();
        self.file_rows = 0;
        self.file_bytes = self.head.len() as u64;
        self.flushed_bytes = self.file_bytes;
        Ok(())
    }

    /// Hands the buffered rows to the kernel. On success every one of them
    /// is in the file; on a failure the file keeps the whole rows the
    /// kernel took (see [`Self::fail`]).
    fn write_out(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let Some(out) = self.out.as_mut() else {
            let e = std::io::Error::other("the CSV is not open");
            return Err(self.fail(0, &e));
        };
        // By hand, not write_all: on a full disk the kernel takes part of
        // the buffer, and the whole rows in that part are kept.
        let mut done = 0;
        while done < self.buf.len() {
            match out.write(&self.buf[done..]) {
                Ok(0) => {
                    let e = std::io::Error::from(std::io::ErrorKind::WriteZero);
                    return Err(self.fail(done, &e));
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.fail(done, &e)),
            }
        }
        self.flushed_bytes += self.buf.len() as u64;
        self.flushed_rows += self.buf_rows.len() as u64;
        self.flushed_seq = self.buf_rows.last().map(|r| r.1).or(self.flushed_seq);
        self.buf.clear();
        self.buf_rows.clear();
        Ok(())
    }

    /// Stops writing for good. `taken` bytes of the buffer reached the
    /// file: its whole rows are kept and a torn last one is cut off. The
    /// message names the file, what it holds and where it ends.
    fn fail(&mut self, taken: usize, e: &std::io::Error) -> anyhow::Error {
        let whole = whole_rows(&self.buf_rows, taken);
        let keep_bytes = whole.checked_sub(1).map_or(0, |i| self.buf_rows[i].0);
        self.flushed_bytes += keep_bytes as u64;
        self.flushed_rows += whole as u64;
        if whole > 0 {
            self.flushed_seq = Some(self.buf_rows[whole - 1].1);
        }
        if let Some(file) = self.out.take() {
            // Cutting back frees nothing on a full disk (the blocks are
            // the same), but the file then ends on a whole row.
            let _ = file.set_len(self.flushed_bytes);
        }
        self.buf.clear();
        self.buf_rows.clear();
        let what = if super::atomic::is_disk_full(e) {
            "disk full"
        } else {
            "write failed"
        };
        self.stop_with(what, e.to_string())
    }

    /// Stops writing for good with the rows flushed so far: `what`
    /// happened ("disk full"), `why` is the detail.
    fn stop_with(&mut self, what: &str, why: String) -> anyhow::Error {
        self.buf.clear();
        self.buf_rows.clear();
        let (path, rows) = (self.path.display(), self.flushed_rows);
        let msg = match self.flushed_seq {
            Some(seq) => format!(
                "{path}: {what} after {rows} rows, the rows written are whole (CSV ends at \
                 probe {seq}: {why})"
            ),
            None => format!(
                "{path}: {what} before the first row: it holds the metadata and header only \
                 ({why})"
            ),
        };
        self.failed = Some(msg.clone());
        anyhow::anyhow!(msg)
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(m) => Err(anyhow::anyhow!("{m}")),
            None => Ok(()),
        }
    }

    /// Appends one row. Written by hand (not serde) because it is on the
    /// per-probe path; `format_row` is what the reader is tested against.
    pub fn write(&mut self, r: &ProbeRecord) -> Result<()> {
        self.write_row(None, r)
    }

    /// Appends one row of target `target` (its `target` cell; empty
    /// without one). A CSV without the column ignores the name.
    pub(crate) fn write_for(&mut self, target: &str, r: &ProbeRecord) -> Result<()> {
        self.write_row(Some(target), r)
    }

    fn write_row(&mut self, target: Option<&str>, r: &ProbeRecord) -> Result<()> {
        self.check()?;
        self.line.clear();
        format_row(&mut self.line, r);
        if self.target_column {
            self.line.pop();
            self.line.push(',');
            self.line.push_str(target.unwrap_or(""));
            self.line.push('\n');
        }
        let len = self.line.len() as u64;
        if self
            .rotated
            .as_ref()
            .is_some_and(|rot| rot.due(self.file_bytes, len, self.file_rows, self.opened.elapsed()))
        {
            self.rotate()?;
        }
        self.buf.extend_from_slice(self.line.as_bytes());
        self.buf_rows.push((self.buf.len(), r.seq));
        self.rows += 1;
        self.file_rows += 1;
        self.file_bytes += len;
        if self.buf.len() >= BUF_BYTES {
            self.write_out()?;
        }
        Ok(())
    }

    /// Hands buffered rows to the kernel (done by the caller on a timer and
    /// at the end), and checks that the file is still there.
    pub fn flush(&mut self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        self.check()?;
        let same = std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id);
        if !same {
            // Nobody can open the file any more: the CSV ended with the
            // last rows handed to it.
            drop(self.out.take());
            return Err(self.stop_with(
                "removed or replaced during the run",
                "nothing more can be added to it".into(),
            ));
        }
        self.write_out()?;
        Ok(())
    }

    /// Closes the current file as `out.csv.1` (shifting the older ones)
    /// and starts a new `out.csv`.
    fn rotate(&mut self) -> Result<()> {
        self.flush()?;
        drop(self.out.take());
        let shifted = match &self.rotated {
            Some(r) => r.shift(),
            None => Ok(()),
        };
        if let Err(e) = shifted.and_then(|()| self.open()) {
            return Err(self.stop_with("rotation failed", e.to_string()));
        }
        self.rotations += 1;
        Ok(())
    }

    /// Rows in the CSV: all rows taken, or after a failure the rows the
    /// files keep.
    pub fn rows(&self) -> u64 {
        if self.failed.is_some() {
            self.flushed_rows
        } else {
            self.rows
        }
    }

    /// How many times the CSV was rotated.
    pub fn rotations(&self) -> u64 {
        self.rotations
    }
}

impl RecordSink for CsvWriter {
    fn write(&mut self, r: &ProbeRecord) -> Result<()> {
        CsvWriter::write(self, r)
    }
    fn write_for(&mut self, target: &str, r: &ProbeRecord) -> Result<()> {
        CsvWriter::write_for(self, target, r)
    }
    fn flush(&mut self) -> Result<()> {
        CsvWriter::flush(self)
    }
}

/// One CSV written by several concurrent flows (rows carry their flow id).
impl RecordSink for &std::sync::Mutex<CsvWriter> {
    fn write(&mut self, r: &ProbeRecord) -> Result<()> {
        self.lock()
            .map_err(|_| anyhow::anyhow!("CSV writer poisoned"))?
            .write(r)
    }
    fn flush(&mut self) -> Result<()> {
        self.lock()
            .map_err(|_| anyhow::anyhow!("CSV writer poisoned"))?
            .flush()
    }
}

impl Drop for CsvWriter {
    fn drop(&mut self) {
        if self.failed.is_none() {
            let _ = self.write_out();
        }
    }
}

/// How many of the buffered rows (end offset, seq) lie wholly within the
/// first `taken` bytes.
fn whole_rows(rows: &[(usize, u64)], taken: usize) -> usize {
    rows.partition_point(|r| r.0 <= taken)
}

/// Formats one CSV row (with trailing newline) into `line`.
pub fn format_row(line: &mut String, r: &ProbeRecord) {
    use std::fmt::Write as _;
    fn opt(line: &mut String, v: Option<i64>) {
        if let Some(v) = v {
            let _ = write!(line, "{v}");
        }
        line.push(',');
    }
    fn src(line: &mut String, v: Option<TsSource>) {
        if let Some(v) = v {
            line.push_str(v.as_str());
        }
        line.push(',');
    }
    let _ = write!(
        line,
        "{},{},{},{},{},",
        r.seq, r.flow, r.size, r.sched_ns, r.send_ns
    );
    opt(line, r.tx_ns);
    opt(line, r.rx_ns);
    opt(line, r.echo_ns);
    opt(line, r.one_way_ns);
    opt(line, r.rtt_ns);
    src(line, r.tx_src);
    src(line, r.rx_src);
    src(line, r.echo_src);
    src(line, r.ts_source);
    line.push(if r.lost { '1' } else { '0' });
    line.push(',');
    opt(line, r.turnaround_ns);
    if let Some(s) = r.start_src {
        line.push_str(s.as_str());
    }
    line.push(',');
    for v in [
        r.tx_sched_ns,
        r.tx_hw_ns,
        r.rx_hw_ns,
        r.rx_user_ns,
        r.echo_send_ns,
        r.echo_tx_sched_ns,
        r.echo_tx_ns,
        r.echo_tx_hw_ns,
        r.echo_hw_ns,
        r.echo_user_ns,
        r.stack_ns,
        r.sender_queue_ns,
        r.driver_ns,
        r.path_ns,
        r.receiver_ns,
        r.reflector_ns,
    ] {
        opt(line, v);
    }
    if let Some(v) = r.return_ns {
        let _ = write!(line, "{v}");
    }
    line.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::StartSrc;

    #[test]
    fn row_format() {
        let mut s = String::new();
        let r = ProbeRecord {
            seq: 7,
            flow: 0,
            size: 64,
            sched_ns: 100,
            send_ns: 110,
            tx_ns: Some(120),
            rx_ns: Some(150),
            echo_ns: None,
            one_way_ns: Some(30),
            rtt_ns: None,
            tx_src: Some(TsSource::Software),
            rx_src: Some(TsSource::Hardware),
            echo_src: None,
            ts_source: Some(TsSource::Mixed),
            lost: false,
            turnaround_ns: Some(9),
            start_src: Some(StartSrc::Sched),
            tx_sched_ns: Some(112),
            path_ns: Some(30),
            return_ns: Some(-4),
            ..Default::default()
        };
        format_row(&mut s, &r);
        assert_eq!(
            s,
            "7,0,64,100,110,120,150,,30,,sw,hw,,mixed,0,9,sched,112,,,,,,,,,,,,,30,,,-4\n"
        );
        assert_eq!(s.trim_end().split(',').count(), HEADER.len());
    }

    #[test]
    fn writer_streams_meta_header_rows() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.csv");
        let meta = RunMeta {
            version: "x".into(),
            size: 64,
            ..Default::default()
        };
        {
            let mut w = CsvWriter::create(&p, &meta).unwrap();
            w.write(&ProbeRecord {
                seq: 0,
                lost: true,
                ..Default::default()
            })
            .unwrap();
            w.flush().unwrap();
            assert_eq!(w.rows(), 1);
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let mut lines = text.lines();
        let m = lines.next().unwrap().strip_prefix(META_PREFIX).unwrap();
        let back: RunMeta = serde_json::from_str(m).unwrap();
        assert_eq!(back.size, 64);
        assert_eq!(lines.next().unwrap(), HEADER.join(","));
        assert_eq!(
            lines.next().unwrap(),
            "0,0,0,0,0,,,,,,,,,,1,,,,,,,,,,,,,,,,,,,"
        );
        assert!(lines.next().is_none());
    }

    #[test]
    fn a_run_with_several_targets_adds_a_last_target_column() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.csv");
        let mut w = CsvWriter::create_for_targets(&p, &RunMeta::default(), None).unwrap();
        let r = ProbeRecord {
            seq: 3,
            lost: true,
            ..Default::default()
        };
        w.write_for("db-1", &r).unwrap();
        w.flush().unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines[0], format!("{},target", HEADER.join(",")));
        assert_eq!(lines[1], "3,0,0,0,0,,,,,,,,,,1,,,,,,,,,,,,,,,,,,,,db-1");
        // A CSV without the column ignores the name: the testbed's columns stay.
        let q = dir.path().join("q.csv");
        let mut w = CsvWriter::create(&q, &RunMeta::default()).unwrap();
        w.write_for("db-1", &r).unwrap();
        w.flush().unwrap();
        let text = std::fs::read_to_string(&q).unwrap();
        assert_eq!(
            text.lines().nth(2).unwrap().split(',').count(),
            HEADER.len()
        );
    }

    fn rows_of(p: &Path) -> Vec<u64> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .skip(2)
            .map(|l| l.split(',').next().unwrap().parse().unwrap())
            .collect()
    }

    #[test]
    fn rotation_starts_every_file_with_meta_and_header() {
        use crate::export::plan::{Rotate, Rotation};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.csv");
        let meta = RunMeta {
            size: 64,
            ..Default::default()
        };
        let head_len = {
            let w = CsvWriter::create(&p, &meta).unwrap();
            w.head.len() as u64
        };
        // Room for the head and 10 rows of "N,0,0,0,0,,,...\n" (36-37 bytes).
        let rotation = Rotation {
            when: Rotate::Bytes(head_len + 10 * 37),
            keep: 2,
        };
        let mut w = CsvWriter::create_rotated(&p, &meta, Some(rotation)).unwrap();
        for seq in 0..45 {
            w.write(&ProbeRecord {
                seq,
                ..Default::default()
            })
            .unwrap();
        }
        w.flush().unwrap();
        assert_eq!(w.rows(), 45);
        assert!(w.rotations() >= 3, "{}", w.rotations());
        let r = super::super::rotate::Rotated::new(&p, rotation);
        assert!(!r.sibling(3).exists(), "keep 2");
        let (older, old, new) = (rows_of(&r.sibling(2)), rows_of(&r.sibling(1)), rows_of(&p));
        assert_eq!(older.last().unwrap() + 1, old[0]);
        assert_eq!(old.last().unwrap() + 1, new[0]);
        assert_eq!(*new.last().unwrap(), 44);
        for f in [r.sibling(2), r.sibling(1), p.clone()] {
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(text.starts_with(META_PREFIX), "{}", f.display());
            assert_eq!(text.lines().nth(1).unwrap(), HEADER.join(","));
            assert!(std::fs::metadata(&f).unwrap().len() <= head_len + 10 * 37);
        }
    }

    #[test]
    fn a_removed_csv_says_where_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.csv");
        let mut w = CsvWriter::create(&p, &RunMeta::default()).unwrap();
        for seq in 0..5 {
            w.write(&ProbeRecord {
                seq,
                ..Default::default()
            })
            .unwrap();
        }
        w.flush().unwrap();
        std::fs::remove_file(&p).unwrap();
        w.write(&ProbeRecord {
            seq: 5,
            ..Default::default()
        })
        .unwrap();
        let e = w.flush().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "{}: removed or replaced during the run after 5 rows, the rows written are whole \
                 (CSV ends at probe 4: ",
                p.display()
            )),
            "{e}"
        );
        let again = w
            .write(&ProbeRecord {
                seq: 6,
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(again.to_string(), e, "every later call says the same");
        assert_eq!(w.rows(), 5);
    }

    #[test]
    fn a_short_write_keeps_the_rows_it_holds_whole() {
        let rows = [(37, 0), (74, 1), (112, 2)];
        assert_eq!(whole_rows(&rows, 0), 0);
        assert_eq!(whole_rows(&rows, 36), 0);
        assert_eq!(whole_rows(&rows, 37), 1);
        assert_eq!(whole_rows(&rows, 111), 2);
        assert_eq!(whole_rows(&rows, 112), 3);
    }

    #[test]
    fn dev_full_fails_at_creation_with_the_reason() {
        if !Path::new("/dev/full").exists() {
            eprintln!("SKIPPED: no /dev/full");
            return;
        }
        let Err(e) = CsvWriter::create(Path::new("/dev/full"), &RunMeta::default()) else {
            panic!("the head cannot be written to /dev/full");
        };
        assert!(
            format!("{e:#}").contains("No space left on device"),
            "{e:#}"
        );
    }

    /// A real full disk: a 64 KiB tmpfs. The CSV is cut back to its last
    /// flushed row and the error names that row.
    #[test]
    #[ignore = "needs root: run by cargo xtask test"]
    fn a_full_disk_cuts_the_csv_back_to_a_whole_row() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "root test without root under CI"
            );
            eprintln!("SKIPPED a_full_disk_cuts_the_csv_back_to_a_whole_row: needs root");
            return;
        }
        struct Unmount(std::path::PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = nix::mount::umount(&self.0);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        nix::mount::mount(
            Some("rtprobe-cont-unit"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=64k"),
        )
        .unwrap();
        let _u = Unmount(dir.path().to_path_buf());
        let p = dir.path().join("out.csv");
        let mut w = CsvWriter::create(&p, &RunMeta::default()).unwrap();
        let mut err = None;
        for seq in 0..100_000 {
            let r = w
                .write(&ProbeRecord {
                    seq,
                    send_ns: 1_763_000_000_000_000_000,
                    ..Default::default()
                })
                .and_then(|()| if seq % 100 == 99 { w.flush() } else { Ok(()) });
            if let Err(e) = r {
                err = Some(e.to_string());
                break;
            }
        }
        let e = err.expect("a 64 KiB disk fills up");
        assert!(e.contains("No space left on device"), "{e}");
        assert!(e.contains("disk full after"), "{e}");
        let n: u64 = e
            .split("CSV ends at probe ")
            .nth(1)
            .and_then(|t| t.split(':').next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{e}"));
        let rows = rows_of(&p);
        assert_eq!(
            *rows.last().unwrap(),
            n,
            "the file ends at the row the error names"
        );
        assert_eq!(rows.len() as u64, n + 1);
        assert_eq!(w.rows(), n + 1);
        assert!(std::fs::read_to_string(&p).unwrap().ends_with('\n'));
        // Every row that fit was kept: the file fills the disk but for
        // less than a page (tmpfs counts whole pages) and a row.
        let len = std::fs::metadata(&p).unwrap().len();
        eprintln!("CSV on a 64 KiB tmpfs: {len} bytes, {} rows", n + 1);
        assert!(len > 64 * 1024 - 4096 - 64, "{len}");
    }
}
