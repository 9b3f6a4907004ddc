//! Everything rtprobe writes: the per-probe CSV (streamed), the JSON summary
//! and the plots, and what the live outputs are asked to do ([`plan`]).
//! No kernel state changes: export writes files (through `atomic`), serves
//! the metrics socket and reads its own process's /proc entries.

pub(crate) mod atomic;
pub(crate) mod compare;
pub mod csv;
pub(crate) mod hdrlog;
pub(crate) mod json;
pub mod live;
pub mod metrics;
pub(crate) mod passive;
pub mod plan;
pub mod plot;
pub(crate) mod rotate;
pub(crate) mod text;

pub use self::csv::{CsvWriter, META_PREFIX};
