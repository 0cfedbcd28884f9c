//! `domaind kubelet-sim`, the binary's kubelet stand-in, against the real kubelet plugin
//! servers over unix sockets with a fake node behind them.

use std::path::PathBuf;
use std::time::Duration;

use domaind_kubelet_plugin::RegistrationState;
use domaind_kubelet_plugin::testing::{
    FakeNodePlugin, Op, PATIENCE, claim, serve, short_dir, within,
};
use domaind_testbed::rack::{LocalRack, RackSpec, http_get, short_temp_dir};
use domaind_testkit::poll_until;

async fn kubelet_sim(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = within(
        "domaind kubelet-sim",
        tokio::process::Command::new(env!("CARGO_BIN_EXE_domaind"))
            .arg("kubelet-sim")
            .args(args)
            .output(),
    )
    .await
    .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let json = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout}\nstderr: {stderr}"));
    (out.status.code().unwrap(), json, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_sim_registers_prepares_and_unprepares_printing_json() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let server = serve(dir.path(), &plugin).await;
    let registry_socket = server.registration_socket().to_str().unwrap().to_string();
    let socket = server.dra_socket().to_str().unwrap().to_string();

    let (code, json, _) = kubelet_sim(&["register", "--registry-socket", &registry_socket]).await;
    assert_eq!(code, 0);
    assert_eq!(json["driver"], "compute-domain.nvidia.com");
    assert_eq!(json["endpoint"], socket.as_str());
    assert_eq!(json["preferredVersion"], "v1");
    assert_eq!(json["supportedVersions"][1], "v1beta1.DRAPlugin");
    assert_eq!(
        *server.registration().borrow(),
        RegistrationState::Registered
    );

    let (code, json, stderr) = kubelet_sim(&[
        "prepare",
        "--socket",
        &socket,
        "--claim",
        "u1:ns:one",
        "--claim",
        "u2:ns:fail-two",
    ])
    .await;
    assert_ne!(code, 0, "a failed claim fails the command");
    assert!(stderr.contains("1 of 2 claim(s) failed"), "{stderr}");
    assert_eq!(json["version"], "v1");
    assert_eq!(json["claims"][0]["uid"], "u1");
    assert_eq!(json["claims"][0]["devices"][0]["deviceName"], "channel-one");
    assert_eq!(
        json["claims"][0]["devices"][0]["cdiDeviceIds"][0],
        "k8s.compute-domain.nvidia.com/claim=u1"
    );
    assert_eq!(json["claims"][1]["error"], "fail-two: broken for good");

    let (code, json, _) = kubelet_sim(&[
        "unprepare",
        "--socket",
        &socket,
        "--version",
        "v1beta1",
        "--claim",
        "u1:ns:one",
    ])
    .await;
    assert_eq!(code, 0);
    assert_eq!(json["version"], "v1beta1");
    assert_eq!(json["claims"][0]["unprepared"], true);
    assert!(json["claims"][0].get("error").is_none());
    assert!(
        plugin
            .calls()
            .contains(&(Op::Unprepare, claim("u1", "ns", "one"))),
        "{:?}",
        plugin.calls()
    );
    within("shutdown", server.shutdown()).await;
}

#[test]
fn kubelet_sim_help_explains_every_flag() {
    let help = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_domaind"))
            .arg("kubelet-sim")
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let prepare = help(&["prepare"]);
    for text in [
        "--socket <PATH>",
        "DRA socket",
        "--version <VERSION>",
        "v1beta1",
        "--claim <UID:NAMESPACE:NAME>",
        "repeat",
    ] {
        assert!(prepare.contains(text), "{text:?} missing from:\n{prepare}");
    }
    let register = help(&["register"]);
    assert!(register.contains("--registry-socket <PATH>"), "{register}");
    assert!(register.contains("registration socket"), "{register}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args([
            "kubelet-sim",
            "prepare",
            "--socket",
            "/nowhere.sock",
            "--claim",
            "a:b",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("expected UID:NAMESPACE:NAME"), "{stderr}");
}

/// `--ready-needs-kubelet`: the daemon says why it is not ready until a kubelet has
/// registered its plugin (here `kubelet-sim register`, the calls a kubelet's plugin
/// watcher makes), then is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_needing_the_kubelet_is_ready_once_registered() {
    const LIMIT: Duration = Duration::from_secs(30);
    let tmp = short_temp_dir("drk").unwrap();
    let mut spec = RackSpec::self_contained(
        1,
        PathBuf::from(env!("CARGO_BIN_EXE_domaind")),
        tmp.path().into(),
    );
    spec.subnet = domaind_loopback::CLI_KUBELET_SIM;
    spec.extra_args = vec!["--ready-needs-kubelet".into()];
    let mut rack = LocalRack::create(spec).unwrap();
    let info = tokio::task::block_in_place(|| {
        rack.start(0)?;
        rack.wait_ready(0, LIMIT)
    })
    .unwrap();
    let registry_socket = info.registration_socket.to_str().unwrap().to_owned();

    let (code, body) = http_get(info.http_addr, "/readyz").await.unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("kubelet: the kubelet has not registered the DRA plugin")
            && body.contains(&registry_socket),
        "{body}"
    );
    assert_eq!(http_get(info.http_addr, "/healthz").await.unwrap().0, 200);

    let (code, _, stderr) = kubelet_sim(&["register", "--registry-socket", &registry_socket]).await;
    assert_eq!(code, 0, "{stderr}");
    let ready = poll_until("/readyz after the registration", PATIENCE, async || {
        let (code, body) = http_get(info.http_addr, "/readyz").await.unwrap();
        (code == 200).then_some(body)
    })
    .await;
    assert!(!ready.contains("kubelet"), "{ready}");
    assert_eq!(rack.stop(0, LIMIT).unwrap(), Some(0));
}
