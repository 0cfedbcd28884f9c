//! Bounds on concurrent inbound connections, per source address and in all, so that a
//! flood from one address cannot starve the peers.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, PerIp>,
}

#[derive(Debug, Default)]
struct PerIp {
    open: usize,
    /// Whether this flood has been logged; cleared when the address drops below its
    /// limit, so one flood is one log line.
    reported: bool,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// First refusal of this episode: log it; later ones are only counted.
    pub first: bool,
}

#[derive(Debug, Clone)]
pub struct Admission {
    per_ip_limit: usize,
    total_limit: usize,
    counts: Arc<Mutex<Counts>>,
}

/// Holds a connection's place; dropping it frees the place.
#[derive(Debug)]
pub struct Admitted {
    ip: IpAddr,
    counts: Arc<Mutex<Counts>>,
}

impl Admission {
    pub fn new(per_ip_limit: usize, total_limit: usize) -> Self {
        Self {
            per_ip_limit,
            total_limit,
            counts: Arc::default(),
        }
    }

    pub fn admit(&self, ip: IpAddr) -> Result<Admitted, Refusal> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let total = counts.total;
        let entry = counts.per_ip.entry(ip).or_default();
        if entry.open >= self.per_ip_limit || total >= self.total_limit {
            let first = !entry.reported;
            entry.reported = true;
            return Err(Refusal { first });
        }
        entry.open += 1;
        counts.total += 1;
        Ok(Admitted {
            ip,
            counts: self.counts.clone(),
        })
    }

    pub fn open_connections(&self) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.total = counts.total.saturating_sub(1);
        if let Some(entry) = counts.per_ip.get_mut(&self.ip) {
            entry.open = entry.open.saturating_sub(1);
            entry.reported = false;
            if entry.open == 0 {
                counts.per_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_one_address_without_starving_others() {
        let admission = Admission::new(2, 10);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let _a1 = admission.admit(a).unwrap();
        let a2 = admission.admit(a).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Refusal { first: true });
        assert_eq!(admission.admit(a).unwrap_err(), Refusal { first: false });
        let _b1 = admission.admit(b).unwrap();
        drop(a2);
        let _a3 = admission.admit(a).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Refusal { first: true });
        assert_eq!(admission.open_connections(), 3);
    }

    #[test]
    fn bounds_the_total() {
        let admission = Admission::new(5, 2);
        let held: Vec<_> = (2..4)
            .map(|i| admission.admit(IpAddr::from([127, 0, 0, i])).unwrap())
            .collect();
        assert!(admission.admit("127.0.0.9".parse().unwrap()).is_err());
        drop(held);
        assert_eq!(admission.open_connections(), 0);
        assert!(admission.admit("127.0.0.9".parse().unwrap()).is_ok());
    }
}
