//! Units the knobs are written in: rates (`100mbit`), byte sizes (`64KiB`;
//! [`Bytes`] lives in [`crate::model::units`], which the other layers
//! share), queue limits (`100p` or `64kb`) and shares of the link (`50%`);
//! durations are [`crate::model::units`] too. Each parses from the CLI and from TOML (string or
//! integer) with an error that says which form is expected, and renders in
//! the syntax `tc` takes. Pure: no kernel access.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

pub(crate) use crate::model::units::Bytes;
use crate::model::units::{fmt_num, serde_via_str, split_number};

/// A rate in bits per second. Units as in tc: `bit`, `kbit`, `mbit`,
/// `gbit` (powers of 1000). tc's `bps`/`kbps`/`mbps` mean *bytes* per
/// second; they are refused because they are easy to misread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Rate {
    pub(crate) bps: u64,
}

impl Rate {
    pub(crate) const fn from_bps(bps: u64) -> Self {
        Self { bps }
    }

    pub(crate) fn mbit(m: u64) -> Self {
        Self { bps: m * 1_000_000 }
    }

    /// Bytes per second (what SO_MAX_PACING_RATE takes).
    pub(crate) fn bytes_per_sec(self) -> u64 {
        self.bps / 8
    }

    /// How tc wants it: exact bits per second.
    pub(crate) fn tc(self) -> String {
        format!("{}bit", self.bps)
    }

    /// The same rate scaled by `f` (shares of a link).
    pub(crate) fn scaled(self, f: f64) -> Self {
        Self {
            bps: (self.bps as f64 * f).round() as u64,
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bps;
        if b >= 1_000_000_000 && b.is_multiple_of(1_000_000_000) {
            write!(f, "{}gbit", b / 1_000_000_000)
        } else if b >= 1_000_000 && b.is_multiple_of(1_000_000) {
            write!(f, "{}mbit", b / 1_000_000)
        } else if b >= 1000 && b.is_multiple_of(1000) {
            write!(f, "{}kbit", b / 1000)
        } else {
            write!(f, "{b}bit")
        }
    }
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let (num, unit) = split_number(&t);
        let v: f64 = num.parse().map_err(|_| {
            format!(
                "invalid rate {s:?}: expected a number and a unit, e.g. 100mbit, 200kbit, 1gbit"
            )
        })?;
        let scale = match unit {
            "bit" => 1.0,
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            "bps" | "kbps" | "mbps" | "gbps" => {
                return Err(format!(
                    "invalid rate {s:?}: tc reads {unit:?} as bytes per second; write bits per second \
                     with bit, kbit, mbit or gbit (e.g. 100mbit)"
                ));
            }
            "" => {
                return Err(format!(
                    "invalid rate {s:?}: give a unit (bit, kbit, mbit, gbit), e.g. 100mbit"
                ));
            }
            _ => {
                return Err(format!(
                    "invalid rate {s:?}: unknown unit {unit:?} (use bit, kbit, mbit, gbit)"
                ));
            }
        };
        let bps = v * scale;
        if !(bps.is_finite() && (1.0..=1e12).contains(&bps)) {
            return Err(format!(
                "invalid rate {s:?}: must be between 1bit and 1000gbit"
            ));
        }
        Ok(Self {
            bps: bps.round() as u64,
        })
    }
}

/// A queue limit: packets (`100`, `100p`, `100pkt`) or bytes (`64kb`, `3000b`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum QueueLimit {
    Packets(u32),
    Bytes(u64),
}

impl fmt::Display for QueueLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueLimit::Packets(p) => write!(f, "{p}p"),
            QueueLimit::Bytes(b) => write!(f, "{}", Bytes(*b)),
        }
    }
}

impl FromStr for QueueLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let (num, unit) = split_number(&t);
        match unit {
            "" | "p" | "pkt" | "pkts" | "packets" => {
                let p: u32 = num.parse().map_err(|_| {
                    format!(
                        "invalid queue limit {s:?}: expected packets (100, 100p) or bytes (64KiB)"
                    )
                })?;
                if p == 0 {
                    return Err(format!(
                        "invalid queue limit {s:?}: must be at least 1 packet"
                    ));
                }
                Ok(QueueLimit::Packets(p))
            }
            _ => {
                let b: Bytes = t.parse().map_err(|e: String| {
                    format!("{e}; a queue limit is packets (100, 100p) or bytes (64KiB)")
                })?;
                if b.0 < 64 {
                    return Err(format!(
                        "invalid queue limit {s:?}: a byte limit below 64 bytes holds no packet"
                    ));
                }
                Ok(QueueLimit::Bytes(b.0))
            }
        }
    }
}

/// How much load: a share of the link (`50%`) or an absolute rate (`50mbit`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum LoadRate {
    /// Fraction of the link rate: 0.5 for `50%`.
    Share(f64),
    Rate(Rate),
}

impl fmt::Display for LoadRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadRate::Share(x) => write!(f, "{}%", fmt_num(x * 100.0)),
            LoadRate::Rate(r) => write!(f, "{r}"),
        }
    }
}

impl FromStr for LoadRate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| {
                format!("invalid share {s:?}: expected a percentage like 50% or a rate like 50mbit")
            })?;
            if !(v.is_finite() && v > 0.0 && v <= 1000.0) {
                return Err(format!(
                    "invalid share {s:?}: must be above 0% and at most 1000%"
                ));
            }
            return Ok(LoadRate::Share(v / 100.0));
        }
        t.parse::<Rate>()
            .map(LoadRate::Rate)
            .map_err(|e| format!("{e}; a load is a share of the link (50%) or a rate (50mbit)"))
    }
}

/// A CPU idle-latency limit held through `/dev/cpu_dma_latency` (PM QoS)
/// while probing: `off`, or the most wake-up latency in µs the CPUs' idle
/// states may add (`0`: never enter a state that halts, as cyclictest does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CpuDmaLatency {
    Off,
    Us(u32),
}

impl fmt::Display for CpuDmaLatency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuDmaLatency::Off => f.write_str("off"),
            CpuDmaLatency::Us(us) => write!(f, "{us}us"),
        }
    }
}

impl FromStr for CpuDmaLatency {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        if t == "off" {
            return Ok(CpuDmaLatency::Off);
        }
        let num = t.strip_suffix("us").unwrap_or(&t);
        // PM QoS takes an s32; 2000 s is "no limit" (PM_QOS_DEFAULT_VALUE).
        num.trim()
            .parse::<u32>()
            .ok()
            .filter(|&v| v <= i32::MAX as u32)
            .map(CpuDmaLatency::Us)
            .ok_or_else(|| {
                format!("invalid CPU DMA latency {s:?}: expected microseconds (0, 10us) or off")
            })
    }
}

/// A duration in tc's syntax, exact to the microsecond.
pub(crate) fn tc_time(d: Duration) -> String {
    format!("{}us", d.as_micros())
}

serde_via_str!(Rate, "a rate such as \"100mbit\"", |_| Err(
    "a rate needs a unit: write it as a string such as \"100mbit\"".to_string()
));
serde_via_str!(
    QueueLimit,
    "packets (100) or a string such as \"100p\" or \"64KiB\"",
    |v| v.to_string().parse()
);
serde_via_str!(CpuDmaLatency, "microseconds (0) or \"off\"", |v| v
    .to_string()
    .parse());
serde_via_str!(LoadRate, "a share (\"50%\") or a rate (\"50mbit\")", |_| {
    Err("write a load rate as a string such as \"50%\" or \"50mbit\"".to_string())
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!("100mbit".parse::<Rate>().unwrap().bps, 100_000_000);
        assert_eq!("200kbit".parse::<Rate>().unwrap().bps, 200_000);
        assert_eq!("1.5gbit".parse::<Rate>().unwrap().bps, 1_500_000_000);
        assert_eq!("9600bit".parse::<Rate>().unwrap().bps, 9600);
        assert_eq!(Rate::mbit(100).to_string(), "100mbit");
        assert_eq!(Rate::from_bps(250_000).to_string(), "250kbit");
        assert_eq!(Rate::mbit(100).tc(), "100000000bit");
        let e = "100mbps".parse::<Rate>().unwrap_err();
        assert!(e.contains("bytes per second"), "{e}");
        assert!("100".parse::<Rate>().unwrap_err().contains("give a unit"));
        assert!("fast".parse::<Rate>().is_err());
        assert!("0mbit".parse::<Rate>().is_err());
    }

    #[test]
    fn bytes() {
        assert_eq!("3000".parse::<Bytes>().unwrap(), Bytes(3000));
        assert_eq!("1514b".parse::<Bytes>().unwrap(), Bytes(1514));
        assert_eq!("64KiB".parse::<Bytes>().unwrap(), Bytes(65536));
        assert_eq!("16kb".parse::<Bytes>().unwrap(), Bytes(16384));
        assert_eq!("512k".parse::<Bytes>().unwrap(), Bytes(524288));
        assert_eq!("1MiB".parse::<Bytes>().unwrap(), Bytes(1 << 20));
        assert_eq!(Bytes(65536).to_string(), "64KiB");
        assert_eq!(Bytes(3000).to_string(), "3000");
        assert!("1.3b".parse::<Bytes>().is_err());
        assert!("10mbit".parse::<Bytes>().unwrap_err().contains("rate unit"));
        assert!("12 parsecs".parse::<Bytes>().is_err());
    }

    #[test]
    fn queue_limits() {
        assert_eq!(
            "100".parse::<QueueLimit>().unwrap(),
            QueueLimit::Packets(100)
        );
        assert_eq!(
            "20p".parse::<QueueLimit>().unwrap(),
            QueueLimit::Packets(20)
        );
        assert_eq!(
            "64KiB".parse::<QueueLimit>().unwrap(),
            QueueLimit::Bytes(65536)
        );
        assert!("0".parse::<QueueLimit>().is_err());
        assert!("10b".parse::<QueueLimit>().is_err());
        assert_eq!(QueueLimit::Packets(20).to_string(), "20p");
    }

    #[test]
    fn cpu_dma_latencies() {
        assert_eq!("off".parse(), Ok(CpuDmaLatency::Off));
        assert_eq!("0".parse(), Ok(CpuDmaLatency::Us(0)));
        assert_eq!(" 10us".parse(), Ok(CpuDmaLatency::Us(10)));
        for bad in ["-1", "1ms", "on", "", "3000000000"] {
            let e = bad.parse::<CpuDmaLatency>().unwrap_err();
            assert!(e.contains("microseconds (0, 10us) or off"), "{bad}: {e}");
        }
        assert_eq!(
            CpuDmaLatency::Us(10).to_string().parse(),
            Ok(CpuDmaLatency::Us(10))
        );
        assert_eq!(CpuDmaLatency::Off.to_string(), "off");
    }

    #[test]
    fn load_rates() {
        assert_eq!("50%".parse::<LoadRate>().unwrap(), LoadRate::Share(0.5));
        assert_eq!(
            "50mbit".parse::<LoadRate>().unwrap(),
            LoadRate::Rate(Rate::mbit(50))
        );
        assert_eq!(LoadRate::Share(1.5).to_string(), "150%");
        assert!("0%".parse::<LoadRate>().is_err());
        assert!("lots".parse::<LoadRate>().is_err());
    }

    #[test]
    fn tc_times() {
        assert_eq!(tc_time(Duration::from_micros(1500)), "1500us");
    }

    #[test]
    fn serde_from_toml() {
        #[derive(Deserialize)]
        struct T {
            a: Bytes,
            b: Bytes,
            q: QueueLimit,
            r: Rate,
        }
        let t: T = toml::from_str("a = 3000\nb = \"64KiB\"\nq = 20\nr = \"100mbit\"").unwrap();
        assert_eq!(
            (t.a, t.b, t.q, t.r.bps),
            (
                Bytes(3000),
                Bytes(65536),
                QueueLimit::Packets(20),
                100_000_000
            )
        );
        let e = toml::from_str::<T>("a = 1\nb = 2\nq = 3\nr = 100")
            .err()
            .unwrap();
        assert!(e.to_string().contains("needs a unit"), "{e}");
        assert!(e.to_string().contains("line 4"), "{e}");
    }
}
