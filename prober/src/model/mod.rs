//! What every layer shares, and depends on nothing above it: the probe
//! record and where records go, the run's metadata, the host it ran on,
//! the units options are written in and the words of the domain enums.
//! Imports nothing from the crate (the observer of a running session and
//! the run's outcome need statistics: they live in `stats`).

pub(crate) mod host;
pub(crate) mod knobs;
pub mod meta;
pub(crate) mod passive;
pub mod record;
pub(crate) mod units;
pub(crate) mod words;
