//! Summary files written whole or not at all: a temporary file in the same
//! directory, fsync, then rename over the target. A reader (or a run that
//! found the disk full) sees either the previous file or the new one,
//! never a truncated one.

use std::{
    fmt,
    io::Write,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

/// A file that was not replaced: what went wrong, and that the target
/// was left as it was.
#[derive(Debug)]
pub(crate) struct NotWritten {
    pub(crate) path: PathBuf,
    pub(crate) source: std::io::Error,
    /// Whether a file was at `path` before (it still is, unchanged).
    pub(crate) kept_previous: bool,
}

impl NotWritten {
    pub(crate) fn disk_full(&self) -> bool {
        is_disk_full(&self.source)
    }
}

/// ENOSPC and EDQUOT: nothing more fits, whatever the file.
pub(crate) fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

impl fmt::Display for NotWritten {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = if self.disk_full() {
            format!("disk full: {}", self.source)
        } else {
            self.source.to_string()
        };
        let before = if self.kept_previous {
            "the earlier file there is unchanged"
        } else {
            "no file left behind"
        };
        write!(f, "{}: not written ({why}; {before})", self.path.display())
    }
}

impl std::error::Error for NotWritten {}

/// Replaces `path` with `bytes`, or leaves it untouched and removes the
/// temporary file.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> Result<(), NotWritten> {
    let kept_previous = path.exists();
    let fail = |source| NotWritten {
        path: path.to_path_buf(),
        source,
        kept_previous,
    };
    let tmp = temp_path(path).map_err(fail)?;
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        // Data on disk before the name points at it: a crash after the
        // rename must not leave an empty file.
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    // The rename itself survives a crash once the directory is synced;
    // the file is complete either way, so this is best effort.
    if let Ok(d) = std::fs::File::open(dir_of(path)) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// `.NAME.PID.N.tmp` next to `path`: same filesystem (rename is atomic),
/// hidden, and unique between threads and processes.
fn temp_path(path: &Path) -> std::io::Result<PathBuf> {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
    })?;
    let tmp = format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    Ok(dir_of(path).join(tmp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        write(&p, b"{\"a\": 1}\n").unwrap();
        write(&p, b"{\"a\": 2}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"a\": 2}\n");
        assert_eq!(entries(dir.path()), ["out.json"]);
    }

    #[test]
    fn a_failed_write_keeps_the_previous_file_and_removes_the_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        std::fs::write(&p, "previous\n").unwrap();
        // A directory where the file should go: the rename fails after
        // the temporary was written.
        let blocked = dir.path().join("sub");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("x"), "").unwrap();
        let e = write(&blocked, b"new\n").unwrap_err();
        assert!(e.kept_previous);
        assert!(
            e.to_string()
                .starts_with(&format!("{}: not written (", blocked.display()))
        );
        assert_eq!(entries(dir.path()), ["out.json", "sub"]);
        // No directory at all: nothing is created.
        let e = write(&dir.path().join("nope/out.json"), b"x").unwrap_err();
        assert!(!e.kept_previous);
        assert!(e.to_string().ends_with("no file left behind)"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "previous\n");
    }

    #[test]
    fn a_full_device_is_told_as_disk_full() {
        let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(is_disk_full(&e));
        let nw = NotWritten {
            path: "out.json".into(),
            source: e,
            kept_previous: false,
        };
        assert!(
            nw.to_string()
                .starts_with("out.json: not written (disk full: "),
            "{nw}"
        );
    }
}
