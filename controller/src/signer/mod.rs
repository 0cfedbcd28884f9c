//! The gossip node certificate signer: it approves and signs the
//! CertificateSigningRequests of our signerName that its rules (`rules`) allow, denies
//! the others with the rule's reason, and keeps the CA's certificate published for the
//! nodes (`bundle`). Only the leader runs it.
//!
//! | module | job |
//! |---|---|
//! | `rules` | approve or deny one request (pure) |
//! | `stage` | what a CSR already went through: skip it, decide it, or sign it |
//! | `ca` | the CA: load, make, sign |
//! | `bundle` | the CA Secret and the CA bundle ConfigMap |

mod bundle;
mod ca;
mod rules;
mod stage;

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource as _, ResourceExt as _};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use bundle::BundleSettings;
pub use ca::{CaError, GossipCa};
pub use rules::{Grant, Policy, Refusal, Request, Rule, decide};
pub use stage::{Stage, stage};

use crate::backoff::Failures;
use domaind_kube_api::names::{CONTROLLER_FIELD_MANAGER, GOSSIP_SIGNER, NODE_NAME_EXTRA};
use domaind_kube_api::reasons::CsrReason;
use domaind_kube_api::{ApiError, bounded};

/// What the signer needs besides the API client.
#[derive(Debug, Clone)]
pub struct SignerSettings {
    pub policy: Policy,
    pub bundle: BundleSettings,
    /// Each API call (`--kube-api-timeout`).
    pub api_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("{0}")]
    Api(#[from] ApiError),
    #[error("cannot sign {csr}: {source}")]
    Ca { csr: String, source: CaError },
}

struct Context {
    client: Client,
    settings: SignerSettings,
    ca: RwLock<Arc<GossipCa>>,
    recorder: Recorder,
    failures: Failures,
}

/// Signs until `term`: first the CA (loaded or made, published), then the CSRs.
pub async fn run(
    client: Client,
    settings: SignerSettings,
    instance: &str,
    term: CancellationToken,
) {
    let Some(ca) = bundle::ensure(&client, &settings.bundle, settings.api_timeout, &term).await
    else {
        return;
    };
    info!(signer = GOSSIP_SIGNER, node_daemon = %settings.policy.node_daemon, "signing gossip node certificates");
    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER_FIELD_MANAGER.into(),
                instance: Some(instance.into()),
            },
        ),
        ca: RwLock::new(Arc::new(ca)),
        client: client.clone(),
        settings,
        failures: Failures::default(),
    });
    let keeper = tokio::spawn(keep_bundle(ctx.clone(), term.clone()));
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    Controller::new(
        csrs,
        watcher::Config::default().fields(&format!("spec.signerName={GOSSIP_SIGNER}")),
    )
    .graceful_shutdown_on(term.clone().cancelled_owned())
    .run(reconcile, error_policy, ctx)
    .for_each(|result| {
        match result {
            Ok((csr, action)) => debug!(csr = %csr.name, ?action, "CSR looked at"),
            Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
            Err(error) => warn!(%error, "CSR signer"),
        }
        futures::future::ready(())
    })
    .await;
    keeper.abort();
}

/// Re-reads the CA Secret now and then: a CA the administrator replaced is used for the
/// next signature and published to the nodes.
async fn keep_bundle(ctx: Arc<Context>, term: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(ctx.settings.bundle.resync) => {}
            _ = term.cancelled() => return,
        }
        match bundle::refresh(&ctx.client, &ctx.settings.bundle, ctx.settings.api_timeout).await {
            Ok(ca) => {
                let changed = ca.cert_pem() != current_ca(&ctx).cert_pem();
                if changed {
                    info!("the gossip CA changed; signing with the new one");
                    *ctx.ca.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ca);
                }
            }
            Err(error) => {
                ::metrics::counter!(crate::metrics::CA_BUNDLE_ERRORS).increment(1);
                warn!(%error, "cannot refresh the gossip CA and its bundle; keeping the current one");
            }
        }
    }
}

fn current_ca(ctx: &Context) -> Arc<GossipCa> {
    ctx.ca.read().unwrap_or_else(|p| p.into_inner()).clone()
}

async fn reconcile(
    csr: Arc<CertificateSigningRequest>,
    ctx: Arc<Context>,
) -> Result<Action, SignError> {
    let result = look_at(&csr, &ctx).await;
    if result.is_ok() {
        ctx.failures.succeeded(&csr.name_any());
    }
    result
}

fn error_policy(
    csr: Arc<CertificateSigningRequest>,
    error: &SignError,
    ctx: Arc<Context>,
) -> Action {
    let retry_in = ctx.failures.failed(&csr.name_any());
    ::metrics::counter!(crate::metrics::CSR_ERRORS).increment(1);
    warn!(csr = %csr.name_any(), %error, ?retry_in, "cannot act on a CSR; retrying");
    Action::requeue(retry_in)
}

/// The parts of `csr` the rules read, with the requester's Node's addresses.
fn request_of<'a>(csr: &'a CertificateSigningRequest, node_addresses: &'a [IpAddr]) -> Request<'a> {
    let spec = &csr.spec;
    Request {
        username: spec.username.as_deref(),
        bound_node: spec
            .extra
            .as_ref()
            .and_then(|extra| extra.get(NODE_NAME_EXTRA))
            .map(Vec::as_slice),
        usages: spec.usages.as_deref().unwrap_or_default(),
        pem: &spec.request.0,
        expiration_seconds: spec.expiration_seconds,
        node_addresses,
    }
}

/// The rules' answer. The requester's Node is read only for a request that names an
/// IP, which no request without one needs.
async fn decide_csr(
    csr: &CertificateSigningRequest,
    ctx: &Context,
) -> Result<Result<Grant, Refusal>, SignError> {
    let first = decide(&ctx.settings.policy, &request_of(csr, &[]));
    let node = match &first {
        Err(refusal) if refusal.rule == Rule::IpMismatch => csr
            .spec
            .extra
            .as_ref()
            .and_then(|extra| extra.get(NODE_NAME_EXTRA))
            .and_then(|nodes| nodes.first()),
        _ => None,
    };
    let Some(node) = node else {
        return Ok(first);
    };
    let addresses = node_addresses(ctx, node).await?;
    Ok(decide(&ctx.settings.policy, &request_of(csr, &addresses)))
}

/// The IPs a Node's `status.addresses` lists (its kubelet writes them; a daemon's pod
/// cannot). No such Node: none.
async fn node_addresses(ctx: &Context, node: &str) -> Result<Vec<IpAddr>, SignError> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let found = bounded(
        format!("cannot read Node {node} to check the IPs its daemon asks for"),
        ctx.settings.api_timeout,
        nodes.get_opt(node),
    )
    .await?;
    Ok(found
        .and_then(|n| n.status)
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .iter()
        .filter_map(|a| a.address.parse().ok())
        .collect())
}

async fn look_at(csr: &CertificateSigningRequest, ctx: &Context) -> Result<Action, SignError> {
    let stage = stage(csr);
    if stage == Stage::Done {
        return Ok(Action::await_change());
    }
    let name = csr.name_any();
    match (stage, decide_csr(csr, ctx).await?) {
        (Stage::Approved, Ok(grant)) => sign(ctx, csr, &grant).await,
        (_, Ok(grant)) => {
            let message = format!("a gossip certificate for node {}", grant.node);
            match write_condition(
                ctx,
                csr,
                "approval",
                "Approved",
                CsrReason::NodeCertificateApproved.as_str(),
                &message,
            )
            .await?
            {
                Some(approved) => sign(ctx, &approved, &grant).await,
                None => Ok(Action::await_change()),
            }
        }
        (Stage::Approved, Err(refusal)) => {
            // Approved by someone else, against our rules: never signed.
            let message = format!("approved, but refused by the signer: {}", refusal.message);
            let reason = CsrReason::RefusedAfterApproval.as_str();
            if write_condition(ctx, csr, "status", "Failed", reason, &message)
                .await?
                .is_some()
            {
                count("failed", refusal.rule.reason());
                warn!(csr = %name, reason = refusal.rule.reason(), %message, "refused to sign an approved request");
                warn_event(ctx, csr, refusal.rule.reason(), "Sign", &message).await;
            }
            Ok(Action::await_change())
        }
        (_, Err(refusal)) => {
            let reason = refusal.rule.reason();
            if write_condition(ctx, csr, "approval", "Denied", reason, &refusal.message)
                .await?
                .is_some()
            {
                count("denied", reason);
                warn!(csr = %name, reason, message = %refusal.message, "denied a node certificate request");
                warn_event(ctx, csr, reason, "Deny", &refusal.message).await;
            }
            Ok(Action::await_change())
        }
    }
}

/// Puts the certificate in `status.certificate`; a conflict means someone else wrote
/// first, and the watch brings what they wrote.
async fn sign(
    ctx: &Context,
    csr: &CertificateSigningRequest,
    grant: &Grant,
) -> Result<Action, SignError> {
    let name = csr.name_any();
    let pem = current_ca(ctx)
        .sign(grant, OffsetDateTime::now_utc())
        .map_err(|source| SignError::Ca {
            csr: name.clone(),
            source,
        })?;
    let mut signed = csr.clone();
    signed
        .status
        .get_or_insert_with(Default::default)
        .certificate = Some(k8s_openapi::ByteString(pem.into_bytes()));
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let written = tolerate_conflict(
        bounded(
            format!("cannot write the certificate of CSR {name}"),
            ctx.settings.api_timeout,
            api.replace_subresource("status", &name, &PostParams::default(), &signed),
        )
        .await,
    )?;
    if written.is_some() {
        count("approved", CsrReason::NodeCertificateApproved.as_str());
        info!(csr = %name, node = %grant.node, lifetime = ?grant.lifetime, "issued a gossip node certificate");
    }
    Ok(Action::await_change())
}

/// Adds one condition through `subresource` (`approval` or `status`), with the CSR's
/// resourceVersion: `None` when the CSR changed meanwhile (the watch brings it back).
async fn write_condition(
    ctx: &Context,
    csr: &CertificateSigningRequest,
    subresource: &str,
    type_: &str,
    reason: &str,
    message: &str,
) -> Result<Option<CertificateSigningRequest>, SignError> {
    let name = csr.name_any();
    let mut updated = csr.clone();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    updated
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: type_.into(),
            status: "True".into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_transition_time: Some(now.clone()),
            last_update_time: Some(now),
        });
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    Ok(tolerate_conflict(
        bounded(
            format!("cannot mark CSR {name} {type_}"),
            ctx.settings.api_timeout,
            api.replace_subresource(subresource, &name, &PostParams::default(), &updated),
        )
        .await,
    )?)
}

fn tolerate_conflict<T>(result: Result<T, ApiError>) -> Result<Option<T>, ApiError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error) if error.is_conflict() => Ok(None),
        Err(error) => Err(error),
    }
}

fn count(decision: &'static str, reason: &str) {
    ::metrics::counter!(crate::metrics::CSR_DECISIONS, "decision" => decision, "reason" => reason.to_string())
        .increment(1);
}

/// A Warning event on the CSR; losing one is logged, never retried.
async fn warn_event(
    ctx: &Context,
    csr: &CertificateSigningRequest,
    reason: &str,
    action: &str,
    message: &str,
) {
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(message.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    let reference = csr.object_ref(&());
    let publish = ctx.recorder.publish(&event, &reference);
    if let Err(error) = bounded("cannot record an event", ctx.settings.api_timeout, publish).await {
        warn!(csr = %csr.name_any(), %error, "cannot record the CSR's event");
    }
}

#[cfg(test)]
mod tests;
