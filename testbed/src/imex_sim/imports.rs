//! imex-sim's model of memory imports, the part of IMEX a running job depends on.
//!
//! A job on one node imports memory that its peers' GPUs export, through the node's
//! IMEX daemon. NVIDIA's IMEX guide says what ends an import: when a peer's daemon
//! reconnects, IMEX checks whether it is "the same (or a new) instance"; a new one
//! means the exporter's memory was cleaned up, so every import of it is gone. A peer
//! dropped from the importer's config is cleaned up likewise. A link that drops and
//! comes back to the *same* instance breaks nothing.
//!
//! So each daemon has an instance id, made at start and told to every peer it links
//! with; an import records the instance of every peer it imports from, and breaks when
//! a link comes up to another instance of one of them, or when the config stops
//! listing one. A restart of the importing daemon loses its imports altogether: the
//! workload stand-in that holds one ([`Imports::report`]) no longer finds it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// One import: whose memory, from which instance of each, and whether it broke.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Import {
    /// The exporting peers (as the nodes config names them) and their instances.
    pub from: BTreeMap<String, u64>,
    /// Why it broke, once it did. A broken import stays broken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken: Option<String>,
}

/// Every import this daemon holds, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imports {
    next_id: u64,
    held: BTreeMap<u64, Import>,
}

impl Imports {
    /// A job imports from every peer in `peers` (name and instance, as linked now).
    pub fn import(&mut self, peers: BTreeMap<String, u64>) -> u64 {
        self.next_id += 1;
        self.held.insert(
            self.next_id,
            Import {
                from: peers,
                broken: None,
            },
        );
        self.next_id
    }

    /// A link to `host` came up, and the daemon there is `instance`.
    pub fn linked(&mut self, host: &str, instance: u64) {
        for import in self.held.values_mut() {
            if import.broken.is_none()
                && let Some(imported) = import.from.get(host)
                && *imported != instance
            {
                import.broken = Some(format!(
                    "{host} is a new IMEX instance ({imported:016x} then, {instance:016x} now): its memory was cleaned up"
                ));
            }
        }
    }

    /// The config now lists `hosts`: imports from a peer it no longer lists are
    /// cleaned up.
    pub fn configured(&mut self, hosts: &BTreeSet<String>) {
        for import in self.held.values_mut() {
            if import.broken.is_some() {
                continue;
            }
            if let Some(gone) = import.from.keys().find(|host| !hosts.contains(*host)) {
                import.broken = Some(format!("{gone} was dropped from the IMEX config"));
            }
        }
    }

    pub fn report(&self) -> &BTreeMap<u64, Import> {
        &self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(list: &[(&str, u64)]) -> BTreeMap<String, u64> {
        list.iter().map(|(h, i)| ((*h).to_owned(), *i)).collect()
    }

    fn hosts(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|h| (*h).to_owned()).collect()
    }

    #[test]
    fn a_link_back_to_the_same_instance_breaks_nothing_a_new_instance_breaks_it() {
        let mut imports = Imports::default();
        let id = imports.import(peers(&[("slot-1", 7), ("slot-2", 9)]));
        imports.linked("slot-1", 7);
        imports.configured(&hosts(&["slot-0", "slot-1", "slot-2"]));
        assert_eq!(imports.report()[&id].broken, None);
        imports.linked("slot-2", 10);
        let why = imports.report()[&id].broken.clone().unwrap();
        assert!(why.contains("slot-2 is a new IMEX instance"), "{why}");
        // It stays broken, with its first cause.
        imports.linked("slot-2", 9);
        imports.configured(&hosts(&[]));
        assert_eq!(imports.report()[&id].broken, Some(why));
    }

    #[test]
    fn a_peer_dropped_from_the_config_breaks_the_imports_of_it_only() {
        let mut imports = Imports::default();
        let of_both = imports.import(peers(&[("slot-1", 7), ("slot-2", 9)]));
        let of_one = imports.import(peers(&[("slot-1", 7)]));
        imports.configured(&hosts(&["slot-0", "slot-1"]));
        assert_eq!(
            imports.report()[&of_both].broken.as_deref(),
            Some("slot-2 was dropped from the IMEX config")
        );
        assert_eq!(imports.report()[&of_one].broken, None);
    }
}
