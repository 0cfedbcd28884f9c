//! What a ResourceClaim's allocation says about this node: which devices of our
//! driver the scheduler gave it here, and which ComputeDomain its opaque config names.
//! Pure: the claim source and the start-up reconciliation both read claims through it.

use std::collections::BTreeSet;

use domaind_actors::model::{AllocatedDevice, AllocationMode, ReadinessPolicy};
use k8s_openapi::api::resource::v1::{
    DeviceAllocationConfiguration, DeviceRequestAllocationResult, ResourceClaim,
};

use domaind_kube_api::channel_config::ChannelConfig;
use domaind_kube_api::names::channel_of_device;

/// A claim allocated to this node by our driver, with its decoded config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedClaim {
    /// The ComputeDomain's uid, from the config's `domainID`.
    pub domain_uid: String,
    pub allocation_mode: AllocationMode,
    pub readiness: Option<ReadinessPolicy>,
    /// Our driver's results in this node's pool: what the kubelet is told the claim got.
    pub devices: Vec<AllocatedDevice>,
    /// Its results here were allocated with `adminAccess`: a monitoring pod's claim,
    /// which may share devices with other claims and joins no domain.
    pub admin_access: bool,
}

/// Why a claim cannot be prepared on this node. Each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadClaim {
    #[error("it is not allocated (status.allocation is empty): the scheduler has not placed it")]
    NotAllocated,
    #[error(
        "it is allocated by driver(s) {}, not {ours}: it is not ours to prepare",
        list(drivers)
    )]
    OtherDriver {
        drivers: BTreeSet<String>,
        ours: String,
    },
    #[error(
        "its devices of driver {driver} come from pool(s) {}, not from this node's pool {node}: \
         the scheduler placed it on another node",
        list(pools)
    )]
    OtherNode {
        driver: String,
        pools: BTreeSet<String>,
        node: String,
    },
    #[error(
        "no opaque config of driver {driver} applies to its request(s) {}: the claim (or its \
         template) needs a ComputeDomainChannelConfig naming the ComputeDomain's uid in \
         spec.devices.config",
        list(requests)
    )]
    NoConfig {
        driver: String,
        requests: BTreeSet<String>,
    },
    #[error("the opaque config for request {request} is not usable: {problem}")]
    BadConfig {
        request: String,
        problem: domaind_kube_api::channel_config::ConfigError,
    },
    #[error(
        "its requests carry different ComputeDomainChannelConfigs ({first} and {second}); \
         one claim joins one ComputeDomain with one mode"
    )]
    ConflictingConfigs { first: String, second: String },
    #[error(
        "its request(s) {} were allocated with adminAccess and {} without: a claim either \
         watches (adminAccess, joining no ComputeDomain) or joins; make them two claims",
        list(admin),
        list(member)
    )]
    MixedAdminAccess {
        admin: BTreeSet<String>,
        member: BTreeSet<String>,
    },
    #[error(
        "it was allocated device {device} with adminAccess, which is not a channel device of \
         driver {driver} (channel-<N>): an admin claim gets the channels it was allocated"
    )]
    NotAChannel { driver: String, device: String },
}

impl BadClaim {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotAllocated => "not_allocated",
            Self::OtherDriver { .. } => "other_driver",
            Self::OtherNode { .. } => "other_node",
            Self::NoConfig { .. } => "no_config",
            Self::BadConfig { .. } => "bad_config",
            Self::ConflictingConfigs { .. } => "conflicting_configs",
            Self::MixedAdminAccess { .. } => "mixed_admin_access",
            Self::NotAChannel { .. } => "not_a_channel",
        }
    }

    /// Whether the claim is simply not this node's business (another node's or another
    /// driver's), as opposed to ours and broken.
    pub fn is_elsewhere(&self) -> bool {
        matches!(
            self,
            Self::NotAllocated | Self::OtherDriver { .. } | Self::OtherNode { .. }
        )
    }
}

fn list(items: &BTreeSet<String>) -> String {
    if items.is_empty() {
        return "none".into();
    }
    items.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// Reads `claim`'s allocation for `node` (whose pool is named after it) and `driver`.
pub fn allocated_claim(
    claim: &ResourceClaim,
    node: &str,
    driver: &str,
) -> Result<AllocatedClaim, BadClaim> {
    let allocation = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .ok_or(BadClaim::NotAllocated)?;
    let results = allocation.results.as_deref().unwrap_or_default();
    if results.is_empty() {
        return Err(BadClaim::NotAllocated);
    }
    let ours: Vec<_> = results.iter().filter(|r| r.driver == driver).collect();
    if ours.is_empty() {
        return Err(BadClaim::OtherDriver {
            drivers: results.iter().map(|r| r.driver.clone()).collect(),
            ours: driver.into(),
        });
    }
    let here: Vec<_> = ours.iter().filter(|r| r.pool == node).collect();
    if here.is_empty() {
        return Err(BadClaim::OtherNode {
            driver: driver.into(),
            pools: ours.iter().map(|r| r.pool.clone()).collect(),
            node: node.into(),
        });
    }

    let (admin, member): (Vec<&DeviceRequestAllocationResult>, Vec<_>) = here
        .iter()
        .copied()
        .partition(|r| r.admin_access == Some(true));
    if !admin.is_empty() && !member.is_empty() {
        return Err(BadClaim::MixedAdminAccess {
            admin: admin.iter().map(|r| r.request.clone()).collect(),
            member: member.iter().map(|r| r.request.clone()).collect(),
        });
    }
    if let Some(device) = admin
        .iter()
        .find(|r| channel_of_device(&r.device).is_none())
    {
        return Err(BadClaim::NotAChannel {
            driver: driver.into(),
            device: device.device.clone(),
        });
    }

    let configs = allocation.config.as_deref().unwrap_or_default();
    let mut chosen: Option<ChannelConfig> = None;
    for result in &here {
        let Some(parameters) = config_for(configs, driver, &result.request) else {
            return Err(BadClaim::NoConfig {
                driver: driver.into(),
                requests: here.iter().map(|r| r.request.clone()).collect(),
            });
        };
        let config = ChannelConfig::decode(parameters).map_err(|problem| BadClaim::BadConfig {
            request: result.request.clone(),
            problem,
        })?;
        match &chosen {
            Some(first) if *first != config => {
                return Err(BadClaim::ConflictingConfigs {
                    first: describe(first),
                    second: describe(&config),
                });
            }
            Some(_) => {}
            None => chosen = Some(config),
        }
    }
    let config = chosen.expect("`here` is not empty, so a config was chosen or we returned");
    Ok(AllocatedClaim {
        domain_uid: config.domain_id.clone(),
        allocation_mode: crate::contract::allocation_mode(config.mode()),
        readiness: config.readiness.map(crate::contract::readiness_policy),
        devices: here
            .iter()
            .map(|r| AllocatedDevice {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
            })
            .collect(),
        admin_access: !admin.is_empty(),
    })
}

fn describe(config: &ChannelConfig) -> String {
    format!(
        "domainID {} mode {:?} readiness {:?}",
        config.domain_id,
        config.mode(),
        config.readiness
    )
}

/// The opaque config of `driver` that applies to `request`: the last one listed, as
/// the allocation lists the class's configs before the claim's and later ones take
/// precedence. A config with no requests applies to all of them; one naming a request
/// applies to its subrequests (`request/sub`) too.
fn config_for<'a>(
    configs: &'a [DeviceAllocationConfiguration],
    driver: &str,
    request: &str,
) -> Option<&'a serde_json::Value> {
    configs.iter().rev().find_map(|entry| {
        let opaque = entry.opaque.as_ref().filter(|o| o.driver == driver)?;
        let applies = match entry.requests.as_deref() {
            None | Some([]) => true,
            Some(names) => names.iter().any(|name| {
                request == name
                    || request
                        .strip_prefix(name.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            }),
        };
        applies.then_some(&opaque.parameters.0)
    })
}

/// Whether the claim is in use: reserved for at least one consumer (a pod).
pub fn is_reserved(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .is_some_and(|r| !r.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const DRIVER: &str = "compute-domain.nvidia.com";
    const NODE: &str = "gb200-rack1-n01";

    fn reference() -> Value {
        serde_json::from_str(include_str!(
            "../../../kube-api/fixtures/resourceclaim-allocated.json"
        ))
        .unwrap()
    }

    fn claim(value: Value) -> ResourceClaim {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_real_api_servers_claim_decodes() {
        let decoded = allocated_claim(&claim(reference()), NODE, DRIVER).unwrap();
        assert_eq!(
            decoded,
            AllocatedClaim {
                domain_uid: "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11".into(),
                allocation_mode: AllocationMode::Single,
                readiness: None,
                devices: vec![AllocatedDevice {
                    request: "channel".into(),
                    pool: NODE.into(),
                    device: "channel-0".into(),
                }],
                admin_access: false,
            }
        );
        assert!(is_reserved(&claim(reference())));
    }

    #[test]
    fn another_nodes_or_drivers_claim_is_elsewhere() {
        let error = allocated_claim(&claim(reference()), "gb200-rack1-n02", DRIVER).unwrap_err();
        assert!(error.is_elsewhere());
        assert!(
            error
                .to_string()
                .contains("pool(s) gb200-rack1-n01, not from this node's pool gb200-rack1-n02"),
            "{error}"
        );
        let error = allocated_claim(&claim(reference()), NODE, "gpu.nvidia.com").unwrap_err();
        assert_eq!(error.reason(), "other_driver");
        assert!(
            error
                .to_string()
                .contains("driver(s) compute-domain.nvidia.com, not gpu.nvidia.com")
        );

        let mut pending = reference();
        pending["status"] = json!({});
        let error = allocated_claim(&claim(pending), NODE, DRIVER).unwrap_err();
        assert_eq!(error, BadClaim::NotAllocated);
    }

    #[test]
    fn the_claims_config_overrides_the_class_and_applies_to_subrequests() {
        let mut value = reference();
        let allocation = &mut value["status"]["allocation"]["devices"];
        allocation["results"][0]["request"] = json!("channel/big");
        let class_config = json!({
            "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
                "domainID": "from-the-class"}},
            "source": "FromClass"
        });
        let mut configs = vec![class_config];
        configs.extend(allocation["config"].as_array().unwrap().iter().cloned());
        configs[1]["opaque"]["parameters"]["allocationMode"] = json!("All");
        allocation["config"] = json!(configs);
        let decoded = allocated_claim(&claim(value), NODE, DRIVER).unwrap();
        assert_eq!(decoded.domain_uid, "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11");
        assert_eq!(decoded.allocation_mode, AllocationMode::All);
        assert_eq!(decoded.devices[0].request, "channel/big");
    }

    #[test]
    fn our_claims_without_a_usable_config_are_refused_saying_why() {
        let mut none = reference();
        none["status"]["allocation"]["devices"]["config"] = json!([]);
        let error = allocated_claim(&claim(none), NODE, DRIVER).unwrap_err();
        assert!(!error.is_elsewhere());
        assert_eq!(error.reason(), "no_config");
        assert!(
            error
                .to_string()
                .contains("needs a ComputeDomainChannelConfig")
        );

        let mut other_request = reference();
        other_request["status"]["allocation"]["devices"]["config"][0]["requests"] = json!(["gpu"]);
        let error = allocated_claim(&claim(other_request), NODE, DRIVER).unwrap_err();
        assert_eq!(error.reason(), "no_config");

        let mut prefix = reference();
        prefix["status"]["allocation"]["devices"]["config"][0]["requests"] = json!(["chan"]);
        let error = allocated_claim(&claim(prefix), NODE, DRIVER).unwrap_err();
        assert_eq!(
            error.reason(),
            "no_config",
            "a name prefix is not a parent request"
        );

        let mut garbled = reference();
        garbled["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["domainID"] =
            json!(42);
        let error = allocated_claim(&claim(garbled), NODE, DRIVER).unwrap_err();
        assert_eq!(error.reason(), "bad_config");
        assert!(error.to_string().contains("request channel"), "{error}");
    }

    #[test]
    fn two_requests_naming_two_domains_are_refused() {
        let mut value = reference();
        let devices = &mut value["status"]["allocation"]["devices"];
        let mut second = devices["results"][0].clone();
        second["request"] = json!("other");
        second["device"] = json!("channel-1");
        devices["results"].as_array_mut().unwrap().push(second);
        let mut config = devices["config"][0].clone();
        config["requests"] = json!(["other"]);
        config["opaque"]["parameters"]["domainID"] = json!("another-domain");
        devices["config"].as_array_mut().unwrap().push(config);
        let error = allocated_claim(&claim(value), NODE, DRIVER).unwrap_err();
        assert_eq!(error.reason(), "conflicting_configs");
        assert!(error.to_string().contains("another-domain"), "{error}");
    }

    /// `status.allocation.devices.results[].adminAccess`, as the API server writes it
    /// for a request with `adminAccess: true` in a namespace labelled for it.
    fn with_admin_access(mut value: Value, admin: &[bool]) -> Value {
        let results = value["status"]["allocation"]["devices"]["results"]
            .as_array_mut()
            .unwrap();
        let first = results[0].clone();
        results.clear();
        for (i, admin) in admin.iter().enumerate() {
            let mut result = first.clone();
            result["request"] = json!(format!("r{i}"));
            result["device"] = json!(format!("channel-{i}"));
            result["adminAccess"] = json!(admin);
            results.push(result);
        }
        // The claim's config, for every request.
        value["status"]["allocation"]["devices"]["config"][0]["requests"] = json!([]);
        value
    }

    #[test]
    fn a_claim_allocated_with_admin_access_is_an_admin_claim() {
        let decoded = allocated_claim(
            &claim(with_admin_access(reference(), &[true])),
            NODE,
            DRIVER,
        )
        .unwrap();
        assert!(decoded.admin_access);
        assert_eq!(decoded.domain_uid, "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11");
        assert_eq!(decoded.devices[0].device, "channel-0");
        let both = allocated_claim(
            &claim(with_admin_access(reference(), &[true, true])),
            NODE,
            DRIVER,
        )
        .unwrap();
        assert!(both.admin_access);
        assert_eq!(both.devices.len(), 2);

        let explicit_false = allocated_claim(
            &claim(with_admin_access(reference(), &[false])),
            NODE,
            DRIVER,
        )
        .unwrap();
        assert!(!explicit_false.admin_access);
        assert!(
            !allocated_claim(&claim(reference()), NODE, DRIVER)
                .unwrap()
                .admin_access,
            "absent is not admin"
        );
    }

    #[test]
    fn admin_and_member_requests_in_one_claim_are_refused() {
        let error = allocated_claim(
            &claim(with_admin_access(reference(), &[true, false])),
            NODE,
            DRIVER,
        )
        .unwrap_err();
        assert_eq!(error.reason(), "mixed_admin_access");
        assert!(!error.is_elsewhere());
        assert!(
            error
                .to_string()
                .contains("request(s) r0 were allocated with adminAccess and r1 without"),
            "{error}"
        );

        // Another node's or driver's admin result is not this node's business.
        let mut elsewhere = with_admin_access(reference(), &[false, true]);
        elsewhere["status"]["allocation"]["devices"]["results"][1]["pool"] = json!("other-node");
        assert!(
            !allocated_claim(&claim(elsewhere), NODE, DRIVER)
                .unwrap()
                .admin_access
        );
    }

    #[test]
    fn an_admin_claim_of_a_device_that_is_no_channel_is_refused() {
        let mut value = with_admin_access(reference(), &[true]);
        value["status"]["allocation"]["devices"]["results"][0]["device"] = json!("daemon-0");
        let error = allocated_claim(&claim(value), NODE, DRIVER).unwrap_err();
        assert_eq!(error.reason(), "not_a_channel");
        assert!(error.to_string().contains("device daemon-0"), "{error}");
    }

    #[test]
    fn several_devices_of_one_domain_are_all_reported() {
        let mut value = reference();
        let devices = &mut value["status"]["allocation"]["devices"];
        let mut second = devices["results"][0].clone();
        second["device"] = json!("channel-5");
        devices["results"].as_array_mut().unwrap().push(second);
        let mut foreign = devices["results"][0].clone();
        foreign["driver"] = json!("gpu.nvidia.com");
        foreign["device"] = json!("gpu-0");
        devices["results"].as_array_mut().unwrap().push(foreign);
        let decoded = allocated_claim(&claim(value), NODE, DRIVER).unwrap();
        let names: Vec<_> = decoded.devices.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(names, ["channel-0", "channel-5"]);
    }
}
