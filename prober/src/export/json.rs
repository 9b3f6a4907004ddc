//! The JSON summary (`--json PATH`), written whole or not at all (see
//! [`super::atomic`]): a full disk leaves the earlier file, never a torn one.

use std::path::Path;

use crate::stats::Summary;

pub(crate) fn write_summary(
    path: &Path,
    summary: &Summary,
) -> Result<(), super::atomic::NotWritten> {
    write_value(path, summary)
}

/// Any serializable report, pretty-printed with a final newline.
pub(crate) fn write_value<T: serde::Serialize + ?Sized>(
    path: &Path,
    value: &T,
) -> Result<(), super::atomic::NotWritten> {
    // Serializing our own types into memory cannot fail; were it to, the
    // file is not touched and the error says why.
    let text = serde_json::to_string_pretty(value).map_err(|e| super::atomic::NotWritten {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
        kept_previous: path.exists(),
    })?;
    super::atomic::write(path, (text + "\n").as_bytes())
}
