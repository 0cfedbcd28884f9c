//! The run's namespace and access: checked before the run, and left clean after it,
//! an interrupted one included (nodes uncordoned, the namespace deleted).

use super::*;

/// The access for `config`, and with `--local-daemons` the directory of the daemons'
/// files (none made for a dry run).
pub(super) fn make_access(
    config: &ClusterConfig,
    client: &Client,
) -> anyhow::Result<(Box<dyn ClusterAccess>, Option<tempfile::TempDir>)> {
    let mut files = None;
    let access: Box<dyn ClusterAccess> = match &config.access {
        AccessChoice::Local {
            kube_state_dir,
            domaind,
        } => {
            let work_dir = if config.dry_run {
                PathBuf::from("/tmp/dchc-<random>")
            } else {
                let dir = domaind_testbed::rack::short_temp_dir("dchc")
                    .context("cannot make a temporary directory")?;
                let path = dir.path().to_path_buf();
                files = Some(dir);
                path
            };
            Box::new(LocalAccess::new(
                client.clone(),
                LocalConfig {
                    kube_state_dir: kube_state_dir.clone(),
                    domaind: domaind.clone(),
                    work_dir,
                    lease_namespace: config.namespace.clone(),
                    log_filter: config.daemon_log.clone(),
                },
            ))
        }
        AccessChoice::Pods {
            namespace,
            release,
            lease_name,
        } => {
            let mut pods =
                crate::cluster::pods::PodAccessConfig::chart(namespace, release.as_deref());
            pods.lease_name = lease_name.clone();
            Box::new(crate::cluster::pods::PodAccess::new(client.clone(), pods))
        }
    };
    Ok((access, files))
}

/// The CRD served and the run's namespace free.
pub(super) async fn preflight(client: &Client, namespace: &str) -> anyhow::Result<()> {
    Api::<ComputeDomain>::all(client.clone())
        .list(&ListParams::default().limit(1))
        .await
        .context(
            "ComputeDomains cannot be listed: is the CRD installed (the chart installs it)?",
        )?;
    if Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await
        .context("cannot read namespaces")?
        .is_some()
    {
        bail!(
            "namespace {namespace} exists: a run makes its own (pass another --namespace, or \
             delete it if a run left it: kubectl delete namespace {namespace})"
        );
    }
    Ok(())
}

/// The workload deleted → its pods gone, its claims released, the domain released.
pub(super) const TEARDOWN_LIMIT: Duration = Duration::from_secs(120);

/// After SIGINT or SIGTERM: uncordons what the run cordoned and deletes its
/// namespace (and with it the domain and the workload). Daemons a local run started
/// die with the process, its controller with them (`controller_gone`): nothing would
/// release the domain's finalizer then, and the namespace would hang in Terminating,
/// so the run releases it itself.
pub async fn cleanup_after_interrupt(namespace: &str, controller_gone: bool) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    uncordon_ours(&client, namespace).await?;
    delete_namespace(&client, namespace).await?;
    if controller_gone {
        let domains = Api::<ComputeDomain>::namespaced(client.clone(), namespace);
        for domain in domains.list(&ListParams::default()).await?.items {
            let patch = json!({"metadata": {"finalizers": null}});
            domains
                .patch(
                    &domain.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .with_context(|| format!("cannot release ComputeDomain {}", domain.name_any()))?;
        }
    }
    Ok(())
}

pub(super) async fn uncordon_ours(client: &Client, namespace: &str) -> anyhow::Result<Vec<String>> {
    let nodes = Api::<Node>::all(client.clone());
    let mut uncordoned = Vec::new();
    for node in nodes.list(&ListParams::default()).await?.items {
        if node
            .annotations()
            .get(CORDON_ANNOTATION)
            .map(String::as_str)
            == Some(namespace)
        {
            set_cordon(client, &node.name_any(), None).await?;
            uncordoned.push(node.name_any());
        }
    }
    Ok(uncordoned)
}

pub(super) async fn delete_namespace(client: &Client, namespace: &str) -> anyhow::Result<()> {
    match Api::<Namespace>::all(client.clone())
        .delete(namespace, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error).with_context(|| format!("cannot delete namespace {namespace}")),
    }
}
