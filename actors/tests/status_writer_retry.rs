//! A failed status write is retried by what the failure says: a timeout soon, with a
//! growing backoff; a refusal (RBAC, a validation) only after the backoff's cap, since
//! the API server gives the same answer until a person acts.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use domaind_actors::actors::status_writer::{PublishStatus, StatusWriterActor};
use domaind_actors::model::{DomainRef, DomainUid};
use domaind_actors::ports::PortError;
use domaind_actors::rules::status::vacated_document;
use domaind_actors::rules::status_writes::StatusWrites;
use domaind_actors::testing::{FakeEventSink, FakeGossipNet, FakeStatusSink, run_paused_actix};

const QUIET: Duration = Duration::from_millis(200);
const MAX_DELAY: Duration = Duration::from_secs(3);
/// The status writer's backoff cap.
const CAP: Duration = Duration::from_secs(10);

fn domain() -> DomainRef {
    DomainRef {
        uid: DomainUid("cd-1".into()),
        namespace: "team-a".into(),
        name: "training".into(),
        num_nodes: 0,
    }
}

/// Publishes a status whose first write fails with `error`; answers how many writes
/// landed one second after the failure, and how many once the cap has passed.
async fn writes_after(error: PortError) -> (usize, usize) {
    let sink = FakeStatusSink::default().for_node("node-a");
    sink.fail_next_with(1, error);
    let net = FakeGossipNet::default();
    let writer = StatusWriterActor::new(
        domain(),
        Arc::new(sink.clone()),
        Arc::new(FakeEventSink::default()),
        Arc::new(net.join("node-a", 1)),
        StatusWrites::new(QUIET, MAX_DELAY, None, 1),
    )
    .start();
    writer
        .send(PublishStatus(vacated_document()))
        .await
        .unwrap();
    // The quiet period passes and the first write fails.
    tokio::time::sleep(QUIET * 2).await;
    assert!(sink.writes().is_empty());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let soon = sink.writes().len();
    tokio::time::sleep(CAP).await;
    (soon, sink.writes().len())
}

#[test]
fn a_timeout_is_retried_soon() {
    run_paused_actix(|| async {
        let (soon, later) = writes_after(PortError::transient("did not answer within 5s")).await;
        assert_eq!((soon, later), (1, 1));
    });
}

#[test]
fn a_refusal_is_retried_only_after_the_cap() {
    run_paused_actix(|| async {
        let (soon, later) = writes_after(PortError::permanent("refused (403 Forbidden)")).await;
        assert_eq!(soon, 0, "a refusal was retried at once");
        assert_eq!(
            later, 1,
            "a refusal is retried, slowly: a person may fix it"
        );
    });
}
