//! What a cluster run creates: a namespace of its own, one ComputeDomain, and a
//! workload of one pod per chosen node (a Deployment or a Job) whose pods each take a
//! channel of the domain. Built as plain objects (pure, tested), printed by
//! `--dry-run`, created by the run.

use domaind_kube_api::crd::{
    ChannelAllocationMode, ComputeDomain, ComputeDomainChannelSpec, ComputeDomainIsolation,
    ComputeDomainSpec, ResourceClaimTemplateRef,
};
use serde_json::{Value, json};

/// The label on every object the run creates, valued with the run's namespace: how the
/// clean-up finds them, and how a cordon of the run is told from anyone else's.
pub const RUN_LABEL: &str = "domaind-chaos/run";
/// Set on a node the run cordoned, valued with the run's namespace.
pub const CORDON_ANNOTATION: &str = "domaind-chaos/cordoned-by";
/// The pod template's claim of the domain's channel.
pub const CLAIM_NAME: &str = "channel";
pub const DOMAIN_NAME: &str = "chaos-domain";
pub const WORKLOAD_NAME: &str = "chaos-workload";

/// Which controller runs the workload's pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// A Deployment: a deleted or evicted pod is replaced.
    Deployment,
    /// A Job of as many pods that never complete: a deleted pod is replaced too.
    Job,
}

/// The run's objects.
#[derive(Debug, Clone)]
pub struct Workload {
    pub namespace: String,
    /// The nodes the pods go to, one each.
    pub nodes: Vec<String>,
    pub image: String,
    pub kind: WorkloadKind,
    /// `nvidia.com/gpu` each pod asks for (0: only the channel).
    pub gpus_per_pod: u32,
}

impl Workload {
    pub fn template_name(&self) -> String {
        format!("{DOMAIN_NAME}-channel")
    }

    fn labels(&self) -> Value {
        json!({
            "app.kubernetes.io/name": "domaind-chaos",
            "app.kubernetes.io/managed-by": "domaind-chaos",
            RUN_LABEL: self.namespace,
        })
    }

    /// The selector of the workload's pods.
    pub fn pod_selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.namespace)
    }

    pub fn namespace_object(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": self.labels()},
        })
    }

    /// The ComputeDomain: NVIDIA's spec as users write it (`numNodes: 0`, the domain
    /// follows the workload), one channel per pod.
    pub fn compute_domain(&self) -> ComputeDomain {
        let mut domain = ComputeDomain::new(
            DOMAIN_NAME,
            ComputeDomainSpec {
                num_nodes: 0,
                channel: ComputeDomainChannelSpec {
                    resource_claim_template: ResourceClaimTemplateRef {
                        name: self.template_name(),
                    },
                    allocation_mode: ChannelAllocationMode::Single,
                },
                isolation: ComputeDomainIsolation::ImexDomain,
            },
        );
        domain.metadata.namespace = Some(self.namespace.clone());
        domain.metadata.labels = serde_json::from_value(self.labels()).ok();
        domain
    }

    /// One pod per chosen node: required node affinity to the chosen nodes, and
    /// required anti-affinity between the run's pods on a host. A pod evicted from a
    /// cordoned node then waits, Pending, until the node is uncordoned.
    fn pod_template(&self) -> Value {
        let mut limits = serde_json::Map::new();
        if self.gpus_per_pod > 0 {
            limits.insert(
                "nvidia.com/gpu".into(),
                json!(self.gpus_per_pod.to_string()),
            );
        }
        json!({
            "metadata": {"labels": self.labels()},
            "spec": {
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{
                            "key": "kubernetes.io/hostname",
                            "operator": "In",
                            "values": self.nodes,
                        }]}],
                    }},
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                        "labelSelector": {"matchLabels": {RUN_LABEL: self.namespace}},
                        "topologyKey": "kubernetes.io/hostname",
                    }]},
                },
                "resourceClaims": [{
                    "name": CLAIM_NAME,
                    "resourceClaimTemplateName": self.template_name(),
                }],
                // `sleep` as PID 1 ignores SIGTERM: keep deletions short.
                "terminationGracePeriodSeconds": 5,
                "restartPolicy": match self.kind {
                    WorkloadKind::Deployment => "Always",
                    WorkloadKind::Job => "Never",
                },
                "containers": [{
                    "name": "workload",
                    "image": self.image,
                    "command": ["sleep", "infinity"],
                    "resources": {
                        "claims": [{"name": CLAIM_NAME}],
                        "limits": limits,
                    },
                }],
            },
        })
    }

    /// The Deployment or Job.
    pub fn workload_object(&self) -> Value {
        let replicas = self.nodes.len();
        match self.kind {
            WorkloadKind::Deployment => json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": WORKLOAD_NAME, "namespace": self.namespace, "labels": self.labels()},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {RUN_LABEL: self.namespace}},
                    // Replace, never surge: one pod per node is all the nodes hold.
                    "strategy": {"type": "Recreate"},
                    "template": self.pod_template(),
                },
            }),
            WorkloadKind::Job => json!({
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": WORKLOAD_NAME, "namespace": self.namespace, "labels": self.labels()},
                "spec": {
                    "parallelism": replicas,
                    "completions": replicas,
                    // Evictions and deletions count as failures: the run makes many.
                    "backoffLimit": 10_000,
                    "template": self.pod_template(),
                },
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(kind: WorkloadKind, gpus: u32) -> Workload {
        Workload {
            namespace: "domaind-chaos-7".into(),
            nodes: vec!["gb-1".into(), "gb-2".into(), "gb-3".into()],
            image: "busybox:1.37".into(),
            kind,
            gpus_per_pod: gpus,
        }
    }

    #[test]
    fn the_domain_is_nvidias_spec_with_a_channel_per_pod() {
        let domain =
            serde_json::to_value(workload(WorkloadKind::Deployment, 0).compute_domain()).unwrap();
        assert_eq!(domain["metadata"]["namespace"], "domaind-chaos-7");
        assert_eq!(domain["spec"]["numNodes"], 0);
        assert_eq!(
            domain["spec"]["channel"]["resourceClaimTemplate"]["name"],
            "chaos-domain-channel"
        );
        assert!(domain["spec"].get("isolation").is_none(), "{domain}");
        assert_eq!(domain["metadata"]["labels"][RUN_LABEL], "domaind-chaos-7");
    }

    #[test]
    fn a_deployment_puts_one_pod_on_each_chosen_node() {
        let object = workload(WorkloadKind::Deployment, 4).workload_object();
        assert_eq!(object["kind"], "Deployment");
        assert_eq!(object["spec"]["replicas"], 3);
        let pod = &object["spec"]["template"]["spec"];
        let hosts = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"];
        assert_eq!(hosts, &json!(["gb-1", "gb-2", "gb-3"]));
        let anti = &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0];
        assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(
            anti["labelSelector"]["matchLabels"][RUN_LABEL],
            object["spec"]["selector"]["matchLabels"][RUN_LABEL]
        );
        assert_eq!(
            pod["resourceClaims"][0]["resourceClaimTemplateName"],
            "chaos-domain-channel"
        );
        let container = &pod["containers"][0];
        assert_eq!(container["resources"]["claims"][0]["name"], CLAIM_NAME);
        assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], "4");
        assert_eq!(container["image"], "busybox:1.37");
    }

    #[test]
    fn a_job_runs_as_many_pods_and_asks_no_gpu_unless_told() {
        let object = workload(WorkloadKind::Job, 0).workload_object();
        assert_eq!(object["kind"], "Job");
        assert_eq!(
            (
                object["spec"]["parallelism"].clone(),
                object["spec"]["completions"].clone()
            ),
            (json!(3), json!(3))
        );
        let pod = &object["spec"]["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(pod["containers"][0]["resources"]["limits"], json!({}));
    }
}
