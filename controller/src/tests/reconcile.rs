//! The reconciler against a scripted API server: the exact calls of each scenario.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::fixtures::{self, NAMESPACE, TEMPLATE, UID};
use crate::reconcile::{Context, Timing, error_policy, reconcile};
use crate::template::TemplateSettings;
use domaind_kube_api::crd::ComputeDomain;
use domaind_kube_api::testing::{ApiServer, Call, pair};

const CD_PATH: &str = "/apis/resource.nvidia.com/v1beta1/namespaces/team-a/computedomains/training";
const CD_STATUS_PATH: &str =
    "/apis/resource.nvidia.com/v1beta1/namespaces/team-a/computedomains/training/status";
const TEMPLATES_PATH: &str = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates";
const TEMPLATE_PATH: &str =
    "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates/training-channel";
const CLAIMS_PATH: &str = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";

fn timing() -> Timing {
    Timing {
        resync: Duration::from_secs(600),
        deletion_poll: Duration::from_secs(5),
        conflict_recheck: Duration::from_secs(30),
        api_timeout: Duration::from_secs(10),
    }
}

fn context() -> (Arc<Context>, ApiServer) {
    let (client, server) = pair();
    let settings = TemplateSettings {
        driver: "compute-domain.nvidia.com".into(),
        device_class: "compute-domain-default-channel.nvidia.com".into(),
    };
    (
        Arc::new(Context::new(client, settings, timing(), "controller-0")),
        server,
    )
}

/// Runs one reconcile of `cd` while `script` answers its calls; then checks no call
/// is left unanswered or unexpected.
async fn scenario<S, F>(cd: ComputeDomain, script: S) -> Result<Action, String>
where
    S: FnOnce(ApiServer) -> F,
    F: std::future::Future<Output = ApiServer> + Send + 'static,
{
    let (ctx, server) = context();
    let verifier = tokio::spawn(script(server));
    let result = reconcile(Arc::new(cd), ctx).await;
    let server = verifier.await.expect("the script passed");
    server.done().await;
    result.map_err(|error| error.to_string())
}

fn not_found(call: Call) {
    call.fail(404, "NotFound");
}

fn not_found_template(call: Call) {
    assert_eq!(call.path, TEMPLATE_PATH);
    not_found(call);
}

/// What the server returns for a created template: what was sent, with a uid.
fn created(mut body: Value) -> Value {
    body["metadata"]["uid"] = json!("467b9276-a36f-4074-9bea-ee778dc66aab");
    body["metadata"]["resourceVersion"] = json!("1524");
    body
}

fn assert_template_body(body: &Value) {
    assert_eq!(body["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(body["kind"], "ResourceClaimTemplate");
    assert_eq!(body["metadata"]["name"], TEMPLATE);
    assert_eq!(body["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        body["metadata"]["ownerReferences"],
        json!([{
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomain",
            "name": "training",
            "uid": UID,
            "controller": true
        }])
    );
    assert_eq!(
        body["metadata"]["labels"]["resource.nvidia.com/computeDomain"],
        UID
    );
    assert_eq!(
        body["spec"]["spec"]["devices"],
        json!({
            "requests": [{
                "name": "channel",
                "exactly": {
                    "deviceClassName": "compute-domain-default-channel.nvidia.com",
                    "allocationMode": "ExactCount",
                    "count": 1
                }
            }],
            "config": [{
                "requests": ["channel"],
                "opaque": {
                    "driver": "compute-domain.nvidia.com",
                    "parameters": {
                        "apiVersion": "resource.nvidia.com/v1beta1",
                        "kind": "ComputeDomainChannelConfig",
                        "domainID": UID,
                        "allocationMode": "Single"
                    }
                }
            }]
        })
    );
}

/// The status apply of the controller: only `TemplateReady`, under its field manager.
fn assert_condition_apply(call: &Call, status: &str, reason: &str) {
    assert_eq!(call.method, Method::PATCH);
    assert_eq!(call.path, CD_STATUS_PATH);
    call.assert_content_type("application/apply-patch+yaml");
    call.assert_query(&[("fieldManager", "domaind-controller"), ("force", "true")]);
    let body = &call.body;
    assert_eq!(body["apiVersion"], "resource.nvidia.com/v1beta1");
    assert_eq!(body["kind"], "ComputeDomain");
    assert_eq!(
        body["metadata"],
        json!({"name": "training", "namespace": NAMESPACE})
    );
    assert_eq!(
        body["status"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        vec!["conditions"],
        "the controller applies nothing of the status but its condition"
    );
    let conditions = body["status"]["conditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0]["type"], "TemplateReady");
    assert_eq!(conditions[0]["status"], status);
    assert_eq!(conditions[0]["reason"], reason);
    assert_eq!(conditions[0]["observedGeneration"], 1);
    assert!(conditions[0]["lastTransitionTime"].is_string());
}

fn with_status_of(mut cd: ComputeDomain, call: &Call) -> ComputeDomain {
    let mut status = json!({"status": "NotReady"});
    status["conditions"] = call.body["status"]["conditions"].clone();
    cd.status = Some(serde_json::from_value(status).unwrap());
    cd
}

fn foreign_template() -> ResourceClaimTemplate {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NAMESPACE, "uid": "someone-elses"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}}
    }))
    .unwrap()
}

fn our_template() -> Value {
    let desired = crate::template::desired(
        &fixtures::compute_domain(),
        &TemplateSettings {
            driver: "compute-domain.nvidia.com".into(),
            device_class: "compute-domain-default-channel.nvidia.com".into(),
        },
    )
    .unwrap();
    created(serde_json::to_value(desired).unwrap())
}

fn allocated_claim() -> ResourceClaim {
    let mut claim: ResourceClaim = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../kube-api/fixtures/resourceclaim-allocated.json"
        ))
        .unwrap(),
    )
    .unwrap();
    claim.metadata.namespace = Some(NAMESPACE.into());
    claim
}

fn claim_list(claims: Vec<ResourceClaim>) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimList",
        "metadata": {"resourceVersion": "2000"},
        "items": claims
    })
}

#[tokio::test]
async fn a_new_domain_gets_the_finalizer_then_its_template() {
    let action = scenario(fixtures::compute_domain(), |mut server| async move {
        let call = server.expect(Method::PATCH, CD_PATH).await;
        call.assert_content_type("application/json-patch+json");
        assert_eq!(
            call.body,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["resource.nvidia.com/computeDomain"]}
            ])
        );
        call.ok(&fixtures::finalized());

        not_found_template(server.expect(Method::GET, TEMPLATE_PATH).await);

        let call = server.expect(Method::POST, TEMPLATES_PATH).await;
        assert_template_body(&call.body);
        let answer = created(call.body.clone());
        call.respond(StatusCode::CREATED, &answer);

        let call = server.next().await;
        assert_condition_apply(&call, "True", "TemplateCreated");
        let answer = with_status_of(fixtures::finalized(), &call);
        call.ok(&answer);
        server
    })
    .await
    .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(600)));
}

#[tokio::test]
async fn a_deleted_template_is_created_again_and_nothing_else_is_written() {
    // The condition already says the template is ready: only the template is written.
    let (ctx, mut server) = context();
    let first = tokio::spawn(reconcile(Arc::new(fixtures::finalized()), ctx.clone()));
    not_found_template(server.expect(Method::GET, TEMPLATE_PATH).await);
    let call = server.expect(Method::POST, TEMPLATES_PATH).await;
    let answer = created(call.body.clone());
    call.respond(StatusCode::CREATED, &answer);
    let call = server.next().await;
    assert_condition_apply(&call, "True", "TemplateCreated");
    let ready = with_status_of(fixtures::finalized(), &call);
    call.ok(&ready);
    first.await.unwrap().unwrap();

    // Someone deletes the template; its watch event wakes the CD.
    let again = tokio::spawn(reconcile(Arc::new(ready.clone()), ctx.clone()));
    not_found_template(server.expect(Method::GET, TEMPLATE_PATH).await);
    let call = server.expect(Method::POST, TEMPLATES_PATH).await;
    assert_template_body(&call.body);
    let answer = created(call.body.clone());
    call.respond(StatusCode::CREATED, &answer);
    assert_eq!(
        again.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(600))
    );

    // With the template in place, a pass only reads.
    let steady = tokio::spawn(reconcile(Arc::new(ready), ctx.clone()));
    server
        .expect(Method::GET, TEMPLATE_PATH)
        .await
        .ok(&our_template());
    steady.await.unwrap().unwrap();
    drop(ctx);
    server.done().await;
}

#[tokio::test]
async fn a_taken_template_name_is_never_written_and_is_reported_once() {
    let (ctx, mut server) = context();
    let first = tokio::spawn(reconcile(Arc::new(fixtures::finalized()), ctx.clone()));
    server
        .expect(Method::GET, TEMPLATE_PATH)
        .await
        .ok(&foreign_template());
    // No POST of a template: the event, then the condition.
    let call = server.expect(Method::POST, EVENTS_PATH).await;
    assert_eq!(call.body["type"], "Warning");
    assert_eq!(call.body["reason"], "TemplateNameTaken");
    assert_eq!(call.body["regarding"]["kind"], "ComputeDomain");
    assert_eq!(call.body["regarding"]["uid"], UID);
    assert_eq!(call.body["reportingController"], "domaind-controller");
    assert_eq!(call.body["reportingInstance"], "controller-0");
    assert!(
        call.body["note"]
            .as_str()
            .unwrap()
            .contains("training-channel already exists"),
        "{}",
        call.body["note"]
    );
    let answer = call.body.clone();
    call.respond(StatusCode::CREATED, &answer);
    let call = server.next().await;
    assert_condition_apply(&call, "False", "TemplateNameTaken");
    let reported = with_status_of(fixtures::finalized(), &call);
    call.ok(&reported);
    assert_eq!(
        first.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(30))
    );

    // Looked at again: still taken, already said: no write at all.
    let again = tokio::spawn(reconcile(Arc::new(reported.clone()), ctx.clone()));
    server
        .expect(Method::GET, TEMPLATE_PATH)
        .await
        .ok(&foreign_template());
    assert_eq!(
        again.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(30))
    );

    // The name came free: the template is created and the condition turns True.
    let freed = tokio::spawn(reconcile(Arc::new(reported), ctx.clone()));
    not_found_template(server.expect(Method::GET, TEMPLATE_PATH).await);
    let call = server.expect(Method::POST, TEMPLATES_PATH).await;
    let answer = created(call.body.clone());
    call.respond(StatusCode::CREATED, &answer);
    let call = server.next().await;
    assert_condition_apply(&call, "True", "TemplateCreated");
    let answer = with_status_of(fixtures::finalized(), &call);
    call.ok(&answer);
    freed.await.unwrap().unwrap();
    drop(ctx);
    server.done().await;
}

#[tokio::test]
async fn a_deleted_domain_waits_for_its_allocated_claims() {
    let action = scenario(fixtures::deleting(), |mut server| async move {
        // The template goes first, so that no new pod joins a domain on its way out.
        server
            .expect(Method::GET, TEMPLATE_PATH)
            .await
            .ok(&our_template());
        let call = server.expect(Method::DELETE, TEMPLATE_PATH).await;
        call.ok(&our_template());

        let call = server.expect(Method::GET, CLAIMS_PATH).await;
        call.ok(&claim_list(vec![allocated_claim()]));

        let call = server.expect(Method::POST, EVENTS_PATH).await;
        assert_eq!(call.body["type"], "Normal");
        assert_eq!(call.body["reason"], "WaitingForMembers");
        assert!(
            call.body["note"]
                .as_str()
                .unwrap()
                .contains("worker-0-cd-0-2csgh")
        );
        let answer = call.body.clone();
        call.respond(StatusCode::CREATED, &answer);
        // No finalizer patch while a claim is allocated.
        server
    })
    .await
    .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
}

#[tokio::test]
async fn a_deleted_domain_is_released_once_no_claim_is_allocated() {
    let action = scenario(fixtures::deleting(), |mut server| async move {
        not_found_template(server.expect(Method::GET, TEMPLATE_PATH).await);
        let mut deallocated = allocated_claim();
        deallocated.status.as_mut().unwrap().allocation = None;
        let mut other_domain = allocated_claim();
        other_domain.metadata.name = Some("of-another-domain".into());
        let config = &mut other_domain
            .status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .config
            .as_mut()
            .unwrap()[0];
        config.opaque.as_mut().unwrap().parameters.0["domainID"] = json!("another-uid");
        server
            .expect(Method::GET, CLAIMS_PATH)
            .await
            .ok(&claim_list(vec![deallocated, other_domain]));

        let call = server.expect(Method::PATCH, CD_PATH).await;
        call.assert_content_type("application/json-patch+json");
        assert_eq!(
            call.body,
            json!([
                {"op": "test", "path": "/metadata/finalizers/0", "value": "resource.nvidia.com/computeDomain"},
                {"op": "remove", "path": "/metadata/finalizers/0"}
            ])
        );
        let mut released = fixtures::deleting();
        released.metadata.finalizers = None;
        call.ok(&released);
        server
    })
    .await
    .unwrap();
    assert_eq!(action, Action::await_change());
}

fn finalizers_released(recorder: &metrics_util::debugging::DebuggingRecorder) -> Option<u64> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| key.key().name() == crate::metrics::FINALIZERS_RELEASED)
        .map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            other => panic!("a counter, not {other:?}"),
        })
}

/// The template's deletion queues a second pass, whose copy of the domain still holds
/// the finalizer the first pass removed: the domain is gone by then, and a release
/// already counted is not counted again.
#[tokio::test]
async fn a_domain_released_by_an_earlier_pass_is_not_counted_again() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    for answer in [200, 404] {
        let action = scenario(fixtures::deleting(), |mut server| async move {
            not_found_template(server.expect(Method::GET, TEMPLATE_PATH).await);
            server
                .expect(Method::GET, CLAIMS_PATH)
                .await
                .ok(&claim_list(vec![]));
            let call = server.expect(Method::PATCH, CD_PATH).await;
            if answer == 200 {
                let mut released = fixtures::deleting();
                released.metadata.finalizers = None;
                call.ok(&released);
            } else {
                call.fail(404, "NotFound");
            }
            server
        })
        .await
        .unwrap();
        assert_eq!(action, Action::await_change());
    }
    assert_eq!(finalizers_released(&recorder), Some(1));
}

#[tokio::test]
async fn a_template_that_is_not_ours_survives_the_domains_deletion() {
    scenario(fixtures::deleting(), |mut server| async move {
        server
            .expect(Method::GET, TEMPLATE_PATH)
            .await
            .ok(&foreign_template());
        server
            .expect(Method::GET, CLAIMS_PATH)
            .await
            .ok(&claim_list(vec![]));
        let call = server.expect(Method::PATCH, CD_PATH).await;
        let answer = fixtures::deleting();
        call.ok(&answer);
        server
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_deleted_domain_without_our_finalizer_is_left_alone() {
    let mut cd = fixtures::deleting();
    cd.metadata.finalizers = Some(vec!["example.com/other".into()]);
    let action = scenario(cd, |server| async move { server }).await.unwrap();
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn api_errors_are_retried_with_growing_delays() {
    let (ctx, mut server) = context();
    let cd = Arc::new(fixtures::finalized());
    let mut delays = vec![];
    for _ in 0..3 {
        let pass = tokio::spawn(reconcile(cd.clone(), ctx.clone()));
        server
            .expect(Method::GET, TEMPLATE_PATH)
            .await
            .fail(500, "InternalError");
        let error = pass.await.unwrap().unwrap_err();
        assert!(
            error
                .to_string()
                .contains("cannot read template team-a/training-channel"),
            "{error}"
        );
        assert_eq!(error.metric_reason(), "read_template");
        delays.push(error_policy(cd.clone(), &error, ctx.clone()));
    }
    assert_eq!(
        delays,
        vec![
            Action::requeue(Duration::from_millis(500)),
            Action::requeue(Duration::from_secs(1)),
            Action::requeue(Duration::from_secs(2)),
        ]
    );
    // A success resets the delay.
    let pass = tokio::spawn(reconcile(cd.clone(), ctx.clone()));
    server
        .expect(Method::GET, TEMPLATE_PATH)
        .await
        .ok(&our_template());
    let call = server.next().await;
    assert_condition_apply(&call, "True", "TemplateCreated");
    let answer = with_status_of(fixtures::finalized(), &call);
    call.ok(&answer);
    pass.await.unwrap().unwrap();
    let pass = tokio::spawn(reconcile(cd.clone(), ctx.clone()));
    server
        .expect(Method::GET, TEMPLATE_PATH)
        .await
        .fail(503, "ServiceUnavailable");
    let error = pass.await.unwrap().unwrap_err();
    assert_eq!(
        error_policy(cd, &error, ctx.clone()),
        Action::requeue(Duration::from_millis(500))
    );
    drop(ctx);
    server.done().await;
}

/// A hung API server: it takes the request and never answers. The pass gives up after
/// `--kube-api-timeout`, backs off like any other failure, and the abandoned request is
/// counted, so that the hang shows up in `domaind_kube_requests_total`.
#[tokio::test(start_paused = true)]
async fn a_hung_api_server_fails_the_pass_in_time_and_it_backs_off() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (ctx, mut server) = context();
    let cd = Arc::new(fixtures::finalized());
    let mut delays = vec![];
    for _ in 0..2 {
        let pass = tokio::spawn(reconcile(cd.clone(), ctx.clone()));
        let held = server.expect(Method::GET, TEMPLATE_PATH).await;
        let error = pass.await.unwrap().unwrap_err();
        drop(held);
        assert_eq!(
            error.to_string(),
            "cannot read template team-a/training-channel: the API server did not answer \
             within 10s"
        );
        assert_eq!(error.metric_reason(), "read_template");
        delays.push(error_policy(cd.clone(), &error, ctx.clone()));
    }
    assert_eq!(
        delays,
        vec![
            Action::requeue(Duration::from_millis(500)),
            Action::requeue(Duration::from_secs(1)),
        ]
    );
    let abandoned = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| {
            let key = key.key();
            key.name() == "domaind_kube_requests_total"
                && key
                    .labels()
                    .any(|l| l.key() == "code" && l.value() == "abandoned")
                && key
                    .labels()
                    .any(|l| l.key() == "resource" && l.value() == "resourceclaimtemplates")
        })
        .map(|(.., value)| value);
    assert_eq!(abandoned, Some(DebugValue::Counter(2)));
    drop(ctx);
    server.done().await;
}

#[tokio::test]
async fn a_template_created_meanwhile_by_someone_else_is_an_error_to_retry() {
    let result = scenario(fixtures::finalized(), |mut server| async move {
        not_found_template(server.expect(Method::GET, TEMPLATE_PATH).await);
        server
            .expect(Method::POST, TEMPLATES_PATH)
            .await
            .fail(409, "AlreadyExists");
        server
    })
    .await;
    assert!(result.unwrap_err().contains("cannot create template"));
}

#[tokio::test]
async fn a_template_the_api_server_refuses_is_reported_not_retried() {
    let mut cd = fixtures::finalized();
    cd.spec.channel.resource_claim_template.name = "Not_A_Name".into();
    let action = scenario(cd, |mut server| async move {
        not_found(
            server
                .expect(
                    Method::GET,
                    "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates/Not_A_Name",
                )
                .await,
        );
        server
            .expect(Method::POST, TEMPLATES_PATH)
            .await
            .fail(422, "Invalid");
        let call = server.expect(Method::POST, EVENTS_PATH).await;
        assert_eq!(call.body["type"], "Warning");
        assert_eq!(call.body["reason"], "TemplateRejected");
        let answer = call.body.clone();
        call.respond(StatusCode::CREATED, &answer);
        let call = server.next().await;
        assert_condition_apply(&call, "False", "TemplateRejected");
        assert!(
            call.body["status"]["conditions"][0]["message"]
                .as_str()
                .unwrap()
                .contains("Invalid (scripted)")
        );
        let answer = with_status_of(fixtures::finalized(), &call);
        call.ok(&answer);
        server
    })
    .await
    .unwrap();
    // Not an error: no backoff retries for a spec that cannot change.
    assert_eq!(action, Action::requeue(Duration::from_secs(600)));
}
