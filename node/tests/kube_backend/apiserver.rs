//! A scripted API server for kube's client: a tower mock whose every request is
//! checked against the next step of a scenario (method, path, query, content type,
//! body) and answered as the step says. Requests out of order or unexpected fail the
//! test; a scenario that is not played to its end fails it too (the test awaits it).

use std::collections::BTreeMap;

use domaind_kube_api::crd::ComputeDomain;
use domaind_node::kube::DomainCache;
use futures::FutureExt as _;
use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower_test::mock::{self, Handle, SendResponse};

type Check = Box<dyn FnOnce(&Value) + Send>;

/// One expected request and its answer.
pub struct Expect {
    method: Method,
    path: String,
    query: Vec<(String, String)>,
    content_type: Option<&'static str>,
    body: Option<Check>,
    answer: Answer,
}

enum Answer {
    Json(u16, Value),
    Raw(u16, Vec<u8>),
    /// Held unanswered until the server is dropped: a call that hangs.
    Never,
}

impl Expect {
    pub fn new(method: Method, path: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            query: Vec::new(),
            content_type: None,
            body: None,
            answer: Answer::Json(200, json!({})),
        }
    }

    /// `path` ending in `*` matches any path it starts with.
    pub fn get(path: impl Into<String>) -> Self {
        Self::new(Method::GET, path)
    }

    pub fn patch(path: impl Into<String>) -> Self {
        Self::new(Method::PATCH, path)
    }

    /// The query must hold `key=value` (decoded).
    pub fn query(mut self, key: &str, value: &str) -> Self {
        self.query.push((key.into(), value.into()));
        self
    }

    /// A server-side apply by `manager`, forced.
    pub fn apply_by(self, manager: &str) -> Self {
        let mut expect = self.query("fieldManager", manager).query("force", "true");
        expect.content_type = Some("application/apply-patch+yaml");
        expect
    }

    pub fn content_type(mut self, content_type: &'static str) -> Self {
        self.content_type = Some(content_type);
        self
    }

    /// Checks the request's JSON body.
    pub fn body(mut self, check: impl FnOnce(&Value) + Send + 'static) -> Self {
        self.body = Some(Box::new(check));
        self
    }

    pub fn respond(mut self, status: u16, body: Value) -> Self {
        self.answer = Answer::Json(status, body);
        self
    }

    /// Answers with the request's own body (what an API server returns for most writes).
    pub fn echo(mut self) -> Self {
        self.answer = Answer::Raw(0, Vec::new());
        self
    }

    /// Answers with these bytes: a watch's event lines.
    pub fn respond_raw(mut self, status: u16, body: Vec<u8>) -> Self {
        self.answer = Answer::Raw(status, body);
        self
    }

    /// Never answers.
    pub fn hang(mut self) -> Self {
        self.answer = Answer::Never;
        self
    }
}

/// A Kubernetes `Status` error body.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// The server side of a mocked client.
pub struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
    held: Vec<SendResponse<Response<Body>>>,
}

/// A client whose requests go to the returned server.
pub fn pair() -> (Client, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (
        Client::new(service, "default"),
        ApiServer {
            handle,
            held: Vec::new(),
        },
    )
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// A request's query, decoded.
pub fn query_of(uri: &http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

impl ApiServer {
    /// Plays `scenario` in a task; the task returns the server for the next one.
    pub fn play(mut self, scenario: Vec<Expect>) -> JoinHandle<Self> {
        tokio::spawn(async move {
            for (step, expect) in scenario.into_iter().enumerate() {
                let (request, send) = self
                    .handle
                    .next_request()
                    .await
                    .unwrap_or_else(|| panic!("step {step}: the client went away"));
                let (parts, body) = request.into_parts();
                let label = format!("step {step}: {} {}", parts.method, parts.uri);
                assert_eq!(parts.method, expect.method, "{label}");
                match expect.path.strip_suffix('*') {
                    Some(prefix) => assert!(parts.uri.path().starts_with(prefix), "{label}"),
                    None => assert_eq!(parts.uri.path(), expect.path, "{label}"),
                }
                let query = query_of(&parts.uri);
                for (key, value) in &expect.query {
                    assert_eq!(query.get(key), Some(value), "{label}: query {key}");
                }
                if let Some(content_type) = expect.content_type {
                    assert_eq!(
                        parts
                            .headers
                            .get(http::header::CONTENT_TYPE)
                            .and_then(|v| v.to_str().ok()),
                        Some(content_type),
                        "{label}"
                    );
                }
                let bytes = body.collect_bytes().await.unwrap();
                if let Some(check) = expect.body {
                    let json: Value = serde_json::from_slice(&bytes)
                        .unwrap_or_else(|e| panic!("{label}: the body is not JSON: {e}"));
                    check(&json);
                }
                let (status, body) = match expect.answer {
                    Answer::Json(status, body) => (status, serde_json::to_vec(&body).unwrap()),
                    Answer::Raw(0, _) => (200, bytes.to_vec()),
                    Answer::Raw(status, body) => (status, body),
                    Answer::Never => {
                        self.held.push(send);
                        continue;
                    }
                };
                send.send_response(
                    Response::builder()
                        .status(status)
                        .header(http::header::CONTENT_TYPE, "application/json")
                        .body(Body::from(body))
                        .unwrap(),
                );
            }
            self
        })
    }

    /// Fails if a request is waiting.
    pub fn assert_idle(&mut self) {
        if let Some(Some((request, _))) = self.handle.next_request().now_or_never() {
            panic!("unexpected request: {} {}", request.method(), request.uri());
        }
    }
}

/// A ComputeDomain as the API server returns it.
pub fn compute_domain(namespace: &str, name: &str, uid: &str, generation: i64) -> ComputeDomain {
    serde_json::from_value(json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": namespace, "uid": uid,
                     "generation": generation, "resourceVersion": "100"},
        "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": format!("{name}-channel")}}},
    }))
    .unwrap()
}

/// A cache holding `domains`, synced; keep the writer to keep it so.
pub fn synced_cache(domains: Vec<ComputeDomain>) -> (DomainCache, Writer<ComputeDomain>) {
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for cd in domains {
        writer.apply_watcher_event(&watcher::Event::InitApply(cd));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (DomainCache::from_store(store), writer)
}

/// A cache whose first list has not arrived.
pub fn unsynced_cache() -> (DomainCache, Writer<ComputeDomain>) {
    let (store, writer) = reflector::store();
    (DomainCache::from_store(store), writer)
}

/// The reference claim, as a real API server returned it.
pub fn reference_claim() -> Value {
    serde_json::from_str(include_str!(
        "../../../kube-api/fixtures/resourceclaim-allocated.json"
    ))
    .unwrap()
}

/// Sums a counter's values over label sets that contain every `labels` pair.
pub fn counter(
    snapshot: &[(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        metrics_util::debugging::DebugValue,
    )],
    name: &str,
    labels: &[(&str, &str)],
) -> u64 {
    snapshot
        .iter()
        .filter(|(key, ..)| key.key().name() == name)
        .filter(|(key, ..)| {
            labels.iter().all(|(k, v)| {
                key.key()
                    .labels()
                    .any(|label| label.key() == *k && label.value() == *v)
            })
        })
        .map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}
