//! What every layer shares, and depends on nothing above it: the probe
//! record and where records go, the observer of a running session, the
//! run's metadata and outcome, the host it ran on, and the units options
//! are written in.
//! Imports nothing from the crate but `stats` (the observer sees running
//! statistics, the outcome carries the summary).

pub mod host;
pub(crate) mod observer;
pub mod record;
pub mod run;
pub(crate) mod units;
pub(crate) mod words;
