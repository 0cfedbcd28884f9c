//! `ComputeDomainChannelConfig`: the opaque parameters a channel claim carries to the
//! node daemons, naming the ComputeDomain by uid. The field names are the anchor's.

use serde::{Deserialize, Serialize};

use super::names::{CHANNEL_CONFIG_API_VERSION, CHANNEL_CONFIG_KIND};
use crate::crd::ChannelAllocationMode;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelConfig {
    pub api_version: String,
    pub kind: String,
    #[serde(rename = "domainID")]
    pub domain_id: String,
    #[serde(default)]
    pub allocation_mode: ChannelAllocationMode,
}

impl ChannelConfig {
    pub fn new(domain_id: impl Into<String>, allocation_mode: ChannelAllocationMode) -> Self {
        Self {
            api_version: CHANNEL_CONFIG_API_VERSION.into(),
            kind: CHANNEL_CONFIG_KIND.into(),
            domain_id: domain_id.into(),
            allocation_mode,
        }
    }

    /// The config in an opaque parameters object, if it is one of ours. Anything else
    /// (another kind, another API version, not an object) is not a channel config.
    pub fn parse(parameters: &serde_json::Value) -> Option<Self> {
        let config: Self = serde_json::from_value(parameters.clone()).ok()?;
        (config.api_version == CHANNEL_CONFIG_API_VERSION && config.kind == CHANNEL_CONFIG_KIND)
            .then_some(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_parameters_the_anchor_writes() {
        let parameters = json!({
            "allocationMode": "Single",
            "apiVersion": "resource.nvidia.com/v1beta1",
            "domainID": "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11",
            "kind": "ComputeDomainChannelConfig"
        });
        let config = ChannelConfig::parse(&parameters).unwrap();
        assert_eq!(config.domain_id, "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11");
        assert_eq!(serde_json::to_value(&config).unwrap(), parameters);
    }

    #[test]
    fn other_kinds_are_not_channel_configs() {
        let daemon = json!({
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainDaemonConfig",
            "domainID": "u"
        });
        assert_eq!(ChannelConfig::parse(&daemon), None);
        assert_eq!(ChannelConfig::parse(&json!("text")), None);
        assert_eq!(
            ChannelConfig::parse(&json!({"kind": "ComputeDomainChannelConfig"})),
            None
        );
    }
}
