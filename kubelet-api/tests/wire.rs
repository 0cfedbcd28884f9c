//! The wire contract with the kubelet, checked byte by byte: if a field number, a type or
//! a service name drifted, the kubelet would talk past us without any error.

use domaind_kubelet_api::dra::{v1, v1beta1};
use domaind_kubelet_api::dra_health;
use domaind_kubelet_api::pluginregistration as reg;
use prost::Message;

#[test]
fn service_names_are_the_kubelets() {
    assert_eq!(
        v1::dra_plugin_server::SERVICE_NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!(
        v1beta1::dra_plugin_server::SERVICE_NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    );
    assert_eq!(
        reg::registration_server::SERVICE_NAME,
        "pluginregistration.Registration"
    );
    // Kubelet 1.36 dials /v1alpha1.DRAResourceHealth/NodeWatchResources.
    assert_eq!(
        dra_health::v1alpha1::dra_resource_health_server::SERVICE_NAME,
        "v1alpha1.DRAResourceHealth"
    );
    assert_eq!(
        dra_health::v1beta1::dra_resource_health_server::SERVICE_NAME,
        "v1beta1.DRAResourceHealth"
    );
    assert_eq!(
        dra_health::v1::dra_resource_health_server::SERVICE_NAME,
        "v1.DRAResourceHealth"
    );
}

#[test]
fn claim_fields_are_namespace_1_uid_2_name_3() {
    let claim = v1::Claim {
        namespace: "n".into(),
        uid: "u".into(),
        name: "c".into(),
    };
    // tag = field << 3 | 2 (length-delimited)
    assert_eq!(
        claim.encode_to_vec(),
        [0x0a, 1, b'n', 0x12, 1, b'u', 0x1a, 1, b'c']
    );
    let beta = v1beta1::Claim::decode(&claim.encode_to_vec()[..]).unwrap();
    assert_eq!(
        (beta.namespace, beta.uid, beta.name),
        ("n".into(), "u".into(), "c".into())
    );
}

#[test]
fn prepare_response_is_a_map_keyed_by_uid_with_devices_and_error() {
    let device = v1::Device {
        request_names: vec!["r".into()],
        pool_name: "p".into(),
        device_name: "d".into(),
        cdi_device_ids: vec!["i".into()],
    };
    assert_eq!(
        device.encode_to_vec(),
        [0x0a, 1, b'r', 0x12, 1, b'p', 0x1a, 1, b'd', 0x22, 1, b'i']
    );
    let entry = v1::NodePrepareResourceResponse {
        devices: vec![],
        error: "e".into(),
    };
    assert_eq!(entry.encode_to_vec(), [0x12, 1, b'e']);
    let response = v1::NodePrepareResourcesResponse {
        claims: [("k".to_string(), entry)].into(),
    };
    // A map entry is a nested message on field 1: key = 1, value = 2.
    assert_eq!(
        response.encode_to_vec(),
        [0x0a, 8, 0x0a, 1, b'k', 0x12, 3, 0x12, 1, b'e']
    );
}

#[test]
fn unprepare_response_error_is_field_1() {
    let entry = v1beta1::NodeUnprepareResourceResponse { error: "e".into() };
    assert_eq!(entry.encode_to_vec(), [0x0a, 1, b'e']);
}

#[test]
fn registration_messages() {
    let info = reg::PluginInfo {
        r#type: "t".into(),
        name: "n".into(),
        endpoint: "e".into(),
        supported_versions: vec!["v".into()],
    };
    assert_eq!(
        info.encode_to_vec(),
        [0x0a, 1, b't', 0x12, 1, b'n', 0x1a, 1, b'e', 0x22, 1, b'v']
    );
    let status = reg::RegistrationStatus {
        plugin_registered: true,
        error: "x".into(),
    };
    assert_eq!(status.encode_to_vec(), [0x08, 1, 0x12, 1, b'x']);
}

#[test]
fn device_health_fields_and_enum_values() {
    use dra_health::v1alpha1 as alpha;
    let identifier = alpha::DeviceIdentifier {
        pool_name: "p".into(),
        device_name: "d".into(),
    };
    assert_eq!(identifier.encode_to_vec(), [0x0a, 1, b'p', 0x12, 1, b'd']);
    assert_eq!(
        [
            alpha::HealthStatus::Unknown as i32,
            alpha::HealthStatus::Healthy as i32,
            alpha::HealthStatus::Unhealthy as i32,
        ],
        [0, 1, 2]
    );
    let health = alpha::DeviceHealth {
        device: Some(identifier),
        health: alpha::HealthStatus::Unhealthy as i32,
        last_updated_time: 300,
        health_check_timeout_seconds: 30,
        message: "m".into(),
    };
    // device = 1 (nested), health = 2 (varint), last_updated_time = 3 (varint int64,
    // 300 = 0xac 0x02), health_check_timeout_seconds = 4, message = 5.
    let bytes = [
        0x0a, 6, 0x0a, 1, b'p', 0x12, 1, b'd', 0x10, 2, 0x18, 0xac, 0x02, 0x20, 30, 0x2a, 1, b'm',
    ];
    assert_eq!(health.encode_to_vec(), bytes);
    let response = alpha::NodeWatchResourcesResponse {
        devices: vec![health],
    };
    let mut list = vec![0x0a, bytes.len() as u8];
    list.extend_from_slice(&bytes);
    assert_eq!(response.encode_to_vec(), list);
    // The other versions are the same bytes.
    let beta = dra_health::v1beta1::NodeWatchResourcesResponse::decode(&list[..]).unwrap();
    assert_eq!(beta.encode_to_vec(), list);
    let v1 = dra_health::v1::NodeWatchResourcesResponse::decode(&list[..]).unwrap();
    assert_eq!(v1.encode_to_vec(), list);
    assert_eq!(v1.devices[0].message, "m");
}
