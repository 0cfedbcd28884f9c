//! The rack's IMEX ports: free on every node's address, and outside the kernel's
//! ephemeral port range.
//!
//! Outside, because a port taken from inside the range (by binding port 0) is only
//! free until the kernel hands it out again: every daemon binds its node's address
//! with port 0 for its outgoing gossip connections, and one that got the IMEX port
//! while IMEX was down held it for as long as the connection lived. IMEX could never
//! listen again, and was restarted every 200 ms for the rest of the run.

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::path::Path;

use anyhow::bail;
use rand::Rng;

use super::ports::free_on_all;
use domaind_imex::listen_check::ephemeral_range;

/// Ports below this are left to well-known services.
const LOWEST: u16 = 10_000;
/// Candidates tried before giving up.
const TRIES: usize = 200;

/// Two distinct ports (IMEX's server and command ports) free on all of `ips`.
pub fn pick(ips: &[IpAddr]) -> anyhow::Result<(u16, u16)> {
    let ephemeral = ephemeral_range(Path::new("/proc/sys/net/ipv4/ip_local_port_range"))
        .unwrap_or((32768, 60999));
    let pools = pools(ephemeral);
    if pools.is_empty() {
        bail!(
            "the ephemeral port range {}-{} leaves no port for IMEX",
            ephemeral.0,
            ephemeral.1
        );
    }
    let mut rng = rand::rng();
    let mut found = Vec::with_capacity(2);
    for _ in 0..TRIES {
        let pool = &pools[rng.random_range(0..pools.len())];
        let port = rng.random_range(pool.clone());
        if !found.contains(&port) && free_on_all(ips, port) {
            found.push(port);
            if let [server, cmd] = found[..] {
                return Ok((server, cmd));
            }
        }
    }
    bail!("no two ports outside the ephemeral range are free on all of {ips:?}")
}

/// The port ranges outside `ephemeral`, from `LOWEST` up.
fn pools((low, high): (u16, u16)) -> Vec<RangeInclusive<u16>> {
    let mut pools = Vec::new();
    if low > LOWEST {
        pools.push(LOWEST..=low - 1);
    }
    if high < u16::MAX {
        pools.push(high.max(LOWEST - 1) + 1..=u16::MAX);
    }
    pools
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pools_avoid_the_ephemeral_range() {
        assert_eq!(pools((32768, 60999)), vec![10_000..=32767, 61000..=65535]);
        assert_eq!(pools((1024, 65535)), vec![]);
        assert_eq!(pools((5000, 60000)), vec![60001..=65535]);
    }

    #[test]
    fn picked_ports_are_distinct_free_and_outside_the_range() {
        let ips = [IpAddr::from([127, 0, 0, 1])];
        let (server, cmd) = pick(&ips).unwrap();
        assert_ne!(server, cmd);
        let (low, high) = ephemeral_range(Path::new("/proc/sys/net/ipv4/ip_local_port_range"))
            .unwrap_or((32768, 60999));
        for port in [server, cmd] {
            assert!(!(low..=high).contains(&port), "{port} in {low}-{high}");
            assert!(port >= LOWEST);
        }
    }
}
