//! `clap::ValueEnum` for the domain enums the specs (and the plot and
//! compare flags of the command line) take, so the types themselves (in ebpf/,
//! probe/, tune/, export/) stay free of clap. Each line is the word on the
//! command line (the same as in TOML) and its help.

use clap::{ValueEnum, builder::PossibleValue};

use crate::{
    ebpf::{ReflectorKind, XdpAction, XdpMode},
    export::{
        compare::CompareMetric,
        plot::{FigureKind, ImageFormat},
    },
    probe::TimestampSource,
    tune::{Bottleneck, DevicePolicy, MissingPolicy, ShaperKind, StressTool},
};

macro_rules! value_enum {
    ($t:ty { $($v:expr => $name:literal : $help:literal),+ $(,)? }) => {
        impl ValueEnum for $t {
            fn value_variants<'a>() -> &'a [Self] {
                &[$($v),+]
            }
            fn to_possible_value(&self) -> Option<PossibleValue> {
                let all = [$(($v, $name, $help)),+];
                all.into_iter()
                    .find(|(v, _, _)| v == self)
                    .map(|(_, name, help)| PossibleValue::new(name).help(help))
            }
        }
    };
}

value_enum!(XdpMode {
    XdpMode::Off => "off": "No XDP program: the kernel forwards (the baseline)",
    XdpMode::Skb => "skb": "Generic XDP (XDP_FLAGS_SKB_MODE), works on any driver",
    XdpMode::Native => "native": "Driver XDP (XDP_FLAGS_DRV_MODE); fails if the driver lacks it",
    XdpMode::Auto => "auto": "Let the kernel choose (native if the driver has it, else generic); the attached mode is reported",
});

value_enum!(crate::testbed::IpVersion {
    crate::testbed::IpVersion::V4 => "4": "IPv4 (10.71.x.x on the testbed)",
    crate::testbed::IpVersion::V6 => "6": "IPv6 (unique-local fd71:x::/64 on the testbed)",
});

value_enum!(super::remote::ProtocolArg {
    super::remote::ProtocolArg::Rtprobe => "rtprobe": "rtprobe's own probes (magic RTPB, 64-bit session id and sequence)",
    super::remote::ProtocolArg::Stamp => "stamp": "STAMP (RFC 8762) session-sender packets, SSID (RFC 8972) + sequence number",
});

value_enum!(XdpAction {
    XdpAction::Redirect => "redirect": "bpf_fib_lookup + MAC rewrite + XDP_REDIRECT (the router)",
    XdpAction::Pass => "pass": "XDP_PASS every packet to the kernel stack (the study's \"pass by default\" variant)",
});

value_enum!(ReflectorKind {
    ReflectorKind::Kernel => "kernel": "rtprobe's XDP program on the receiver's interface replies with XDP_TX and writes its receive/transmit times into the echo",
    ReflectorKind::User => "user": "A user-space thread reads each probe and sends the echo",
});

value_enum!(TimestampSource {
    TimestampSource::Auto => "auto": "Hardware where the NIC has it (SIOCSHWTSTAMP), software otherwise",
    TimestampSource::Hardware => "hardware": "Hardware only: fail if the NIC cannot timestamp in hardware",
    TimestampSource::Software => "software": "Kernel software timestamps only",
});

value_enum!(Bottleneck {
    Bottleneck::Sender => "sender": "The sender's interface, in the sender namespace (the study's choice)",
    Bottleneck::Router => "router": "The router's interface toward the receiver (veth testbed only)",
});

value_enum!(MissingPolicy {
    MissingPolicy::Fail => "fail": "Stop with an error before anything is changed",
    MissingPolicy::Skip => "skip": "Run without it; the metadata and the summary say it was skipped",
});

value_enum!(DevicePolicy {
    DevicePolicy::Report => "report": "Record \"unsupported\" with the reason and go on",
    DevicePolicy::Fail => "fail": "Stop with an error",
});

value_enum!(ShaperKind {
    ShaperKind::Htb => "htb": "Hierarchical token bucket: one class at the link rate",
    ShaperKind::Tbf => "tbf": "Token bucket filter (the bandwidth lab's shaper)",
});

value_enum!(StressTool {
    StressTool::Builtin => "builtin": "sqrt loops on threads inside rtprobe",
    StressTool::StressNg => "stress-ng": "The stress-ng program (must be installed)",
});

value_enum!(CompareMetric {
    CompareMetric::OneWay => "one-way": "The packet's one-way latency (CSV column one_way_ns)",
    CompareMetric::Rtt => "rtt": "The round trip (CSV column rtt_ns)",
});

value_enum!(FigureKind {
    FigureKind::Box => "box": "Boxplot, whiskers at 1.5 IQR, every outlier (`*-box`)",
    FigureKind::Cdf => "cdf": "Empirical CDF (`*-cdf`)",
    FigureKind::Time => "time": "Latency per probe over time, lost probes marked (`*-time`)",
    FigureKind::Percentiles => "percentiles": "Latency by percentile on a log(1/(1-p)) axis, 50 % to 99.99 % and beyond, HdrHistogram style: the tail at a glance (`*-percentiles`)",
    FigureKind::Stages => "stages": "Time per stage of the timestamp chain (stack, sender queue, driver, path, receiver, reflector, return), one box per stage and run (`*-stages`; CSVs written since rtprobe records the chain)",
});

value_enum!(ImageFormat {
    ImageFormat::Svg => "svg": "Scalable vector graphics, text kept as text",
    ImageFormat::Png => "png": "Bitmap through plotters' bitmap backend",
});
