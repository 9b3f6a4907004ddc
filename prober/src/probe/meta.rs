//! The one place a session's [`RunMeta`] (the CSV's first line and the
//! JSON's `meta`) is built: what the probes were, from the session's
//! options, and where they went, from its endpoints.

use super::ProbeConfig;
use crate::model::meta::RunMeta;

/// Where a session's probes went and who answered, as the metadata names it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Place {
    /// "veth", "nic-pair" or "remote".
    pub(crate) testbed: String,
    pub(crate) testbed_id: String,
    pub(crate) tx_if: Option<String>,
    pub(crate) rx_if: Option<String>,
    pub(crate) xdp_mode_requested: String,
    pub(crate) xdp_mode_attached: String,
    pub(crate) xdp_action: String,
    /// "kernel", "user" or "remote <protocol>".
    pub(crate) reflector: String,
}

impl Place {
    /// A run from this host against reflectors not ours to drive: no
    /// testbed, no XDP; `rx_if` says where the probes went, `reflector`
    /// who answered ("remote", "remote stamp").
    pub(crate) fn remote(rx_if: String, reflector: String) -> Self {
        Place {
            testbed: "remote".into(),
            tx_if: Some("this host".into()),
            rx_if: Some(rx_if),
            xdp_mode_requested: "none".into(),
            xdp_mode_attached: "none".into(),
            xdp_action: "none".into(),
            reflector,
            ..Default::default()
        }
    }
}

impl Place {
    /// A run on a testbed this host built: `testbed` its kind ("veth",
    /// "nic-pair"), `testbed_id` its id, `reflector` who answered
    /// ("kernel", "user"). The interfaces and the XDP router are left
    /// out (None, empty) unless [`Place::interfaces`] and [`Place::xdp`]
    /// add them.
    pub(crate) fn testbed(testbed: &str, testbed_id: &str, reflector: &str) -> Self {
        Place {
            testbed: testbed.into(),
            testbed_id: testbed_id.into(),
            reflector: reflector.into(),
            ..Default::default()
        }
    }

    /// The sender's and the receiver's interfaces.
    pub(crate) fn interfaces(self, tx_if: &str, rx_if: &str) -> Self {
        Place {
            tx_if: Some(tx_if.into()),
            rx_if: Some(rx_if.into()),
            ..self
        }
    }

    /// The XDP router: the mode asked for, the mode attached, its action.
    pub(crate) fn xdp(self, requested: &str, attached: String, action: &str) -> Self {
        Place {
            xdp_mode_requested: requested.into(),
            xdp_mode_attached: attached,
            xdp_action: action.into(),
            ..self
        }
    }
}

/// The metadata of a session of `cfg` at `place`, started now. Knobs and
/// extra flows are the caller's to add: only a testbed run has them.
pub(crate) fn run_meta(cfg: &ProbeConfig, label: Option<String>, place: Place) -> RunMeta {
    RunMeta {
        version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        label,
        testbed: place.testbed,
        testbed_id: place.testbed_id,
        tx_if: place.tx_if,
        rx_if: place.rx_if,
        xdp_mode_requested: place.xdp_mode_requested,
        xdp_mode_attached: place.xdp_mode_attached,
        xdp_action: place.xdp_action,
        reflector: place.reflector,
        size: cfg.size as u32,
        interval_ns: cfg.interval.as_nanos() as u64,
        count: cfg.count,
        duration_ns: cfg.duration.map(|d| d.as_nanos() as u64),
        tos: cfg.tos,
        port: cfg.port,
        timestamps_requested: cfg.timestamps.as_str().into(),
        knobs: Default::default(),
        extra_flows: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_probes_come_from_the_options_and_the_place_is_kept() {
        let cfg = ProbeConfig {
            size: 200,
            interval: Duration::from_micros(500),
            count: Some(7),
            duration: Some(Duration::from_secs(2)),
            tos: 0xb8,
            port: 9000,
            timestamps: super::super::TimestampSource::Software,
            timeout: Duration::from_secs(1),
            flow: 0,
            spin: None,
            busy_poll: false,
            no_warm_up: false,
            rt: Default::default(),
            kernel_reflector: false,
        };
        let place = Place {
            testbed: "remote".into(),
            rx_if: Some("192.0.2.7:9000".into()),
            reflector: "remote stamp".into(),
            ..Place::default()
        };
        let m = run_meta(&cfg, Some("x".into()), place);
        assert_eq!(m.version, env!("CARGO_PKG_VERSION"));
        assert!(m.started_at.ends_with('Z'), "{}", m.started_at);
        assert_eq!(m.label.as_deref(), Some("x"));
        assert_eq!((m.size, m.interval_ns, m.count), (200, 500_000, Some(7)));
        assert_eq!(
            (m.duration_ns, m.tos, m.port),
            (Some(2_000_000_000), 0xb8, 9000)
        );
        assert_eq!(m.timestamps_requested, "software");
        assert_eq!(
            (m.testbed.as_str(), m.reflector.as_str()),
            ("remote", "remote stamp")
        );
        assert_eq!(m.rx_if.as_deref(), Some("192.0.2.7:9000"));
        assert!(m.knobs.is_empty() && m.extra_flows.is_empty());
    }

    #[test]
    fn a_testbed_place_names_what_it_is_given_and_leaves_the_rest_empty() {
        let p = Place::testbed("veth", "tb1", "user");
        assert_eq!((p.testbed.as_str(), p.testbed_id.as_str()), ("veth", "tb1"));
        assert_eq!(p.reflector, "user");
        assert_eq!((p.tx_if, p.rx_if), (None, None));
        assert!(p.xdp_mode_requested.is_empty() && p.xdp_action.is_empty());
        let p = Place::testbed("nic-pair", "tb2", "kernel")
            .interfaces("a0", "b0")
            .xdp("native", "native".into(), "redirect");
        assert_eq!(
            (p.tx_if.as_deref(), p.rx_if.as_deref()),
            (Some("a0"), Some("b0"))
        );
        assert_eq!(
            (
                p.xdp_mode_requested.as_str(),
                p.xdp_mode_attached.as_str(),
                p.xdp_action.as_str()
            ),
            ("native", "native", "redirect")
        );
        assert_eq!(p.reflector, "kernel");
    }
}
