//! Which timestamps to ask the kernel for: a plain domain type (no clap;
//! the option model gives it its flag).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimestampSource {
    /// Hardware where the NIC has it (SIOCSHWTSTAMP), software otherwise.
    #[default]
    Auto,
    /// Hardware only: fail if the NIC cannot timestamp in hardware.
    Hardware,
    /// Kernel software timestamps only.
    Software,
}

impl TimestampSource {
    pub(crate) const ALL: [TimestampSource; 3] = [
        TimestampSource::Auto,
        TimestampSource::Hardware,
        TimestampSource::Software,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TimestampSource::Auto => "auto",
            TimestampSource::Hardware => "hardware",
            TimestampSource::Software => "software",
        }
    }
}

crate::model::words::words!(TimestampSource, "timestamp source");
