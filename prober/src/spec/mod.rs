//! Option groups shared by the command line and scenario files: each is
//! one struct deriving `clap::Args` and `serde::Deserialize` with `Option`
//! fields, validated in one place.

pub mod remote;
