//! The JSON summary (`--json PATH`).

use std::path::Path;

use anyhow::{Context, Result};

use crate::stats::Summary;

pub fn write_summary(path: &Path, summary: &Summary) -> Result<()> {
    let text = serde_json::to_string_pretty(summary)?;
    std::fs::write(path, text + "\n").with_context(|| {
        format!(
            "cannot write {}: check the directory exists and is writable",
            path.display()
        )
    })
}
