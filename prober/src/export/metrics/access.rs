//! Who may read `/metrics`: anyone who reaches the address, or only
//! requests that carry the bearer token of `--metrics-token-file`
//! (`Authorization: Bearer TOKEN`, RFC 6750), as Prometheus sends it with
//! `authorization: {credentials_file: FILE}`. Reads the token file once,
//! at start (a file's mode bits through stat(2)).

use std::path::Path;

use anyhow::{Context, Result, bail};

/// Shortest token accepted: 16 characters of a random token are ~100 bits
/// or more; shorter ones are passwords a stranger may guess.
const MIN_TOKEN_BYTES: usize = 16;
/// Longest token accepted (and the file read at most this much further).
const MAX_TOKEN_BYTES: usize = 4096;

/// The access rule of a metrics server.
#[derive(Clone, Default)]
pub(crate) struct Access {
    token: Option<Vec<u8>>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        f.write_str(if self.token.is_some() {
            "Access(bearer token)"
        } else {
            "Access(open)"
        })
    }
}

/// The option that names the token file, in errors.
const FLAG: &str = "--metrics-token-file";

impl Access {
    /// Anyone who reaches the address.
    pub(crate) fn open() -> Self {
        Self::default()
    }

    /// `--metrics-token-file`'s rule: open without a file, the file's
    /// token otherwise.
    pub(crate) fn from_token_file(file: Option<&Path>) -> Result<Self> {
        file.map_or_else(|| Ok(Self::open()), Self::token_file)
    }

    /// Only requests with the token in `file`: at least 16 visible ASCII
    /// characters, one line (a final newline is not part of it), in a
    /// file not every user can read.
    pub(crate) fn token_file(file: &Path) -> Result<Self> {
        let flag = FLAG;
        let meta = std::fs::metadata(file)
            .with_context(|| format!("{flag} {}: cannot read it", file.display()))?;
        if !meta.is_file() {
            bail!(
                "{flag} {}: not a regular file: give the file that holds the token",
                file.display()
            );
        }
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o004 != 0 {
            bail!(
                "{flag} {}: every user can read it: `chmod o-r {}` (the token is a secret)",
                file.display(),
                file.display()
            );
        }
        let mut text = std::fs::read(file)
            .with_context(|| format!("{flag} {}: cannot read it", file.display()))?;
        while text.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            text.pop();
        }
        let visible = |b: &u8| b.is_ascii_graphic();
        if text.len() < MIN_TOKEN_BYTES || text.len() > MAX_TOKEN_BYTES || !text.iter().all(visible)
        {
            bail!(
                "{flag} {}: holds no usable token: give one line of {MIN_TOKEN_BYTES} to \
                 {MAX_TOKEN_BYTES} visible ASCII characters (e.g. `openssl rand -hex 32 > FILE`)",
                file.display()
            );
        }
        Ok(Self { token: Some(text) })
    }

    /// Whether a request with this `Authorization` header may read.
    pub(super) fn allows(&self, authorization: Option<&[u8]>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let Some(given) = authorization.and_then(bearer) else {
            return false;
        };
        constant_time_eq(given, token)
    }
}

/// The credentials of `Bearer TOKEN` (the scheme is case-insensitive).
fn bearer(header: &[u8]) -> Option<&[u8]> {
    let scheme = header.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(header[7..].trim_ascii())
}

/// Equality that takes the same time wherever the first difference is:
/// a stranger learns nothing of the token from how fast 401 comes.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn file_with(dir: &Path, text: &str, mode: u32) -> std::path::PathBuf {
        let p = dir.join(format!("token{mode:o}{}", text.len()));
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn a_token_file_is_read_checked_and_compared() {
        let dir = tempfile::tempdir().unwrap();
        let token = "0123456789abcdef0123";
        let a = Access::token_file(&file_with(dir.path(), &format!("{token}\n"), 0o600)).unwrap();
        assert!(a.allows(Some(format!("Bearer {token}").as_bytes())));
        assert!(a.allows(Some(format!("bearer  {token} ").as_bytes())));
        assert!(!a.allows(None));
        assert!(!a.allows(Some(b"Bearer 0123456789abcdef012")));
        assert!(!a.allows(Some(format!("Basic {token}").as_bytes())));
        assert!(!a.allows(Some(b"Bearer")));
        assert!(Access::open().allows(None));
        assert_eq!(format!("{a:?}"), "Access(bearer token)");
        let err = |text: &str, mode: u32| {
            format!(
                "{:#}",
                Access::token_file(&file_with(dir.path(), text, mode)).unwrap_err()
            )
        };
        assert!(err(token, 0o644).contains("chmod o-r"));
        assert!(err("short\n", 0o600).contains("holds no usable token"));
        assert!(err("0123456789 abcdef0123", 0o600).contains("visible ASCII"));
        let e = format!(
            "{:#}",
            Access::token_file(Path::new("/nonexistent/t")).unwrap_err()
        );
        assert!(
            e.starts_with("--metrics-token-file /nonexistent/t: cannot read it"),
            "{e}"
        );
        let e = format!("{:#}", Access::token_file(dir.path()).unwrap_err());
        assert!(e.contains("not a regular file"), "{e}");
        assert!(Access::from_token_file(None).unwrap().allows(None));
    }
}
