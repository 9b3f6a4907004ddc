//! The ethtool ioctl lives in [`crate::sys::ethtool`]; this name stays for
//! the callers outside the testbed (probe::phc, bench) until they go
//! through [`crate::sys::Sys`].

pub use crate::sys::ethtool::*;
