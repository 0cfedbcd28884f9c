//! Metrics of every request the Kubernetes client sends, whoever sends it (our calls,
//! the watches, the event recorder): a tower layer under kube's client.
//!
//! - `domaind_kube_requests_total{verb, resource, code}`: `code` is the HTTP status,
//!   `error` when no response came (connection refused, TLS), or `abandoned` when the
//!   caller stopped waiting first (`--kube-api-timeout`, a shutdown): a hung API server
//!   shows up here, not as silence.
//! - `domaind_kube_request_duration_seconds{verb, resource}`: until the response's
//!   headers (for a watch, until it is established).
//!
//! `resource` is the plural name, with the subresource when there is one
//! (`computedomains/status`): object names never become labels.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Method, Request, Response, Uri};
use tower::{Layer, Service};

pub const API_REQUESTS: &str = "domaind_kube_requests_total";
pub const API_REQUEST_DURATION: &str = "domaind_kube_request_duration_seconds";

/// Gives the Kubernetes client's and the HTTP servers' metrics their help text (`# HELP`
/// on `/metrics`, and the book's metrics reference); both processes call it once, after
/// installing their recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_histogram};
    describe_counter!(
        API_REQUESTS,
        "Every request to the Kubernetes API server (ours, the watches', the event \
         recorder's), by `verb`, `resource` (plural, with the subresource) and `code`: the \
         HTTP status, `error` (no response: connection refused, TLS) or `abandoned` (the \
         caller stopped waiting first, e.g. `--kube-api-timeout`)."
    );
    describe_histogram!(
        API_REQUEST_DURATION,
        "Seconds to the response's headers of a Kubernetes API request (for a watch, until \
         it is established), by `verb` and `resource`."
    );
    describe_counter!(
        crate::http_guard::REQUESTS_REFUSED,
        "HTTP requests refused by the process's HTTP servers (`/metrics`, the health and \
         state endpoints), by `reason`: `header_timeout`, `headers_too_large`, \
         `body_too_large`."
    );
}

/// Adds [`ApiMetrics`] to a client's service stack.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiMetricsLayer;

impl<S> Layer<S> for ApiMetricsLayer {
    type Service = ApiMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiMetrics { inner }
    }
}

/// Counts and times the requests `inner` sends.
#[derive(Debug, Clone)]
pub struct ApiMetrics<S> {
    inner: S,
}

impl<S, B, R> Service<Request<B>> for ApiMetrics<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let endpoint = Endpoint::of(request.method(), request.uri());
        let started = Instant::now();
        let response = self.inner.call(request);
        let mut record = Record {
            endpoint: Some(endpoint),
            started,
        };
        Box::pin(async move {
            let result = response.await;
            record.finish(match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_owned(),
            });
            result
        })
    }
}

/// One request's count and duration, recorded once: when its response comes, or as
/// `abandoned` when its future is dropped before that.
struct Record {
    endpoint: Option<Endpoint>,
    started: Instant,
}

impl Record {
    fn finish(&mut self, code: String) {
        let Some(endpoint) = self.endpoint.take() else {
            return;
        };
        metrics::counter!(
            API_REQUESTS,
            "verb" => endpoint.verb,
            "resource" => endpoint.resource.clone(),
            "code" => code
        )
        .increment(1);
        metrics::histogram!(
            API_REQUEST_DURATION,
            "verb" => endpoint.verb,
            "resource" => endpoint.resource
        )
        .record(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.finish("abandoned".to_owned());
    }
}

/// What a request does, in Kubernetes' words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: &'static str,
    pub resource: String,
}

impl Endpoint {
    pub fn of(method: &Method, uri: &Uri) -> Self {
        let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
        // /api/v1/... or /apis/<group>/<version>/...
        let rest = match segments.first() {
            Some(&"api") => segments.get(2..),
            Some(&"apis") => segments.get(3..),
            _ => None,
        }
        .unwrap_or_default();
        // namespaces/<ns>/<resource>/... ; but /api/v1/namespaces/<name> is a namespace.
        let rest = if rest.len() >= 3 && rest[0] == "namespaces" {
            &rest[2..]
        } else {
            rest
        };
        let resource = match rest {
            [] => "other".to_owned(),
            [resource] | [resource, _] => (*resource).to_owned(),
            [resource, _, sub, ..] => format!("{resource}/{sub}"),
        };
        let named = rest.len() >= 2;
        let watching = uri
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let verb = match *method {
            Method::GET if watching => "watch",
            Method::GET if named => "get",
            Method::GET => "list",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if named => "delete",
            Method::DELETE => "deletecollection",
            _ => "other",
        };
        Self { verb, resource }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: Method, uri: &str) -> (&'static str, String) {
        let endpoint = Endpoint::of(&method, &uri.parse().unwrap());
        (endpoint.verb, endpoint.resource)
    }

    #[test]
    fn requests_are_named_by_verb_and_resource_never_by_object() {
        let cases = [
            (
                Method::GET,
                "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/worker-0",
                ("get", "resourceclaims"),
            ),
            (
                Method::GET,
                "/apis/resource.k8s.io/v1/resourceclaims?limit=500",
                ("list", "resourceclaims"),
            ),
            (
                Method::GET,
                "/apis/resource.nvidia.com/v1beta1/computedomains?watch=true&resourceVersion=5",
                ("watch", "computedomains"),
            ),
            (
                Method::PATCH,
                "/apis/resource.nvidia.com/v1beta1/namespaces/a/computedomains/cd/status?fieldManager=x",
                ("patch", "computedomains/status"),
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/a/events",
                ("create", "events"),
            ),
            (Method::GET, "/api/v1/nodes/gb200-n01", ("get", "nodes")),
            (
                Method::DELETE,
                "/api/v1/namespaces/team-a",
                ("delete", "namespaces"),
            ),
            (
                Method::DELETE,
                "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dn",
                ("deletecollection", "resourceslices"),
            ),
            (Method::GET, "/version", ("list", "other")),
        ];
        for (method, uri, (verb, resource)) in cases {
            assert_eq!(of(method, uri), (verb, resource.to_owned()), "{uri}");
        }
    }

    /// `(labels, count)` of every request counter in `snapshot`.
    fn counted(recorder: &metrics_util::debugging::DebuggingRecorder) -> Vec<(Vec<String>, u64)> {
        use metrics_util::debugging::DebugValue;
        let mut counted: Vec<_> = recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == API_REQUESTS)
            .map(|(key, _, _, value)| {
                let labels = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                let DebugValue::Counter(count) = value else {
                    panic!("{API_REQUESTS} is a counter")
                };
                (labels, count)
            })
            .collect();
        counted.sort();
        counted
    }

    #[tokio::test(start_paused = true)]
    async fn answered_and_abandoned_requests_are_both_counted() {
        use futures::FutureExt as _;
        use tower::ServiceExt as _;

        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let _local = metrics::set_default_local_recorder(&recorder);
        let (service, mut handle) = tower_test::mock::pair::<Request<()>, Response<()>>();
        let mut service = ApiMetricsLayer.layer(service);
        let get = |path: &str| Request::get(path).body(()).unwrap();

        let answered = service.ready().await.unwrap().call(get("/api/v1/nodes/n1"));
        let (_, respond) = handle.next_request().await.unwrap();
        respond.send_response(Response::builder().status(404).body(()).unwrap());
        answered.await.unwrap();

        // The caller's timeout drops the future while the server holds the request.
        let hung = service.ready().await.unwrap().call(get("/api/v1/nodes/n2"));
        let mut hung = hung.boxed();
        assert!((&mut hung).now_or_never().is_none());
        let _held = handle.next_request().await.unwrap();
        drop(hung);

        let labels = |code: &str| -> Vec<String> {
            vec![
                "verb=get".into(),
                "resource=nodes".into(),
                format!("code={code}"),
            ]
        };
        assert_eq!(
            counted(&recorder),
            vec![(labels("404"), 1), (labels("abandoned"), 1)]
        );
    }
}
