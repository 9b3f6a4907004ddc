//! The HdrHistogram interval log (`--hdr-log`): one histogram per report
//! interval and metric (tags `one-way` and `rtt`; values in ns, the max
//! column in ms), V2 deflate-compressed and base64-encoded, as HdrHistogram's
//! `HistogramLogProcessor`, HdrHistogram's plotters and `rtprobe plot` read
//! it. Written with the `hdrhistogram` crate's own log writer.
//!
//! The crate's writer borrows its file and serializer, so it lives on a
//! thread of its own that owns both; the probe run hands it each interval's
//! histogram and learns of a failed write at the next hand-over.
//!
//! The file only ever ends on a whole line: the crate writes a line in
//! pieces, so [`WholeLines`] holds them until the newline and, when the
//! disk is full half-way through a line, cuts the file back to the end of
//! the last whole one (ftruncate needs no free space). `rtprobe plot`
//! then reads every interval that was written.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result, anyhow};
use hdrhistogram::{
    Histogram,
    serialization::{
        V2DeflateSerializer,
        interval_log::{IntervalLogWriterBuilder, Tag},
    },
};

/// The tags rtprobe writes.
pub(crate) const TAG_ONE_WAY: &str = "one-way";
pub(crate) const TAG_RTT: &str = "rtt";

struct Entry {
    tag: &'static str,
    /// Interval start, from the log's BaseTime.
    start: Duration,
    len: Duration,
    hist: Histogram<u64>,
}

/// An interval log being written.
pub(crate) struct HdrLog {
    path: PathBuf,
    tx: Option<mpsc::SyncSender<Entry>>,
    thread: Option<JoinHandle<()>>,
    error: Arc<Mutex<Option<String>>>,
    intervals: u64,
}

/// Histograms waiting for the writer at most (it writes one a few times a
/// second; more waiting means the disk stalls, and the run is told so).
const QUEUE: usize = 64;

impl HdrLog {
    /// Creates the log at `path`, its StartTime and BaseTime `start`.
    pub(crate) fn create(path: &Path, start: SystemTime, comment: &str) -> Result<Self> {
        let file = File::create(path).with_context(|| {
            format!(
                "--hdr-log: cannot create {}: check the directory exists and is writable",
                path.display()
            )
        })?;
        let (tx, rx) = mpsc::sync_channel::<Entry>(QUEUE);
        let error = Arc::new(Mutex::new(None));
        let err = error.clone();
        let comment = comment.to_string();
        let thread = std::thread::Builder::new()
            .name("rtprobe-hdrlog".into())
            .spawn(move || {
                if let Err(e) = write_log(file, start, &comment, rx)
                    && let Ok(mut slot) = err.lock()
                {
                    *slot = Some(e);
                }
            })
            .context("spawn the HDR log writer")?;
        Ok(Self {
            path: path.to_path_buf(),
            tx: Some(tx),
            thread: Some(thread),
            error,
            intervals: 0,
        })
    }

    fn failure(&self) -> Option<String> {
        self.error.lock().ok().and_then(|e| e.clone()).map(|e| {
            format!(
                "HDR log {} ends after {} intervals: {e}",
                self.path.display(),
                self.intervals
            )
        })
    }

    /// Queues one interval's histogram. Errors once the writer failed.
    pub(crate) fn write(
        &mut self,
        tag: &'static str,
        start: Duration,
        len: Duration,
        hist: &Histogram<u64>,
    ) -> Result<()> {
        if let Some(e) = self.failure() {
            return Err(anyhow!(e));
        }
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| anyhow!("the HDR log is closed"))?;
        let entry = Entry {
            tag,
            start,
            len,
            hist: hist.clone(),
        };
        match tx.try_send(entry) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(_)) => {
                return Err(anyhow!(
                    "HDR log {}: the disk does not keep up ({QUEUE} intervals waiting)",
                    self.path.display()
                ));
            }
            Err(mpsc::TrySendError::Disconnected(_)) => {
                return Err(anyhow!(
                    self.failure()
                        .unwrap_or_else(|| "the HDR log writer stopped".into())
                ));
            }
        }
        if tag == TAG_ONE_WAY || tag == TAG_RTT {
            self.intervals += u64::from(tag == TAG_ONE_WAY);
        }
        Ok(())
    }

    /// Writes what is queued and closes the file.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.close();
        match self.failure() {
            Some(e) => Err(anyhow!(e)),
            None => Ok(()),
        }
    }

    fn close(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HdrLog {
    fn drop(&mut self) {
        self.close();
    }
}

/// A file that can be cut back to a length.
trait CutBack: Write {
    fn cut_back(&mut self, len: u64) -> std::io::Result<()>;
}

impl CutBack for File {
    fn cut_back(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)?;
        // The next write continues at the cut, not past it.
        std::io::Seek::seek(self, std::io::SeekFrom::Start(len)).map(|_| ())
    }
}

/// A writer that passes only whole lines to its file, and leaves the file
/// ending on the last whole line when a write fails.
struct WholeLines<F: CutBack> {
    file: F,
    /// Bytes of the current line not yet written.
    pending: Vec<u8>,
    /// Length of the file up to the end of its last whole line.
    committed: u64,
    /// A write failed: the file is cut back and takes nothing more.
    failed: bool,
}

impl<F: CutBack> WholeLines<F> {
    fn new(file: F) -> Self {
        Self {
            file,
            pending: Vec::new(),
            committed: 0,
            failed: false,
        }
    }

    /// Writes the pending whole lines; on failure cuts the file back to
    /// the last whole line and refuses further writes.
    fn commit_lines(&mut self) -> std::io::Result<()> {
        let Some(end) = self
            .pending
            .iter()
            .rposition(|&b| b == b'\n')
            .map(|i| i + 1)
        else {
            return Ok(());
        };
        if let Err(e) = self.file.write_all(&self.pending[..end]) {
            self.failed = true;
            // The file may hold part of these lines now: back to the last
            // whole one (a failed cut leaves the error to say so anyway).
            let _ = self.file.cut_back(self.committed);
            return Err(e);
        }
        self.committed += end as u64;
        self.pending.drain(..end);
        Ok(())
    }
}

impl<F: CutBack> Write for WholeLines<F> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.failed {
            return Err(std::io::Error::other(
                "an earlier write failed; the log ends on its last whole line",
            ));
        }
        self.pending.extend_from_slice(buf);
        if buf.contains(&b'\n') {
            self.commit_lines()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

fn write_log(
    file: File,
    start: SystemTime,
    comment: &str,
    rx: mpsc::Receiver<Entry>,
) -> Result<(), String> {
    let mut file = WholeLines::new(file);
    let mut serializer = V2DeflateSerializer::new();
    let mut log = IntervalLogWriterBuilder::new()
        .add_comment(comment)
        .add_comment("values in ns; the max column in ms; tags: one-way, rtt")
        .with_start_time(start)
        .with_base_time(start)
        .with_max_value_divisor(1e6)
        .begin_log_with(&mut file, &mut serializer)
        .map_err(|e| e.to_string())?;
    for e in rx {
        let tag = Tag::new(e.tag).ok_or_else(|| format!("bad tag {:?}", e.tag))?;
        log.write_histogram(&e.hist, e.start, e.len, Some(tag))
            .map_err(|e| match e {
                hdrhistogram::serialization::interval_log::IntervalLogWriterError::IoError(io) => {
                    io.to_string()
                }
                other => other.to_string(),
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use hdrhistogram::serialization::{
        Deserializer,
        interval_log::{IntervalLogIterator, LogEntry},
    };

    fn hist(values: &[u64]) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 100_000_000_000, 3).unwrap();
        for &v in values {
            h.record(v).unwrap();
        }
        h
    }

    #[test]
    fn intervals_round_trip_through_the_crates_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.hlog");
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_763_000_000);
        let mut log = HdrLog::create(&path, start, "rtprobe test").unwrap();
        let sec = Duration::from_secs(1);
        let intervals = [
            (vec![40_000u64, 41_000, 45_000], vec![90_000u64, 95_000]),
            (vec![1_500_000], vec![3_000_000]),
            (vec![], vec![]),
        ];
        for (i, (ow, rtt)) in intervals.iter().enumerate() {
            let at = sec * i as u32;
            log.write(TAG_ONE_WAY, at, sec, &hist(ow)).unwrap();
            log.write(TAG_RTT, at, sec, &hist(rtt)).unwrap();
        }
        log.finish().unwrap();

        let bytes = std::fs::read(&path).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with("#rtprobe test\n"), "{text}");
        let mut base_time = None;
        let mut got = Vec::new();
        let mut de = Deserializer::new();
        for entry in IntervalLogIterator::new(&bytes) {
            match entry.unwrap() {
                LogEntry::BaseTime(t) => base_time = Some(t),
                LogEntry::StartTime(_) => {}
                LogEntry::Interval(ilh) => {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(ilh.encoded_histogram())
                        .unwrap();
                    let h: Histogram<u64> = de.deserialize(&mut raw.as_slice()).unwrap();
                    got.push((
                        ilh.tag().unwrap().as_str().to_string(),
                        ilh.start_timestamp(),
                        ilh.duration(),
                        h.len(),
                        h.max(),
                        ilh.max(),
                    ));
                }
            }
        }
        assert_eq!(base_time, Some(Duration::from_secs(1_763_000_000)));
        assert_eq!(got.len(), 6);
        assert_eq!(got[0].0, "one-way");
        assert_eq!(got[1].0, "rtt");
        assert_eq!((got[0].1, got[0].2), (Duration::ZERO, sec));
        assert_eq!(got[2].1, sec);
        assert_eq!(got[0].3, 3);
        // 3 significant digits: 45 000 reads back as 45 000..45 055.
        assert!((45_000..45_100).contains(&got[0].4), "{}", got[0].4);
        assert_eq!(got[3].3, 1);
        assert!(
            (1.499..1.51).contains(&got[2].5),
            "max column in ms: {}",
            got[2].5
        );
        assert_eq!(got[4].3, 0, "an empty interval is written too");
    }

    /// A disk with room for `room` bytes: a write past it stores what
    /// fits and fails, as write(2) on a full filesystem does.
    struct SmallDisk {
        data: Vec<u8>,
        room: usize,
    }

    impl Write for SmallDisk {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.room - self.data.len());
            if n == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.data.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl CutBack for SmallDisk {
        fn cut_back(&mut self, len: u64) -> std::io::Result<()> {
            self.data.truncate(len as usize);
            Ok(())
        }
    }

    #[test]
    fn a_full_disk_leaves_the_log_on_its_last_whole_line() {
        for room in [10, 37, 38, 100, 250] {
            let mut w = WholeLines::new(SmallDisk {
                data: Vec::new(),
                room,
            });
            let mut failed = false;
            for i in 0..20 {
                // A line in pieces, as the crate's writer sends it.
                let r = write!(w, "Tag=rtt,{i:02}.000,1.000,")
                    .and_then(|()| w.write_all(b"HISTFAAAA\n"));
                if r.is_err() {
                    failed = true;
                    break;
                }
            }
            assert!(failed, "room {room}: the disk should fill");
            assert!(w.write(b"x\n").is_err(), "nothing after a failure");
            let data = &w.file.data;
            assert!(
                data.is_empty() || data.ends_with(b"\n"),
                "room {room}: ends mid-line: {:?}",
                String::from_utf8_lossy(data)
            );
            assert_eq!(data.len() % 31, 0, "whole lines only");
        }
    }

    #[test]
    fn a_full_disk_is_reported_at_the_next_interval() {
        let Ok(file) = File::options().write(true).open("/dev/full") else {
            eprintln!("SKIPPED: no /dev/full");
            return;
        };
        drop(file);
        let mut log = HdrLog::create(Path::new("/dev/full"), SystemTime::now(), "x").unwrap();
        let h = hist(&[5]);
        let mut failed = None;
        for i in 0..200 {
            if let Err(e) = log.write(
                TAG_ONE_WAY,
                Duration::from_secs(i),
                Duration::from_secs(1),
                &h,
            ) {
                failed = Some(e.to_string());
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let e = failed.expect("writes to /dev/full fail");
        assert!(e.contains("No space left on device"), "{e}");
        assert!(log.finish().is_err());
    }
}
