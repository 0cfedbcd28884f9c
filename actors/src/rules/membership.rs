//! Who is in a domain: the live nodes whose `domain/<uid>` key advertises it.

use std::collections::BTreeMap;

use domaind_membership::Membership;

use crate::model::{Advertisement, CliqueId, DomainMember, DomainUid, NodeId};

pub const DOMAIN_KEY_PREFIX: &str = "domain/";
pub const STATUS_KEY_PREFIX: &str = "status/";

/// The gossip key a node advertises its part in a domain under.
pub fn domain_key(uid: &DomainUid) -> String {
    format!("{DOMAIN_KEY_PREFIX}{uid}")
}

/// The gossip key a reporter publishes the digest of its last status write under, so
/// that a successor does not write the same document again.
pub fn status_key(uid: &DomainUid) -> String {
    format!("{STATUS_KEY_PREFIX}{uid}")
}

pub fn encode_advertisement(ad: &Advertisement) -> String {
    serde_json::to_string(ad).expect("an advertisement always serialises")
}

pub fn decode_advertisement(value: &str) -> Result<Advertisement, serde_json::Error> {
    serde_json::from_str(value)
}

/// A domain's live members, and the advertisements that could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainView {
    pub members: BTreeMap<NodeId, DomainMember>,
    /// Nodes whose advertisement is unreadable (another version, or corrupt), with why.
    pub malformed: Vec<(NodeId, String)>,
    /// Nodes advertising the domain from another clique: they cannot share memory.
    pub foreign: Vec<NodeId>,
}

/// The members of domain `uid` in the gossip view, restricted to `clique`.
pub fn domain_members(uid: &DomainUid, live: &Membership, clique: &CliqueId) -> DomainView {
    let key = domain_key(uid);
    let mut view = DomainView::default();
    for (node, member) in live {
        let Some(value) = member.keys.get(&key) else {
            continue;
        };
        match decode_advertisement(value) {
            Ok(ad) if &ad.clique == clique => {
                view.members.insert(
                    node.clone(),
                    DomainMember {
                        node: node.clone(),
                        generation: member.generation,
                        ad,
                    },
                );
            }
            Ok(_) => view.foreign.push(node.clone()),
            Err(error) => view.malformed.push((node.clone(), error.to_string())),
        }
    }
    view
}

/// The domain a node advertises, if any: a node serves one domain at a time.
pub fn advertised_domains(keys: &BTreeMap<String, String>) -> Vec<DomainUid> {
    keys.keys()
        .filter_map(|k| k.strip_prefix(DOMAIN_KEY_PREFIX))
        .map(|uid| DomainUid(uid.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::fixtures::advertisement;
    use domaind_membership::Member;

    fn ad(clique: &str, slot: Option<u16>) -> Advertisement {
        Advertisement {
            clique: CliqueId(clique.into()),
            slot,
            joined_at_ms: 1,
            ..advertisement()
        }
    }

    fn live(nodes: &[(&str, &[(&str, String)])]) -> Membership {
        nodes
            .iter()
            .map(|(node, keys)| {
                (
                    (*node).to_owned(),
                    Member {
                        node: (*node).to_owned(),
                        generation: 1,
                        gossip_addr: "127.0.0.1:1".parse().unwrap(),
                        keys: keys
                            .iter()
                            .map(|(k, v)| ((*k).to_owned(), v.clone()))
                            .collect(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn members_are_the_nodes_advertising_the_domain_in_our_clique() {
        let uid = DomainUid("cd-1".into());
        let good = encode_advertisement(&ad("c.0", Some(0)));
        let foreign = encode_advertisement(&ad("c.1", None));
        let other_domain = encode_advertisement(&ad("c.0", None));
        let view = domain_members(
            &uid,
            &live(&[
                ("a", &[("domain/cd-1", good.clone())]),
                ("b", &[("domain/cd-2", other_domain)]),
                ("c", &[("domain/cd-1", foreign)]),
                ("d", &[("domain/cd-1", "{not json".into())]),
                ("e", &[]),
            ]),
            &CliqueId("c.0".into()),
        );
        assert_eq!(view.members.keys().collect::<Vec<_>>(), vec!["a"]);
        assert_eq!(view.foreign, vec!["c".to_string()]);
        assert_eq!(view.malformed.len(), 1);
        assert_eq!(view.malformed[0].0, "d");
    }

    #[test]
    fn advertisement_round_trips() {
        let original = ad("c.0", Some(17));
        assert_eq!(
            decode_advertisement(&encode_advertisement(&original)).unwrap(),
            original
        );
        let failing = Advertisement {
            imex_failing: true,
            ..original.clone()
        };
        assert_eq!(
            decode_advertisement(&encode_advertisement(&failing)).unwrap(),
            failing
        );
    }

    /// A healthy node's advertisement is what it was before `imex_failing` existed, and
    /// an older node's (without the field) reads as not failing: nodes of both versions
    /// share a clique during a rolling upgrade (and older ones ignore the field, as
    /// serde ignores unknown fields).
    #[test]
    fn imex_failing_is_written_only_when_true() {
        let healthy = encode_advertisement(&ad("c.0", Some(1)));
        assert!(!healthy.contains("imex_failing"), "{healthy}");
        let failing = encode_advertisement(&Advertisement {
            imex_failing: true,
            ..ad("c.0", Some(1))
        });
        assert!(failing.contains("\"imex_failing\":true"), "{failing}");
        let mut older: serde_json::Value = serde_json::from_str(&failing).unwrap();
        older.as_object_mut().unwrap().remove("imex_failing");
        assert_eq!(
            decode_advertisement(&older.to_string()).unwrap(),
            ad("c.0", Some(1))
        );
    }
}
