//! The last node out writes the vacated status with a few attempts: a failure that may
//! pass is tried again, a refusal is not, since the API server would answer the same.

use std::sync::Arc;
use std::time::Duration;

use domaind_actors::actors::last_out::LastOut;
use domaind_actors::model::{CliqueId, DomainRef, DomainUid};
use domaind_actors::ports::{PortError, StatusSink};
use domaind_actors::rules::status::vacated_document;
use domaind_actors::testing::{FakeEventSink, FakeGossipNet, FakeStatusSink, run_paused_actix};

fn domain() -> DomainRef {
    DomainRef {
        uid: DomainUid("cd-1".into()),
        namespace: "team-a".into(),
        name: "training".into(),
        num_nodes: 0,
    }
}

/// The node leaves a domain whose written status still lists a workload, and its
/// first vacated write fails with `error`: whether it wrote, and what the sink holds.
async fn leave_after(error: PortError) -> (bool, usize) {
    let sink = FakeStatusSink::default().for_node("node-a");
    let mut written = vacated_document();
    written.message = "1/1 nodes ready".into();
    sink.write(&domain(), &written).await.unwrap();
    sink.fail_next_with(1, error);
    let net = FakeGossipNet::default();
    let wrote = LastOut {
        domain: domain(),
        me: "node-a".into(),
        clique: CliqueId("c.0".into()),
        gossip: Arc::new(net.join("node-a", 1)),
        sink: Arc::new(sink.clone()),
        events: Arc::new(FakeEventSink::default()),
        within: Duration::from_secs(1),
    }
    .run()
    .await;
    (wrote, sink.writes().len())
}

#[test]
fn a_timeout_is_tried_again() {
    run_paused_actix(|| async {
        let (wrote, writes) = leave_after(PortError::transient("did not answer within 5s")).await;
        assert!(wrote);
        assert_eq!(writes, 2, "the status, then the vacated one");
    });
}

#[test]
fn a_refusal_is_not_tried_again() {
    run_paused_actix(|| async {
        let (wrote, writes) = leave_after(PortError::permanent("refused (403 Forbidden)")).await;
        assert!(!wrote);
        assert_eq!(writes, 1, "only the status written before");
    });
}
