//! `tc` is wrapped once, in [`crate::sys::tc`]; tune builds its command
//! lines and runs them through [`crate::sys::Sys::tc`].

pub(crate) use crate::sys::tc::*;
