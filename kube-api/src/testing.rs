//! The one scripted API server of the project's tests (`testing` feature), in the
//! manner of kube-rs controller-rs's fixtures: the client under test talks to a
//! `tower_test` mock through the same layer a real client has
//! ([`crate::metrics::ApiMetricsLayer`]), and the test checks each request exactly
//! (method, path, query, content type, body) and answers as the API server would.
//!
//! Two ways to drive it: one request at a time ([`ApiServer::expect`], then
//! [`Call::ok`] or [`Call::fail`]), or a whole scenario played in a task
//! ([`ApiServer::play`] with a list of [`Expect`]). A request out of order or not
//! expected fails the test; so does one that never comes, and one too many.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::FutureExt as _;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use kube::Client;
use kube::client::{Body, ClientBuilder};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower_test::mock::{self, Handle, SendResponse};

use crate::metrics::ApiMetricsLayer;

/// How long a test waits for the next request before deciding it will not come.
const PATIENCE: Duration = Duration::from_secs(10);

/// The server side of a mocked client.
#[derive(Debug)]
pub struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
    /// Requests a scenario left unanswered: calls that hang until the server goes.
    held: Vec<SendResponse<Response<Body>>>,
}

/// A client whose every request reaches the returned server.
pub fn pair() -> (Client, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = ClientBuilder::new(service, "default")
        .with_layer(&ApiMetricsLayer)
        .build();
    (
        client,
        ApiServer {
            handle,
            held: Vec::new(),
        },
    )
}

/// A Kubernetes `Status` failure body.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// One request, read whole.
#[derive(Debug)]
pub struct Call {
    pub method: Method,
    pub path: String,
    /// Decoded.
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// The body as JSON; `Null` when empty or not JSON (see `raw`).
    pub body: Value,
    pub raw: Vec<u8>,
    send: SendResponse<Response<Body>>,
}

impl ApiServer {
    /// The next request, which must come within a patience of 10 s.
    pub async fn next(&mut self) -> Call {
        let (request, send) = tokio::time::timeout(PATIENCE, self.handle.next_request())
            .await
            .expect("the client made no further request")
            .expect("the client was dropped before its next request");
        Call::read(request, send).await
    }

    /// The next request, however long it takes: a scenario's next step may be due only
    /// after a retry's backoff or an interval, in paused time.
    async fn next_step(&mut self, step: usize) -> Call {
        let (request, send) = self
            .handle
            .next_request()
            .await
            .unwrap_or_else(|| panic!("step {step}: the client went away"));
        Call::read(request, send).await
    }

    /// The next request, which must be `method` on `path`.
    pub async fn expect(&mut self, method: Method, path: &str) -> Call {
        let call = self.next().await;
        assert_eq!(
            (&call.method, call.path.as_str()),
            (&method, path),
            "unexpected request; body: {}",
            call.body
        );
        call
    }

    /// No request comes any more: every client is gone without making one.
    pub async fn done(mut self) {
        let more = tokio::time::timeout(PATIENCE, self.handle.next_request())
            .await
            .expect("the client is still alive: drop every clone before calling done()");
        if let Some((request, _)) = more {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }

    /// Fails if a request is waiting.
    pub fn assert_idle(&mut self) {
        if let Some(Some((request, _))) = self.handle.next_request().now_or_never() {
            panic!("unexpected request: {} {}", request.method(), request.uri());
        }
    }

    /// Plays `scenario` in a task; the task returns the server for the next one.
    pub fn play(mut self, scenario: Vec<Expect>) -> JoinHandle<Self> {
        tokio::spawn(async move {
            for (step, mut expect) in scenario.into_iter().enumerate() {
                let call = self.next_step(step).await;
                let label = format!("step {step}: {} {}", call.method, call.path);
                expect.check(&call, &label);
                if let Some(check) = expect.body.take() {
                    let json: Value = serde_json::from_slice(&call.raw)
                        .unwrap_or_else(|e| panic!("{label}: the body is not JSON: {e}"));
                    check(&json);
                }
                match expect.answer {
                    Answer::Json(status, body) => call.respond_bytes(
                        status,
                        serde_json::to_vec(&body).expect("a serialisable answer"),
                    ),
                    Answer::Echo => {
                        let raw = call.raw.clone();
                        call.respond_bytes(200, raw);
                    }
                    Answer::Raw(status, body) => call.respond_bytes(status, body),
                    Answer::Never => self.held.push(call.send),
                }
            }
            self
        })
    }
}

impl Call {
    async fn read(request: Request<Body>, send: SendResponse<Response<Body>>) -> Self {
        let (parts, body) = request.into_parts();
        let raw = body
            .collect()
            .await
            .expect("a readable request body")
            .to_bytes()
            .to_vec();
        Call {
            path: parts.uri.path().to_string(),
            query: form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
                .into_owned()
                .collect(),
            method: parts.method,
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .map(|v| v.to_str().expect("an ASCII content type").to_string()),
            body: serde_json::from_slice(&raw).unwrap_or(Value::Null),
            raw,
            send,
        }
    }

    /// Answers with `object` as JSON.
    pub fn respond(self, status: StatusCode, object: &impl Serialize) {
        let bytes = serde_json::to_vec(object).expect("a serialisable answer");
        self.respond_bytes(status.as_u16(), bytes);
    }

    fn respond_bytes(self, status: u16, body: Vec<u8>) {
        self.send.send_response(
            Response::builder()
                .status(status)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(body))
                .expect("a valid response"),
        );
    }

    /// Answers 200 with `object`.
    pub fn ok(self, object: &impl Serialize) {
        self.respond(StatusCode::OK, object);
    }

    /// Answers with a `metav1.Status` failure, as the API server does.
    pub fn fail(self, code: u16, reason: &str) {
        let body = status(code, reason, &format!("{reason} (scripted)"));
        self.respond(
            StatusCode::from_u16(code).expect("a valid status code"),
            &body,
        );
    }

    /// Asserts the query holds these parameters (among others kube may add).
    pub fn assert_query(&self, expected: &[(&str, &str)]) {
        for (key, value) in expected {
            assert_eq!(
                self.query.get(*key).map(String::as_str),
                Some(*value),
                "query parameter {key} of {} {} ({:?})",
                self.method,
                self.path,
                self.query
            );
        }
    }

    pub fn assert_content_type(&self, expected: &str) {
        assert_eq!(self.content_type.as_deref(), Some(expected));
    }
}

type Check = Box<dyn FnOnce(&Value) + Send>;

/// One expected request of a scenario, and its answer.
pub struct Expect {
    method: Method,
    path: String,
    query: Vec<(String, String)>,
    content_type: Option<&'static str>,
    body: Option<Check>,
    answer: Answer,
}

impl std::fmt::Debug for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expect")
            .field("method", &self.method)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
enum Answer {
    Json(u16, Value),
    /// The request's own body, 200 (what an API server returns for most writes).
    Echo,
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
        self.answer = Answer::Echo;
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

    fn check(&self, call: &Call, label: &str) {
        assert_eq!(call.method, self.method, "{label}");
        match self.path.strip_suffix('*') {
            Some(prefix) => assert!(call.path.starts_with(prefix), "{label}"),
            None => assert_eq!(call.path, self.path, "{label}"),
        }
        for (key, value) in &self.query {
            assert_eq!(call.query.get(key), Some(value), "{label}: query {key}");
        }
        if let Some(content_type) = self.content_type {
            assert_eq!(call.content_type.as_deref(), Some(content_type), "{label}");
        }
    }
}
