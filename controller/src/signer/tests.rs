//! The signer's API calls against a scripted API server: what it writes for an
//! approval, a denial, a refusal after someone else's approval, a conflict, and a CSR
//! already done.

use std::collections::BTreeMap;

use http::Method;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequestSpec, CertificateSigningRequestStatus,
};
use rcgen::{CertificateParams, DnType, KeyPair};
use serde_json::{Value, json};
use x509_parser::prelude::{FromDer as _, X509Certificate};

use super::*;
use domaind_kube_api::names::IMEX_SHARED_NAME;
use domaind_kube_api::testing::{ApiServer, pair};

const SA: &str = "system:serviceaccount:domaind:domaind-node";
const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

/// The signer looking at `asked` in the background, as the controller's loop would.
fn looking_at(
    ctx: &Arc<Context>,
    asked: &CertificateSigningRequest,
) -> tokio::task::JoinHandle<Result<Action, SignError>> {
    let (ctx, asked) = (ctx.clone(), asked.clone());
    tokio::spawn(async move { look_at(&asked, &ctx).await })
}

/// The look ended well, and the API server was asked nothing more.
async fn finish(
    task: tokio::task::JoinHandle<Result<Action, SignError>>,
    ctx: Arc<Context>,
    server: ApiServer,
) {
    assert!(task.await.unwrap().is_ok());
    drop(ctx);
    server.done().await;
}

fn context(client: Client) -> Arc<Context> {
    let ca = GossipCa::generate(Duration::from_secs(86400), OffsetDateTime::now_utc()).unwrap();
    Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER_FIELD_MANAGER.into(),
                instance: Some("test".into()),
            },
        ),
        ca: RwLock::new(Arc::new(ca)),
        client,
        settings: SignerSettings {
            policy: Policy::new("domaind", "domaind-node", Duration::from_secs(86400)),
            bundle: BundleSettings {
                namespace: "domaind".into(),
                secret: "ca".into(),
                config_map: "bundle".into(),
                resync: Duration::from_secs(60),
            },
            api_timeout: Duration::from_secs(5),
        },
        failures: Failures::default(),
    })
}

/// A CSR from node-a's daemon naming `name`.
fn csr(name: &str) -> CertificateSigningRequest {
    csr_with_ips(name, &[])
}

/// A CSR from node-a's daemon naming `name` and the IPs `ips`.
fn csr_with_ips(name: &str, ips: &[[u8; 4]]) -> CertificateSigningRequest {
    csr_naming(&[name], ips)
}

/// A CSR from node-a's daemon with the common name `names[0]`, the DNS names `names`
/// and the IPs `ips`.
fn csr_naming(names: &[&str], ips: &[[u8; 4]]) -> CertificateSigningRequest {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    for ip in ips {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress((*ip).into()));
    }
    let pem = params
        .serialize_request(&KeyPair::generate().unwrap())
        .unwrap()
        .pem()
        .unwrap();
    CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some("req-1".into()),
            resource_version: Some("7".into()),
            uid: Some("00000000-0000-4000-8000-000000000001".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(pem.into_bytes()),
            signer_name: GOSSIP_SIGNER.into(),
            usages: Some(
                domaind_kube_api::names::GOSSIP_CERT_USAGES
                    .iter()
                    .map(|u| u.to_string())
                    .collect(),
            ),
            username: Some(SA.into()),
            extra: Some(BTreeMap::from([(
                NODE_NAME_EXTRA.to_string(),
                vec!["node-a".to_string()],
            )])),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        status: None,
    }
}

fn conditions(body: &Value) -> Vec<(String, String)> {
    body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap().to_string(),
                c["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The event the recorder posts: its reason.
async fn expect_event(server: &mut ApiServer) -> String {
    let call = server
        .expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/default/events",
        )
        .await;
    let reason = call.body["reason"].as_str().unwrap().to_string();
    assert_eq!(call.body["type"], "Warning");
    assert_eq!(call.body["regarding"]["name"], "req-1");
    let body = call.body.clone();
    call.ok(&body);
    reason
}

#[tokio::test]
async fn a_good_request_is_approved_then_signed_with_what_the_grant_allows() {
    let (client, mut server) = pair();
    let ctx = context(client);
    let asked = csr("node-a");
    let task = looking_at(&ctx, &asked);
    let approval = server
        .expect(Method::PUT, &format!("{CSRS}/req-1/approval"))
        .await;
    assert_eq!(approval.body["metadata"]["resourceVersion"], "7");
    assert_eq!(
        conditions(&approval.body),
        [("Approved".into(), "NodeCertificateApproved".into())]
    );
    let mut approved = approval.body.clone();
    approved["metadata"]["resourceVersion"] = json!("8");
    approval.ok(&approved);

    let status = server
        .expect(Method::PUT, &format!("{CSRS}/req-1/status"))
        .await;
    assert_eq!(status.body["metadata"]["resourceVersion"], "8");
    let issued: CertificateSigningRequest = serde_json::from_value(status.body.clone()).unwrap();
    let pem = issued.status.unwrap().certificate.unwrap().0;
    let (_, block) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    let (_, cert) = X509Certificate::from_der(&block.contents).unwrap();
    let cn: Vec<_> = cert
        .subject()
        .iter_common_name()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(cn, ["node-a"]);
    let lifetime = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    assert_eq!(lifetime, 3600 + 300, "asked 1h, backdated 5 min");
    let body = status.body.clone();
    status.ok(&body);
    finish(task, ctx, server).await;
}

#[tokio::test]
async fn a_request_for_another_node_is_denied_with_its_reason_and_an_event() {
    let (client, mut server) = pair();
    let ctx = context(client);
    let asked = csr("node-b");
    let task = looking_at(&ctx, &asked);
    let approval = server
        .expect(Method::PUT, &format!("{CSRS}/req-1/approval"))
        .await;
    assert_eq!(
        conditions(&approval.body),
        [("Denied".into(), "NameMismatch".into())]
    );
    assert!(approval.body["status"].get("certificate").is_none());
    let body = approval.body.clone();
    approval.ok(&body);
    assert_eq!(expect_event(&mut server).await, "NameMismatch");
    finish(task, ctx, server).await;
}

#[tokio::test]
async fn someone_elses_approval_of_a_bad_request_gets_failed_and_no_certificate() {
    let (client, mut server) = pair();
    let ctx = context(client);
    let mut asked = csr("node-b");
    asked.status = Some(CertificateSigningRequestStatus {
        conditions: Some(vec![CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("AdminApproved".into()),
            ..Default::default()
        }]),
        certificate: None,
    });
    let task = looking_at(&ctx, &asked);
    let status = server
        .expect(Method::PUT, &format!("{CSRS}/req-1/status"))
        .await;
    assert_eq!(
        conditions(&status.body),
        [
            ("Approved".into(), "AdminApproved".into()),
            ("Failed".into(), "RefusedAfterApproval".into())
        ]
    );
    assert!(status.body["status"].get("certificate").is_none());
    let body = status.body.clone();
    status.ok(&body);
    assert_eq!(expect_event(&mut server).await, "NameMismatch");
    finish(task, ctx, server).await;
}

#[tokio::test]
async fn a_conflict_leaves_the_csr_to_whoever_wrote_first() {
    let (client, mut server) = pair();
    let ctx = context(client);
    let asked = csr("node-a");
    let task = looking_at(&ctx, &asked);
    server
        .expect(Method::PUT, &format!("{CSRS}/req-1/approval"))
        .await
        .fail(409, "Conflict");
    assert!(
        task.await.unwrap().is_ok(),
        "no error: the watch brings the change"
    );
    drop(ctx);
    server.done().await;
}

#[tokio::test]
async fn an_issued_or_denied_request_is_left_alone_and_an_api_error_is_an_error() {
    let (client, mut server) = pair();
    let ctx = context(client);
    let mut issued = csr("node-a");
    issued.status = Some(CertificateSigningRequestStatus {
        conditions: None,
        certificate: Some(k8s_openapi::ByteString(b"PEM".to_vec())),
    });
    assert!(look_at(&issued, &ctx).await.is_ok());

    let asked = csr("node-a");
    let task = looking_at(&ctx, &asked);
    server
        .expect(Method::PUT, &format!("{CSRS}/req-1/approval"))
        .await
        .fail(500, "InternalError");
    let error = task.await.unwrap().unwrap_err();
    assert!(
        error.to_string().contains("cannot mark CSR req-1 Approved"),
        "{error}"
    );
    drop(ctx);
    server.done().await;
}

/// node-a's Node, as the API server answers it: its kubelet's addresses.
async fn answer_node_a(server: &mut ApiServer) {
    let call = server.expect(Method::GET, "/api/v1/nodes/node-a").await;
    call.ok(&json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-a"},
        "status": {"addresses": [
            {"type": "Hostname", "address": "node-a"},
            {"type": "InternalIP", "address": "10.0.0.1"}
        ]}
    }));
}

#[tokio::test]
async fn a_request_for_another_nodes_ip_is_denied_against_the_node_object_with_an_event() {
    let (client, mut server) = pair();
    let ctx = context(client);
    let asked = csr_with_ips("node-a", &[[10, 0, 0, 2]]);
    let task = looking_at(&ctx, &asked);
    answer_node_a(&mut server).await;
    let approval = server
        .expect(Method::PUT, &format!("{CSRS}/req-1/approval"))
        .await;
    assert_eq!(
        conditions(&approval.body),
        [("Denied".into(), "IpMismatch".into())]
    );
    let message = approval.body["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(message.contains("10.0.0.2"), "{message}");
    assert!(approval.body["status"].get("certificate").is_none());
    let body = approval.body.clone();
    approval.ok(&body);
    assert_eq!(expect_event(&mut server).await, "IpMismatch");
    finish(task, ctx, server).await;
}

#[tokio::test]
async fn a_request_for_the_nodes_own_ip_is_signed_with_it() {
    let (client, mut server) = pair();
    let ctx = context(client);
    let asked = csr_with_ips("node-a", &[[10, 0, 0, 1]]);
    let task = looking_at(&ctx, &asked);
    answer_node_a(&mut server).await;
    let approval = server
        .expect(Method::PUT, &format!("{CSRS}/req-1/approval"))
        .await;
    let approved = approval.body.clone();
    approval.ok(&approved);
    let status = server
        .expect(Method::PUT, &format!("{CSRS}/req-1/status"))
        .await;
    let issued: CertificateSigningRequest = serde_json::from_value(status.body.clone()).unwrap();
    let pem = issued.status.unwrap().certificate.unwrap().0;
    let (_, block) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    let (_, cert) = X509Certificate::from_der(&block.contents).unwrap();
    let sans = cert.subject_alternative_name().unwrap().unwrap();
    assert_eq!(
        sans.value.general_names,
        [
            x509_parser::extensions::GeneralName::DNSName("node-a"),
            x509_parser::extensions::GeneralName::IPAddress(&[10, 0, 0, 1])
        ]
    );
    let body = status.body.clone();
    status.ok(&body);
    finish(task, ctx, server).await;
}

/// DNS-names mode: IMEX's shared name is signed beside the node's, without reading the
/// Node (it is no address of anyone's).
#[tokio::test]
async fn a_request_for_imex_s_shared_name_is_signed_with_it() {
    let (client, mut server) = pair();
    let ctx = context(client);
    let asked = csr_naming(&["node-a", IMEX_SHARED_NAME], &[]);
    let task = looking_at(&ctx, &asked);
    let approval = server
        .expect(Method::PUT, &format!("{CSRS}/req-1/approval"))
        .await;
    let approved = approval.body.clone();
    approval.ok(&approved);
    let status = server
        .expect(Method::PUT, &format!("{CSRS}/req-1/status"))
        .await;
    let issued: CertificateSigningRequest = serde_json::from_value(status.body.clone()).unwrap();
    let pem = issued.status.unwrap().certificate.unwrap().0;
    let (_, block) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    let (_, cert) = X509Certificate::from_der(&block.contents).unwrap();
    let sans = cert.subject_alternative_name().unwrap().unwrap();
    assert_eq!(
        sans.value.general_names,
        [
            x509_parser::extensions::GeneralName::DNSName("node-a"),
            x509_parser::extensions::GeneralName::DNSName(IMEX_SHARED_NAME)
        ]
    );
    let body = status.body.clone();
    status.ok(&body);
    finish(task, ctx, server).await;
}

#[tokio::test]
async fn a_request_for_another_shared_name_is_denied_with_an_event() {
    let (client, mut server) = pair();
    let ctx = context(client);
    let asked = csr_naming(&["node-a", "imex.other.invalid"], &[]);
    let task = looking_at(&ctx, &asked);
    let approval = server
        .expect(Method::PUT, &format!("{CSRS}/req-1/approval"))
        .await;
    assert_eq!(
        conditions(&approval.body),
        [("Denied".into(), "NameMismatch".into())]
    );
    assert!(approval.body["status"].get("certificate").is_none());
    let body = approval.body.clone();
    approval.ok(&body);
    assert_eq!(expect_event(&mut server).await, "NameMismatch");
    finish(task, ctx, server).await;
}
