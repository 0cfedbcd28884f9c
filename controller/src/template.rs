//! The ResourceClaimTemplate a ComputeDomain's pods reference: what it must hold, and
//! whether one found under its name is ours.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClaimConfiguration, DeviceRequest, ExactDeviceRequest,
    OpaqueDeviceConfiguration, ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::{Resource as _, ResourceExt as _};

use domaind_kube_api::ChannelConfig;
use domaind_kube_api::crd::ComputeDomain;
use domaind_kube_api::names::{
    CHANNEL_REQUEST, DOMAIN_LABEL, MANAGED_BY, MANAGED_BY_LABEL, TARGET_LABEL, TARGET_WORKLOAD,
};

/// What the template carries besides the CD's own fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSettings {
    /// The DRA driver the opaque config is for (`--driver-name`).
    pub driver: String,
    /// The device class of the channel request (`--device-class`).
    pub device_class: String,
}

/// Why a CD cannot have its template: the CD itself is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("the ComputeDomain has no {0} (it was not read from the API server)")]
    Missing(&'static str),
}

/// The template for `cd`: in its namespace, under the name its spec gives, owned by it
/// (so that garbage collection removes it with the CD, and its deletion wakes the
/// controller), with one request `channel` for exactly one channel device and the opaque
/// config naming the CD by uid. Its labels also go on every claim made from it, so
/// `kubectl get resourceclaims -l resource.nvidia.com/computeDomain=<uid>` finds them.
pub fn desired(
    cd: &ComputeDomain,
    settings: &TemplateSettings,
) -> Result<ResourceClaimTemplate, TemplateError> {
    let uid = cd.uid().ok_or(TemplateError::Missing("uid"))?;
    let namespace = cd.namespace().ok_or(TemplateError::Missing("namespace"))?;
    let owner = cd
        .controller_owner_ref(&())
        .ok_or(TemplateError::Missing("name or uid"))?;
    let labels = BTreeMap::from([
        (DOMAIN_LABEL.to_string(), uid.clone()),
        (TARGET_LABEL.to_string(), TARGET_WORKLOAD.to_string()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ]);
    let config = ChannelConfig::new(uid, cd.spec.channel.allocation_mode);
    Ok(ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(cd.spec.channel.resource_claim_template.name.clone()),
            namespace: Some(namespace),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                ..ObjectMeta::default()
            }),
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: CHANNEL_REQUEST.into(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: settings.device_class.clone(),
                            allocation_mode: Some("ExactCount".into()),
                            count: Some(1),
                            ..ExactDeviceRequest::default()
                        }),
                        ..DeviceRequest::default()
                    }]),
                    config: Some(vec![DeviceClaimConfiguration {
                        requests: Some(vec![CHANNEL_REQUEST.into()]),
                        opaque: Some(OpaqueDeviceConfiguration {
                            driver: settings.driver.clone(),
                            parameters: RawExtension(
                                serde_json::to_value(&config)
                                    .expect("a channel config always serialises"),
                            ),
                        }),
                    }]),
                    ..DeviceClaim::default()
                }),
            },
        },
    })
}

/// Whose a template found under the CD's template name is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Ours: its controller is this CD.
    Ours,
    /// Someone else's. `owner` names its controller, if it has one (another CD naming
    /// the same template, or one being deleted whose template is not yet collected).
    Taken { owner: Option<String> },
}

pub fn ownership(template: &ResourceClaimTemplate, cd_uid: &str) -> Ownership {
    let controller = template
        .owner_references()
        .iter()
        .find(|owner| owner.controller == Some(true));
    match controller {
        Some(owner) if owner.uid == cd_uid => Ownership::Ours,
        Some(owner) => Ownership::Taken {
            owner: Some(format!("{} {} (uid {})", owner.kind, owner.name, owner.uid)),
        },
        None => Ownership::Taken { owner: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domaind_kube_api::crd::ChannelAllocationMode;
    use serde_json::json;

    fn cd(mode: ChannelAllocationMode) -> ComputeDomain {
        let mut cd = crate::tests::fixtures::compute_domain();
        cd.spec.channel.allocation_mode = mode;
        cd
    }

    fn settings() -> TemplateSettings {
        TemplateSettings {
            driver: "compute-domain.nvidia.com".into(),
            device_class: "compute-domain-default-channel.nvidia.com".into(),
        }
    }

    #[test]
    fn the_template_has_the_shape_a_real_api_server_returned_for_nvidias() {
        let reference: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../kube-api/fixtures/resourceclaimtemplate.json"
            ))
            .unwrap(),
        )
        .unwrap();
        let ours =
            serde_json::to_value(desired(&cd(ChannelAllocationMode::Single), &settings()).unwrap())
                .unwrap();
        // The claim spec, exactly as the server returned NVIDIA's driver's (the domain id is
        // the CD's uid in both).
        assert_eq!(ours["spec"]["spec"], reference["spec"]["spec"]);
    }

    #[test]
    fn the_template_is_owned_by_and_labelled_with_its_domain() {
        let template = desired(&cd(ChannelAllocationMode::All), &settings()).unwrap();
        let json = serde_json::to_value(&template).unwrap();
        assert_eq!(json["metadata"]["name"], "training-channel");
        assert_eq!(json["metadata"]["namespace"], "team-a");
        assert_eq!(
            json["metadata"]["ownerReferences"],
            json!([{
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomain",
                "name": "training",
                "uid": "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11",
                "controller": true
            }])
        );
        let labels = json!({
            "resource.nvidia.com/computeDomain": "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11",
            "resource.nvidia.com/computeDomainTarget": "Workload",
            "app.kubernetes.io/managed-by": "domaind-controller"
        });
        assert_eq!(json["metadata"]["labels"], labels);
        assert_eq!(json["spec"]["metadata"]["labels"], labels);
        assert_eq!(
            json["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["allocationMode"],
            "All"
        );
        assert_eq!(
            ownership(&template, "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11"),
            Ownership::Ours
        );
    }

    #[test]
    fn a_cd_not_read_from_the_server_has_no_template() {
        let mut unsaved = cd(ChannelAllocationMode::Single);
        unsaved.metadata.uid = None;
        assert_eq!(
            desired(&unsaved, &settings()).unwrap_err(),
            TemplateError::Missing("uid")
        );
    }

    #[test]
    fn a_template_of_another_controller_or_none_is_taken() {
        let mut template = desired(&cd(ChannelAllocationMode::Single), &settings()).unwrap();
        assert_eq!(
            ownership(&template, "another-uid"),
            Ownership::Taken {
                owner: Some(
                    "ComputeDomain training (uid 5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11)".into()
                )
            }
        );
        // An owner reference that is not the controller does not make it ours.
        template.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        assert_eq!(
            ownership(&template, "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11"),
            Ownership::Taken { owner: None }
        );
        template.metadata.owner_references = None;
        assert_eq!(
            ownership(&template, "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11"),
            Ownership::Taken { owner: None }
        );
    }
}
