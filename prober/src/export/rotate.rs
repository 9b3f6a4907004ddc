//! Rotation of a streamed output: `out.csv` is the file being written,
//! `out.csv.1` the one before it, up to `out.csv.N` (`--out-keep N`); older
//! files are deleted, so a run of any length stays bounded on disk.

use std::{
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::export::plan::{Rotate, Rotation};

/// The rotated family of one output path.
#[derive(Debug, Clone)]
pub(crate) struct Rotated {
    path: PathBuf,
    rotation: Rotation,
}

impl Rotated {
    pub(crate) fn new(path: &Path, rotation: Rotation) -> Self {
        Self {
            path: path.to_path_buf(),
            rotation,
        }
    }

    /// `out.csv.N`.
    pub(crate) fn sibling(&self, n: u32) -> PathBuf {
        let mut s = self.path.clone().into_os_string();
        s.push(format!(".{n}"));
        PathBuf::from(s)
    }

    /// Whether a file that has `bytes` (and would grow by `next` bytes) and
    /// is `age` old must be rotated before the next write. A file always
    /// holds at least one row, so a huge row cannot rotate forever.
    pub(crate) fn due(&self, bytes: u64, next: u64, rows: u64, age: Duration) -> bool {
        rows > 0
            && match self.rotation.when {
                Rotate::Bytes(max) => bytes + next > max,
                Rotate::Every(period) => age >= period,
            }
    }

    /// Removes `out.csv.1`, `out.csv.2`... left by an earlier run, which a
    /// new run would otherwise mix with its own (the earlier `out.csv` is
    /// truncated by the new run all the same).
    pub(crate) fn clear_earlier_run(&self) -> io::Result<()> {
        for n in 1.. {
            match std::fs::remove_file(self.sibling(n)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Shifts the family by one: `out.csv.(N-1)` replaces `out.csv.N` (the
    /// oldest goes), ..., `out.csv` becomes `out.csv.1`. The caller then
    /// creates a new `out.csv`.
    pub(crate) fn shift(&self) -> io::Result<()> {
        for n in (1..self.rotation.keep).rev() {
            match std::fs::rename(self.sibling(n), self.sibling(n + 1)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        std::fs::rename(&self.path, self.sibling(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shift_keeps_n_files_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.csv");
        let r = Rotated::new(
            &p,
            Rotation {
                when: Rotate::Bytes(100),
                keep: 2,
            },
        );
        std::fs::write(r.sibling(7), "stale").unwrap();
        std::fs::write(r.sibling(1), "stale").unwrap();
        r.clear_earlier_run().unwrap();
        assert!(!r.sibling(1).exists());
        assert!(r.sibling(7).exists(), "not contiguous: left alone");
        for g in 0..4 {
            std::fs::write(&p, format!("gen{g}")).unwrap();
            r.shift().unwrap();
        }
        std::fs::write(&p, "gen4").unwrap();
        let read = |q: PathBuf| std::fs::read_to_string(q).unwrap();
        assert_eq!(read(p.clone()), "gen4");
        assert_eq!(read(r.sibling(1)), "gen3");
        assert_eq!(read(r.sibling(2)), "gen2");
        assert!(!r.sibling(3).exists(), "only 2 rotated files kept");
        assert_eq!(r.sibling(1).file_name().unwrap(), "out.csv.1");
    }

    #[test]
    fn due_by_size_or_age_never_on_an_empty_file() {
        let by_size = Rotated::new(
            Path::new("x"),
            Rotation {
                when: Rotate::Bytes(1000),
                keep: 1,
            },
        );
        assert!(!by_size.due(990, 10, 5, Duration::ZERO));
        assert!(by_size.due(990, 11, 5, Duration::ZERO));
        assert!(!by_size.due(5000, 11, 0, Duration::ZERO), "no row yet");
        let by_age = Rotated::new(
            Path::new("x"),
            Rotation {
                when: Rotate::Every(Duration::from_secs(60)),
                keep: 1,
            },
        );
        assert!(!by_age.due(1 << 40, 10, 5, Duration::from_secs(59)));
        assert!(by_age.due(0, 10, 5, Duration::from_secs(60)));
    }
}
