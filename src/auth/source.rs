//! Where a client comes from, as every per-source bound counts it: the IPv4 address (also
//! when it arrives IPv4-mapped on an IPv6 socket), or the /64 prefix of an IPv6 address, since
//! one host commonly has a whole /64 to pick addresses from. One function for the listeners'
//! pending and connected slots, the failed-login limits, the hash workers' shares, the HTTP
//! bounds and the dedup and dead-letter shares of unverified clients (issue 35, eighth
//! adversarial pass, Q2: the shares had taken the whole IPv6 address, so one host was 2^64
//! identities).
//!
//! Must not: look at anything but the address.

use std::net::{IpAddr, Ipv6Addr};

/// The source `ip` counts as.
pub(crate) fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
    }
}
