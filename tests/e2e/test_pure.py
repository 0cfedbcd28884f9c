"""The end-to-end scripts' pure parts, without a cluster: `unit.sh` runs these."""

from __future__ import annotations

import itertools
import unittest

import yaml
from chart import CHART, ObjectId, api_warnings, manifest_objects, merge, object_id, set_value
from helm_chart import BASE_VALUES, UPGRADE_VALUES, grants
from kube import E2EError
from sa_kubeconfigs import build_kubeconfig, checks, service_account_of


class Manifest(unittest.TestCase):
    def test_comment_only_documents_hold_no_object(self) -> None:
        text = (
            "---\n# Source: a.yaml\n# only a comment\n---\n"
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x, namespace: ns}\n"
        )
        objects = manifest_objects(text)
        self.assertEqual(
            [object_id(o) for o in objects], [ObjectId("", "ServiceAccount", "ns", "x")]
        )

    def test_a_document_that_is_no_object_is_an_error(self) -> None:
        with self.assertRaises(E2EError):
            manifest_objects("---\n- a list\n")

    def test_ids_carry_the_group_not_the_version(self) -> None:
        oid = object_id(
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "d"}}
        )
        self.assertEqual(oid, ObjectId("resource.k8s.io", "DeviceClass", "", "d"))
        self.assertEqual(str(oid), "DeviceClass.resource.k8s.io d")


class Values(unittest.TestCase):
    def test_set_reads_the_value_as_yaml_and_leaves_the_input_alone(self) -> None:
        base = {"node": {"channelDevices": 8}}
        out = set_value(base, "node.channelDevices=4")
        self.assertEqual(out, {"node": {"channelDevices": 4}})
        self.assertEqual(base, {"node": {"channelDevices": 8}})
        self.assertEqual(set_value({}, "a.b=true"), {"a": {"b": True}})

    def test_set_needs_a_key_and_maps_on_the_way(self) -> None:
        for bad in ("novalue", "=3"):
            with self.assertRaises(E2EError):
                set_value({}, bad)
        with self.assertRaises(E2EError):
            set_value({"a": 1}, "a.b=2")

    def test_merge_is_by_key_at_every_depth(self) -> None:
        self.assertEqual(
            merge({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"c": 9}}), {"a": {"b": 1, "c": 9}, "d": 3}
        )

    def test_the_upgrade_keeps_the_base_values_and_names_only_keys_the_chart_has(self) -> None:
        chart = yaml.safe_load((CHART / "values.yaml").read_text())

        def keys(d: dict, prefix: str = "") -> set[str]:
            out = set()
            for k, v in d.items():
                out.add(prefix + k)
                if isinstance(v, dict) and prefix + k not in (
                    "node.nodeSelector",
                    "controller.nodeSelector",
                    "monitoring.prometheusRule.labels",
                ):
                    out |= keys(v, prefix + k + ".")
            return out

        self.assertLessEqual(keys(UPGRADE_VALUES), keys(chart))
        self.assertEqual(merge(UPGRADE_VALUES, BASE_VALUES), UPGRADE_VALUES)


class Warnings(unittest.TestCase):
    def test_klog_warning_lines_are_found_and_unquoted(self) -> None:
        log = (
            "I1124 02:05:37.887194 3978 warnings.go:107] "
            '"Warning: unrecognized format \\"uint32\\""\n'
            "some other line\n"
        )
        self.assertEqual(api_warnings(log), ['unrecognized format "uint32"'])
        self.assertEqual(api_warnings("nothing to see\n"), [])


class Rbac(unittest.TestCase):
    def test_grants_needs_group_resource_and_verb_in_one_rule(self) -> None:
        role = {
            "rules": [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                {"apiGroups": ["x"], "resources": ["y"], "verbs": ["watch"]},
            ]
        }
        self.assertTrue(grants(role, "", "nodes", "get"))
        self.assertFalse(grants(role, "", "nodes", "watch"))

    def test_no_permission_is_both_needed_and_forbidden(self) -> None:
        values = yaml.safe_load((CHART / "values.yaml").read_text())
        modes = itertools.product((False, True), (False, True), ("csr", "sharedCA"))
        for rack, election, tls in modes:
            values["controller"]["rackMode"]["enabled"] = rack
            values["controller"]["leaderElection"]["enabled"] = election
            values["tls"]["mode"] = tls
            for who, (may, must_not) in checks(values, "ns").items():
                both = {tuple(a) for a in may} & {tuple(a) for a in must_not}
                self.assertFalse(both, f"{who}: {both}")

    def test_the_service_account_is_the_workloads(self) -> None:
        def workload(kind: str, component: str, account: str | None) -> dict:
            spec = {"serviceAccountName": account} if account else {}
            return {
                "kind": kind,
                "metadata": {"labels": {"app.kubernetes.io/component": component}},
                "spec": {"template": {"spec": spec}},
            }

        ds = workload("DaemonSet", "node", "n")
        runner = workload("DaemonSet", "imex-runner", None)
        self.assertEqual(service_account_of([ds, runner], "DaemonSet", "node"), "n")
        with self.assertRaises(E2EError):
            service_account_of([ds, ds], "DaemonSet", "node")
        with self.assertRaises(E2EError):
            service_account_of([ds], "Deployment", "controller")
        with self.assertRaises(E2EError):
            service_account_of([runner], "DaemonSet", "imex-runner")

    def test_the_kubeconfig_holds_server_ca_token_and_namespace(self) -> None:
        config = build_kubeconfig(
            "https://127.0.0.1:6443", "Q0E=", "system:serviceaccount:ns:sa", "tok", "ns"
        )
        context = config["contexts"][0]["context"]
        self.assertEqual(config["current-context"], config["contexts"][0]["name"])
        self.assertEqual(config["clusters"][0]["cluster"]["server"], "https://127.0.0.1:6443")
        self.assertEqual(config["clusters"][0]["cluster"]["certificate-authority-data"], "Q0E=")
        self.assertEqual(config["users"][0]["user"], {"token": "tok"})
        self.assertEqual(context["namespace"], "ns")


if __name__ == "__main__":
    unittest.main()
