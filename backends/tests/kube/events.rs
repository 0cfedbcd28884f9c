//! The event sink: Events on the ComputeDomain through kube-runtime's recorder.

use std::time::Duration;

use domaind_actors::model::{DomainRef, DomainUid};
use domaind_actors::ports::{DomainEvent, ErrorKind, EventSink};
use domaind_backends::kube::KubeEventSink;
use http::Method;
use serde_json::{Value, json};

use crate::apiserver::{Expect, assert_refused_by_kube, pair, status};

const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";

fn domain() -> DomainRef {
    DomainRef {
        uid: DomainUid("cd-uid-1".into()),
        namespace: "team-a".into(),
        name: "training".into(),
        num_nodes: 0,
    }
}

#[tokio::test]
async fn events_name_the_domain_the_node_and_what_happened() {
    let (client, server) = pair();
    let script = server.play(vec![
        Expect::new(Method::POST, EVENTS_PATH)
            .body(|event: &Value| {
                assert_eq!(event["type"], "Warning");
                assert_eq!(event["reason"], "NodeLost");
                assert_eq!(event["action"], "Membership");
                assert!(event["note"].as_str().unwrap().contains("node-3"));
                assert_eq!(event["reportingController"], "domaind");
                assert_eq!(event["reportingInstance"], "node-1");
                assert_eq!(
                    event["regarding"],
                    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                           "name": "training", "namespace": "team-a", "uid": "cd-uid-1"})
                );
                assert_eq!(
                    event["related"],
                    json!({"apiVersion": "v1", "kind": "Node", "name": "node-3"})
                );
                assert_eq!(event["metadata"]["namespace"], "team-a");
            })
            .echo(),
        // The same loss again: a series on the same event.
        Expect::patch(format!("{EVENTS_PATH}/training.*"))
            .content_type("application/merge-patch+json")
            .body(|event: &Value| assert_eq!(event["series"]["count"], 2))
            .echo(),
        // Another node's loss is another event.
        Expect::new(Method::POST, EVENTS_PATH)
            .body(|event: &Value| assert_eq!(event["related"]["name"], "node-4"))
            .echo(),
        // Readiness changes never fold into a series: each carries its own message.
        Expect::new(Method::POST, EVENTS_PATH)
            .body(|event: &Value| {
                assert_eq!(
                    (event["type"].clone(), event["reason"].clone()),
                    (json!("Warning"), json!("DomainNotReady"))
                );
                assert_eq!(event["note"], "1/3 nodes ready, lost: node-3, node-4");
                assert!(event.get("related").is_none());
            })
            .echo(),
        Expect::new(Method::POST, EVENTS_PATH)
            .body(|event: &Value| assert_eq!(event["note"], "2/3 nodes ready, lost: node-4"))
            .echo(),
    ]);
    let sink = KubeEventSink::new(client, "node-1", Duration::from_secs(10));
    let lost = |node: &str| DomainEvent::NodeLost { node: node.into() };
    sink.emit(&domain(), lost("node-3")).await.unwrap();
    sink.emit(&domain(), lost("node-3")).await.unwrap();
    sink.emit(&domain(), lost("node-4")).await.unwrap();
    for message in [
        "1/3 nodes ready, lost: node-3, node-4",
        "2/3 nodes ready, lost: node-4",
    ] {
        sink.emit(
            &domain(),
            DomainEvent::NotReady {
                message: message.into(),
            },
        )
        .await
        .unwrap();
    }
    let mut server = script.await.unwrap();
    server.assert_idle();
}

#[tokio::test]
async fn a_refused_event_is_an_error_the_caller_logs() {
    let (client, server) = pair();
    let script = server.play(vec![Expect::new(Method::POST, EVENTS_PATH).respond(
        403,
        status(403, "Forbidden", "events.events.k8s.io is forbidden"),
    )]);
    let sink = KubeEventSink::new(client, "node-1", Duration::from_secs(10));
    let error = sink
        .emit(
            &domain(),
            DomainEvent::NodeJoined {
                node: "node-2".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(error.to_string().contains("403 Forbidden"), "{error}");
    // Asking again gets the same refusal; kube's own error stays beneath.
    assert_eq!(error.kind(), ErrorKind::Permanent);
    assert_refused_by_kube(&error, 403);
    script.await.unwrap();
}

/// A failing IMEX daemon is a Warning about its Node, one event per failure episode:
/// a second episode is a new event with its own reason, not a series keeping the
/// first one's note.
#[tokio::test]
async fn each_imex_failure_episode_is_an_event_of_its_own() {
    let (client, server) = pair();
    let script = server.play(vec![
        Expect::new(Method::POST, EVENTS_PATH)
            .body(|event: &Value| {
                assert_eq!(event["type"], "Warning");
                assert_eq!(event["reason"], "ImexFailing");
                assert_eq!(event["action"], "ImexDaemon");
                assert_eq!(
                    event["related"],
                    json!({"apiVersion": "v1", "kind": "Node", "name": "node-2"})
                );
                let note = event["note"].as_str().unwrap();
                assert!(
                    note.contains("node node-2") && note.contains("50000"),
                    "{note}"
                );
            })
            .echo(),
        Expect::new(Method::POST, EVENTS_PATH)
            .body(|event: &Value| {
                assert!(event["note"].as_str().unwrap().contains("exit status: 1"));
            })
            .echo(),
    ]);
    let sink = KubeEventSink::new(client, "node-2", Duration::from_secs(10));
    for reason in [
        "IMEX cannot listen on 10.0.0.2:50000 (SERVER_PORT): Address already in use",
        "exited (exit status: 1) with no output",
    ] {
        sink.emit(
            &domain(),
            DomainEvent::ImexFailing {
                node: "node-2".into(),
                reason: reason.into(),
            },
        )
        .await
        .unwrap();
    }
    let mut server = script.await.unwrap();
    server.assert_idle();
}
