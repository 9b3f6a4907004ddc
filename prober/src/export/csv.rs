//! The per-probe CSV: one row per probe sent, header first, streamed and
//! flushed as the run goes so an interrupted run still leaves a valid file.
//!
//! Layout:
//! ```text
//! # rtprobe-meta: {"version":"0.1.0","xdp_mode_requested":"native",...}
//! seq,flow,size,sched_ns,send_ns,tx_ns,rx_ns,echo_ns,one_way_ns,rtt_ns,tx_src,rx_src,echo_src,ts_source,lost,turnaround_ns
//! 0,0,64,1763771234000000000,1763771234000001200,...,sw,sw,sw,sw,0,8210
//! ```
//! All `*_ns` times are CLOCK_REALTIME nanoseconds (the clock of the kernel's
//! software timestamps); `one_way_ns` and `rtt_ns` are differences. An empty
//! cell means "not available" (lost probe, missing timestamp).

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The first line of the CSV starts with this, followed by the [`RunMeta`] JSON.
pub const META_PREFIX: &str = "# rtprobe-meta: ";

/// The CSV header, in column order.
pub const HEADER: [&str; 16] = [
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
];

/// Where a timestamp came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TsSource {
    /// NIC hardware clock (SOF_TIMESTAMPING_RAW_HARDWARE).
    #[serde(rename = "hw")]
    Hardware,
    /// Kernel software timestamp (SOF_TIMESTAMPING_SOFTWARE).
    #[serde(rename = "sw")]
    Software,
    /// Both ends of a difference, one hardware and one software.
    #[serde(rename = "mixed")]
    Mixed,
}

impl TsSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TsSource::Hardware => "hw",
            TsSource::Software => "sw",
            TsSource::Mixed => "mixed",
        }
    }

    /// The source of a difference between two timestamps.
    pub fn combine(a: TsSource, b: TsSource) -> TsSource {
        if a == b { a } else { TsSource::Mixed }
    }
}

/// One probe, as written to the CSV.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub seq: u64,
    /// Flow id (0 unless several probe flows run at once).
    pub flow: u8,
    /// UDP payload bytes.
    pub size: u32,
    /// When the pacer meant to send it.
    pub sched_ns: i64,
    /// User-space clock just before sendmsg().
    pub send_ns: i64,
    /// Sender TX timestamp (kernel), if one arrived.
    pub tx_ns: Option<i64>,
    /// Receiver RX timestamp, if the probe arrived.
    pub rx_ns: Option<i64>,
    /// Sender RX timestamp of the echo, if it came back.
    pub echo_ns: Option<i64>,
    /// rx_ns - tx_ns.
    pub one_way_ns: Option<i64>,
    /// echo_ns - tx_ns.
    pub rtt_ns: Option<i64>,
    pub tx_src: Option<TsSource>,
    pub rx_src: Option<TsSource>,
    pub echo_src: Option<TsSource>,
    /// Source of the one-way figure (or of the RTT if only that exists).
    pub ts_source: Option<TsSource>,
    /// The probe never reached the receiver.
    pub lost: bool,
    /// Reflector turnaround: its clock before sending the echo minus the
    /// probe's (software) RX timestamp. `rtt_ns - turnaround_ns` is the RTT
    /// of the path without the user-space reflector in it. Last column, so
    /// readers of the first fifteen are unaffected.
    #[serde(default)]
    pub turnaround_ns: Option<i64>,
}

/// Run metadata stored as the CSV's first line, so plots can be titled
/// without flags. Every field is optional on read (older or foreign CSVs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunMeta {
    pub version: String,
    /// RFC 3339 start time.
    pub started_at: String,
    pub label: Option<String>,
    /// "veth" (self-built namespaces) or "nic-pair".
    pub testbed: String,
    /// Unique id of the run's testbed: its namespaces are `rtprobe-<id>-<role>`.
    pub testbed_id: String,
    pub tx_if: Option<String>,
    pub rx_if: Option<String>,
    pub xdp_mode_requested: String,
    pub xdp_mode_attached: String,
    pub xdp_action: String,
    pub size: u32,
    pub interval_ns: u64,
    pub count: Option<u64>,
    pub duration_ns: Option<u64>,
    pub tos: u8,
    pub port: u16,
    pub timestamps_requested: String,
    /// Flows probed alongside the main one (flow id, port, tos, size, interval_ns).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_flows: Vec<serde_json::Value>,
    /// Knobs applied for this run (qdisc, BQL, load...), by name.
    pub knobs: serde_json::Map<String, serde_json::Value>,
}

/// Streams [`ProbeRecord`]s to a CSV file, flushing after every row so an
/// interrupted run leaves every row written so far.
pub struct CsvWriter {
    out: BufWriter<File>,
    rows: u64,
    line: String,
}

impl CsvWriter {
    pub fn create(path: &Path, meta: &RunMeta) -> Result<Self> {
        let file = File::create(path).with_context(|| {
            format!(
                "cannot create {}: check the directory exists and is writable",
                path.display()
            )
        })?;
        let mut out = BufWriter::new(file);
        writeln!(out, "{META_PREFIX}{}", serde_json::to_string(meta)?)?;
        writeln!(out, "{}", HEADER.join(","))?;
        out.flush()?;
        Ok(Self {
            out,
            rows: 0,
            line: String::with_capacity(256),
        })
    }

    /// Appends one row. Written by hand (not serde) because it is on the
    /// per-probe path; `format_row` is what the reader is tested against.
    pub fn write(&mut self, r: &ProbeRecord) -> Result<()> {
        self.line.clear();
        format_row(&mut self.line, r);
        self.out.write_all(self.line.as_bytes())?;
        self.rows += 1;
        Ok(())
    }

    /// Flush buffered rows to the file (done by the caller on a timer and at the end).
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }
}

impl Drop for CsvWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
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
    if let Some(t) = r.turnaround_ns {
        let _ = write!(line, "{t}");
    }
    line.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        format_row(&mut s, &r);
        assert_eq!(s, "7,0,64,100,110,120,150,,30,,sw,hw,,mixed,0,9\n");
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
        assert_eq!(lines.next().unwrap(), "0,0,0,0,0,,,,,,,,,,1,");
        assert!(lines.next().is_none());
    }
}
