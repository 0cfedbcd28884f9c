//! Admin claims (`adminAccess`, a monitoring pod's) over fakes, in paused time: beside
//! workload claims of their own domain and of others, on a node that holds the domain
//! and on one that holds none, across a restart from the checkpoint. An admin claim
//! joins nothing: no member, no conflict, no channel, no IMEX, no status.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Rack, domain, run};
use domaind_actors::model::{AllocationMode, ClaimInfo, DomainUid, Isolation, Phase};
use domaind_actors::rules::channels::shared_imex_uid;
use domaind_actors::rules::membership::{decode_advertisement, domain_key};
use domaind_actors::testing::{GossipCall, ImexCall};
use domaind_actors::{NodeSnapshot, Prepared};

const LIMIT: Duration = Duration::from_secs(30);

fn rack_of(nodes: &[&str]) -> Rack {
    let mut rack = Rack::default();
    for node in nodes {
        rack.start(node);
    }
    rack
}

fn assert_admin(prepared: &Prepared) {
    assert!(prepared.admin_access, "{prepared:?}");
    assert_eq!(
        (prepared.slot, prepared.channel),
        (None, None),
        "{prepared:?}"
    );
}

/// The names of the nodes a domain's latest status lists.
fn listed(rack: &Rack, uid: &str) -> Option<Vec<String>> {
    let write = rack.status.latest(uid)?;
    Some(write.status.nodes.iter().map(|n| n.name.clone()).collect())
}

/// What `node` did to its IMEX daemon besides asking its status.
fn imex_changes(rack: &Rack, node: &str) -> usize {
    rack.nodes[node]
        .imex
        .count(|c| !matches!(c, ImexCall::Status))
}

fn domains_of(snapshot: &NodeSnapshot) -> Vec<(String, Vec<String>)> {
    snapshot
        .domains
        .iter()
        .map(|d| (d.domain.uid.0.clone(), d.claims.clone()))
        .collect()
}

/// Exclusive domains: an admin claim of cd1 beside cd1's workload, on a node that
/// holds no domain, and an admin claim of cd2 beside cd1's workload: none conflicts,
/// none makes a member or starts IMEX, and unpreparing them touches no domain.
#[test]
fn admin_claims_join_nothing_beside_workloads_of_their_domain_and_of_another() {
    run(|| async {
        let rack = rack_of(&["node-a", "node-b"]);
        let (cd1, cd2) = (domain("cd1", 0), domain("cd2", 0));
        rack.claim("w1", &cd1, None);
        rack.prepare("node-a", "w1").await.unwrap();
        rack.wait_until(LIMIT, "cd1 is Ready on node-a", &["node-a"], |_| {
            rack.status
                .latest("cd1")
                .is_some_and(|w| w.status.status == Phase::Ready)
        })
        .await;

        // Of cd1, beside its workload; of cd1 where it has none; of cd2 beside cd1's.
        rack.admin_claim("adm1-a", &cd1, Isolation::ImexDomain);
        rack.admin_claim("adm1-b", &cd1, Isolation::ImexDomain);
        rack.admin_claim("adm2-a", &cd2, Isolation::ImexDomain);
        for (node, claim) in [
            ("node-a", "adm1-a"),
            ("node-b", "adm1-b"),
            ("node-a", "adm2-a"),
        ] {
            let prepared = rack
                .prepare(node, claim)
                .await
                .unwrap_or_else(|e| panic!("{claim} on {node}: {e}"));
            assert_admin(&prepared);
        }

        let a = rack.snapshot("node-a").await;
        assert_eq!(domains_of(&a), [("cd1".into(), vec!["w1".into()])]);
        let b = rack.snapshot("node-b").await;
        assert!(b.domains.is_empty() && b.shared_imex.is_none(), "{b:?}");
        assert_eq!(b.claims, ["adm1-b"]);
        assert_eq!(
            imex_changes(&rack, "node-b"),
            0,
            "node-b's IMEX is untouched"
        );
        assert!(
            rack.nodes["node-b"].gossip.calls().is_empty(),
            "node-b advertises nothing: {:?}",
            rack.nodes["node-b"].gossip.calls()
        );

        // A workload of cd2 on node-b, where the admin claim of cd1 is: admitted.
        rack.claim("w2", &cd2, None);
        rack.prepare("node-b", "w2").await.unwrap();
        rack.wait_until(LIMIT, "both statuses settle", &["node-a", "node-b"], |s| {
            s.iter()
                .all(|n| n.domains.iter().all(|d| d.phase == Phase::Ready))
                && listed(&rack, "cd1") == Some(vec!["node-a".into()])
                && listed(&rack, "cd2") == Some(vec!["node-b".into()])
        })
        .await;
        assert!(
            rack.status
                .writes()
                .iter()
                .all(|w| (w.domain.uid.0 == "cd1") == (w.writer == "node-a")),
            "each status written by its only member: {:?}",
            rack.status.writes()
        );

        // Unprepared: an admin claim touches nothing; the workload's last claim leaves
        // cd1 although an admin claim of cd1 is still held.
        let writes = rack.status.writes().len();
        let imex_a = imex_changes(&rack, "node-a");
        rack.unprepare("node-a", "adm2-a").await.unwrap();
        rack.unprepare("node-b", "adm1-b").await.unwrap();
        assert_eq!(domains_of(&rack.snapshot("node-a").await).len(), 1);
        assert_eq!(imex_changes(&rack, "node-a"), imex_a);
        assert_eq!(rack.status.writes().len(), writes, "no status changed");
        rack.unprepare("node-a", "w1").await.unwrap();
        let a = rack.snapshot("node-a").await;
        assert!(a.domains.is_empty(), "cd1 left node-a: {a:?}");
        assert_eq!(a.claims, ["adm1-a"]);
        assert!(
            rack.nodes["node-a"]
                .gossip
                .calls()
                .contains(&GossipCall::Delete {
                    key: domain_key(&DomainUid("cd1".into()))
                })
        );
        rack.unprepare("node-a", "adm1-a").await.unwrap();
        let saved = rack.nodes["node-a"].checkpoint.saved().unwrap();
        assert!(saved.claims.is_empty(), "{saved:?}");
    });
}

/// A restarted node restores its admin claims from the checkpoint as admin claims:
/// the domain comes back with its workload claims only, the admin claim is answered
/// at once without asking the claim source, and a node holding admin claims alone
/// starts no domain.
#[test]
fn admin_claims_survive_a_restart_and_still_join_nothing() {
    run(|| async {
        let mut rack = rack_of(&["node-a", "node-b"]);
        let (cd1, cd2) = (domain("cd1", 0), domain("cd2", 0));
        rack.claim("w1", &cd1, None);
        rack.admin_claim("adm1-a", &cd1, Isolation::ImexDomain);
        rack.admin_claim("adm2-a", &cd2, Isolation::ImexDomain);
        rack.admin_claim("adm1-b", &cd1, Isolation::ImexDomain);
        rack.prepare("node-a", "w1").await.unwrap();
        for (node, claim) in [
            ("node-a", "adm1-a"),
            ("node-a", "adm2-a"),
            ("node-b", "adm1-b"),
        ] {
            rack.prepare(node, claim).await.unwrap();
        }
        let saved = rack.nodes["node-a"].checkpoint.saved().unwrap();
        assert!(saved.claims["adm1-a"].info.admin_access);
        assert!(!saved.claims["w1"].info.admin_access);

        for node in ["node-a", "node-b"] {
            rack.kill_daemon(node);
            rack.start(node);
        }
        rack.wait_until(LIMIT, "cd1 is back on node-a", &["node-a"], |s| {
            s[0].domains
                .first()
                .is_some_and(|d| d.phase == Phase::Ready)
        })
        .await;
        let a = rack.snapshot("node-a").await;
        assert_eq!(domains_of(&a), [("cd1".into(), vec!["w1".into()])]);
        assert_eq!(a.claims, ["adm1-a", "adm2-a", "w1"]);
        let b = rack.snapshot("node-b").await;
        assert!(b.domains.is_empty(), "{b:?}");
        assert_eq!(b.claims, ["adm1-b"]);
        assert_eq!(imex_changes(&rack, "node-b"), 0);

        let lookups = rack.claims.lookups().len();
        assert_admin(&rack.prepare("node-a", "adm1-a").await.unwrap());
        assert_admin(&rack.prepare("node-b", "adm1-b").await.unwrap());
        assert_eq!(
            rack.claims.lookups().len(),
            lookups,
            "answered from the checkpoint"
        );
        rack.unprepare("node-a", "adm1-a").await.unwrap();
        assert_eq!(
            domains_of(&rack.snapshot("node-a").await),
            [("cd1".into(), vec!["w1".into()])]
        );
        rack.wait_until(LIMIT, "cd1 lists node-a alone", &["node-a"], |_| {
            listed(&rack, "cd1") == Some(vec!["node-a".into()])
        })
        .await;
    });
}

/// Channel isolation: admin claims of a sharing domain, on its node and on one that
/// holds none, and of a second sharing domain: the second gets no channel, the first's
/// pods hold only the workload's, no shared IMEX domain starts for them, an admin
/// claim of a sharing domain sits beside an exclusive domain's workload, and `All` is
/// no refusal for an admin claim. The last workload claim's unprepare ends the shared
/// IMEX domain although admin claims of its domain are still held.
#[test]
fn admin_claims_of_sharing_domains_hold_no_channel_and_start_no_shared_imex() {
    run(|| async {
        let rack = rack_of(&["node-a", "node-b"]);
        let (s1, s2, x) = (domain("s1", 0), domain("s2", 0), domain("x", 0));
        rack.sharing_claim("w-s1", &s1, AllocationMode::Single);
        let workload = rack.prepare("node-a", "w-s1").await.unwrap();
        let channel = workload.channel.expect("a sharing domain's channel");

        rack.admin_claim("adm-s1-a", &s1, Isolation::Channel);
        rack.admin_claim("adm-s2-a", &s2, Isolation::Channel);
        rack.claims.insert(
            "adm-s1-all-b",
            Ok(ClaimInfo {
                domain: s1.clone(),
                allocation_mode: AllocationMode::All,
                readiness: None,
                devices: Vec::new(),
                isolation: Isolation::Channel,
                admin_access: true,
            }),
        );
        rack.claim("w-x", &x, None);
        rack.prepare("node-b", "w-x").await.unwrap();
        for (node, claim) in [
            ("node-a", "adm-s1-a"),
            ("node-a", "adm-s2-a"),
            ("node-b", "adm-s1-all-b"),
        ] {
            let prepared = rack
                .prepare(node, claim)
                .await
                .unwrap_or_else(|e| panic!("{claim} on {node}: {e}"));
            assert_admin(&prepared);
        }

        let a = rack.snapshot("node-a").await;
        assert_eq!(domains_of(&a), [("s1".into(), vec!["w-s1".into()])]);
        let shared = a.shared_imex.as_ref().expect("s1's workload runs it");
        assert_eq!(
            shared.channels,
            BTreeMap::from([(DomainUid("s1".into()), channel)]),
            "s2 is assigned no channel"
        );
        let b = rack.snapshot("node-b").await;
        assert!(b.shared_imex.is_none(), "{b:?}");
        assert_eq!(domains_of(&b), [("x".into(), vec!["w-x".into()])]);

        // node-a's pods hold s1's channel, for its workload alone.
        let key = domain_key(&shared_imex_uid(&rack_clique()));
        let held = || {
            let view = rack.net.snapshot();
            let ad = decode_advertisement(&view["node-a"].keys[&key]).expect("advertised");
            ad.sharing.unwrap_or_default().held_channels
        };
        assert_eq!(held(), BTreeMap::from([(DomainUid("s1".into()), channel)]));

        rack.unprepare("node-a", "w-s1").await.unwrap();
        let a = rack.snapshot("node-a").await;
        assert!(
            a.domains.is_empty() && a.shared_imex.is_none(),
            "s1 and the shared IMEX domain left node-a: {a:?}"
        );
        assert_eq!(a.claims, ["adm-s1-a", "adm-s2-a"]);
        assert!(listed(&rack, "s2").is_none(), "s2 never had a status");
    });
}

/// The clique every node of a [`Rack`] is in.
fn rack_clique() -> domaind_actors::model::CliqueId {
    domaind_actors::model::CliqueId("cluster-1.0".into())
}
