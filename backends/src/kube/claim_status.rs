//! What this node writes in its claims' `status.devices` (pure): for every device of a
//! claim prepared here, a `Ready` condition saying how the device's ComputeDomain
//! channel is on this node (`rules/channel_health.rs` decides) and `data` naming the
//! domain, the clique, this node's index, the channel and the IMEX peers linked. And
//! the [`Book`] that says, claim by claim, whether a write is needed and when.
//!
//! A claim is written when what it should say changed, once the views have settled
//! (a burst of views is one write per claim), or when its last write failed and its
//! backoff ran out. A change a reader must see promptly (the condition's status or
//! reason, the domain, clique, index or channel, a device entry come or gone) is due a
//! settle after it. A change only in the details (the IMEX peer counts in `data`, the
//! condition's message: the counts, the peers whose link is down, the domain's ready
//! nodes) is due no sooner than a hold after the claim's last write: they change one
//! member and one link at a time as a domain forms or a node comes back, and writing
//! each step was most of our API writes. Whatever is written is the latest,
//! so a prompt write carries the count along (and starts the hold again), and the final
//! count is always written. Before its first write a claim is read once: what a
//! previous run of the daemon wrote is then not written again, and a condition whose
//! status did not change keeps its transition time across restarts.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::time::Duration;

use domaind_actors::model::ClaimRef;
use domaind_actors::ports::ErrorKind;
use domaind_actors::rules::channel_health::{ChannelHealth, HealthReason};
use domaind_actors::{HealthView, PreparedDevice};
use domaind_backoff::Backoff;
use domaind_kube_api::crd::{Condition, ConditionStatus};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio::time::Instant;

/// The condition type of every entry.
pub const READY_CONDITION: &str = "Ready";

/// A device in its pool: how `status.devices` keys entries of one driver.
pub type DeviceKey = (String, String);

/// One device's entry, as it should be: all but the condition's transition time and
/// observed generation, which come from what the API holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEntry {
    pub status: ConditionStatus,
    pub reason: HealthReason,
    pub message: String,
    pub data: Value,
}

/// Everything this node writes into one claim: an entry per device of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimEntries {
    pub claim: ClaimRef,
    pub devices: BTreeMap<DeviceKey, DeviceEntry>,
}

/// The entry `device` gets.
pub fn device_entry(device: &PreparedDevice) -> DeviceEntry {
    let (status, message) = match device.health() {
        ChannelHealth::Healthy => (ConditionStatus::True, healthy_message(device)),
        ChannelHealth::Unhealthy(why) => (ConditionStatus::False, why.clone()),
        ChannelHealth::Unknown => (
            ConditionStatus::Unknown,
            "not known yet: this node's IMEX has not answered, or the ComputeDomain has \
             not been judged here yet"
                .to_owned(),
        ),
    };
    let domain = &device.domain;
    let mut data = json!({
        "computeDomain": {
            "namespace": domain.namespace,
            "name": domain.name,
            "uid": domain.uid.0,
        },
    });
    if let Some(judged) = &device.status {
        data["cliqueID"] = json!(judged.clique.0);
        if let Some(index) = judged.index {
            data["index"] = json!(index);
        }
        // A domain without its own channel (`isolation: Exclusive`) uses channel 0.
        data["channel"] = json!(judged.channel.unwrap_or(0));
        data["imexPeers"] = json!({"linked": judged.linked_peers, "total": judged.peers});
    }
    DeviceEntry {
        status,
        reason: device.reason(),
        message,
        data,
    }
}

fn healthy_message(device: &PreparedDevice) -> String {
    match &device.status {
        Some(judged) if judged.reason == HealthReason::ImexReady => format!(
            "IMEX ready on this node, {} of {} IMEX peers linked",
            judged.linked_peers, judged.peers
        ),
        _ => "ComputeDomain Ready".to_owned(),
    }
}

/// What every claim of `view` should hold, by claim uid.
pub fn desired(view: &HealthView) -> BTreeMap<String, ClaimEntries> {
    let mut claims: BTreeMap<String, ClaimEntries> = BTreeMap::new();
    for device in &view.devices {
        claims
            .entry(device.claim.uid.clone())
            .or_insert_with(|| ClaimEntries {
                claim: device.claim.clone(),
                devices: BTreeMap::new(),
            })
            .devices
            .insert(
                (device.device.pool.clone(), device.device.device.clone()),
                device_entry(device),
            );
    }
    claims
}

/// One of our entries as the API holds it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeenDevice {
    /// None when absent, or not a condition we can read (it is then written again).
    pub ready: Option<Condition>,
    pub data: Option<Value>,
}

/// A claim as the API holds it, as far as our entries go.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Seen {
    pub generation: Option<i64>,
    pub devices: BTreeMap<DeviceKey, SeenDevice>,
}

/// Our driver's entries of `claim`.
pub fn seen_in(claim: &ResourceClaim, driver: &str) -> Seen {
    let devices = claim
        .status
        .as_ref()
        .and_then(|status| status.devices.as_ref())
        .into_iter()
        .flatten()
        .filter(|entry| entry.driver == driver && entry.share_id.is_none())
        .map(|entry| {
            let ready = entry
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == READY_CONDITION)
                .and_then(|c| serde_json::to_value(c).ok())
                .and_then(|c| serde_json::from_value(c).ok());
            let data = entry.data.as_ref().map(|raw| raw.0.clone());
            (
                (entry.pool.clone(), entry.device.clone()),
                SeenDevice { ready, data },
            )
        })
        .collect();
    Seen {
        generation: claim.metadata.generation,
        devices,
    }
}

/// Whether the API holds exactly what `want` says (at the claim's generation).
pub fn up_to_date(want: &ClaimEntries, seen: &Seen) -> bool {
    want.devices.len() == seen.devices.len()
        && want.devices.iter().all(|(key, entry)| {
            seen.devices.get(key).is_some_and(|held| {
                held.data.as_ref() == Some(&entry.data)
                    && held.ready.as_ref().is_some_and(|ready| {
                        ready.status == entry.status
                            && ready.reason == entry.reason.as_str()
                            && ready.message == entry.message
                            && ready.observed_generation == seen.generation
                    })
            })
        })
}

/// What of an entry a reader must see promptly: whether the channel works and why
/// (the condition's status and reason) and where (the domain, clique, index and
/// channel); not the details that change with every member and link (the IMEX peer
/// counts, the message).
#[derive(Debug, PartialEq)]
struct Prompt<'a> {
    status: ConditionStatus,
    reason: &'a str,
    data: Value,
}

impl<'a> Prompt<'a> {
    fn of(status: ConditionStatus, reason: &'a str, data: &Value) -> Self {
        let mut data = data.clone();
        if let Some(data) = data.as_object_mut() {
            data.remove("imexPeers");
        }
        Self {
            status,
            reason,
            data,
        }
    }
}

/// Whether writing `want` over what the API holds changes more than the details: an
/// entry of ours held unreadable, or not held at all, is such a change.
pub fn prompt_change(want: &ClaimEntries, seen: &Seen) -> bool {
    want.devices.len() != seen.devices.len()
        || want.devices.iter().any(|(key, entry)| {
            let Some(SeenDevice {
                ready: Some(ready),
                data: Some(data),
            }) = seen.devices.get(key)
            else {
                return true;
            };
            Prompt::of(entry.status, entry.reason.as_str(), &entry.data)
                != Prompt::of(ready.status, &ready.reason, data)
        })
}

/// The server-side apply body: the claim's identity (the uid makes the write miss a
/// claim recreated under the same name) and our entries, each condition keeping its
/// transition time while its status stays.
pub fn apply_body(driver: &str, want: &ClaimEntries, seen: &Seen, now: OffsetDateTime) -> Value {
    let devices: Vec<Value> = want
        .devices
        .iter()
        .map(|((pool, device), entry)| {
            let previous = seen.devices.get(&(pool.clone(), device.clone()));
            let ready = Condition::transition(
                previous.and_then(|p| p.ready.as_ref()),
                READY_CONDITION,
                entry.status,
                entry.reason.as_str(),
                entry.message.clone(),
                seen.generation,
                now,
            );
            json!({
                "driver": driver,
                "pool": pool,
                "device": device,
                "conditions": [ready],
                "data": entry.data,
            })
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": want.claim.name,
            "namespace": want.claim.namespace,
            "uid": want.claim.uid,
        },
        "status": {"devices": devices},
    })
}

/// What to do next for a claim that is due.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Read it first: what the API holds is not known yet.
    Read(ClaimRef),
    /// Write this body.
    Apply(ClaimRef, Value),
    /// Nothing: it holds what it should, or it is gone.
    Done,
}

/// What a read or a write answered: the claim as it now is, None when it is gone
/// (deleted, or recreated under its name), or why it failed.
pub type Answer = Result<Option<Seen>, ErrorKind>;

#[derive(Debug)]
struct Tracked {
    want: ClaimEntries,
    seen: Option<Seen>,
    /// Deleted or recreated: never written again while it is prepared here.
    gone: bool,
    due: Option<Instant>,
    /// When its last write succeeded (in this run): a count-only change waits the hold
    /// from it.
    written_at: Option<Instant>,
    backoff: Backoff,
}

/// The claims prepared here, what each should hold, what the API was last seen to hold,
/// and when each is to be read or written.
#[derive(Debug)]
pub struct Book {
    driver: String,
    settle: Duration,
    hold: Duration,
    backoff: Backoff,
    claims: BTreeMap<String, Tracked>,
}

impl Book {
    /// `settle`: how long after a change a claim waits for more before it is written.
    /// `hold`: how long after a claim's last write a change only in its linked-peers
    /// count waits. `backoff`: each claim's retries, from a fresh copy.
    pub fn new(
        driver: impl Into<String>,
        settle: Duration,
        hold: Duration,
        backoff: Backoff,
    ) -> Self {
        Self {
            driver: driver.into(),
            settle,
            hold,
            backoff,
            claims: BTreeMap::new(),
        }
    }

    /// Takes a new view. A claim that left it (unprepared) is forgotten, a pending
    /// write or retry with it: the API server drops its entries once it is deallocated
    /// or deleted. A claim whose entries changed is due `settle` after its first change
    /// since its last write, or, when it differs from what the API holds only in the
    /// linked-peers count, no sooner than `hold` after its last write; a retry already
    /// scheduled stays as it is.
    pub fn observe(&mut self, view: &HealthView, now: Instant) {
        let desired = desired(view);
        self.claims.retain(|uid, _| desired.contains_key(uid));
        let settled = now + self.settle;
        let hold = self.hold;
        for (uid, want) in desired {
            match self.claims.entry(uid) {
                Entry::Vacant(vacant) => {
                    vacant.insert(Tracked {
                        want,
                        seen: None,
                        gone: false,
                        due: Some(settled),
                        written_at: None,
                        backoff: self.backoff.clone(),
                    });
                }
                Entry::Occupied(mut occupied) => {
                    let tracked = occupied.get_mut();
                    if tracked.want == want {
                        continue;
                    }
                    tracked.want = want;
                    if tracked.gone || tracked.backoff.failures() > 0 {
                        continue;
                    }
                    let count_only = tracked
                        .seen
                        .as_ref()
                        .is_some_and(|seen| !prompt_change(&tracked.want, seen));
                    let at = match tracked.written_at {
                        Some(written) if count_only => settled.max(written + hold),
                        _ => settled,
                    };
                    tracked.due = Some(tracked.due.map_or(at, |due| due.min(at)));
                }
            }
        }
    }

    /// The earliest time a claim is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.claims.values().filter_map(|t| t.due).min()
    }

    /// The claims due at `now`, by uid.
    pub fn due(&self, now: Instant) -> Vec<String> {
        self.claims
            .iter()
            .filter(|(_, t)| t.due.is_some_and(|due| due <= now))
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// What to do for claim `uid` now; `Done` clears its due time.
    pub fn step(&mut self, uid: &str, now: OffsetDateTime) -> Step {
        let Some(tracked) = self.claims.get_mut(uid) else {
            return Step::Done;
        };
        let step = match &tracked.seen {
            _ if tracked.gone => Step::Done,
            None => Step::Read(tracked.want.claim.clone()),
            Some(seen) if up_to_date(&tracked.want, seen) => Step::Done,
            Some(seen) => Step::Apply(
                tracked.want.claim.clone(),
                apply_body(&self.driver, &tracked.want, seen, now),
            ),
        };
        if step == Step::Done {
            tracked.due = None;
        }
        step
    }

    /// Records what a read of claim `uid` answered. A success leaves it due: the next
    /// step says whether it needs a write. A failure makes it due after its backoff,
    /// which is returned.
    pub fn read(&mut self, uid: &str, answer: Answer, now: Instant) -> Option<Duration> {
        self.answered(uid, answer, now, false)
    }

    /// Records what a write of claim `uid` answered. A success is the end of it until
    /// the next change, even should the answer differ from what was written (no write
    /// loop on a server that spells something its own way).
    pub fn written(&mut self, uid: &str, answer: Answer, now: Instant) -> Option<Duration> {
        self.answered(uid, answer, now, true)
    }

    fn answered(
        &mut self,
        uid: &str,
        answer: Answer,
        now: Instant,
        write: bool,
    ) -> Option<Duration> {
        let tracked = self.claims.get_mut(uid)?;
        match answer {
            Ok(Some(seen)) => {
                tracked.seen = Some(seen);
                tracked.backoff.succeed();
                if write {
                    tracked.due = None;
                    tracked.written_at = Some(now);
                }
                None
            }
            Ok(None) => {
                tracked.gone = true;
                tracked.due = None;
                tracked.backoff.succeed();
                None
            }
            Err(kind) => {
                // A permanent refusal (RBAC, validation) waits the cap at once, so a
                // fix by a person is picked up within it.
                let wait = match kind {
                    ErrorKind::Permanent => tracked.backoff.fail_at_cap(),
                    ErrorKind::Transient | ErrorKind::Conflict => tracked.backoff.fail(),
                };
                tracked.due = Some(now + wait);
                Some(wait)
            }
        }
    }

    /// Failures in a row of claim `uid`'s reads and writes.
    pub fn failures(&self, uid: &str) -> u32 {
        self.claims.get(uid).map_or(0, |t| t.backoff.failures())
    }
}

#[cfg(test)]
mod tests {
    use domaind_actors::model::{AllocatedDevice, CliqueId, DomainRef, DomainUid};
    use domaind_actors::rules::channel_health::DomainHealth;
    use time::macros::datetime;

    use super::*;

    const DRIVER: &str = "compute-domain.nvidia.com";
    const SETTLE: Duration = Duration::from_millis(100);
    const HOLD: Duration = Duration::from_secs(5);
    const MS: Duration = Duration::from_millis(1);

    fn claim(i: u32) -> ClaimRef {
        ClaimRef {
            uid: format!("claim-uid-{i}"),
            namespace: "team-a".into(),
            name: format!("pod-{i}-channel"),
        }
    }

    fn healthy() -> DomainHealth {
        DomainHealth {
            health: ChannelHealth::Healthy,
            reason: HealthReason::ImexReady,
            clique: CliqueId("c.1".into()),
            index: Some(2),
            channel: None,
            linked_peers: 3,
            peers: 3,
            imex_failing: None,
        }
    }

    fn link_down() -> DomainHealth {
        DomainHealth {
            health: ChannelHealth::Unhealthy("IMEX link down to node-1 (index 1)".into()),
            reason: HealthReason::LinkDown,
            linked_peers: 2,
            ..healthy()
        }
    }

    fn device(i: u32, name: &str, status: Option<DomainHealth>) -> PreparedDevice {
        PreparedDevice {
            claim: claim(i),
            device: AllocatedDevice {
                request: "channel".into(),
                pool: "node-2".into(),
                device: name.into(),
            },
            domain: DomainRef {
                uid: DomainUid("cd-uid".into()),
                namespace: "team-a".into(),
                name: "training".into(),
                num_nodes: 0,
            },
            status,
        }
    }

    fn view(devices: Vec<PreparedDevice>) -> HealthView {
        HealthView {
            devices,
            imex_failing: None,
        }
    }

    fn book() -> Book {
        Book::new(
            DRIVER,
            SETTLE,
            HOLD,
            Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
        )
    }

    fn at_generation(generation: i64) -> Seen {
        Seen {
            generation: Some(generation),
            devices: BTreeMap::new(),
        }
    }

    /// What the API server would hold after `body` was applied to a claim at
    /// `generation`.
    fn held(body: &Value, generation: i64) -> Seen {
        let mut claim = body.clone();
        claim["metadata"]["generation"] = json!(generation);
        claim["spec"] = json!({});
        seen_in(&serde_json::from_value(claim).unwrap(), DRIVER)
    }

    #[test]
    fn a_healthy_device_is_ready_with_its_domain_clique_index_channel_and_peers() {
        let entry = device_entry(&device(1, "channel-3", Some(healthy())));
        assert_eq!(entry.status, ConditionStatus::True);
        assert_eq!(entry.reason.as_str(), "ImexReady");
        assert_eq!(
            entry.message,
            "IMEX ready on this node, 3 of 3 IMEX peers linked"
        );
        assert_eq!(
            entry.data,
            json!({
                "computeDomain": {"namespace": "team-a", "name": "training", "uid": "cd-uid"},
                "cliqueID": "c.1",
                "index": 2,
                "channel": 0,
                "imexPeers": {"linked": 3, "total": 3},
            })
        );
        let sharing = DomainHealth {
            channel: Some(7),
            ..healthy()
        };
        assert_eq!(
            device_entry(&device(1, "channel-3", Some(sharing))).data["channel"],
            7
        );
    }

    #[test]
    fn an_unhealthy_device_is_not_ready_and_says_why() {
        let entry = device_entry(&device(1, "channel-3", Some(link_down())));
        assert_eq!(entry.status, ConditionStatus::False);
        assert_eq!(entry.reason.as_str(), "LinkDown");
        assert_eq!(entry.message, "IMEX link down to node-1 (index 1)");
        assert_eq!(entry.data["imexPeers"], json!({"linked": 2, "total": 3}));
    }

    #[test]
    fn a_device_not_judged_yet_is_unknown_and_names_only_its_domain() {
        let entry = device_entry(&device(1, "channel-3", None));
        assert_eq!(entry.status, ConditionStatus::Unknown);
        assert_eq!(entry.reason.as_str(), "Pending");
        assert_eq!(
            entry.data,
            json!({"computeDomain": {"namespace": "team-a", "name": "training", "uid": "cd-uid"}})
        );
        let judging = DomainHealth {
            health: ChannelHealth::Unknown,
            reason: HealthReason::Pending,
            index: None,
            ..healthy()
        };
        let entry = device_entry(&device(1, "channel-3", Some(judging)));
        assert_eq!(entry.status, ConditionStatus::Unknown);
        assert!(entry.data.get("index").is_none(), "{}", entry.data);
    }

    #[test]
    fn without_fabric_a_ready_domain_is_ready() {
        let no_fabric = DomainHealth {
            reason: HealthReason::DomainReady,
            clique: CliqueId::default(),
            linked_peers: 0,
            peers: 0,
            ..healthy()
        };
        let entry = device_entry(&device(1, "channel-0", Some(no_fabric)));
        assert_eq!(
            (entry.status, entry.reason.as_str(), entry.message.as_str()),
            (ConditionStatus::True, "DomainReady", "ComputeDomain Ready")
        );
    }

    #[test]
    fn the_body_holds_our_entries_and_keeps_a_transition_time_while_the_status_stays() {
        let mut book = book();
        let t0 = Instant::now();
        book.observe(&view(vec![device(1, "channel-3", Some(healthy()))]), t0);
        let uid = claim(1).uid;
        let _ = book.step(&uid, datetime!(2026-11-22 10:00:00 UTC));
        book.read(&uid, Ok(Some(at_generation(1))), t0);
        let Step::Apply(_, body) = book.step(&uid, datetime!(2026-11-22 10:00:00.7 UTC)) else {
            panic!("a write")
        };
        assert_eq!(
            body["metadata"],
            json!({"name": "pod-1-channel", "namespace": "team-a", "uid": "claim-uid-1"})
        );
        let entry = &body["status"]["devices"][0];
        assert_eq!(
            (&entry["driver"], &entry["pool"], &entry["device"]),
            (&json!(DRIVER), &json!("node-2"), &json!("channel-3"))
        );
        assert_eq!(
            entry["conditions"],
            json!([{
                "type": "Ready", "status": "True", "reason": "ImexReady",
                "message": "IMEX ready on this node, 3 of 3 IMEX peers linked",
                "lastTransitionTime": "2026-11-22T10:00:00Z",
                "observedGeneration": 1,
            }]),
            "whole seconds"
        );
        book.written(&uid, Ok(Some(held(&body, 1))), t0);
        assert_eq!(
            book.step(&uid, datetime!(2026-11-22 10:05:00 UTC)),
            Step::Done
        );

        // The peers linked change, the status does not: the time stays.
        let fewer = DomainHealth {
            linked_peers: 2,
            ..healthy()
        };
        book.observe(&view(vec![device(1, "channel-3", Some(fewer))]), t0);
        let Step::Apply(_, body) = book.step(&uid, datetime!(2026-11-22 10:05:00 UTC)) else {
            panic!("a write")
        };
        let ready = &body["status"]["devices"][0]["conditions"][0];
        assert_eq!(ready["lastTransitionTime"], "2026-11-22T10:00:00Z");
        assert_eq!(ready["observedGeneration"], 1);
        book.written(&uid, Ok(Some(held(&body, 1))), t0);

        // Not ready: a new transition time.
        book.observe(&view(vec![device(1, "channel-3", Some(link_down()))]), t0);
        let Step::Apply(_, body) = book.step(&uid, datetime!(2026-11-22 10:06:00 UTC)) else {
            panic!("a write")
        };
        let ready = &body["status"]["devices"][0]["conditions"][0];
        assert_eq!(
            (
                &ready["status"],
                &ready["reason"],
                &ready["lastTransitionTime"]
            ),
            (
                &json!("False"),
                &json!("LinkDown"),
                &json!("2026-11-22T10:06:00Z")
            )
        );
    }

    #[test]
    fn a_claim_is_read_once_then_written_only_when_it_differs() {
        let mut book = book();
        let t0 = Instant::now();
        let devices = vec![
            device(1, "channel-3", Some(healthy())),
            device(1, "channel-4", Some(healthy())),
        ];
        book.observe(&view(devices.clone()), t0);
        let uid = claim(1).uid;
        assert_eq!(book.due(t0), Vec::<String>::new(), "settling");
        assert_eq!(book.next_due(), Some(t0 + SETTLE));
        assert_eq!(book.due(t0 + SETTLE), vec![uid.clone()]);
        let now = datetime!(2026-11-22 10:00:00 UTC);
        assert_eq!(book.step(&uid, now), Step::Read(claim(1)));

        // A previous run wrote exactly this: nothing to do, nothing due.
        let mut previous = self::book();
        previous.observe(&view(devices), t0);
        previous.read(&uid, Ok(Some(Seen::default())), t0);
        let Step::Apply(_, body) = previous.step(&uid, now) else {
            panic!("a write")
        };
        assert_eq!(body["status"]["devices"].as_array().unwrap().len(), 2);
        let mut written = held(&body, 1);
        // Written at generation 1 without observedGeneration: not the same.
        book.read(&uid, Ok(Some(written.clone())), t0);
        assert!(matches!(book.step(&uid, now), Step::Apply(..)));
        for device in written.devices.values_mut() {
            device.ready.as_mut().unwrap().observed_generation = Some(1);
        }
        book.read(&uid, Ok(Some(written.clone())), t0);
        assert_eq!(book.step(&uid, now), Step::Done);
        assert_eq!(book.next_due(), None);

        // An entry of ours the API holds for a device we no longer say anything of is
        // written away.
        written
            .devices
            .insert(("node-2".into(), "channel-9".into()), SeenDevice::default());
        book.read(&uid, Ok(Some(written)), t0);
        assert!(matches!(book.step(&uid, now), Step::Apply(..)));
    }

    #[test]
    fn a_burst_of_views_is_one_write_due_a_settle_after_its_first_change() {
        let mut book = book();
        let t0 = Instant::now();
        let uid = claim(1).uid;
        book.observe(&view(vec![device(1, "channel-3", None)]), t0);
        book.read(&uid, Ok(Some(at_generation(1))), t0);
        let now = datetime!(2026-11-22 10:00:00 UTC);
        let Step::Apply(_, body) = book.step(&uid, now) else {
            panic!("a write")
        };
        book.written(&uid, Ok(Some(held(&body, 1))), t0);
        assert_eq!(book.step(&uid, now), Step::Done);

        let t1 = t0 + Duration::from_secs(5);
        for (i, linked) in [1, 2, 3].into_iter().enumerate() {
            let health = DomainHealth {
                linked_peers: linked,
                ..healthy()
            };
            book.observe(
                &view(vec![device(1, "channel-3", Some(health))]),
                t1 + MS * (10 * i as u32),
            );
        }
        assert_eq!(book.next_due(), Some(t1 + SETTLE), "not pushed back");
        let Step::Apply(_, body) = book.step(&uid, now) else {
            panic!("a write")
        };
        assert_eq!(
            body["status"]["devices"][0]["data"]["imexPeers"]["linked"], 3,
            "the latest"
        );
        // The same view again changes nothing.
        book.written(&uid, Ok(Some(held(&body, 1))), t1);
        assert_eq!(book.step(&uid, now), Step::Done);
        let same = view(vec![device(1, "channel-3", Some(healthy()))]);
        book.observe(&same, t1 + SETTLE);
        assert_eq!(book.next_due(), None);
    }

    /// Healthy in a domain of 18: this node and 17 peers, `linked` of them linked.
    fn formed(linked: usize) -> DomainHealth {
        DomainHealth {
            linked_peers: linked,
            peers: 17,
            ..healthy()
        }
    }

    fn one(status: Option<DomainHealth>) -> HealthView {
        view(vec![device(1, "channel-3", status)])
    }

    /// Plays `views`, each at its time, through `book` as the writer does (a claim due
    /// is read once, then written), against an API server that holds claim 1 at
    /// generation 1 and keeps what is written; until `until`. Each write's time, and
    /// its condition's status, message and linked count.
    fn play(
        book: &mut Book,
        views: Vec<(Instant, HealthView)>,
        until: Instant,
    ) -> Vec<(Instant, Value, Value, Value)> {
        let uid = claim(1).uid;
        let wall = datetime!(2026-11-22 10:00:00 UTC);
        let mut server = at_generation(1);
        let mut writes = Vec::new();
        let mut views = views.into_iter().peekable();
        loop {
            let due = book.next_due().filter(|due| *due <= until);
            let next_view = views.peek().map(|(at, _)| *at);
            match (due, next_view) {
                (Some(due), next) if next.is_none_or(|at| due <= at) => {
                    assert_eq!(book.due(due), vec![uid.clone()]);
                    if let Step::Read(_) = book.step(&uid, wall) {
                        book.read(&uid, Ok(Some(server.clone())), due);
                    }
                    if let Step::Apply(_, body) = book.step(&uid, wall) {
                        server = held(&body, 1);
                        book.written(&uid, Ok(Some(server.clone())), due);
                        let entry = &body["status"]["devices"][0];
                        let ready = &entry["conditions"][0];
                        writes.push((
                            due,
                            ready["status"].clone(),
                            ready["message"].clone(),
                            entry["data"]["imexPeers"]["linked"].clone(),
                        ));
                    }
                }
                (_, Some(_)) => {
                    let (at, view) = views.next().unwrap();
                    book.observe(&view, at);
                }
                (_, None) => return writes,
            }
        }
    }

    fn linked_message(linked: usize) -> Value {
        json!(format!(
            "IMEX ready on this node, {linked} of 17 IMEX peers linked"
        ))
    }

    #[test]
    fn a_formation_is_three_writes_the_last_with_the_final_count() {
        let mut book = book();
        let t0 = Instant::now();
        // Judged early, then the other 16 peers link one by one over 3 s.
        let judged = t0 + MS * 200;
        let mut views = vec![(t0, one(None)), (judged, one(Some(formed(1))))];
        for linked in 2..=17 {
            let at = judged + MS * 187 * (linked as u32 - 1);
            views.push((at, one(Some(formed(linked)))));
        }
        let writes = play(&mut book, views, t0 + Duration::from_secs(60));
        let pending = "not known yet: this node's IMEX has not answered, or the \
                       ComputeDomain has not been judged here yet";
        assert_eq!(
            writes,
            vec![
                (t0 + SETTLE, json!("Unknown"), json!(pending), Value::Null),
                (judged + SETTLE, json!("True"), linked_message(1), json!(1)),
                (
                    judged + SETTLE + HOLD,
                    json!("True"),
                    linked_message(17),
                    json!(17)
                ),
            ],
            "the climb waits a hold from the last write, and its latest count goes"
        );
    }

    #[test]
    fn a_prompt_change_in_a_hold_goes_a_settle_after_it_with_the_latest_count_and_holds_again() {
        let mut book = book();
        let t0 = Instant::now();
        let down = |linked| DomainHealth {
            linked_peers: linked,
            ..DomainHealth {
                peers: 17,
                ..link_down()
            }
        };
        let s = Duration::from_secs;
        let views = vec![
            (t0, one(Some(formed(3)))),
            // Held: the last write was at t0 + SETTLE.
            (t0 + s(1), one(Some(formed(4)))),
            (t0 + s(2), one(Some(formed(5)))),
            // Prompt: goes a settle after it, with the count held so far.
            (t0 + MS * 2500, one(Some(down(5)))),
            // Held again, a hold from that write, not from the first.
            (t0 + s(3), one(Some(down(6)))),
        ];
        let writes = play(&mut book, views, t0 + s(60));
        let lost = json!("IMEX link down to node-1 (index 1)");
        assert_eq!(
            writes,
            vec![
                (t0 + SETTLE, json!("True"), linked_message(3), json!(3)),
                (
                    t0 + MS * 2500 + SETTLE,
                    json!("False"),
                    lost.clone(),
                    json!(5)
                ),
                (
                    t0 + MS * 2500 + SETTLE + HOLD,
                    json!("False"),
                    lost,
                    json!(6)
                ),
            ]
        );
    }

    #[test]
    fn a_count_change_after_a_quiet_spell_waits_a_settle_and_the_next_at_most_a_hold() {
        let mut book = book();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let views = vec![
            (t0, one(Some(formed(3)))),
            (t0 + s(60), one(Some(formed(4)))),
            (t0 + s(61), one(Some(formed(5)))),
            (t0 + s(62), one(Some(formed(6)))),
            // Back to what is held before its hold ran out: nothing to write.
            (t0 + s(67), one(Some(formed(7)))),
            (t0 + s(68), one(Some(formed(6)))),
        ];
        let writes = play(&mut book, views, t0 + s(120));
        let times: Vec<Duration> = writes.iter().map(|w| w.0 - t0).collect();
        let counts: Vec<&Value> = writes.iter().map(|w| &w.3).collect();
        assert_eq!(
            (times, counts),
            (
                vec![SETTLE, s(60) + SETTLE, s(60) + SETTLE + HOLD],
                vec![&json!(3), &json!(4), &json!(6)]
            )
        );
        assert!(s(60) + SETTLE + HOLD - s(61) <= HOLD, "at most a hold");
    }

    #[test]
    fn only_a_change_in_the_linked_count_is_not_prompt() {
        let wall = datetime!(2026-11-22 10:00:00 UTC);
        let uid = claim(1).uid;
        let want = |devices: Vec<PreparedDevice>| desired(&view(devices)).remove(&uid).unwrap();
        let held_now = held(
            &apply_body(
                DRIVER,
                &want(vec![device(1, "channel-3", Some(formed(3)))]),
                &at_generation(1),
                wall,
            ),
            1,
        );
        let prompt = |status: DomainHealth| {
            prompt_change(&want(vec![device(1, "channel-3", Some(status))]), &held_now)
        };
        assert!(!prompt(formed(3)), "the same");
        assert!(!prompt(formed(9)), "only the count");
        assert!(prompt(link_down()), "status, reason and message");
        let no_fabric = DomainHealth {
            reason: HealthReason::DomainReady,
            ..formed(3)
        };
        assert!(prompt(no_fabric), "reason and message, the status the same");
        for moved in [
            DomainHealth {
                clique: CliqueId("c.2".into()),
                ..formed(3)
            },
            DomainHealth {
                index: Some(5),
                ..formed(3)
            },
            DomainHealth {
                channel: Some(7),
                ..formed(3)
            },
        ] {
            assert!(prompt(moved.clone()), "{moved:?}");
        }
        // Members joining change the total as links change the linked count.
        assert!(
            !prompt(DomainHealth {
                peers: 16,
                ..formed(3)
            }),
            "only the counts"
        );
        // Within a reason, the message is a detail: which links are down now.
        let down = |message: &str| DomainHealth {
            health: ChannelHealth::Unhealthy(message.into()),
            reason: HealthReason::LinkDown,
            ..formed(3)
        };
        let held_down = held(
            &apply_body(
                DRIVER,
                &want(vec![device(1, "channel-3", Some(down("to node-1")))]),
                &at_generation(1),
                wall,
            ),
            1,
        );
        let changes = |status: DomainHealth| {
            prompt_change(
                &want(vec![device(1, "channel-3", Some(status))]),
                &held_down,
            )
        };
        assert!(!changes(DomainHealth {
            linked_peers: 2,
            ..down("to node-1")
        }));
        assert!(!changes(down("to node-1, node-4")));
        assert!(changes(formed(3)), "the link is back: status and reason");
        // A device come or gone, or an entry held unreadable.
        assert!(prompt_change(
            &want(vec![
                device(1, "channel-3", Some(formed(3))),
                device(1, "channel-4", Some(formed(3))),
            ]),
            &held_now
        ));
        let mut unreadable = held_now.clone();
        for device in unreadable.devices.values_mut() {
            device.ready = None;
        }
        assert!(prompt_change(
            &want(vec![device(1, "channel-3", Some(formed(3)))]),
            &unreadable
        ));
        let mut one_more = held_now.clone();
        one_more
            .devices
            .insert(("node-2".into(), "channel-4".into()), SeenDevice::default());
        assert!(prompt_change(
            &want(vec![device(1, "channel-3", Some(formed(3)))]),
            &one_more
        ));
    }

    #[test]
    fn failures_wait_their_backoff_permanent_ones_the_cap_and_a_change_does_not_hurry_them() {
        let mut book = book();
        let t0 = Instant::now();
        let uid = claim(1).uid;
        book.observe(&view(vec![device(1, "channel-3", Some(healthy()))]), t0);
        assert_eq!(
            book.written(&uid, Err(ErrorKind::Transient), t0),
            Some(Duration::from_millis(200))
        );
        assert_eq!(
            book.written(&uid, Err(ErrorKind::Conflict), t0),
            Some(Duration::from_millis(400))
        );
        assert_eq!(book.failures(&uid), 2);
        assert_eq!(
            book.written(&uid, Err(ErrorKind::Permanent), t0),
            Some(Duration::from_secs(30))
        );
        book.observe(&view(vec![device(1, "channel-3", Some(link_down()))]), t0);
        assert_eq!(book.next_due(), Some(t0 + Duration::from_secs(30)));
        // A success starts the backoff again.
        book.read(&uid, Ok(Some(Seen::default())), t0);
        assert_eq!(book.failures(&uid), 0);
        assert_eq!(
            book.written(&uid, Err(ErrorKind::Transient), t0),
            Some(Duration::from_millis(200))
        );
    }

    #[test]
    fn a_claim_gone_is_never_written_again_and_one_unprepared_is_forgotten() {
        let mut book = book();
        let t0 = Instant::now();
        let (one, two) = (claim(1).uid, claim(2).uid);
        book.observe(
            &view(vec![
                device(1, "channel-3", Some(healthy())),
                device(2, "channel-4", Some(healthy())),
            ]),
            t0,
        );
        book.read(&one, Ok(None), t0);
        assert_eq!(
            book.step(&one, datetime!(2026-11-22 10:00:00 UTC)),
            Step::Done
        );
        book.observe(
            &view(vec![
                device(1, "channel-3", Some(link_down())),
                device(2, "channel-4", Some(healthy())),
            ]),
            t0 + SETTLE,
        );
        assert_eq!(book.due(t0 + SETTLE * 3), vec![two.clone()]);

        // Claim 2 unprepared while its retry waits: forgotten with it.
        book.written(&two, Err(ErrorKind::Transient), t0 + SETTLE);
        book.observe(
            &view(vec![device(1, "channel-3", Some(link_down()))]),
            t0 + SETTLE,
        );
        assert_eq!(book.next_due(), None);
        assert_eq!(
            book.step(&two, datetime!(2026-11-22 10:00:00 UTC)),
            Step::Done
        );
    }

    #[test]
    fn entries_of_other_drivers_and_shared_devices_are_not_ours() {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "n", "generation": 2},
            "spec": {},
            "status": {"devices": [
                {"driver": "gpu.nvidia.com", "pool": "node-2", "device": "gpu-0"},
                {"driver": DRIVER, "pool": "node-2", "device": "channel-1", "shareID": "a"},
                {"driver": DRIVER, "pool": "node-2", "device": "channel-3",
                 "conditions": [{"type": "Ready", "status": "True", "reason": "ImexReady",
                                 "message": "m", "lastTransitionTime": "2026-11-22T10:00:00Z"}],
                 "data": {"cliqueID": "c.1"}},
            ]},
        }))
        .unwrap();
        let seen = seen_in(&claim, DRIVER);
        assert_eq!(seen.generation, Some(2));
        assert_eq!(
            seen.devices.keys().collect::<Vec<_>>(),
            vec![&("node-2".to_owned(), "channel-3".to_owned())]
        );
        let held = &seen.devices[&("node-2".to_owned(), "channel-3".to_owned())];
        assert_eq!(held.ready.as_ref().unwrap().reason, "ImexReady");
        assert_eq!(held.data, Some(json!({"cliqueID": "c.1"})));
    }
}
