//! The part of the CDI spec format we write: device nodes only.

use std::collections::BTreeSet;
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use super::names::{check_device_name, check_vendor_or_class};

/// The CDI version of our specs. Our fields (`deviceNodes` with path, type, major,
/// minor, permissions) are all in 0.3.0, the oldest version CDI registries still read;
/// but device names start with the claim UID, which is a UUID and often starts with a
/// digit, and device names may start with a digit only since 0.5.0.
pub const CDI_VERSION: &str = "0.5.0";

/// Linux device numbers: 12 bits of major, 20 of minor.
const MAX_MAJOR: u32 = (1 << 12) - 1;
const MAX_MINOR: u32 = (1 << 20) - 1;

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    /// `<vendor>/<class>`.
    pub kind: String,
    pub devices: Vec<Device>,
    /// Edits applied whenever any device of this spec is injected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_edits: Option<ContainerEdits>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceType {
    #[serde(rename = "c")]
    Char,
    #[serde(rename = "b")]
    Block,
}

/// A device node the runtime creates in the container, from its numbers: nothing on
/// the host is looked up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// In the container.
    pub path: String,
    #[serde(rename = "type")]
    pub device_type: DeviceType,
    pub major: u32,
    pub minor: u32,
    /// Device cgroup access: some of `r`, `w`, `m` (mknod).
    pub permissions: String,
}

impl DeviceNode {
    /// A character device the container may read and write (not create more of).
    pub fn char_device(path: impl Into<String>, major: u32, minor: u32) -> Self {
        Self {
            path: path.into(),
            device_type: DeviceType::Char,
            major,
            minor,
            permissions: "rw".to_owned(),
        }
    }

    fn check(&self) -> Result<(), String> {
        let path = Path::new(&self.path);
        if !path.is_absolute()
            || self.path.contains("//")
            || path
                .components()
                .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
        {
            return Err(format!(
                "device path {:?} is not an absolute, normal path",
                self.path
            ));
        }
        if self.major > MAX_MAJOR || self.minor > MAX_MINOR {
            return Err(format!(
                "device {} has numbers {}:{}, beyond Linux's {MAX_MAJOR}:{MAX_MINOR}",
                self.path, self.major, self.minor
            ));
        }
        let mut seen = BTreeSet::new();
        if self.permissions.is_empty()
            || !self
                .permissions
                .chars()
                .all(|c| matches!(c, 'r' | 'w' | 'm') && seen.insert(c))
        {
            return Err(format!(
                "device {} has permissions {:?}, not some of \"rwm\"",
                self.path, self.permissions
            ));
        }
        Ok(())
    }
}

impl ContainerEdits {
    fn check(&self) -> Result<(), String> {
        let mut paths = BTreeSet::new();
        for node in &self.device_nodes {
            node.check()?;
            if !paths.insert(&node.path) {
                return Err(format!("device path {} is listed twice", node.path));
            }
        }
        Ok(())
    }
}

impl Spec {
    /// What a CDI registry would reject, and what we promise on top: known version, a
    /// kind whose class needs no newer version, unique valid device names, and device
    /// nodes with absolute paths and real device numbers.
    pub fn check(&self) -> Result<(), String> {
        if self.cdi_version != CDI_VERSION {
            return Err(format!(
                "cdiVersion is {:?}, not {CDI_VERSION:?}",
                self.cdi_version
            ));
        }
        let (vendor, class) = self
            .kind
            .split_once('/')
            .ok_or_else(|| format!("kind {:?} is not <vendor>/<class>", self.kind))?;
        check_vendor_or_class(vendor).map_err(|why| format!("vendor {vendor:?}: {why}"))?;
        check_vendor_or_class(class).map_err(|why| format!("class {class:?}: {why}"))?;
        if class.contains('.') {
            return Err(format!("class {class:?} has a dot, which needs CDI 0.6.0"));
        }
        if self.devices.is_empty() {
            return Err("the spec has no device".to_owned());
        }
        let mut names = BTreeSet::new();
        for device in &self.devices {
            check_device_name(&device.name)
                .map_err(|why| format!("device name {:?}: {why}", device.name))?;
            if !names.insert(&device.name) {
                return Err(format!("device name {:?} is used twice", device.name));
            }
            device.container_edits.check()?;
        }
        if let Some(edits) = &self.container_edits {
            edits.check()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(nodes: Vec<DeviceNode>) -> Spec {
        Spec {
            cdi_version: CDI_VERSION.to_owned(),
            kind: "k8s.example.com/claim".to_owned(),
            devices: vec![Device {
                name: "0abc-channel-1".to_owned(),
                container_edits: ContainerEdits {
                    device_nodes: nodes,
                },
            }],
            container_edits: None,
        }
    }

    #[test]
    fn a_char_device_spec_passes_and_serialises_as_cdi_names_it() {
        let spec = spec(vec![DeviceNode::char_device("/dev/x/channel1", 234, 1)]);
        spec.check().unwrap();
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "cdiVersion": "0.5.0",
                "kind": "k8s.example.com/claim",
                "devices": [{
                    "name": "0abc-channel-1",
                    "containerEdits": {"deviceNodes": [
                        {"path": "/dev/x/channel1", "type": "c", "major": 234, "minor": 1, "permissions": "rw"}
                    ]}
                }]
            })
        );
        assert_eq!(serde_json::from_value::<Spec>(json).unwrap(), spec);
    }

    #[test]
    fn bad_device_nodes_are_caught() {
        let good = DeviceNode::char_device("/dev/x/channel1", 234, 1);
        let bad = [
            DeviceNode {
                path: "dev/x".into(),
                ..good.clone()
            },
            DeviceNode {
                path: "/dev/../etc/x".into(),
                ..good.clone()
            },
            DeviceNode {
                path: "/dev//x".into(),
                ..good.clone()
            },
            DeviceNode {
                major: MAX_MAJOR + 1,
                ..good.clone()
            },
            DeviceNode {
                minor: MAX_MINOR + 1,
                ..good.clone()
            },
            DeviceNode {
                permissions: String::new(),
                ..good.clone()
            },
            DeviceNode {
                permissions: "rwx".into(),
                ..good.clone()
            },
            DeviceNode {
                permissions: "rr".into(),
                ..good.clone()
            },
        ];
        for node in bad {
            assert!(spec(vec![node.clone()]).check().is_err(), "{node:?}");
        }
        assert!(
            spec(vec![good.clone(), good]).check().is_err(),
            "duplicate path"
        );
    }

    #[test]
    fn bad_specs_are_caught() {
        let good = spec(vec![DeviceNode::char_device("/dev/x/channel1", 234, 1)]);
        let mut cases = Vec::new();
        cases.push(Spec {
            cdi_version: "0.3.0".into(),
            ..good.clone()
        });
        for kind in [
            "claim",
            "k8s.example.com/",
            "k8s.example.com/a.b",
            "1x/claim",
        ] {
            cases.push(Spec {
                kind: kind.into(),
                ..good.clone()
            });
        }
        cases.push(Spec {
            devices: Vec::new(),
            ..good.clone()
        });
        let mut twice = good.clone();
        twice.devices.push(twice.devices[0].clone());
        cases.push(twice);
        let mut bad_name = good.clone();
        bad_name.devices[0].name = "a/b".into();
        cases.push(bad_name);
        let mut bad_top = good.clone();
        bad_top.container_edits = Some(ContainerEdits {
            device_nodes: vec![DeviceNode::char_device("relative", 1, 1)],
        });
        cases.push(bad_top);
        for case in cases {
            assert!(case.check().is_err(), "{case:?}");
        }
        good.check().unwrap();
    }
}
