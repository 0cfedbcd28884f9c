//! The opaque configuration a ComputeDomain's claims carry: `ComputeDomainChannelConfig`,
//! as NVIDIA's driver defines it, so that claim templates written for it work unchanged.
//!
//! ```yaml
//! apiVersion: resource.nvidia.com/v1beta1
//! kind: ComputeDomainChannelConfig
//! domainID: 5b0e7c7e-...        # the ComputeDomain's uid (required)
//! allocationMode: Single        # or All; Single when absent
//! readiness: Domain             # domaind only, optional: Local or Domain
//! ```
//!
//! `readiness` is our extension: when a prepared claim's pod may start (`Local`: this
//! node's IMEX daemon is ready; `Domain`: every member's is). Without it the daemon's
//! `--default-readiness` applies. NVIDIA's driver decodes strictly and would refuse a
//! claim that sets it, which is the point: a claim that asks for a barrier should not
//! silently run without one.
//!
//! Decoding is strict here too: an unknown field is most often a typo
//! (`allocationmode`), and ignoring it would give the claim something it did not ask
//! for. The controller reads the same type, but only asks which domain a config names
//! ([`ChannelConfig::domain_of`]): a claim the nodes would refuse is still allocated,
//! and deleting its domain must still wait for it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::crd::ChannelAllocationMode;

pub const CHANNEL_CONFIG_API_VERSION: &str = "resource.nvidia.com/v1beta1";
pub const CHANNEL_CONFIG_KIND: &str = "ComputeDomainChannelConfig";

/// A decoded `ComputeDomainChannelConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChannelConfig {
    pub api_version: String,
    pub kind: String,
    /// The ComputeDomain's uid.
    #[serde(rename = "domainID")]
    pub domain_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<ChannelAllocationMode>,
    /// domaind's extension; the daemon's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Readiness>,
}

/// `readiness`: when a prepared claim's pod may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Readiness {
    /// This node's IMEX daemon is ready (NVIDIA's driver's behaviour).
    Local,
    /// Every member of the domain is: a barrier across nodes.
    Domain,
}

impl ChannelConfig {
    /// A config for `domain_id`, as the controller writes it into claim templates.
    pub fn new(domain_id: impl Into<String>, mode: ChannelAllocationMode) -> Self {
        Self {
            api_version: CHANNEL_CONFIG_API_VERSION.into(),
            kind: CHANNEL_CONFIG_KIND.into(),
            domain_id: domain_id.into(),
            allocation_mode: Some(mode),
            readiness: None,
        }
    }

    /// `allocationMode`, `Single` when absent.
    pub fn mode(&self) -> ChannelAllocationMode {
        self.allocation_mode.unwrap_or_default()
    }

    /// Decodes the `parameters` of an opaque device configuration. The error says what
    /// is wrong in words fit for the user who wrote the claim.
    pub fn decode(parameters: &Value) -> Result<Self, ConfigError> {
        let Some(object) = parameters.as_object() else {
            return Err(ConfigError::NotAnObject {
                found: kind_of(parameters),
            });
        };
        // apiVersion and kind first: a config of another kind would otherwise be
        // reported as a list of unknown fields.
        let field = |name: &str| object.get(name).and_then(Value::as_str);
        if field("apiVersion") != Some(CHANNEL_CONFIG_API_VERSION)
            || field("kind") != Some(CHANNEL_CONFIG_KIND)
        {
            return Err(ConfigError::OtherKind {
                api_version: field("apiVersion").unwrap_or("").into(),
                kind: field("kind").unwrap_or("").into(),
            });
        }
        let config: Self = serde_json::from_value(parameters.clone())
            .map_err(|e| ConfigError::Invalid(Arc::new(e)))?;
        if config.domain_id.trim().is_empty() {
            return Err(ConfigError::EmptyDomainId);
        }
        Ok(config)
    }
}

/// Why a claim's opaque parameters are not a channel config this node can use, in
/// words fit for the user who wrote the claim. Every one stays wrong until the claim
/// is rewritten.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConfigError {
    #[error("its parameters are not an object but {found}")]
    NotAnObject { found: &'static str },
    #[error(
        "its parameters are apiVersion {api_version:?}, kind {kind:?}; expected \
         {CHANNEL_CONFIG_API_VERSION}, {CHANNEL_CONFIG_KIND}"
    )]
    OtherKind { api_version: String, kind: String },
    #[error("its {CHANNEL_CONFIG_KIND} is not valid: {0}")]
    Invalid(#[source] Arc<serde_json::Error>),
    #[error("its {CHANNEL_CONFIG_KIND} has an empty domainID; it must be the ComputeDomain's uid")]
    EmptyDomainId,
}

/// Alike when they say the same: serde's error has no equality of its own, and a
/// claim's refusal is compared (by its prepare's answers) for what it tells the user.
impl PartialEq for ConfigError {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for ConfigError {}

impl ChannelConfig {
    /// The domain uid an opaque parameters object names, if it is a channel config,
    /// whether or not the rest of it would decode. `None` for any other kind.
    pub fn domain_of(parameters: &Value) -> Option<&str> {
        let object = parameters.as_object()?;
        let field = |name: &str| object.get(name).and_then(Value::as_str);
        (field("apiVersion") == Some(CHANNEL_CONFIG_API_VERSION)
            && field("kind") == Some(CHANNEL_CONFIG_KIND))
        .then(|| field("domainID"))
        .flatten()
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(extra: Value) -> Value {
        let mut base = json!({
            "apiVersion": CHANNEL_CONFIG_API_VERSION,
            "kind": CHANNEL_CONFIG_KIND,
            "domainID": "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11",
        });
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        base
    }

    #[test]
    fn nvidias_config_decodes_with_its_defaults() {
        let config = ChannelConfig::decode(&params(json!({}))).unwrap();
        assert_eq!(config.domain_id, "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11");
        assert_eq!(config.mode(), ChannelAllocationMode::Single);
        assert_eq!(config.readiness, None);
        let all = ChannelConfig::decode(&params(json!({"allocationMode": "All"}))).unwrap();
        assert_eq!(all.mode(), ChannelAllocationMode::All);
    }

    #[test]
    fn readiness_is_our_optional_extension() {
        let config = ChannelConfig::decode(&params(json!({"readiness": "Domain"}))).unwrap();
        assert_eq!(config.readiness, Some(Readiness::Domain));
        let error = ChannelConfig::decode(&params(json!({"readiness": "Eventually"}))).unwrap_err();
        assert!(
            error.to_string().contains("unknown variant `Eventually`"),
            "{error}"
        );
        // serde's error is kept, not only its words.
        assert!(std::error::Error::source(&error).is_some());
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let cases = [
            (json!("a string"), "not an object but a string"),
            (
                params(json!({"kind": "ComputeDomainDaemonConfig"})),
                "kind \"ComputeDomainDaemonConfig\"; expected",
            ),
            (
                params(json!({"apiVersion": "resource.nvidia.com/v1alpha1"})),
                "apiVersion \"resource.nvidia.com/v1alpha1\"",
            ),
            (params(json!({"domainID": ""})), "empty domainID"),
            (params(json!({"domainID": 7})), "invalid type: integer `7`"),
            (
                params(json!({"allocationmode": "All"})),
                "unknown field `allocationmode`",
            ),
            (
                params(json!({"allocationMode": "Several"})),
                "unknown variant `Several`",
            ),
        ];
        for (parameters, expected) in cases {
            let error = ChannelConfig::decode(&parameters).unwrap_err();
            assert!(
                error.to_string().contains(expected),
                "{parameters}: {error}"
            );
        }
        let mut missing = params(json!({}));
        missing.as_object_mut().unwrap().remove("domainID");
        let error = ChannelConfig::decode(&missing).unwrap_err();
        assert!(
            error.to_string().contains("missing field `domainID`"),
            "{error}"
        );
    }

    #[test]
    fn what_the_controller_writes_decodes_back() {
        let written = ChannelConfig::new("uid-1", ChannelAllocationMode::All);
        let back = ChannelConfig::decode(&serde_json::to_value(&written).unwrap()).unwrap();
        assert_eq!(back, written);
    }

    #[test]
    fn the_controller_writes_what_nvidias_driver_writes() {
        let nvidias = json!({
            "allocationMode": "Single",
            "apiVersion": "resource.nvidia.com/v1beta1",
            "domainID": "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11",
            "kind": "ComputeDomainChannelConfig"
        });
        let ours = ChannelConfig::new(
            "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11",
            ChannelAllocationMode::Single,
        );
        assert_eq!(serde_json::to_value(&ours).unwrap(), nvidias);
    }

    #[test]
    fn the_domain_a_config_names_is_read_even_when_the_rest_would_not_decode() {
        let typo = params(json!({"allocationmode": "All"}));
        assert!(ChannelConfig::decode(&typo).is_err());
        assert_eq!(
            ChannelConfig::domain_of(&typo),
            Some("5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11")
        );
        let daemon = params(json!({"kind": "ComputeDomainDaemonConfig"}));
        assert_eq!(ChannelConfig::domain_of(&daemon), None);
        assert_eq!(ChannelConfig::domain_of(&json!("text")), None);
        let mut missing = params(json!({}));
        missing.as_object_mut().unwrap().remove("domainID");
        assert_eq!(ChannelConfig::domain_of(&missing), None);
    }
}
