//! The CA Secret (only the controller may read it) and the CA bundle ConfigMap the
//! nodes mount (the certificate alone). A missing Secret is made once, here: the chart
//! then works with no step by hand, and an administrator who wants their own CA creates
//! the Secret before the controller starts.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::ca::{CaError, GossipCa};
use crate::backoff::reconcile_backoff;
use domaind_kube_api::names::{CONTROLLER_FIELD_MANAGER, GOSSIP_CA_BUNDLE_KEY};
use domaind_kube_api::{ApiError, bounded};

/// How long a CA the controller makes is valid.
const GENERATED_CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSettings {
    pub namespace: String,
    /// The CA Secret (`kubernetes.io/tls`: `tls.crt`, `tls.key`).
    pub secret: String,
    /// The ConfigMap holding `ca.crt`.
    pub config_map: String,
    /// How often the Secret is read again and the ConfigMap made equal to it.
    pub resync: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{0}")]
    Api(#[from] ApiError),
    #[error("Secret {namespace}/{name}: {source}")]
    Ca {
        namespace: String,
        name: String,
        source: CaError,
    },
    #[error("Secret {namespace}/{name} has no {key}")]
    Missing {
        namespace: String,
        name: String,
        key: &'static str,
    },
}

/// The CA, loaded or made, and its bundle published; retried with backoff until it
/// works or `term`. `None` after `term`.
pub async fn ensure(
    client: &Client,
    settings: &BundleSettings,
    timeout: Duration,
    term: &CancellationToken,
) -> Option<GossipCa> {
    let mut backoff = reconcile_backoff();
    loop {
        let attempt = async {
            let ca = load_or_make(client, settings, timeout).await?;
            publish(client, settings, timeout, &ca).await?;
            Ok::<_, BundleError>(ca)
        };
        let error = tokio::select! {
            result = attempt => match result {
                Ok(ca) => return Some(ca),
                Err(error) => error,
            },
            _ = term.cancelled() => return None,
        };
        ::metrics::counter!(crate::metrics::CA_BUNDLE_ERRORS).increment(1);
        let retry_in = backoff.fail();
        warn!(%error, ?retry_in, "cannot load the gossip CA or publish its bundle; no node certificate is signed until then");
        tokio::select! {
            _ = tokio::time::sleep(retry_in) => {}
            _ = term.cancelled() => return None,
        }
    }
}

/// The Secret's CA as it is now, and the ConfigMap made equal to it.
pub async fn refresh(
    client: &Client,
    settings: &BundleSettings,
    timeout: Duration,
) -> Result<GossipCa, BundleError> {
    let ca = load_or_make(client, settings, timeout).await?;
    publish(client, settings, timeout, &ca).await?;
    Ok(ca)
}

async fn load_or_make(
    client: &Client,
    settings: &BundleSettings,
    timeout: Duration,
) -> Result<GossipCa, BundleError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.namespace);
    let what = format!(
        "cannot read Secret {}/{}",
        settings.namespace, settings.secret
    );
    match bounded(what, timeout, secrets.get(&settings.secret)).await {
        Ok(secret) => from_secret(settings, &secret),
        Err(error) if error.is_not_found() => make(&secrets, settings, timeout).await,
        Err(error) => Err(error.into()),
    }
}

/// Makes a CA and creates its Secret; if another replica made one first, theirs wins.
async fn make(
    secrets: &Api<Secret>,
    settings: &BundleSettings,
    timeout: Duration,
) -> Result<GossipCa, BundleError> {
    let ca_error = |source| BundleError::Ca {
        namespace: settings.namespace.clone(),
        name: settings.secret.clone(),
        source,
    };
    let ca =
        GossipCa::generate(GENERATED_CA_LIFETIME, OffsetDateTime::now_utc()).map_err(ca_error)?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": settings.secret,
            "namespace": settings.namespace,
            "labels": {"app.kubernetes.io/managed-by": CONTROLLER_FIELD_MANAGER},
        },
        "type": "kubernetes.io/tls",
    }))
    .expect("a Secret");
    let secret = Secret {
        data: Some(BTreeMap::from([
            (
                "tls.crt".to_string(),
                ByteString(ca.cert_pem().as_bytes().to_vec()),
            ),
            (
                "tls.key".to_string(),
                ByteString(ca.key_pem().as_bytes().to_vec()),
            ),
        ])),
        ..secret
    };
    let what = format!(
        "cannot create Secret {}/{}",
        settings.namespace, settings.secret
    );
    match bounded(
        what,
        timeout,
        secrets.create(&PostParams::default(), &secret),
    )
    .await
    {
        Ok(_) => {
            info!(secret = %settings.secret, namespace = %settings.namespace, "made a gossip CA: no Secret held one");
            Ok(ca)
        }
        Err(error) if error.is_conflict() => {
            let what = format!(
                "cannot read Secret {}/{}",
                settings.namespace, settings.secret
            );
            let secret = bounded(what, timeout, secrets.get(&settings.secret)).await?;
            from_secret(settings, &secret)
        }
        Err(error) => Err(error.into()),
    }
}

fn from_secret(settings: &BundleSettings, secret: &Secret) -> Result<GossipCa, BundleError> {
    let field = |key: &'static str| {
        secret
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned())
            .ok_or_else(|| BundleError::Missing {
                namespace: settings.namespace.clone(),
                name: settings.secret.clone(),
                key,
            })
    };
    GossipCa::from_pem(&field("tls.crt")?, &field("tls.key")?).map_err(|source| BundleError::Ca {
        namespace: settings.namespace.clone(),
        name: settings.secret.clone(),
        source,
    })
}

/// Applies the ConfigMap with the CA's certificate (server-side apply: creates it, or
/// puts back what someone changed).
async fn publish(
    client: &Client,
    settings: &BundleSettings,
    timeout: Duration,
    ca: &GossipCa,
) -> Result<(), BundleError> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &settings.namespace);
    let body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": settings.config_map,
            "namespace": settings.namespace,
            "labels": {"app.kubernetes.io/managed-by": CONTROLLER_FIELD_MANAGER},
        },
        "data": {GOSSIP_CA_BUNDLE_KEY: ca.cert_pem()},
    });
    let what = format!(
        "cannot apply ConfigMap {}/{}",
        settings.namespace, settings.config_map
    );
    let params = PatchParams::apply(CONTROLLER_FIELD_MANAGER).force();
    bounded(
        what,
        timeout,
        config_maps.patch(&settings.config_map, &params, &Patch::Apply(&body)),
    )
    .await?;
    Ok(())
}
