//! Option groups that derive both `clap::Args` and `serde::Deserialize`
//! (`Option` fields), each with its own validator.

pub mod continuous;
