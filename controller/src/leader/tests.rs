//! The elector against a scripted API server, in paused time: acquire, renew, lose,
//! take over an expired lease, lose a race, release.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use kube::Api;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{Elector, Heartbeat, Leadership, LeaseSettings, Timing};
use domaind_kube_api::testing::{ApiServer, Call, pair};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/domaind/leases";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/domaind/leases/domaind-controller";

fn elector() -> (Elector, Leadership, ApiServer) {
    let (client, server) = pair();
    let settings = LeaseSettings {
        name: "domaind-controller".into(),
        namespace: "domaind".into(),
        identity: "controller-a".into(),
        timing: Timing::default(),
    };
    let (elector, leadership) = Elector::new(
        Api::namespaced(client, "domaind"),
        settings,
        Arc::new(Heartbeat::default()),
    );
    (elector, leadership, server)
}

fn lease(holder: Option<&str>, version: &str, transitions: i32) -> Value {
    let mut spec = json!({
        "leaseDurationSeconds": 15,
        "leaseTransitions": transitions,
        "acquireTime": "2026-11-22T10:00:00.000000Z",
        "renewTime": "2026-11-22T10:00:00.000000Z"
    });
    if let Some(holder) = holder {
        spec["holderIdentity"] = json!(holder);
    }
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "domaind-controller", "namespace": "domaind", "resourceVersion": version},
        "spec": spec
    })
}

/// The server's answer to a write: what was sent, at a new version.
fn stored(call: &Call, version: &str) -> Value {
    let mut body = call.body.clone();
    body["metadata"]["resourceVersion"] = json!(version);
    body
}

/// Runs one round of `elector` while `script` answers; returns the elector.
async fn round<F>(mut elector: Elector, script: F) -> (Elector, ApiServer)
where
    F: std::future::Future<Output = ApiServer> + Send + 'static,
{
    let answering = tokio::spawn(script);
    elector.round().await;
    (elector, answering.await.unwrap())
}

/// Acquires the lease from scratch: returns the leading elector.
async fn leading() -> (Elector, Leadership, ApiServer) {
    let (elector, leadership, server) = elector();
    let (elector, server) = round(elector, async move {
        let mut server = server;
        server
            .expect(Method::GET, LEASE)
            .await
            .fail(404, "NotFound");
        let call = server.expect(Method::POST, LEASES).await;
        let answer = stored(&call, "1");
        call.respond(StatusCode::CREATED, &answer);
        server
    })
    .await;
    (elector, leadership, server)
}

#[tokio::test(start_paused = true)]
async fn a_missing_lease_is_created_and_held() {
    let (elector, leadership, server) = elector();
    assert!(!leadership.is_leader());
    let (_elector, _server) = round(elector, async move {
        let mut server = server;
        server
            .expect(Method::GET, LEASE)
            .await
            .fail(404, "NotFound");
        let call = server.expect(Method::POST, LEASES).await;
        let spec = &call.body["spec"];
        assert_eq!(spec["holderIdentity"], "controller-a");
        assert_eq!(spec["leaseDurationSeconds"], 15);
        assert_eq!(spec["leaseTransitions"], 0);
        assert!(spec["acquireTime"].is_string() && spec["renewTime"].is_string());
        assert_eq!(call.body["metadata"]["name"], "domaind-controller");
        let answer = stored(&call, "1");
        call.respond(StatusCode::CREATED, &answer);
        server
    })
    .await;
    assert!(leadership.is_leader());
}

#[tokio::test(start_paused = true)]
async fn the_leader_renews_conditionally_on_the_version_it_read() {
    let (elector, leadership, server) = leading().await;
    tokio::time::advance(Duration::from_secs(2)).await;
    let (_elector, _server) = round(elector, async move {
        let mut server = server;
        server
            .expect(Method::GET, LEASE)
            .await
            .ok(&lease(Some("controller-a"), "1", 0));
        let call = server.expect(Method::PUT, LEASE).await;
        assert_eq!(call.body["metadata"]["resourceVersion"], "1");
        assert_eq!(call.body["spec"]["holderIdentity"], "controller-a");
        assert_eq!(call.body["spec"]["leaseTransitions"], 0);
        // A renewal keeps the acquisition time.
        assert_eq!(
            call.body["spec"]["acquireTime"],
            "2026-11-22T10:00:00.000000Z"
        );
        assert_ne!(
            call.body["spec"]["renewTime"],
            "2026-11-22T10:00:00.000000Z"
        );
        let answer = stored(&call, "2");
        call.ok(&answer);
        server
    })
    .await;
    // Ten seconds from the renewal, not from the first acquisition.
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(leadership.is_leader());
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_renew_stops_at_the_deadline() {
    let (mut elector, mut leadership, mut server) = leading().await;
    let acquired = Instant::now();
    let mut lost = leadership.clone();
    let lost_at = tokio::spawn(async move {
        lost.lost().await;
        Instant::now()
    });
    // The API server fails every request from now on.
    for _ in 0..4 {
        tokio::time::advance(Duration::from_secs(2)).await;
        let answering = tokio::spawn(async move {
            server
                .expect(Method::GET, LEASE)
                .await
                .fail(500, "InternalError");
            server
        });
        elector.round().await;
        server = answering.await.unwrap();
        assert!(leadership.is_leader(), "still within the renew deadline");
    }
    let lost_at = lost_at.await.unwrap();
    // Stopped exactly ten seconds after the last successful write was sent (the
    // acquisition), before anyone else may take over at fifteen.
    assert_eq!(lost_at - acquired, Duration::from_secs(10));
    assert!(!leadership.is_leader());
    // And it does not come back by itself.
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(!leadership.is_leader());
    tokio::select! {
        _ = leadership.acquired() => panic!("leading again without a renewal"),
        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
    }
}

#[tokio::test(start_paused = true)]
async fn a_live_holder_is_followed_and_an_expired_one_taken_over() {
    let (elector, leadership, server) = elector();
    let (elector, server) = round(elector, async move {
        let mut server = server;
        server
            .expect(Method::GET, LEASE)
            .await
            .ok(&lease(Some("controller-b"), "5", 2));
        server
    })
    .await;
    assert!(!leadership.is_leader());

    // The holder renews at 10 s: the wait starts again from there.
    tokio::time::advance(Duration::from_secs(10)).await;
    let (elector, server) = round(elector, async move {
        let mut server = server;
        server
            .expect(Method::GET, LEASE)
            .await
            .ok(&lease(Some("controller-b"), "6", 2));
        server
    })
    .await;
    tokio::time::advance(Duration::from_secs(14)).await;
    let (elector, server) = round(elector, async move {
        let mut server = server;
        server
            .expect(Method::GET, LEASE)
            .await
            .ok(&lease(Some("controller-b"), "6", 2));
        server
    })
    .await;
    assert!(!leadership.is_leader());

    // Then it stops: fifteen seconds after version 6 was first seen, it is taken over.
    tokio::time::advance(Duration::from_secs(1)).await;
    let (_elector, _server) = round(elector, async move {
        let mut server = server;
        server
            .expect(Method::GET, LEASE)
            .await
            .ok(&lease(Some("controller-b"), "6", 2));
        let call = server.expect(Method::PUT, LEASE).await;
        assert_eq!(call.body["metadata"]["resourceVersion"], "6");
        assert_eq!(call.body["spec"]["holderIdentity"], "controller-a");
        assert_eq!(call.body["spec"]["leaseTransitions"], 3);
        assert_ne!(
            call.body["spec"]["acquireTime"],
            "2026-11-22T10:00:00.000000Z"
        );
        let answer = stored(&call, "7");
        call.ok(&answer);
        server
    })
    .await;
    assert!(leadership.is_leader());
}

#[tokio::test(start_paused = true)]
async fn of_two_takeovers_the_one_that_loses_the_race_follows() {
    let (elector, leadership, server) = elector();
    let (elector, server) = round(elector, async move {
        let mut server = server;
        server
            .expect(Method::GET, LEASE)
            .await
            .ok(&lease(None, "9", 4));
        // Released: taken at once, but another replica wrote first.
        let call = server.expect(Method::PUT, LEASE).await;
        assert_eq!(call.body["spec"]["leaseTransitions"], 5);
        call.fail(409, "Conflict");
        server
    })
    .await;
    assert!(!leadership.is_leader());
    tokio::time::advance(Duration::from_secs(2)).await;
    let (_elector, _server) = round(elector, async move {
        let mut server = server;
        server
            .expect(Method::GET, LEASE)
            .await
            .ok(&lease(Some("controller-b"), "10", 5));
        server
    })
    .await;
    assert!(!leadership.is_leader());
}

#[tokio::test(start_paused = true)]
async fn the_leader_steps_down_at_once_when_another_holds_the_lease() {
    let (elector, leadership, server) = leading().await;
    tokio::time::advance(Duration::from_secs(2)).await;
    let (_elector, _server) = round(elector, async move {
        let mut server = server;
        // Someone rewrote the lease (an administrator, or a replica with bad timing).
        server
            .expect(Method::GET, LEASE)
            .await
            .ok(&lease(Some("controller-b"), "3", 1));
        server
    })
    .await;
    assert!(!leadership.is_leader());
}

#[tokio::test(start_paused = true)]
async fn release_hands_the_lease_over_without_a_holder() {
    let (elector, leadership, mut server) = leading().await;
    let releasing = tokio::spawn(elector.release());
    let call = server.expect(Method::PUT, LEASE).await;
    assert_eq!(call.body["metadata"]["resourceVersion"], "1");
    assert!(
        call.body["spec"].get("holderIdentity").is_none(),
        "{}",
        call.body
    );
    let answer = stored(&call, "2");
    call.ok(&answer);
    releasing.await.unwrap();
    assert!(!leadership.is_leader());
    server.done().await;
}

#[tokio::test(start_paused = true)]
async fn a_follower_releases_nothing() {
    let (elector, _leadership, server) = elector();
    let (elector, server) = round(elector, async move {
        let mut server = server;
        server
            .expect(Method::GET, LEASE)
            .await
            .ok(&lease(Some("controller-b"), "5", 2));
        server
    })
    .await;
    elector.release().await;
    server.done().await;
}

#[tokio::test(start_paused = true)]
async fn unconditional_leadership_never_ends() {
    let mut leadership = Leadership::unconditional();
    leadership.acquired().await;
    tokio::time::advance(Duration::from_secs(365 * 24 * 3600)).await;
    assert!(leadership.is_leader());
}
