//! The whole leader's loop (kube-runtime's `Controller` with its watches) against the
//! scripted API server: the watches select what they should, a listed domain is
//! reconciled, and the deletion of its template (a watch event) brings it back.

use std::time::Duration;

use clap::Parser;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::fixtures;
use crate::ControllerArgs;
use domaind_kube_api::testing::{ApiServer, Call, pair};

const CDS: &str = "/apis/resource.nvidia.com/v1beta1/computedomains";
const TEMPLATES: &str = "/apis/resource.k8s.io/v1/resourceclaimtemplates";
const TEMPLATE_PATH: &str =
    "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates/training-channel";
const TEMPLATES_POST: &str = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ControllerArgs,
}

/// The API server's side of the watches: lists answered, watches held open (returned
/// in `held` so that a test can answer one with an event). Returns the first request
/// that is not a list or a watch.
async fn next_call(server: &mut ApiServer, held: &mut Vec<Call>, domains: &Value) -> Call {
    loop {
        let call = server.next().await;
        let watch = call.query.get("watch").map(String::as_str) == Some("true");
        match (&call.method, call.path.as_str(), watch) {
            (&Method::GET, CDS | TEMPLATES, true) => held.push(call),
            (&Method::GET, CDS, false) => call.ok(domains),
            (&Method::GET, TEMPLATES, false) => {
                // Only our templates are watched.
                call.assert_query(&[("labelSelector", "resource.nvidia.com/computeDomain")]);
                call.ok(&json!({
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplateList",
                    "metadata": {"resourceVersion": "20"},
                    "items": []
                }));
            }
            _ => return call,
        }
    }
}

fn created(call: Call) -> Value {
    assert_eq!(
        (&call.method, call.path.as_str()),
        (&Method::POST, TEMPLATES_POST)
    );
    let mut template = call.body.clone();
    template["metadata"]["uid"] = json!("template-uid");
    template["metadata"]["resourceVersion"] = json!("30");
    call.respond(StatusCode::CREATED, &template);
    template
}

#[tokio::test]
async fn the_leader_reconciles_what_it_lists_and_recreates_a_deleted_template() {
    // A domain already finalized and told its template is ready: only the template is
    // written, so every call below is the template's.
    let mut cd = fixtures::finalized();
    cd.status = Some(
        serde_json::from_value(json!({
            "status": "NotReady",
            "conditions": [{
                "type": "TemplateReady", "status": "True", "reason": "TemplateCreated",
                "message": "ResourceClaimTemplate training-channel is ready for the domain's pods",
                "lastTransitionTime": "2026-11-22T10:00:00Z", "observedGeneration": 1
            }]
        }))
        .unwrap(),
    );
    let domains = json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainList",
        "metadata": {"resourceVersion": "10"},
        "items": [cd]
    });
    let args = Cli::parse_from(["controller", "--leader-elect=false"]).args;
    let (client, mut server) = pair();
    let term = CancellationToken::new();
    let leading = tokio::spawn({
        let term = term.clone();
        async move { crate::lead(client, &args, "controller-0", term).await }
    });
    let mut held = vec![];

    let call = next_call(&mut server, &mut held, &domains).await;
    assert_eq!(
        (&call.method, call.path.as_str()),
        (&Method::GET, TEMPLATE_PATH)
    );
    call.fail(404, "NotFound");
    let template = created(next_call(&mut server, &mut held, &domains).await);

    // Someone deletes it: the owned-templates watch says so.
    let watch = loop {
        if let Some(at) = held.iter().position(|c| c.path == TEMPLATES) {
            break held.remove(at);
        }
        let call = server.next().await;
        assert_eq!(
            call.query.get("watch").map(String::as_str),
            Some("true"),
            "{}",
            call.path
        );
        held.push(call);
    };
    watch.ok(&json!({"type": "DELETED", "object": template}));
    let call = next_call(&mut server, &mut held, &domains).await;
    assert_eq!(
        (&call.method, call.path.as_str()),
        (&Method::GET, TEMPLATE_PATH)
    );
    call.fail(404, "NotFound");
    created(next_call(&mut server, &mut held, &domains).await);

    // The term ends: the controller stops.
    term.cancel();
    tokio::time::timeout(Duration::from_secs(10), leading)
        .await
        .expect("the controller stops when its term ends")
        .unwrap();
    drop(held);
    server.done().await;
}
