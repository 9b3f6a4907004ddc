//! Everything rtprobe writes: the per-probe CSV (streamed), the JSON summary
//! and the plots. Pure: no kernel access.

pub mod atomic;
pub mod compare;
pub mod csv;
pub mod hdrlog;
pub mod json;
pub mod live;
pub mod metrics;
pub mod plot;
pub mod rotate;
pub mod text;

pub use self::csv::{CsvWriter, META_PREFIX};
