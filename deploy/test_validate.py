"""Tests for deploy/validate.py: the shipped files pass, and each kind of mistake fails.

Run with: python -m pytest -q deploy/test_validate.py
Each test copies the deployment files into a temporary repository, breaks one thing, and runs
the validator on the copy.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY_DIR = Path(__file__).resolve().parent
REPO_ROOT = DEPLOY_DIR.parent

_spec = importlib.util.spec_from_file_location("sluice_deploy_validate", DEPLOY_DIR / "validate.py")
validate = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = validate
_spec.loader.exec_module(validate)


def source_config() -> Path:
    """config/edge.yaml once it exists; until then the ConfigMap's copy stands in for it."""
    config = REPO_ROOT / "config" / "edge.yaml"
    return config if config.is_file() else DEPLOY_DIR / "kubernetes" / "edge.yaml"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(
        DEPLOY_DIR, tmp_path / "deploy", ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache")
    )
    shutil.copy(REPO_ROOT / "Cargo.toml", tmp_path / "Cargo.toml")
    (tmp_path / "config").mkdir()
    shutil.copy(source_config(), tmp_path / "config" / "edge.yaml")
    return tmp_path


def run(repo: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = validate.main(["--root", str(repo)])
    return code, capsys.readouterr().out


def edit(repo: Path, relative: str, old: str, new: str) -> None:
    """Replaces every occurrence of `old` (comments included) in a file of the copy."""
    path = repo / relative
    text = path.read_text()
    assert old in text, f"{old!r} not in {relative}: the test no longer matches the file"
    path.write_text(text.replace(old, new))


def edit_yaml(repo: Path, relative: str, change: Callable[[list[Any]], None]) -> None:
    """Applies `change` to the parsed YAML documents of a file of the copy and writes them back."""
    path = repo / relative
    documents = list(yaml.safe_load_all(path.read_text()))
    change(documents)
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))


def envoy_vhost(documents: list[Any]) -> dict:
    hcm = documents[0]["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    return hcm["typed_config"]["route_config"]["virtual_hosts"][0]


def rlqs_filter(documents: list[Any]) -> dict:
    hcm = documents[0]["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    quota = next(f for f in hcm["typed_config"]["http_filters"] if f["name"] == validate.RATE_LIMIT_QUOTA_FILTER)
    return quota["typed_config"]


def rlqs_tenant_settings(documents: list[Any]) -> dict:
    """The bucket settings of the plain-tenant matcher (the second)."""
    matcher = rlqs_filter(documents)["bucket_matchers"]["matcher_list"]["matchers"][1]
    return matcher["on_match"]["action"]["typed_config"]


def istio_vhost_patch(documents: list[Any]) -> dict:
    patch = next(p for p in documents[0]["spec"]["configPatches"] if p["applyTo"] == "VIRTUAL_HOST")
    return patch["patch"]["value"]


def test_shipped_files_pass(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(repo, capsys)
    assert code == 0, out
    assert "all deployment files valid" in out


@pytest.mark.parametrize(
    ("relative", "old", "new", "expected"),
    [
        # Kubernetes objects, against the Kubernetes schemas.
        (
            "deploy/kubernetes/deployment.yaml",
            "readinessProbe:",
            "readinesProbe:",
            "'readinesProbe' was unexpected",
        ),
        (
            "deploy/kubernetes/hpa.yaml",
            "averageUtilization:",
            "averageUtilisation:",
            "'averageUtilisation' was unexpected",
        ),
        ("deploy/kubernetes/redis.yaml", "serviceName:", "servicename:", "'servicename' was unexpected"),
        (
            "deploy/kubernetes/service.yaml",
            "appProtocol: grpc",
            "appProtocols: grpc",
            "'appProtocols' was unexpected",
        ),
        (
            "deploy/kubernetes/kustomization.yaml",
            "configMapGenerator:",
            "configMapGenerater:",
            "'configMapGenerater' was unexpected",
        ),
        # The Envoy bootstrap, against the Envoy v3 protos (also inside typed_config).
        ("deploy/envoy/envoy.yaml", "grpc_service:", "grpc_servce:", "Unknown field 'grpc_servce'"),
        ("deploy/envoy/envoy.yaml", "stat_prefix:", "stats_prefix:", "Unknown field 'stats_prefix'"),
        ("deploy/envoy/envoy.yaml", "transport_api_version: V3", "transport_api_version: V4", "V4"),
        ("deploy/envoy/envoy.yaml", "timeout: 0.025s", "timeout: 25ms", "Invalid duration string: 25ms"),
        # The RLQS bootstrap: nested typed_configs (matcher input inside bucket settings inside the
        # filter inside the connection manager) are parsed too.
        (
            "deploy/envoy/envoy-rlqs.yaml",
            "header_name: x-plan",
            "header_nam: x-plan",
            "Unknown field 'header_nam'",
        ),
        (
            "deploy/envoy/envoy-rlqs.yaml",
            "fill_interval: 60s",
            "fill_interval: 60 s",
            "Invalid duration string: 60 s",
        ),
        # EnvoyFilter structure, and its patch values against the Envoy v3 protos.
        (
            "deploy/istio/ratelimit-filter.yaml",
            "configPatches:",
            "configPatchs:",
            "'configPatchs' was unexpected",
        ),
        (
            "deploy/istio/ratelimit-filter.yaml",
            "failure_mode_deny:",
            "failure_mode_deney:",
            "Unknown field 'failure_mode_deney'",
        ),
        (
            "deploy/istio/ratelimit-actions.yaml",
            "descriptor_key: tenant",
            "descriptor_kye: tenant",
            "Unknown field 'descriptor_kye'",
        ),
        (
            "deploy/istio/ratelimit-actions.yaml",
            "applyTo: HTTP_ROUTE",
            "applyTo: HTTP_ROUT",
            "'HTTP_ROUT' is not one of",
        ),
        (
            "deploy/istio/ratelimit-actions.yaml",
            "vh_rate_limits: INCLUDE",
            "vh_rate_limit: INCLUDE",
            "Unknown field 'vh_rate_limit'",
        ),
        # Alert rules and the dashboard.
        ("deploy/observability/alerts.yaml", "severity: warning", "severity: page", "'page' is not one of"),
        ("deploy/observability/alerts.yaml", "for: 10m", "for: 10 minutes", "does not match"),
        (
            "deploy/observability/alerts.yaml",
            "(sluice_config_last_load_failed)",
            "(sluice_config_last_load_failed",
            "alert SluiceConfigRejected: expr: unclosed '('",
        ),
        (
            "deploy/observability/grafana-dashboard.json",
            '"expr": "sum(rate(ratelimit_service_total_requests{job=~\\"$job\\"}[$__rate_interval]))"',
            '"expr": "sum(rate(ratelimit_service_total_requests{job=~\\"$job\\"}[$__rate_interval])"',
            "unclosed '('",
        ),
        ("deploy/observability/grafana-dashboard.json", '"w": 12,', '"w": 20,', "exceeds the 24 columns"),
    ],
)
def test_misspelled_field_fails(
    repo: Path, capsys: pytest.CaptureFixture[str], relative: str, old: str, new: str, expected: str
) -> None:
    edit(repo, relative, old, new)
    code, out = run(repo, capsys)
    assert code == 1
    assert expected in out
    assert f"FAIL {relative}" in out


def test_action_producing_an_unlimited_descriptor_fails(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A virtual-host action that sends [route=export] alone: the config limits route only under tenant.
    edit_yaml(
        repo,
        "deploy/envoy/envoy.yaml",
        lambda docs: envoy_vhost(docs)["rate_limits"].append(
            {"actions": [{"generic_key": {"descriptor_key": "route", "descriptor_value": "export"}}]}
        ),
    )
    code, out = run(repo, capsys)
    assert code == 1
    assert "FAIL deploy/envoy/envoy.yaml: actions produce descriptor [route=export]" in out
    assert "has no rule for it" in out


def test_plan_from_raw_header_value_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Taking x-plan's value verbatim sends [plan=<anything>, tenant]; only plan=free has a rule.
    def plan_from_header(documents: list[Any]) -> None:
        plan_limit = istio_vhost_patch(documents)["rate_limits"][2]
        assert "header_value_match" in plan_limit["actions"][0]
        plan_limit["actions"][0] = {"request_headers": {"header_name": "x-plan", "descriptor_key": "plan"}}

    edit_yaml(repo, "deploy/istio/ratelimit-actions.yaml", plan_from_header)
    code, out = run(repo, capsys)
    assert code == 1
    assert "FAIL deploy/istio: actions produce descriptor [plan, tenant]" in out


def test_config_rule_without_action_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def drop_remote_address(documents: list[Any]) -> None:
        limits = envoy_vhost(documents)["rate_limits"]
        limits[:] = [limit for limit in limits if "remote_address" not in limit["actions"][0]]

    edit_yaml(repo, "deploy/envoy/envoy.yaml", drop_remote_address)
    code, out = run(repo, capsys)
    assert code == 1
    assert "FAIL deploy/envoy/envoy.yaml: config rule [remote_address] is never produced" in out


def test_keying_on_raw_path_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(repo, "deploy/envoy/envoy.yaml", "header_name: x-tenant-id", 'header_name: ":path"')
    code, out = run(repo, capsys)
    assert code == 1
    assert "request_headers keys on :path" in out


def test_route_hiding_virtual_host_actions_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Envoy's default (OVERRIDE) drops the tenant, address and plan limits on /export.
    def override_on_export(documents: list[Any]) -> None:
        route = next(r for r in envoy_vhost(documents)["routes"] if r["name"] == "export")
        del route["typed_per_filter_config"]

    edit_yaml(repo, "deploy/envoy/envoy.yaml", override_on_export)
    code, out = run(repo, capsys)
    assert code == 1
    assert "route 'export': its own rate_limits hide the virtual host's" in out


def test_domain_mismatch_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(repo, "deploy/istio/ratelimit-filter.yaml", "domain: edge", "domain: internal")
    code, out = run(repo, capsys)
    assert code == 1
    assert "domain 'internal' differs from the config's 'edge'" in out


def test_configmap_copy_drift_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(repo, "deploy/kubernetes/edge.yaml", "requests_per_unit: 600", "requests_per_unit: 601")
    code, out = run(repo, capsys)
    assert code == 1
    assert "FAIL deploy/kubernetes/edge.yaml: differs from config/edge.yaml" in out


def test_unknown_kind_without_schema_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(repo, "deploy/kubernetes/pdb.yaml", "kind: PodDisruptionBudget", "kind: PodDisruptionBudgett")
    code, out = run(repo, capsys)
    assert code == 1
    assert "Couldn't find schema for kind PodDisruptionBudgett" in out


def test_duplicate_yaml_key_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(
        repo,
        "deploy/kubernetes/deployment.yaml",
        "  revisionHistoryLimit: 5\n",
        "  revisionHistoryLimit: 5\n  replicas: 1\n",
    )
    code, out = run(repo, capsys)
    assert code == 1
    assert "duplicate key 'replicas'" in out


def test_grace_period_shorter_than_drain_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(
        repo,
        "deploy/kubernetes/deployment.yaml",
        "terminationGracePeriodSeconds: 30",
        "terminationGracePeriodSeconds: 10",
    )
    code, out = run(repo, capsys)
    assert code == 1
    assert "terminationGracePeriodSeconds 10 must exceed" in out


def test_dockerfile_root_user_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(repo, "deploy/Dockerfile", "USER nonroot", "USER root")
    code, out = run(repo, capsys)
    assert code == 1
    assert "FAIL deploy/Dockerfile: the runtime stage must set a non-root USER" in out


def test_admin_listener_on_all_interfaces_without_a_token_fails(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(repo, "deploy/kubernetes/deployment.yaml", 'value: "127.0.0.1:6070"', 'value: "0.0.0.0:6070"')
    code, out = run(repo, capsys)
    assert code == 1
    assert "SLUICE_ADMIN_ADDR='0.0.0.0:6070' must stay on 127.0.0.1 unless SLUICE_ADMIN_TOKEN_FILE" in out


def test_probes_on_the_admin_port_fail(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (repo / "deploy/kubernetes/deployment.yaml").read_text()
    (repo / "deploy/kubernetes/deployment.yaml").write_text(
        text.replace("path: /readyz\n              port: http-metrics", "path: /readyz\n              port: 6070")
    )
    code, out = run(repo, capsys)
    assert code == 1
    assert "readinessProbe must GET /readyz on the metrics port" in out


def config_of(text: str) -> validate.DescriptorConfig:
    failures = validate.Failures(Path("/"))
    config = validate.parse_descriptor_config(yaml.safe_load(text), Path("/test.yaml"), failures)
    assert config is not None and not failures.lines
    return config


def test_request_value_needs_a_bare_key_rule() -> None:
    # Only a wildcard rule: an arbitrary tenant id is not limited, so the action is rejected.
    config = config_of(
        "domain: d\ndescriptors:\n  - {key: tenant, value: 'internal-*', rate_limit: {unlimited: true}}\n"
    )
    failures = validate.Failures(Path("/"))
    validate.compare_descriptors(config, {(("tenant", validate.ANY),): ["test"]}, Path("/x"), failures)
    assert any("actions produce descriptor [tenant]" in line for line in failures.lines)


def test_fixed_values_follow_exact_then_wildcard_then_bare() -> None:
    config = config_of(
        "domain: d\ndescriptors:\n"
        "  - {key: k, value: ab, rate_limit: {unit: second, requests_per_unit: 1}}\n"
        "  - {key: k, value: 'a*', rate_limit: {unit: second, requests_per_unit: 2}}\n"
        "  - {key: k, rate_limit: {unit: second, requests_per_unit: 3}}\n"
    )
    exact, wildcard, bare = config.roots
    assert validate.generic_match(config, (("k", "ab"),)) is exact
    assert validate.generic_match(config, (("k", "ax"),)) is wildcard
    assert validate.generic_match(config, (("k", "b"),)) is bare
    assert validate.generic_match(config, (("k", validate.ANY),)) is bare
    assert validate.reachable_rules(config, (("k", validate.ANY),)) == {id(exact), id(wildcard), id(bare)}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_render_matches_kubectl_kustomize(repo: Path) -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(repo / "deploy" / "kubernetes")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    from_kubectl = {(doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(rendered)}
    ours = validate.render_kustomization(repo / "deploy" / "kubernetes", validate.Failures(repo))
    # kustomize appends a content hash to generated ConfigMap names.
    normalized = {
        (kind, name.rsplit("-", 1)[0] if kind == "ConfigMap" else name) for kind, name in from_kubectl
    }
    assert normalized == {(doc["kind"], doc["metadata"]["name"]) for _, doc in ours}


RLQS = "deploy/envoy/envoy-rlqs.yaml"


def test_rlqs_bucket_without_rule_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # {customer: <header>}: no descriptor names `customer`, so sluice would answer ALLOW_ALL.
    def customer_bucket(documents: list[Any]) -> None:
        builder = rlqs_tenant_settings(documents)["bucket_id_builder"]["bucket_id_builder"]
        builder["customer"] = builder.pop("tenant")

    edit_yaml(repo, RLQS, customer_bucket)
    code, out = run(repo, capsys)
    assert code == 1
    assert f"FAIL {RLQS}: bucket_matchers build bucket id {{customer}}" in out
    assert "has no rule for it" in out


def test_rlqs_domain_mismatch_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(repo, RLQS, "domain: edge", "domain: internal")
    code, out = run(repo, capsys)
    assert code == 1
    assert f"FAIL {RLQS}: listener 'ingress': domain 'internal' differs from the config's 'edge'" in out


def test_rlqs_server_cluster_must_exist_and_speak_http2(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def break_clusters(documents: list[Any]) -> None:
        rlqs_filter(documents)["rlqs_server"]["envoy_grpc"]["cluster_name"] = "ratelimit"
        sluice = next(c for c in documents[0]["static_resources"]["clusters"] if c["name"] == "sluice")
        sluice["name"] = "ratelimit"
        del sluice["typed_extension_protocol_options"]

    edit_yaml(repo, RLQS, break_clusters)
    code, out = run(repo, capsys)
    assert code == 1
    assert f"FAIL {RLQS}: cluster 'ratelimit' must speak HTTP/2" in out

    edit_yaml(repo, RLQS, lambda docs: rlqs_filter(docs)["rlqs_server"]["envoy_grpc"].update(cluster_name="gone"))
    code, out = run(repo, capsys)
    assert code == 1
    assert f"FAIL {RLQS}: rlqs_server cluster 'gone' is not defined" in out


def test_rlqs_sub_second_fill_interval_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(repo, RLQS, "fill_interval: 1s", "fill_interval: 0.5s")
    code, out = run(repo, capsys)
    assert code == 1
    assert "expired_assignment_behavior: token_bucket fill_interval 0.5s: Envoy truncates it" in out


def test_rlqs_token_bucket_before_the_first_assignment_fails(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def token_bucket_first(documents: list[Any]) -> None:
        settings = rlqs_tenant_settings(documents)
        settings["no_assignment_behavior"] = {"fallback_rate_limit": {"token_bucket": {
            "max_tokens": 100, "tokens_per_fill": 10, "fill_interval": "1s"}}}

    edit_yaml(repo, RLQS, token_bucket_first)
    code, out = run(repo, capsys)
    assert code == 1
    assert "no_assignment_behavior: a token_bucket crashes Envoy 1.36-1.40" in out


def test_rlqs_reporting_interval_at_envoys_minimum_fails(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(repo, RLQS, "reporting_interval: 1s", "reporting_interval: 0.1s")
    code, out = run(repo, capsys)
    assert code == 1
    assert "reporting_interval must be set and above 100ms" in out


def test_rlqs_bucket_keyed_on_raw_path_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def path_bucket(documents: list[Any]) -> None:
        builder = rlqs_tenant_settings(documents)["bucket_id_builder"]["bucket_id_builder"]
        builder["tenant"]["custom_value"]["typed_config"]["header_name"] = ":path"

    edit_yaml(repo, RLQS, path_bucket)
    code, out = run(repo, capsys)
    assert code == 1
    assert "bucket id entry 'tenant' takes :path" in out


def test_rlqs_catch_all_without_bucket_id_fails(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def unreported(documents: list[Any]) -> None:
        del rlqs_filter(documents)["bucket_matchers"]["on_no_match"]["action"]["typed_config"]["bucket_id_builder"]

    edit_yaml(repo, RLQS, unreported)
    code, out = run(repo, capsys)
    assert code == 1
    assert "bucket_matchers.on_no_match (anonymous): no bucket_id_builder" in out


def test_bucket_id_entries_are_placed_by_key_with_backtracking() -> None:
    config = config_of(
        "domain: d\ndescriptors:\n"
        "  - key: plan\n"
        "  - key: tenant\n"
        "    descriptors:\n"
        "      - {key: plan, value: free, rate_limit: {unit: second, requests_per_unit: 1}}\n"
        "      - {key: plan, rate_limit: {unit: second, requests_per_unit: 2}}\n"
    )
    plan_free, plan_any = config.roots[1].children
    # `plan` sorts first and lands on the bare root `plan`, which has nothing below for `tenant`:
    # backtrack and place `tenant` first.
    assert validate.bucket_match(config, (("plan", "free"), ("tenant", validate.ANY))) is plan_free
    assert validate.bucket_match(config, (("plan", "gold"), ("tenant", "acme"))) is plan_any
    # The bare root `plan` is reached, but it has no rule; an entry nothing names is never placed.
    assert not validate.bucket_match(config, (("plan", "free"),)).has_rule
    assert validate.bucket_match(config, (("tenant", "acme"), ("region", "eu"))) is None
    assert validate.bucket_match(config, (("plan", "free"), ("tenant", "a"), ("user", "u"))) is None
