//! The HdrHistogram interval log (`--hdr-log`): one histogram per report
//! interval and metric (tags `one-way` and `rtt`; values in ns, the max
//! column in ms), V2 deflate-compressed and base64-encoded, as HdrHistogram's
//! `HistogramLogProcessor`, HdrHistogram's plotters and `rtprobe plot` read
//! it. Written with the `hdrhistogram` crate's own log writer.
//!
//! The crate's writer borrows its file and serializer, so it lives on a
//! thread of its own that owns both; the probe run hands it each interval's
//! histogram and learns of a failed write at the next hand-over.

use std::{
    fs::File,
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
pub const TAG_ONE_WAY: &str = "one-way";
pub const TAG_RTT: &str = "rtt";

struct Entry {
    tag: &'static str,
    /// Interval start, from the log's BaseTime.
    start: Duration,
    len: Duration,
    hist: Histogram<u64>,
}

/// An interval log being written.
pub struct HdrLog {
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
    pub fn create(path: &Path, start: SystemTime, comment: &str) -> Result<Self> {
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
    pub fn write(
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
    pub fn finish(mut self) -> Result<()> {
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

fn write_log(
    mut file: File,
    start: SystemTime,
    comment: &str,
    rx: mpsc::Receiver<Entry>,
) -> Result<(), String> {
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
