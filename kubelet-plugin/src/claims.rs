//! One call of the kubelet, whatever its version: check the claims, hand each to the node
//! concurrently, and answer for every claim. The versioned services only translate.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::future::Future;
use std::sync::Arc;

use domaind_actors::model::ClaimRef;
use futures::future::{Either, join_all};
use tonic::Status;
use tracing::Instrument;

use super::gate::CallGate;
use super::plugin::{ClaimFailure, NodePlugin, PreparedDevice};
use super::version::DraVersion;

/// Calls, by `method`, `version` and `outcome`: `ok` (every claim answered without
/// error), `claim_errors` (at least one claim has an error), `invalid_argument`,
/// `unavailable` (shutting down), `malformed` (the protobuf did not decode).
pub const REQUESTS_TOTAL: &str = "domaind_dra_requests_total";
/// Claims, by `method`, `version` and `outcome`: `ok`, `retryable_error`,
/// `permanent_error`, `invalid` (refused before reaching the node).
pub const CLAIMS_TOTAL: &str = "domaind_dra_claims_total";
/// Seconds a call took, by `method`, from the kubelet's request to the answer for all of
/// its claims; calls refused whole (shutting down, malformed) are not timed. A prepare
/// waits here for its domain (up to `--prepare-deadline`), so this is the latency a pod
/// start sees from the plugin.
pub const REQUEST_SECONDS: &str = "domaind_dra_request_duration_seconds";

/// Each claim's answer, keyed by uid as the kubelet's response is: the claim's result or
/// the text of its `error` field.
pub(crate) type ClaimAnswers<T> = BTreeMap<String, Result<T, String>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Prepare,
    Unprepare,
}

impl Method {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Method::Prepare => "NodePrepareResources",
            Method::Unprepare => "NodeUnprepareResources",
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    /// Well formed: the node gets it.
    Call(ClaimRef),
    /// Answered with this error without asking the node.
    Refused { uid: String, reason: String },
}

/// Checks a request's claims. What cannot be answered per claim fails the call: no
/// claims, a claim without a uid (the response is keyed by uid, so it has no entry to
/// put an error in), and one uid naming two different claims. A claim repeated exactly is
/// answered once.
pub(crate) fn check_claims(claims: Vec<ClaimRef>) -> Result<Vec<Checked>, Status> {
    if claims.is_empty() {
        return Err(Status::invalid_argument("the request names no claims"));
    }
    let mut seen: BTreeMap<String, (usize, ClaimRef)> = BTreeMap::new();
    let mut checked = Vec::with_capacity(claims.len());
    for (index, claim) in claims.into_iter().enumerate() {
        if claim.uid.is_empty() {
            return Err(Status::invalid_argument(format!(
                "claim {index} (namespace {:?}, name {:?}) has no uid; the response is keyed \
                 by uid, so every claim needs one",
                claim.namespace, claim.name
            )));
        }
        match seen.entry(claim.uid.clone()) {
            Entry::Occupied(first) => {
                let (first_index, first_claim) = first.get();
                if *first_claim == claim {
                    continue;
                }
                return Err(Status::invalid_argument(format!(
                    "claims {first_index} and {index} have the same uid {:?} but name \
                     different claims ({}/{} and {}/{})",
                    claim.uid, first_claim.namespace, first_claim.name, claim.namespace, claim.name
                )));
            }
            Entry::Vacant(slot) => {
                slot.insert((index, claim.clone()));
            }
        }
        let missing = match (claim.namespace.is_empty(), claim.name.is_empty()) {
            (false, false) => None,
            (true, false) => Some("namespace"),
            (false, true) => Some("name"),
            (true, true) => Some("namespace and no name"),
        };
        checked.push(match missing {
            None => Checked::Call(claim),
            Some(what) => Checked::Refused {
                reason: format!(
                    "claim {} has no {what}: the kubelet must send each claim's namespace, uid \
                     and name",
                    claim.uid
                ),
                uid: claim.uid,
            },
        });
    }
    Ok(checked)
}

/// Runs calls against the node, for both DRA versions.
#[derive(Clone)]
pub(crate) struct ClaimHandler {
    plugin: Arc<dyn NodePlugin>,
    gate: CallGate,
}

impl std::fmt::Debug for ClaimHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimHandler")
            .field("in_flight", &self.gate.in_flight())
            .finish_non_exhaustive()
    }
}

impl ClaimHandler {
    pub(crate) fn new(plugin: Arc<dyn NodePlugin>, gate: CallGate) -> Self {
        Self { plugin, gate }
    }

    pub(crate) async fn prepare(
        &self,
        version: DraVersion,
        claims: Vec<ClaimRef>,
    ) -> Result<ClaimAnswers<Vec<PreparedDevice>>, Status> {
        self.handle(
            Method::Prepare,
            version,
            claims,
            |plugin, claim| async move { plugin.prepare(claim).await },
        )
        .await
    }

    pub(crate) async fn unprepare(
        &self,
        version: DraVersion,
        claims: Vec<ClaimRef>,
    ) -> Result<ClaimAnswers<()>, Status> {
        self.handle(
            Method::Unprepare,
            version,
            claims,
            |plugin, claim| async move { plugin.unprepare(claim).await },
        )
        .await
    }

    async fn handle<T, F, Fut>(
        &self,
        method: Method,
        version: DraVersion,
        claims: Vec<ClaimRef>,
        call: F,
    ) -> Result<ClaimAnswers<T>, Status>
    where
        F: Fn(Arc<dyn NodePlugin>, ClaimRef) -> Fut,
        Fut: Future<Output = Result<T, ClaimFailure>>,
    {
        let span = tracing::info_span!(
            "dra_call",
            method = method.as_str(),
            version = version.as_str(),
            claims = claims.len()
        );
        let started = std::time::Instant::now();
        async {
            let _admitted = self.gate.enter().inspect_err(|_| {
                count_request(method, version, "unavailable");
                tracing::info!("refused: shutting down");
            })?;
            let checked = check_claims(claims).inspect_err(|status| {
                count_request(method, version, "invalid_argument");
                tracing::warn!(error = status.message(), "refused a malformed request");
            })?;
            let answers = join_all(checked.into_iter().map(|item| match item {
                Checked::Refused { uid, reason } => {
                    count_claim(method, version, "invalid");
                    tracing::warn!(claim.uid = %uid, error = %reason, "refused a claim");
                    Either::Left(std::future::ready((uid, Err(reason))))
                }
                Checked::Call(claim) => {
                    let span = tracing::info_span!(
                        "claim",
                        uid = %claim.uid,
                        namespace = %claim.namespace,
                        name = %claim.name
                    );
                    let future = call(Arc::clone(&self.plugin), claim.clone());
                    Either::Right(
                        async move {
                            let result = future.await;
                            log_claim(method, version, &result);
                            (claim.uid, result.map_err(error_text))
                        }
                        .instrument(span),
                    )
                }
            }))
            .await;
            let all_ok = answers.iter().all(|(_, result)| result.is_ok());
            count_request(method, version, if all_ok { "ok" } else { "claim_errors" });
            metrics::histogram!(REQUEST_SECONDS, "method" => method.as_str())
                .record(started.elapsed().as_secs_f64());
            Ok(answers.into_iter().collect())
        }
        .instrument(span)
        .await
    }
}

/// The claim's `error` field: empty would read as success, so it never is.
fn error_text(failure: ClaimFailure) -> String {
    if failure.message.is_empty() {
        "the node failed this claim without saying why".to_string()
    } else {
        failure.message
    }
}

fn log_claim<T>(method: Method, version: DraVersion, result: &Result<T, ClaimFailure>) {
    match result {
        Ok(_) => {
            count_claim(method, version, "ok");
            tracing::debug!("claim done");
        }
        Err(failure) if failure.retryable => {
            count_claim(method, version, "retryable_error");
            tracing::info!(error = %failure, "claim not done yet; the kubelet will call again");
        }
        Err(failure) => {
            count_claim(method, version, "permanent_error");
            tracing::warn!(error = %failure, "claim failed");
        }
    }
}

pub(crate) fn count_request(method: Method, version: DraVersion, outcome: &'static str) {
    metrics::counter!(
        REQUESTS_TOTAL,
        "method" => method.as_str(),
        "version" => version.as_str(),
        "outcome" => outcome
    )
    .increment(1);
}

fn count_claim(method: Method, version: DraVersion, outcome: &'static str) {
    metrics::counter!(
        CLAIMS_TOTAL,
        "method" => method.as_str(),
        "version" => version.as_str(),
        "outcome" => outcome
    )
    .increment(1);
}

#[cfg(test)]
mod tests;
