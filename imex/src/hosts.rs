//! The hosts file in DNS-names mode. Only the block between our markers is ours: the
//! rest (in production, the container's own /etc/hosts) is kept as it is.

/// Where a simulator of IMEX (`imex-sim`) reads the hosts file that real IMEX reads
/// from `/etc/hosts`: a rack of simulated nodes on one machine cannot share one.
pub const SIM_HOSTS_ENV: &str = "IMEX_SIM_HOSTS";

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::Path;

use domaind_actors::model::Slot;
use domaind_actors::rules::peers::{PeerSet, slot_hostname};

pub const BEGIN: &str = "# BEGIN domaind IMEX slots";
pub const END: &str = "# END domaind IMEX slots";
/// Marks a slot nobody holds; the simulator treats such names as unresolvable.
pub const UNUSED: &str = "# domaind: unused slot";

/// Our block: every slot's name, mapped to its holder or parked.
pub fn render_block(peers: &PeerSet, max_slots: Slot, unused_slot_ip: IpAddr) -> String {
    let mut out = format!("{BEGIN}\n");
    for slot in 0..max_slots {
        match peers.peers.get(&slot) {
            Some(peer) => out.push_str(&format!("{}\t{}\n", peer.ip, slot_hostname(slot))),
            None => out.push_str(&format!(
                "{unused_slot_ip}\t{} {UNUSED}\n",
                slot_hostname(slot)
            )),
        }
    }
    out.push_str(END);
    out.push('\n');
    out
}

/// Our block while an adopted daemon's node catches up: each slot `asked` holds, as
/// asked; each other slot as `served` (the hosts file the daemon runs with) maps it;
/// parked otherwise. A restarted node knows few of its peers at first, and the daemon
/// must not lose the others before the node knows whether they are gone.
pub fn held_block(
    served: &str,
    asked: &PeerSet,
    max_slots: Slot,
    unused_slot_ip: IpAddr,
) -> String {
    let served = parse(served);
    let mut held = asked.clone();
    for slot in 0..max_slots {
        if held.peers.contains_key(&slot) {
            continue;
        }
        if let Some(Resolution::Ip(ip)) = served.get(&slot_hostname(slot)) {
            held.peers.insert(
                slot,
                domaind_actors::rules::peers::Peer {
                    node: String::new(),
                    ip: *ip,
                },
            );
        }
    }
    render_block(&held, max_slots, unused_slot_ip)
}

/// Whether `served` (the hosts file the daemon runs with) maps a slot to an address
/// that `asked` does not give it: an adopted daemon still serves peers the node has not
/// asked for (yet).
pub fn serves_beyond(served: &str, asked: &PeerSet, max_slots: Slot) -> bool {
    let served = parse(served);
    (0..max_slots).any(|slot| match served.get(&slot_hostname(slot)) {
        Some(Resolution::Ip(ip)) => asked.peers.get(&slot).is_none_or(|peer| peer.ip != *ip),
        _ => false,
    })
}

/// `existing` with our block replaced by `block` (or appended).
pub fn merge(existing: &str, block: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in existing.lines() {
        match line.trim() {
            BEGIN => inside = true,
            END if inside => inside = false,
            _ if inside => {}
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out.push_str(block);
    out
}

/// A name → IP entry of a hosts file; parked names resolve to nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    Ip(IpAddr),
    Parked,
}

/// Parses a hosts file into name → resolution (first entry wins, as resolvers do).
pub fn parse(text: &str) -> BTreeMap<String, Resolution> {
    let mut names = BTreeMap::new();
    for line in text.lines() {
        let parked = line.contains(UNUSED);
        let content = line.split('#').next().unwrap_or("");
        let mut fields = content.split_whitespace();
        let Some(Ok(ip)) = fields.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        for name in fields {
            names.entry(name.to_owned()).or_insert(if parked {
                Resolution::Parked
            } else {
                Resolution::Ip(ip)
            });
        }
    }
    names
}

/// Writes the hosts file. A file that is a bind mount (a container's /etc/hosts)
/// cannot be renamed over, so it is rewritten in place; IMEX only reads it on
/// SIGUSR1, which follows the write.
pub fn write(path: &Path, block: &str) -> std::io::Result<bool> {
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let merged = merge(&existing, block);
    if merged == existing {
        return Ok(false);
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)?;
    file.write_all(merged.as_bytes())?;
    file.sync_all()?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_block_keeps_the_served_slots_it_was_not_asked_about() {
        let unused: IpAddr = "127.255.255.254".parse().unwrap();
        let served = render_block(
            &peers(&[
                (0, "a", "10.0.0.1"),
                (1, "b", "10.0.0.2"),
                (2, "c", "10.0.0.3"),
            ]),
            4,
            unused,
        );
        let file = format!("127.0.0.1 localhost\n{served}");
        // Only itself known yet: the others stay as served.
        let asked = peers(&[(1, "b", "10.0.0.2")]);
        assert_eq!(held_block(&file, &asked, 4, unused), served);
        // A slot asked for another IP takes the asked one; a new slot is added.
        let asked = peers(&[(0, "a", "10.0.0.9"), (3, "d", "10.0.0.4")]);
        let held = parse(&held_block(&file, &asked, 4, unused));
        let ip = |slot| held[&slot_hostname(slot)].clone();
        assert_eq!(ip(0), Resolution::Ip("10.0.0.9".parse().unwrap()));
        assert_eq!(ip(1), Resolution::Ip("10.0.0.2".parse().unwrap()));
        assert_eq!(ip(3), Resolution::Ip("10.0.0.4".parse().unwrap()));
        // Nothing served: as asked.
        assert_eq!(
            held_block("", &asked, 4, unused),
            render_block(&asked, 4, unused)
        );
    }
    use domaind_actors::rules::peers::Peer;

    fn peers(pairs: &[(Slot, &str, &str)]) -> PeerSet {
        PeerSet {
            peers: pairs
                .iter()
                .map(|(slot, node, ip)| {
                    (
                        *slot,
                        Peer {
                            node: (*node).to_owned(),
                            ip: ip.parse().unwrap(),
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn block_maps_holders_and_parks_the_rest() {
        let block = render_block(
            &peers(&[(1, "b", "10.0.0.2")]),
            3,
            "127.255.255.254".parse().unwrap(),
        );
        let parsed = parse(&block);
        assert_eq!(
            parsed["domaind-imex-slot-001"],
            Resolution::Ip("10.0.0.2".parse().unwrap())
        );
        assert_eq!(parsed["domaind-imex-slot-000"], Resolution::Parked);
        assert_eq!(parsed["domaind-imex-slot-002"], Resolution::Parked);
    }

    #[test]
    fn merging_keeps_foreign_lines_and_replaces_only_our_block() {
        let existing = "127.0.0.1 localhost\n10.9.9.9 pod-1\n";
        let first = merge(
            existing,
            &render_block(
                &peers(&[(0, "a", "10.0.0.1")]),
                2,
                "127.255.255.254".parse().unwrap(),
            ),
        );
        let second = merge(
            &first,
            &render_block(
                &peers(&[(0, "a", "10.0.0.7")]),
                2,
                "127.255.255.254".parse().unwrap(),
            ),
        );
        assert!(second.starts_with(existing));
        assert_eq!(second.matches(BEGIN).count(), 1);
        assert_eq!(
            parse(&second)["domaind-imex-slot-000"],
            Resolution::Ip("10.0.0.7".parse().unwrap())
        );
        assert_eq!(
            parse(&second)["pod-1"],
            Resolution::Ip("10.9.9.9".parse().unwrap())
        );
    }

    #[test]
    fn write_reports_whether_anything_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(&path, "127.0.0.1 localhost\n").unwrap();
        let block = render_block(
            &peers(&[(0, "a", "10.0.0.1")]),
            2,
            "127.255.255.254".parse().unwrap(),
        );
        assert!(write(&path, &block).unwrap());
        assert!(!write(&path, &block).unwrap());
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .starts_with("127.0.0.1 localhost\n")
        );
    }
}
