//! Helpers for the tests of runs with several targets (`--targets FILE`):
//! the outputs of one run, read back.

use std::path::{Path, PathBuf};

use super::read_summary;

/// One run of `rtprobe --targets FILE` in namespace A (as root: the file
/// and outputs are in a private temporary directory).
pub struct MultiRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub json: serde_json::Value,
    /// Data rows; the last cell is the `target` column.
    pub rows: Vec<Vec<String>>,
    pub header: String,
    /// User + system CPU of the run (its process tree), seconds.
    pub cpu_s: f64,
    pub wall_s: f64,
}

pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

pub fn read_run(dir: &Path, o: std::process::Output, cpu_s: f64, wall_s: f64) -> MultiRun {
    let text = std::fs::read_to_string(dir.join("out.csv")).unwrap_or_default();
    let mut lines = text.lines().skip(1);
    let header = lines.next().unwrap_or_default().to_string();
    let rows = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    MultiRun {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        json: read_summary(&dir.join("out.json")),
        rows,
        header,
        cpu_s,
        wall_s,
    }
}

pub fn target_of<'a>(j: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    j["extra"]["targets"]
        .as_array()
        .unwrap_or_else(|| panic!("no extra.targets: {j}"))
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no target {name}: {j}"))
}

pub fn col(header: &str, name: &str) -> usize {
    header
        .split(',')
        .position(|c| c == name)
        .unwrap_or_else(|| panic!("no {name} column: {header}"))
}
