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
use tracing::{info, warn};

use super::backoff::Failures;
use super::condition::{self, TemplateOutcome};
use super::names::{FIELD_MANAGER, reason};
use super::template::{self, Ownership, TemplateError, TemplateSettings};
use super::{finalizer, membership};
use crate::crd::{ComputeDomain, ConditionStatus};

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
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            resync: Duration::from_secs(600),
            deletion_poll: Duration::from_secs(5),
            conflict_recheck: Duration::from_secs(30),
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
                controller: FIELD_MANAGER.into(),
                instance: Some(instance.into()),
            },
        );
        Self {
            client,
            template,
            timing,
            recorder,
            failures: Failures::default(),
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
    #[error("cannot {} {object}: {source}", step.describe())]
    Api {
        step: Step,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("ComputeDomain {cd}: {source}")]
    Invalid {
        cd: String,
        #[source]
        source: TemplateError,
    },
}

impl Error {
    /// The `reason` label of the error counter: what failed.
    pub fn metric_reason(&self) -> &'static str {
        match self {
            Self::Api { step, .. } => step.label(),
            Self::Invalid { .. } => "invalid",
        }
    }
}

fn api(step: Step, object: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let object = object.into();
    move |source| Error::Api {
        step,
        object,
        source,
    }
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

fn key(cd: &ComputeDomain) -> String {
    format!("{}/{}", cd.namespace().unwrap_or_default(), cd.name_any())
}

/// The reconciler the controller runs: one pass, timed and counted.
pub async fn reconcile(cd: Arc<ComputeDomain>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_once(&cd, &ctx).await;
    ::metrics::histogram!(super::metrics::RECONCILE_SECONDS)
        .record(started.elapsed().as_secs_f64());
    let outcome = if result.is_ok() { "ok" } else { "error" };
    ::metrics::counter!(super::metrics::RECONCILES, "outcome" => outcome).increment(1);
    if result.is_ok() {
        ctx.failures.succeeded(&key(&cd));
    }
    result
}

/// After a failed pass: retry with exponential backoff for this CD.
pub fn error_policy(cd: Arc<ComputeDomain>, error: &Error, ctx: Arc<Context>) -> Action {
    let retry_in = ctx.failures.failed(&key(&cd));
    ::metrics::counter!(super::metrics::RECONCILE_ERRORS, "reason" => error.metric_reason())
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
        cds.patch(
            &cd.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
        .map_err(api(Step::AddFinalizer, key(cd)))?;
        info!("finalizer added");
    }

    let existing = templates.get_opt(template_name).await.map_err(api(
        Step::ReadTemplate,
        format!("{namespace}/{template_name}"),
    ))?;
    let outcome = match existing {
        None => {
            let desired = template::desired(cd, &ctx.template).map_err(invalid)?;
            match templates.create(&PostParams::default(), &desired).await {
                Ok(_) => {
                    ::metrics::counter!(super::metrics::TEMPLATES_CREATED).increment(1);
                    info!(template = %template_name, "ResourceClaimTemplate created");
                    TemplateOutcome::Ready {
                        template: template_name.clone(),
                    }
                }
                // Invalid (a name that is no DNS subdomain, say): the spec is immutable,
                // so no retry can help; the user is told.
                Err(kube::Error::Api(status)) if status.code == 422 => TemplateOutcome::Rejected {
                    template: template_name.clone(),
                    why: status.message,
                },
                Err(error) => {
                    return Err(api(
                        Step::CreateTemplate,
                        format!("{namespace}/{template_name}"),
                    )(error));
                }
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
            ::metrics::counter!(super::metrics::TEMPLATE_NAME_CONFLICTS).increment(1);
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
    cds.patch_status(
        &cd.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(api(Step::ApplyCondition, key(cd)))?;
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
    let template = templates.get_opt(template_name).await.map_err(api(
        Step::ReadTemplate,
        format!("{namespace}/{template_name}"),
    ))?;
    let mut deleted_template = false;
    if let Some(template) = template
        && template::ownership(&template, uid) == Ownership::Ours
        && template.metadata.deletion_timestamp.is_none()
    {
        match templates
            .delete(template_name, &DeleteParams::default())
            .await
        {
            Ok(_) => {
                ::metrics::counter!(super::metrics::TEMPLATES_DELETED).increment(1);
                info!(template = %template_name, "ResourceClaimTemplate deleted");
                deleted_template = true;
            }
            Err(error) if is_not_found(&error) => {}
            Err(error) => {
                return Err(api(
                    Step::DeleteTemplate,
                    format!("{namespace}/{template_name}"),
                )(error));
            }
        }
    }

    let claims: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let listed = claims
        .list(&ListParams::default())
        .await
        .map_err(api(Step::ListClaims, namespace.clone()))?;
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
                reason::WAITING_FOR_MEMBERS,
                "Delete",
                message,
            )
            .await;
        }
        return Ok(Action::requeue(ctx.timing.deletion_poll));
    }

    let patch: json_patch::Patch =
        serde_json::from_value(remove).expect("our finalizer patch is a valid JSON patch");
    match cds
        .patch(
            &cd.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
    {
        // Gone already: someone else removed the last finalizer.
        Err(error) if is_not_found(&error) => {}
        result => {
            result.map_err(api(Step::RemoveFinalizer, key(cd)))?;
        }
    }
    ::metrics::counter!(super::metrics::FINALIZERS_RELEASED).increment(1);
    info!("no claim of the domain is allocated any more: finalizer released");
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
    if let Err(error) = ctx.recorder.publish(&event, &cd.object_ref(&())).await {
        warn!(%error, reason, "cannot record an event on the ComputeDomain");
    }
}
