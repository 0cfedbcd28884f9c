//! deploy/: every plain manifest parses, the Helm chart's templates are consistent with
//! its values, its helpers and the binary's flags, and the copies of the CRD and the
//! DeviceClasses agree. (Helm itself is not needed: templates are checked as text.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn chart() -> PathBuf {
    deploy().join("helm/domaind")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn is_template(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "templates")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn documents(path: &Path) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(&read(path))
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn values() -> Value {
    serde_saphyr::from_str(&read(&chart().join("values.yaml"))).unwrap()
}

#[test]
fn every_plain_yaml_file_parses_and_names_its_kind() {
    let mut all = vec![];
    files(&deploy(), &mut all);
    let yaml: Vec<&PathBuf> = all
        .iter()
        .filter(|p| {
            matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                && !is_template(p)
        })
        .collect();
    assert!(yaml.len() >= 5, "found only {yaml:?}");
    for path in yaml {
        let docs = documents(path);
        assert!(!docs.is_empty(), "{} is empty", path.display());
        let name = path.file_name().unwrap().to_str().unwrap();
        if name == "Chart.yaml" || name == "values.yaml" {
            continue;
        }
        for doc in docs {
            assert!(
                doc["apiVersion"].is_string() && doc["kind"].is_string(),
                "{}: a document without apiVersion and kind",
                path.display()
            );
            assert!(doc["metadata"]["name"].is_string(), "{}", path.display());
        }
    }
}

#[test]
fn the_chart_describes_this_release() {
    let chart_yaml: Value = serde_saphyr::from_str(&read(&chart().join("Chart.yaml"))).unwrap();
    assert_eq!(chart_yaml["apiVersion"], "v2");
    assert_eq!(chart_yaml["name"], "domaind");
    assert_eq!(chart_yaml["appVersion"], env!("CARGO_PKG_VERSION"));
    assert!(chart_yaml["version"].as_str().unwrap().split('.').count() == 3);
}

#[test]
fn the_charts_crd_is_the_generated_one() {
    let generated = read(&deploy().join("crds/computedomains.resource.nvidia.com.yaml"));
    let in_chart = read(&chart().join("crds/computedomains.resource.nvidia.com.yaml"));
    assert!(
        generated == in_chart,
        "deploy/helm/domaind/crds is stale: copy deploy/crds/computedomains.resource.nvidia.com.yaml there"
    );
    assert_eq!(generated, domaind_kube_api::crd::crd_yaml());
}

#[test]
fn the_device_classes_select_our_channels_and_match_the_charts() {
    let docs = documents(&deploy().join("deviceclasses.yaml"));
    let expression = |name: &str| -> String {
        let class = docs
            .iter()
            .find(|d| d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no DeviceClass {name}"));
        assert_eq!(class["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(class["kind"], "DeviceClass");
        class["spec"]["selectors"][0]["cel"]["expression"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let channel = expression("compute-domain-default-channel.nvidia.com");
    assert_eq!(
        channel,
        "device.driver == 'compute-domain.nvidia.com' && \
         device.attributes['compute-domain.nvidia.com'].type == 'channel'"
    );
    let daemon = expression("compute-domain-daemon.nvidia.com");

    // The chart's template, rendered with the default driver name, says the same.
    let template = read(&chart().join("templates/deviceclasses.yaml"));
    let driver = values()["driverName"].as_str().unwrap().to_string();
    let rendered: Vec<String> = template
        .lines()
        .filter_map(|line| line.split_once("printf \"").map(|(_, rest)| rest))
        .map(|rest| rest.split_once('"').unwrap().0.replace("%s", &driver))
        .collect();
    assert_eq!(rendered, vec![channel, daemon]);
}

/// `{{ ... }}` actions of a template, trimmed of `-` and spaces.
fn actions(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let end = after.find("}}").expect("an unclosed {{");
        out.push(
            after[..end]
                .trim_matches(|c: char| c == '-' || c.is_whitespace())
                .to_string(),
        );
        rest = &after[end + 2..];
    }
    assert!(!rest.contains("}}"), "a }} without {{");
    out
}

fn templates() -> Vec<(PathBuf, String)> {
    let mut all = vec![];
    files(&chart().join("templates"), &mut all);
    all.sort();
    all.into_iter().map(|p| (p.clone(), read(&p))).collect()
}

#[test]
fn template_blocks_are_balanced() {
    for (path, text) in templates() {
        let mut open: Vec<String> = vec![];
        for action in actions(&text) {
            if action.starts_with("/*") {
                continue;
            }
            let word = action.split_whitespace().next().unwrap_or_default();
            match word {
                "if" | "with" | "range" | "define" | "block" => open.push(action.clone()),
                "end" => {
                    open.pop()
                        .unwrap_or_else(|| panic!("{}: an end with nothing open", path.display()));
                }
                "else" => assert!(!open.is_empty(), "{}: else outside a block", path.display()),
                _ => {}
            }
        }
        assert!(open.is_empty(), "{}: unclosed {open:?}", path.display());
    }
}

#[test]
fn every_value_a_template_reads_is_in_values_yaml() {
    let values = values();
    let mut read_paths = BTreeSet::new();
    for (_, text) in templates() {
        let mut rest = text.as_str();
        while let Some(at) = rest.find(".Values.") {
            let tail = &rest[at + ".Values.".len()..];
            let path: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
                .collect();
            read_paths.insert(path.trim_end_matches('.').to_string());
            rest = tail;
        }
    }
    assert!(read_paths.len() > 20, "{read_paths:?}");
    for path in &read_paths {
        let mut at = &values;
        for key in path.split('.') {
            at = at
                .get(key)
                .unwrap_or_else(|| panic!(".Values.{path}: values.yaml has no {key}"));
        }
    }
}

#[test]
fn every_included_helper_is_defined() {
    let all = templates();
    let defined: BTreeSet<String> = all
        .iter()
        .flat_map(|(_, text)| actions(text))
        .filter_map(|a| {
            a.strip_prefix("define ")
                .map(|n| n.trim_matches('"').to_string())
        })
        .collect();
    for (path, text) in &all {
        for action in actions(text) {
            for part in action.split("include ").skip(1) {
                let name = part.split('"').nth(1).unwrap();
                assert!(
                    defined.contains(name),
                    "{}: include of undefined {name}",
                    path.display()
                );
            }
        }
    }
}

/// The `--flag` names in a template's container args.
fn flags(template: &str) -> BTreeSet<String> {
    template
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- --"))
        .map(|flag| format!("--{}", flag.split('=').next().unwrap()))
        .collect()
}

fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "{args:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_charts_command_lines_use_flags_the_binary_has() {
    // Each with the fewest flags it passes: a check that found nothing proves nothing.
    let cases = [
        ("templates/deployment.yaml", vec!["controller", "--help"], 5),
        ("templates/daemonset.yaml", vec!["run", "--help"], 5),
        (
            "templates/imex-runner.yaml",
            vec!["imex-runner", "--help"],
            3,
        ),
    ];
    for (template, command, fewest) in cases {
        let text = read(&chart().join(template));
        let mut used = flags(&text);
        // The init container's `certs issue` flags are checked below.
        let certs = ["--ca", "--node", "--out", "--valid-days"];
        if template.ends_with("daemonset.yaml") {
            for flag in certs {
                assert!(used.remove(flag), "{template}: {flag}");
            }
            let issue = help(&["certs", "issue", "--help"]);
            for flag in certs {
                assert!(issue.contains(flag), "certs issue has no {flag}");
            }
        }
        assert!(used.len() >= fewest, "{template}: {used:?}");
        let help = help(&command);
        for flag in used {
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{template} passes {flag}, which `domaind {}` does not have",
                command.join(" ")
            );
        }
    }
}

/// `node.imex.sharedName`, off by default, reaches both places that issue a node's
/// certificate: `domaind run` (tls.mode csr) and the init container's `certs issue`
/// (sharedCA).
#[test]
fn the_shared_name_value_reaches_the_daemon_and_the_init_containers_certificate() {
    assert_eq!(values()["node"]["imex"]["sharedName"], Value::Bool(false));
    let daemonset = read(&chart().join("templates/daemonset.yaml"));
    let gated = "{{- if .Values.node.imex.sharedName }}\n            - --imex-shared-name\n            {{- end }}";
    let init = block(&daemonset, "- name: issue-certificate", "env:");
    let daemon = block(&daemonset, "- name: domaind\n", "env:");
    for (who, args) in [("the init container", init), ("the node daemon", daemon)] {
        assert!(
            args.contains(gated),
            "{who} does not pass node.imex.sharedName"
        );
    }
    for command in [&["run", "--help"][..], &["certs", "issue", "--help"]] {
        assert!(help(command).contains("--imex-shared-name"), "{command:?}");
    }
}

/// Host-managed IMEX (`node.imex.hostService.unit`) is off by default; on, it replaces
/// the runner (no runner DaemonSet, no runner flag), passes the unit and the systemctl
/// to reach it, and gives the node pod the host's PID namespace that nsenter needs.
#[test]
fn host_managed_imex_is_off_by_default_and_on_replaces_the_runner() {
    let host = &values()["node"]["imex"]["hostService"];
    assert_eq!(host["unit"], Value::String(String::new()));
    assert!(
        host["systemctl"]
            .as_str()
            .is_some_and(|s| s.starts_with("nsenter --target 1 --mount -- ")),
        "{host:?}"
    );
    let runner = read(&chart().join("templates/imex-runner.yaml"));
    assert!(
        runner.starts_with(
            "{{- if and .Values.node.imex.runner.enabled (not .Values.node.imex.hostService.unit) }}"
        ),
        "the runner is deployed beside host-managed IMEX"
    );
    let daemonset = read(&chart().join("templates/daemonset.yaml"));
    assert!(daemonset.contains("{{- $hostImex := .Values.node.imex.hostService.unit }}"));
    assert!(
        daemonset
            .contains("{{- $runner := and .Values.node.imex.runner.enabled (not $hostImex) }}")
    );
    assert!(
        daemonset.contains("      {{- if $hostImex }}\n")
            && block(&daemonset, "{{- if $hostImex }}", "{{- end }}").contains("hostPID: true"),
        "the node pod does not get hostPID with host-managed IMEX"
    );
    let args = block(
        &daemonset,
        "{{- if $hostImex }}\n            - --imex-host-service",
        "{{- end }}",
    );
    for flag in [
        "--imex-host-service=",
        "--imex-systemctl=",
        "--imex-hosts-file=",
    ] {
        assert!(args.contains(flag), "{flag}: {args}");
    }
    assert!(
        args.contains("{{- else if $runner }}\n            - --imex-runner="),
        "{args}"
    );
    let help = help(&["run", "--help"]);
    for flag in ["--imex-host-service", "--imex-systemctl"] {
        assert!(help.contains(flag), "{flag}");
    }
}

/// The lines of `text` from the first line containing `from` up to the next line, after
/// it, that contains `to`.
fn block<'a>(text: &'a str, from: &str, to: &str) -> &'a str {
    let start = text
        .find(from)
        .unwrap_or_else(|| panic!("no {from:?} in the template"));
    let rest = &text[start..];
    let end = rest[from.len()..]
        .find(to)
        .map_or(rest.len(), |at| at + from.len());
    &rest[..end]
}

fn the_dockerfile() -> String {
    read(&deploy().join("../Dockerfile"))
}

#[test]
fn the_controller_runs_as_the_images_user_on_a_read_only_root() {
    let deployment = read(&chart().join("templates/deployment.yaml"));
    let context = block(&deployment, "securityContext:", "resources");
    for setting in [
        "allowPrivilegeEscalation: false",
        "readOnlyRootFilesystem: true",
        "runAsNonRoot: true",
        "runAsUser: 65532",
        "runAsGroup: 65532",
        "drop: [\"ALL\"]",
        "type: RuntimeDefault",
    ] {
        assert!(context.contains(setting), "the controller lacks {setting}");
    }
    // No writable volume: the controller writes no file.
    assert!(!deployment.contains("volumeMounts"), "{deployment}");
    // The user the chart asks for is the one the image declares.
    assert!(
        the_dockerfile().contains("\nUSER 65532:65532\n"),
        "the Dockerfile's USER is not the controller's runAsUser"
    );
}

#[test]
fn the_node_daemon_asks_for_root_as_the_image_defaults_to_another_user() {
    let daemonset = read(&chart().join("templates/daemonset.yaml"));
    let init = block(&daemonset, "- name: issue-certificate", "containers:");
    for setting in [
        "runAsUser: 0",
        "allowPrivilegeEscalation: false",
        "readOnlyRootFilesystem: true",
        "drop: [\"ALL\"]",
    ] {
        assert!(init.contains(setting), "the init container lacks {setting}");
    }
    let daemon = block(&daemonset, "- name: domaind", "ports:");
    for setting in ["privileged: true", "runAsUser: 0"] {
        assert!(daemon.contains(setting), "the node daemon lacks {setting}");
    }
}

#[test]
fn the_image_installs_the_package_list_that_ci_checks() {
    let dockerfile = the_dockerfile();
    let list = deploy().join("image/runtime-packages");
    let packages: Vec<String> = read(&list)
        .lines()
        .map(|line| line.split('#').next().unwrap().trim().to_string())
        .filter(|line| !line.is_empty())
        .collect();
    assert!(packages.contains(&"libc6".to_string()), "{packages:?}");
    assert!(
        dockerfile.contains("COPY deploy/image/runtime-packages "),
        "the Dockerfile does not install deploy/image/runtime-packages"
    );
    let check = read(&deploy().join("image/check-rootfs.sh"));
    assert!(check.contains("packages_file=\"$here/runtime-packages\""));
}

/// `(API group, resource, verb)` of every rule of `rules`.
fn grants(rules: &Value) -> BTreeSet<(String, String, String)> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap_or_else(|| panic!("a list: {v}"))
            .iter()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect()
    };
    let mut grants = BTreeSet::new();
    for rule in rules.as_array().expect("a list of rules") {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    grants.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    grants
}

/// The backquoted words of a Markdown table cell: `` `a`, `""` (core) `` is `a` and "".
fn cell_words(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(|word| {
            if word == "\"\"" {
                String::new()
            } else {
                word.to_string()
            }
        })
        .collect()
}

#[test]
fn the_install_pages_node_rbac_table_is_the_charts() {
    // The ClusterRole's rules have no template actions: the YAML after the header is
    // plain once the lines with actions are dropped.
    let template = read(&chart().join("templates/rbac-node.yaml"));
    let plain: String = template
        .lines()
        .filter(|line| !line.contains("{{"))
        .map(|line| format!("{line}\n"))
        .collect();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&plain).unwrap();
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole")
        .expect("rbac-node.yaml has the ClusterRole");
    let chart = grants(&role["rules"]);

    let page = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/install.md"));
    let table = block(
        &page,
        "## RBAC the node daemon needs",
        "This table is the chart's",
    );
    let mut documented = BTreeSet::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        for group in cell_words(cells[0]) {
            for resource in cell_words(cells[1]) {
                for verb in cell_words(cells[2]) {
                    documented.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    assert!(
        !documented.is_empty(),
        "the install page's table was not found"
    );
    let missing: Vec<_> = chart.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&chart).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/src/install.md's node RBAC table differs from rbac-node.yaml: granted but not documented \
         {missing:?}; documented but not granted {extra:?}"
    );
}
