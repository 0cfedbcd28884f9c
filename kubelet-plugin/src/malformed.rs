//! Counts DRA calls tonic refused before our handler saw them: a request whose protobuf
//! does not decode is answered INTERNAL by tonic's codec, and our handler, which never
//! answers INTERNAL, cannot count it. This layer reads the status off the response.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::Code;
use tonic::codegen::http;
use tower::Service;

use super::claims::{Method, count_request};
use super::version::DraVersion;

#[derive(Debug, Clone)]
pub(crate) struct CountMalformed<S> {
    inner: S,
}

impl<S> CountMalformed<S> {
    pub(crate) fn layer() -> impl tower::Layer<S, Service = Self> + Clone {
        tower::layer::layer_fn(|inner| Self { inner })
    }
}

/// The DRA method and version a request path names, if it names one.
fn dra_call(path: &str) -> Option<(Method, DraVersion)> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    let version = DraVersion::ALL
        .into_iter()
        .find(|version| version.service_name() == service)?;
    let method = [Method::Prepare, Method::Unprepare]
        .into_iter()
        .find(|m| m.as_str() == method)?;
    Some((method, version))
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for CountMalformed<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let call = dra_call(request.uri().path());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if let Some((method, version)) = call {
                let status = tonic::Status::from_header_map(response.headers());
                if status.is_some_and(|status| status.code() == Code::Internal) {
                    count_request(method, version, "malformed");
                    tracing::warn!(
                        method = method.as_str(),
                        version = version.as_str(),
                        "refused a request that does not decode"
                    );
                }
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_a_dra_call_or_nothing() {
        assert_eq!(
            dra_call("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"),
            Some((Method::Prepare, DraVersion::V1))
        );
        assert_eq!(
            dra_call("/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"),
            Some((Method::Unprepare, DraVersion::V1beta1))
        );
        for other in [
            "/grpc.health.v1.Health/Check",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/Other",
            "/k8s.io.kubelet.pkg.apis.dra.v2.DRAPlugin/NodePrepareResources",
            "NodePrepareResources",
            "/",
        ] {
            assert_eq!(dra_call(other), None, "{other}");
        }
    }
}
