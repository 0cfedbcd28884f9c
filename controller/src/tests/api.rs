//! A scripted API server for the controller's tests, in the manner of kube-rs
//! controller-rs's `fixtures.rs`: the client under test talks to a `tower_test` mock,
//! and the test takes each request in turn, checks it exactly (method, path, query,
//! content type, body), and answers as the API server would. A request the script does
//! not expect fails the test; so does one that never comes, and one too many.

use std::collections::BTreeMap;
use std::time::Duration;

use domaind_kube_api::metrics::ApiMetricsLayer;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use kube::Client;
use kube::client::{Body, ClientBuilder};
use serde::Serialize;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle, SendResponse};

/// How long a test waits for the next request before deciding it will not come.
const PATIENCE: Duration = Duration::from_secs(10);

pub struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
}

/// A client whose every request reaches the returned server.
pub fn pair() -> (Client, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    // The layer the controller's real client has: its tests see the same metrics.
    let client = ClientBuilder::new(service, "default")
        .with_layer(&ApiMetricsLayer)
        .build();
    (client, ApiServer { handle })
}

/// One request, read whole.
pub struct Call {
    pub method: Method,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    pub body: Value,
    send: SendResponse<Response<Body>>,
}

impl ApiServer {
    /// The next request, which must come.
    pub async fn next(&mut self) -> Call {
        let (request, send) = tokio::time::timeout(PATIENCE, self.handle.next_request())
            .await
            .expect("the client made no further request")
            .expect("the client was dropped before its next request");
        let (parts, body) = request.into_parts();
        let bytes = body
            .collect()
            .await
            .expect("a readable request body")
            .to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON request body")
        };
        let query = parts
            .uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                (key.to_string(), value.to_string())
            })
            .collect();
        Call {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query,
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .map(|v| v.to_str().expect("an ASCII content type").to_string()),
            body,
            send,
        }
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
}

impl Call {
    /// Answers with `object` as JSON.
    pub fn respond(self, status: StatusCode, object: &impl Serialize) {
        let bytes = serde_json::to_vec(object).expect("a serialisable answer");
        self.send.send_response(
            Response::builder()
                .status(status)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(bytes))
                .expect("a valid response"),
        );
    }

    /// Answers 200 with `object`.
    pub fn ok(self, object: &impl Serialize) {
        self.respond(StatusCode::OK, object);
    }

    /// Answers with a `metav1.Status` failure, as the API server does.
    pub fn fail(self, code: u16, reason: &str) {
        let status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("{reason} (scripted)"),
            "reason": reason,
            "code": code
        });
        self.respond(
            StatusCode::from_u16(code).expect("a valid status code"),
            &status,
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
