//! One pass over one ComputeDomain: the API calls that carry out the rules of
//! `template`, `membership`, `condition` and `finalizer`.
//!
//! A live CD: our finalizer is added, then its template is created if missing (a
//! template of that name that is not ours is never written: a Warning event and the
//! `TemplateReady=False` condition say so). A CD being deleted: its template is deleted
//! first, so that no new pod can join a domain on its way out, then the finalizer is
//! released once no claim of the domain remains allocated (see `membership`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource as _, ResourceExt as _};
use time::OffsetDateTime;
use tracing::{debug, info, warn};

use crate::backoff::Failures;
use crate::census::{self, Census};
use crate::condition::{self, TemplateOutcome};
use crate::template::{self, Ownership, TemplateError, TemplateSettings};
use crate::{finalizer, membership};
use domaind_kube_api::crd::{ComputeDomain, ConditionStatus};
use domaind_kube_api::names::CONTROLLER_FIELD_MANAGER;
use domaind_kube_api::reasons::ControllerEventReason;
use domaind_kube_api::{ApiError, bounded};

/// How often things are looked at again when no watch event says they changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    /// A CD whose template is in place: the watches cover it; this is a safety net.
    pub resync: Duration,
    /// A CD being deleted whose claims are still allocated (claims are not watched).
    pub deletion_poll: Duration,
    /// A CD whose template name is taken by someone else's template (which is not
    /// watched): when to look whether it is gone.
    pub conflict_recheck: Duration,
    /// Each API call of a pass (`--kube-api-timeout`): a hung API server fails the
    /// pass, which is retried with backoff, instead of holding the CD for good.
    pub api_timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            resync: Duration::from_secs(600),
            deletion_poll: Duration::from_secs(5),
            conflict_recheck: Duration::from_secs(30),
            api_timeout: Duration::from_secs(10),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    client: Client,
    template: TemplateSettings,
    timing: Timing,
    recorder: Recorder,
    failures: Failures,
    /// This term's sightings of every domain, for the domain metrics.
    census: std::sync::Mutex<Census>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("template", &self.template)
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// `instance` names this replica in the events it records (its pod name).
    pub fn new(client: Client, template: TemplateSettings, timing: Timing, instance: &str) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER_FIELD_MANAGER.into(),
                instance: Some(instance.into()),
            },
        );
        Self {
            client,
            template,
            timing,
            recorder,
            failures: Failures::default(),
            census: std::sync::Mutex::default(),
        }
    }
}

/// The API call a pass failed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    AddFinalizer,
    ReadTemplate,
    CreateTemplate,
    DeleteTemplate,
    ListClaims,
    RemoveFinalizer,
    ApplyCondition,
}

impl Step {
    fn describe(self) -> &'static str {
        match self {
            Self::AddFinalizer => "add the finalizer to",
            Self::ReadTemplate => "read template",
            Self::CreateTemplate => "create template",
            Self::DeleteTemplate => "delete template",
            Self::ListClaims => "list the ResourceClaims of namespace",
            Self::RemoveFinalizer => "remove the finalizer from",
            Self::ApplyCondition => "apply the TemplateReady condition to",
        }
    }

    /// The `reason` label of the error counter.
    pub fn label(self) -> &'static str {
        match self {
            Self::AddFinalizer => "add_finalizer",
            Self::ReadTemplate => "read_template",
            Self::CreateTemplate => "create_template",
            Self::DeleteTemplate => "delete_template",
            Self::ListClaims => "list_claims",
            Self::RemoveFinalizer => "remove_finalizer",
            Self::ApplyCondition => "apply_condition",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused, failed or did not answer in time; `source` names the
    /// call ("cannot read template team-a/x").
    #[error("{source}")]
    Api {
        step: Step,
        #[source]
        source: ApiError,
    },
    #[error("ComputeDomain {cd}: {source}")]
    Invalid {
        cd: String,
        #[source]
        source: TemplateError,
    },
}

impl Error {
    fn is_not_found(&self) -> bool {
        matches!(self, Self::Api { source, .. } if source.is_not_found())
    }

    /// The `reason` label of the error counter: what failed.
    pub fn metric_reason(&self) -> &'static str {
        match self {
            Self::Api { step, .. } => step.label(),
            Self::Invalid { .. } => "invalid",
        }
    }
}

/// Runs one API call of a pass, bounded by `--kube-api-timeout`.
async fn call<T>(
    ctx: &Context,
    step: Step,
    object: impl std::fmt::Display,
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, Error> {
    let what = format!("cannot {} {object}", step.describe());
    bounded(what, ctx.timing.api_timeout, request)
        .await
        .map_err(|source| Error::Api { step, source })
}

fn key(cd: &ComputeDomain) -> String {
    format!("{}/{}", cd.namespace().unwrap_or_default(), cd.name_any())
}

/// The reconciler the controller runs: one pass, timed and counted.
pub async fn reconcile(cd: Arc<ComputeDomain>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    census::record(
        &mut ctx.census.lock().unwrap_or_else(|p| p.into_inner()),
        &cd,
        started,
    );
    let result = reconcile_once(&cd, &ctx).await;
    ::metrics::histogram!(crate::metrics::RECONCILE_SECONDS)
        .record(started.elapsed().as_secs_f64());
    let outcome = if result.is_ok() { "ok" } else { "error" };
    ::metrics::counter!(crate::metrics::RECONCILES, "outcome" => outcome).increment(1);
    if result.is_ok() {
        ctx.failures.succeeded(&key(&cd));
    }
    result
}

/// After a failed pass: retry with exponential backoff for this CD.
pub fn error_policy(cd: Arc<ComputeDomain>, error: &Error, ctx: Arc<Context>) -> Action {
    let retry_in = ctx.failures.failed(&key(&cd));
    ::metrics::counter!(crate::metrics::RECONCILE_ERRORS, "reason" => error.metric_reason())
        .increment(1);
    warn!(cd = %key(&cd), error = %error, ?retry_in, "reconcile failed; retrying");
    Action::requeue(retry_in)
}

#[tracing::instrument(skip_all, fields(cd = %key(cd)))]
async fn reconcile_once(cd: &ComputeDomain, ctx: &Context) -> Result<Action, Error> {
    let invalid = |source| Error::Invalid {
        cd: key(cd),
        source,
    };
    let namespace = cd
        .namespace()
        .ok_or(TemplateError::Missing("namespace"))
        .map_err(invalid)?;
    let uid = cd
        .uid()
        .ok_or(TemplateError::Missing("uid"))
        .map_err(invalid)?;
    let cds: Api<ComputeDomain> = Api::namespaced(ctx.client.clone(), &namespace);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client.clone(), &namespace);
    let template_name = &cd.spec.channel.resource_claim_template.name;

    if cd.metadata.deletion_timestamp.is_some() {
        return release(cd, ctx, &cds, &templates, &uid).await;
    }

    if !finalizer::has(cd) {
        let patch: json_patch::Patch = serde_json::from_value(finalizer::add(cd))
            .expect("our finalizer patch is a valid JSON patch");
        call(
            ctx,
            Step::AddFinalizer,
            key(cd),
            cds.patch(
                &cd.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            ),
        )
        .await?;
        info!("finalizer added");
    }

    let existing = call(
        ctx,
        Step::ReadTemplate,
        format!("{namespace}/{template_name}"),
        templates.get_opt(template_name),
    )
    .await?;
    let outcome = match existing {
        None => {
            let desired = template::desired(cd, &ctx.template).map_err(invalid)?;
            let created = call(
                ctx,
                Step::CreateTemplate,
                format!("{namespace}/{template_name}"),
                templates.create(&PostParams::default(), &desired),
            )
            .await;
            match created {
                Ok(_) => {
                    ::metrics::counter!(crate::metrics::TEMPLATES_CREATED).increment(1);
                    info!(template = %template_name, "ResourceClaimTemplate created");
                    TemplateOutcome::Ready {
                        template: template_name.clone(),
                    }
                }
                // Invalid (a name that is no DNS subdomain, say): the spec is immutable,
                // so no retry can help; the user is told.
                Err(Error::Api {
                    source:
                        ApiError::Status {
                            code: 422, message, ..
                        },
                    ..
                }) => TemplateOutcome::Rejected {
                    template: template_name.clone(),
                    why: message,
                },
                Err(error) => return Err(error),
            }
        }
        Some(found) => match template::ownership(&found, &uid) {
            Ownership::Ours => TemplateOutcome::Ready {
                template: template_name.clone(),
            },
            Ownership::Taken { owner } => TemplateOutcome::NameTaken {
                template: template_name.clone(),
                owner,
            },
        },
    };

    let Some(condition) = condition::update(cd, &outcome, OffsetDateTime::now_utc()) else {
        return Ok(next_pass(&outcome, &ctx.timing));
    };
    // Events once per change of the condition, not per pass: the condition says it
    // meanwhile.
    match &outcome {
        TemplateOutcome::Ready { .. } => {}
        TemplateOutcome::NameTaken { template, .. } => {
            ::metrics::counter!(crate::metrics::TEMPLATE_NAME_CONFLICTS).increment(1);
            warn!(template = %template, "template name taken by a template that is not ours");
        }
        TemplateOutcome::Rejected { template, why } => {
            warn!(template = %template, %why, "the API server refused the template");
        }
    }
    if condition.status == ConditionStatus::False {
        publish(
            ctx,
            cd,
            EventType::Warning,
            &condition.reason,
            "CreateTemplate",
            condition.message.clone(),
        )
        .await;
    }
    let body = condition::apply_body(cd, &condition);
    call(
        ctx,
        Step::ApplyCondition,
        key(cd),
        cds.patch_status(
            &cd.name_any(),
            &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        ),
    )
    .await?;
    Ok(next_pass(&outcome, &ctx.timing))
}

fn next_pass(outcome: &TemplateOutcome, timing: &Timing) -> Action {
    match outcome {
        // Deletion of our template wakes us through the owned-templates watch.
        TemplateOutcome::Ready { .. } => Action::requeue(timing.resync),
        TemplateOutcome::NameTaken { .. } => Action::requeue(timing.conflict_recheck),
        // Nothing to retry: the spec cannot change.
        TemplateOutcome::Rejected { .. } => Action::requeue(timing.resync),
    }
}

/// A CD being deleted: delete its template, wait for its claims, release it.
async fn release(
    cd: &ComputeDomain,
    ctx: &Context,
    cds: &Api<ComputeDomain>,
    templates: &Api<ResourceClaimTemplate>,
    uid: &str,
) -> Result<Action, Error> {
    let Some(remove) = finalizer::remove(cd) else {
        // Not ours to hold (or already released): nothing to do.
        return Ok(Action::await_change());
    };
    let namespace = cd.namespace().unwrap_or_default();
    let template_name = &cd.spec.channel.resource_claim_template.name;
    let template = call(
        ctx,
        Step::ReadTemplate,
        format!("{namespace}/{template_name}"),
        templates.get_opt(template_name),
    )
    .await?;
    let mut deleted_template = false;
    if let Some(template) = template
        && template::ownership(&template, uid) == Ownership::Ours
        && template.metadata.deletion_timestamp.is_none()
    {
        let deleted = call(
            ctx,
            Step::DeleteTemplate,
            format!("{namespace}/{template_name}"),
            templates.delete(template_name, &DeleteParams::default()),
        )
        .await;
        match deleted {
            Ok(_) => {
                ::metrics::counter!(crate::metrics::TEMPLATES_DELETED).increment(1);
                info!(template = %template_name, "ResourceClaimTemplate deleted");
                deleted_template = true;
            }
            Err(error) if error.is_not_found() => {}
            Err(error) => return Err(error),
        }
    }

    let claims: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let listed = call(
        ctx,
        Step::ListClaims,
        &namespace,
        claims.list(&ListParams::default()),
    )
    .await?;
    let members = membership::allocated_claims(&listed.items, &ctx.template.driver, uid);
    if !members.is_empty() {
        info!(claims = ?members, "waiting for the domain's claims to be deallocated");
        if deleted_template {
            let message = format!(
                "ResourceClaimTemplate {template_name} deleted; the ComputeDomain is released \
                 once its {} allocated claim(s) are gone: {}",
                members.len(),
                members.join(", ")
            );
            publish(
                ctx,
                cd,
                EventType::Normal,
                ControllerEventReason::WaitingForMembers.as_str(),
                "Delete",
                message,
            )
            .await;
        }
        return Ok(Action::requeue(ctx.timing.deletion_poll));
    }

    let patch: json_patch::Patch =
        serde_json::from_value(remove).expect("our finalizer patch is a valid JSON patch");
    let removed = call(
        ctx,
        Step::RemoveFinalizer,
        key(cd),
        cds.patch(
            &cd.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        ),
    )
    .await;
    match removed {
        // Gone already: an earlier pass released it (the template's deletion queues a
        // second pass, which still sees the finalizer in its copy). Released once,
        // counted once.
        Err(error) if error.is_not_found() => {
            debug!("the domain is gone: its finalizer was released already");
        }
        result => {
            result?;
            ::metrics::counter!(crate::metrics::FINALIZERS_RELEASED).increment(1);
            info!("no claim of the domain is allocated any more: finalizer released");
        }
    }
    Ok(Action::await_change())
}

/// Events are for people: one that cannot be written is logged, and the reconcile goes
/// on (the condition carries the same news).
async fn publish(
    ctx: &Context,
    cd: &ComputeDomain,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    let published = bounded(
        format!("cannot record a {reason} event"),
        ctx.timing.api_timeout,
        ctx.recorder.publish(&event, &cd.object_ref(&())),
    )
    .await;
    if let Err(error) = published {
        warn!(%error, reason, "cannot record an event on the ComputeDomain");
    }
}
