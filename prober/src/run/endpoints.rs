//! The ends of a testbed run's probes: the testbed's (or NIC pair's)
//! namespaces and interfaces, as the plain [`Endpoints`] a probe session
//! takes.

use anyhow::Result;

use crate::{
    probe::Endpoints,
    testbed::{IpVersion, Testbed},
};

/// The testbed's two sides, where the probes go from and to in `ip`.
/// Fails where the receiver has no address in `ip`'s family.
pub(super) fn of(testbed: &Testbed, ip: IpVersion) -> Result<Endpoints<'_>> {
    Ok(Endpoints {
        sys: testbed.sys(),
        sender_ns: &testbed.sender,
        receiver_ns: &testbed.receiver,
        sender_if: &testbed.sender_if.name,
        receiver_if: &testbed.receiver_if.name,
        dst_ip: testbed.receiver_if.ip(ip)?,
    })
}
