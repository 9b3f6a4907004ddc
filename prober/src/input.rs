//! Files the user names and rtprobe reads whole (scenario and sweep TOML,
//! key files, bench-forward reports, its own testbed records): each is read
//! with a size cap, so a wrong path (a disk image, /dev/zero, a multi-GB
//! log) costs at most the cap in memory, and text must be UTF-8. Every
//! refusal is one line that names the file and says what to do.
//!
//! Streamed inputs (probe CSVs, HDR logs) are read a row at a time; a CSV
//! reader holds a whole row, so [`LineCapped`] bounds how long one may be.

use std::{
    fmt,
    io::Read,
    path::{Path, PathBuf},
};

/// Largest scenario or bench-forward sweep file read: the shipped ones are
/// a few KB, and the parser's memory grows with the text.
pub(crate) const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Largest STAMP key file read (HMAC-SHA-256 keys are 16..64 bytes).
pub(crate) const MAX_KEY_BYTES: u64 = 4096;
/// Largest testbed record read back by `rtprobe cleanup` (they are ~1 KB).
pub(crate) const MAX_RECORD_BYTES: u64 = 256 * 1024;
/// Largest JSON report read whole (bench-forward reports are tens of KB).
pub(crate) const MAX_REPORT_BYTES: u64 = 64 * 1024 * 1024;

/// Why a file was not read.
#[derive(Debug)]
pub(crate) enum InputError {
    /// Opening or reading failed.
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    /// The file holds more than `cap_bytes` (`size_bytes` if its size is
    /// known before reading, else None).
    TooLarge {
        path: PathBuf,
        what: &'static str,
        cap_bytes: u64,
        size_bytes: Option<u64>,
    },
    /// Text that is not UTF-8: the first bad byte and where it is.
    NotUtf8 {
        path: PathBuf,
        what: &'static str,
        offset: usize,
        byte: u8,
        line: usize,
    },
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputError::Io { path, what, source } => {
                let hint = match source.kind() {
                    std::io::ErrorKind::NotFound => "check the path",
                    std::io::ErrorKind::PermissionDenied => "make it readable or run as its owner",
                    _ if source.raw_os_error() == Some(libc::EISDIR) => {
                        "it is a directory: give the file in it"
                    }
                    _ => "check the path and the file",
                };
                write!(f, "cannot read {what} {}: {source}: {hint}", path.display())
            }
            InputError::TooLarge {
                path,
                what,
                cap_bytes,
                size_bytes,
            } => {
                let size = match size_bytes {
                    Some(s) => format!("{s} bytes"),
                    None => "more".into(),
                };
                write!(
                    f,
                    "{}: {size}, over the {cap_bytes}-byte limit of a {what}: check that this \
                     is the right file (a {what} is much smaller)",
                    path.display()
                )
            }
            InputError::NotUtf8 {
                path,
                what,
                offset,
                byte,
                line,
            } => write!(
                f,
                "{}: not UTF-8 (byte 0x{byte:02x} at offset {offset}, line {line}): save the \
                 {what} as UTF-8 text",
                path.display()
            ),
        }
    }
}

impl std::error::Error for InputError {}

/// Reads all of `path`, refusing more than `cap_bytes`. `what` names the
/// kind of file in errors ("scenario file"). Memory used is at most the
/// cap plus one byte, whatever the file is (a FIFO, /dev/zero).
pub(crate) fn read_capped(
    path: &Path,
    what: &'static str,
    cap_bytes: u64,
) -> Result<Vec<u8>, InputError> {
    let io = |source| InputError::Io {
        path: path.to_path_buf(),
        what,
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let md = file.metadata().map_err(io)?;
    if md.is_dir() {
        return Err(io(std::io::Error::from_raw_os_error(libc::EISDIR)));
    }
    // A regular file's size is known before reading; devices and pipes
    // are told by the read below.
    if md.is_file() && md.len() > cap_bytes {
        return Err(InputError::TooLarge {
            path: path.to_path_buf(),
            what,
            cap_bytes,
            size_bytes: Some(md.len()),
        });
    }
    let mut bytes = Vec::with_capacity(if md.is_file() { md.len() as usize } else { 0 });
    file.take(cap_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > cap_bytes {
        return Err(InputError::TooLarge {
            path: path.to_path_buf(),
            what,
            cap_bytes,
            size_bytes: None,
        });
    }
    Ok(bytes)
}

/// [`read_capped`], then the bytes as UTF-8 text; the error names the
/// first byte that is not (offset and line).
pub(crate) fn read_text(
    path: &Path,
    what: &'static str,
    cap_bytes: u64,
) -> Result<String, InputError> {
    let bytes = read_capped(path, what, cap_bytes)?;
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        InputError::NotUtf8 {
            path: path.to_path_buf(),
            what,
            offset,
            byte: bytes[offset],
            line: bytes[..offset].iter().filter(|&&b| b == b'\n').count() + 1,
        }
    })
}

/// Longest line of a probe CSV read (rows are a few hundred bytes; the
/// metadata line is capped at the same 64 KiB).
pub(crate) const MAX_CSV_LINE_BYTES: u64 = 64 * 1024;

/// A reader that fails (InvalidData) once a line runs longer than
/// `max_line_bytes`, so a parser that buffers a line (the csv crate's
/// record) stays bounded on a file with no newlines.
pub(crate) struct LineCapped<R> {
    inner: R,
    max_line_bytes: u64,
    line_bytes: u64,
    line: u64,
}

impl<R> LineCapped<R> {
    pub(crate) fn new(inner: R, max_line_bytes: u64) -> Self {
        Self {
            inner,
            max_line_bytes,
            line_bytes: 0,
            line: 1,
        }
    }
}

impl<R: Read> Read for LineCapped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        for &b in &buf[..n] {
            if b == b'\n' {
                self.line += 1;
                self.line_bytes = 0;
            } else {
                self.line_bytes += 1;
                if self.line_bytes > self.max_line_bytes {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "line {} is longer than {} bytes: this is not a CSV rtprobe wrote",
                            self.line, self.max_line_bytes
                        ),
                    ));
                }
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_over_the_cap_is_refused_naming_file_cap_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.toml");
        std::fs::write(&p, vec![b'#'; 2000]).unwrap();
        assert_eq!(read_capped(&p, "scenario file", 2000).unwrap().len(), 2000);
        let e = read_text(&p, "scenario file", 1999)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("{}: 2000 bytes, over the 1999-byte", p.display())),
            "{e}"
        );
        assert!(e.contains("scenario file") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn an_endless_device_costs_at_most_the_cap() {
        let e = read_capped(Path::new("/dev/zero"), "key file", 4096)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/dev/zero: more, over the 4096-byte limit"),
            "{e}"
        );
    }

    #[test]
    fn text_that_is_not_utf8_names_the_byte_offset_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("latin1.toml");
        std::fs::write(&p, b"name = \"x\"\n# caf\xe9\n").unwrap();
        let e = read_text(&p, "scenario file", MAX_CONFIG_BYTES)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "{}: not UTF-8 (byte 0xe9 at offset 16, line 2): save the scenario file as \
                 UTF-8 text",
                p.display()
            )
        );
    }

    #[test]
    fn missing_files_and_directories_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_text(&dir.path().join("nope.toml"), "scenario file", 10)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("cannot read scenario file ") && e.ends_with("check the path"),
            "{e}"
        );
        let e = read_text(dir.path(), "scenario file", 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("it is a directory"), "{e}");
    }

    #[test]
    fn a_line_over_the_cap_fails_the_read_naming_the_line() {
        let text = format!("a,b\n{}\n", "x".repeat(100));
        let mut out = String::new();
        let e = LineCapped::new(text.as_bytes(), 99)
            .read_to_string(&mut out)
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(
            e.to_string().starts_with("line 2 is longer than 99 bytes"),
            "{e}"
        );
        let mut out = String::new();
        LineCapped::new(text.as_bytes(), 100)
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, text);
    }
}
