#!/usr/bin/env python3
"""Offline validation of sluice's deployment files.

Checks, without a cluster, an Envoy binary or the network:

1. Kubernetes: the kustomization in deploy/kubernetes/ is rendered (its `resources` concatenated,
   its `configMapGenerator` turned into ConfigMaps) and every object is validated against the
   Kubernetes OpenAPI schemas shipped by `kubernetes-validate`, strictly (an unknown field
   fails). Then the requirements of a production rollout: probes, security context, resources,
   replicas, grace period longer than the drain, selectors and ports that line up.
2. Envoy: deploy/envoy/envoy.yaml (RLS) and deploy/envoy/envoy-rlqs.yaml (the rate_limit_quota
   filter) are parsed as envoy.config.bootstrap.v3.Bootstrap, and every
   EnvoyFilter patch value in deploy/istio/ as the message its `applyTo` names, with the Envoy v3
   protos of `envoy-data-plane` (betterproto2 classes; unknown fields, bad enum values, bad
   durations and two members of one oneof fail). typed_config `@type`s are resolved to their
   message classes, so nested configs are checked too. EnvoyFilter objects themselves (a CRD
   with no schema in kubernetes-validate) are checked against the subset of Istio's schema
   in deploy/schemas/envoyfilter.yaml.
3. Descriptors: the set of descriptors the Envoy actions can produce (bootstrap AND EnvoyFilter)
   must equal the set the descriptor config has rules for: every produced descriptor reaches a
   rule, and every rule is reachable. Every bucket id the RLQS bootstrap's bucket_matchers can
   build reaches a rule too, matched as sluice matches a BucketId (see `bucket_match`).
4. The ConfigMap's copy deploy/kubernetes/edge.yaml equals the descriptor config byte for byte.
5. The Dockerfile agrees with the Deployment (ports, config path, non-root user).
6. Observability: deploy/observability/alerts.yaml is a Prometheus rule file (groups, unique
   alert names, `for` durations, a severity, summary and description, expressions with balanced
   brackets and quotes) and grafana-dashboard.json a dashboard whose panels query through the
   `datasource` variable, fit the 24-column grid and have unique ids. (That every metric they use
   exists is checked against a real scrape by integration/observability.rs.)

Usage: validate.py [--root REPO] [--config PATH]     (exit 1 with one line per failure)
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import importlib
import json
import re
import sys
import tomllib
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import yaml

# 1.30 is the oldest release these manifests support (the preStop `sleep` action is on by
# default from 1.30); 1.37 is the newest schema set of the pinned kubernetes-validate.
KUBERNETES_VERSIONS = ("1.30", "1.37")

# Kinds that have no schema in kubernetes-validate. Each is validated another way; any other
# kind without a schema fails.
CRD_ALLOW_LIST = {("networking.istio.io/v1alpha3", "EnvoyFilter")}

# sluice drains for about this long after SIGTERM before it exits.
SLUICE_DRAIN_SECONDS = 10

RATELIMIT_FILTER = "envoy.filters.http.ratelimit"
ROUTER_FILTER = "envoy.filters.http.router"
HCM_TYPE = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
RATELIMIT_TYPE = "envoy.extensions.filters.http.ratelimit.v3.RateLimit"
RATELIMIT_PER_ROUTE_TYPE = "envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute"
HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
RATE_LIMIT_QUOTA_FILTER = "envoy.filters.http.rate_limit_quota"
RATE_LIMIT_QUOTA_TYPE = "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig"
BUCKET_SETTINGS_TYPE = "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings"
# The one dynamic bucket-id value modelled: a request header (Envoy's docs use it for custom_value).
HEADER_INPUT_TYPE = "envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
# Envoy refuses a reporting_interval of 100 ms or less.
MIN_REPORTING_INTERVAL_SECONDS = 0.1

# Request headers that carry the raw path: keying a descriptor on them is unbounded.
UNBOUNDED_HEADERS = {":path", "x-envoy-original-path"}

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
# What the kustomization renderer understands, and the subset of Istio's EnvoyFilter schema in use.
KUSTOMIZATION_SCHEMA: dict[str, Any] = yaml.safe_load((SCHEMA_DIR / "kustomization.yaml").read_text())
ENVOYFILTER_SCHEMA: dict[str, Any] = yaml.safe_load((SCHEMA_DIR / "envoyfilter.yaml").read_text())

# EnvoyFilter applyTo -> the Envoy message its patch value is (module, class name).
PATCH_VALUE_TYPES = {
    "LISTENER": ("envoy.config.listener.v3", "Listener"),
    "FILTER_CHAIN": ("envoy.config.listener.v3", "FilterChain"),
    "NETWORK_FILTER": ("envoy.config.listener.v3", "Filter"),
    "HTTP_FILTER": ("envoy.extensions.filters.network.http_connection_manager.v3", "HttpFilter"),
    "ROUTE_CONFIGURATION": ("envoy.config.route.v3", "RouteConfiguration"),
    "VIRTUAL_HOST": ("envoy.config.route.v3", "VirtualHost"),
    "HTTP_ROUTE": ("envoy.config.route.v3", "Route"),
    "CLUSTER": ("envoy.config.cluster.v3", "Cluster"),
}


class Failures:
    """Collects one line per problem; validation goes on after a failure to report them all."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lines: list[str] = []

    def add(self, where: Path | str, message: str) -> None:
        if isinstance(where, Path):
            try:
                where = str(where.relative_to(self.root))
            except ValueError:
                where = str(where)
        self.lines.append(f"{where}: {message}")


# ---------------------------------------------------------------------------------------------
# YAML


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML keeps the last one silently)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    mapping: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in mapping:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_documents(path: Path, failures: Failures) -> list[Any]:
    try:
        text = path.read_text()
    except OSError as error:
        failures.add(path, f"cannot read: {error.strerror}")
        return []
    try:
        return [doc for doc in yaml.load_all(text, Loader=_StrictLoader) if doc is not None]
    except yaml.YAMLError as error:
        failures.add(path, f"invalid YAML: {error}")
        return []


def load_yaml_document(path: Path, failures: Failures) -> Any:
    documents = load_yaml_documents(path, failures)
    if len(documents) != 1:
        if documents:
            failures.add(path, f"expected one YAML document, found {len(documents)}")
        return None
    return documents[0]


def json_path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".") or "(top level)"


def schema_errors(schema: dict, instance: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{json_path(error.absolute_path)}: {error.message}"
        for error in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    ]


# ---------------------------------------------------------------------------------------------
# Descriptor config and descriptor matching

ANY = None  # an action entry whose value comes from the request: any value


@dataclass
class RuleNode:
    key: str
    value: str | None  # None: bare key (any value); "prefix*": wildcard
    has_rule: bool  # has a rate_limit (a limit or `unlimited: true`)
    children: list[RuleNode] = field(default_factory=list)
    path: tuple[tuple[str, str | None], ...] = ()

    def label(self) -> str:
        return describe(self.path)


def describe(entries: Iterable[tuple[str, str | None]]) -> str:
    return "[" + ", ".join(key if value is None else f"{key}={value}" for key, value in entries) + "]"


@dataclass
class DescriptorConfig:
    domain: str
    roots: list[RuleNode]

    def rule_nodes(self) -> list[RuleNode]:
        found: list[RuleNode] = []

        def walk(nodes: list[RuleNode]) -> None:
            for node in nodes:
                if node.has_rule:
                    found.append(node)
                walk(node.children)

        walk(self.roots)
        return found


def load_descriptor_config(path: Path, failures: Failures) -> DescriptorConfig | None:
    document = load_yaml_document(path, failures)
    return None if document is None else parse_descriptor_config(document, path, failures)


def parse_descriptor_config(document: Any, path: Path, failures: Failures) -> DescriptorConfig | None:
    if not isinstance(document, dict) or not isinstance(document.get("domain"), str):
        failures.add(path, "descriptor config needs a string `domain`")
        return None

    def build(items: Any, parent: tuple[tuple[str, str | None], ...], where: str) -> list[RuleNode]:
        nodes: list[RuleNode] = []
        if items is None:
            return nodes
        if not isinstance(items, list):
            failures.add(path, f"{where}: `descriptors` must be a list")
            return nodes
        for index, item in enumerate(items):
            here = f"{where}[{index}]"
            if not isinstance(item, dict) or not isinstance(item.get("key"), str) or not item["key"]:
                failures.add(path, f"{here}: every descriptor needs a non-empty string `key`")
                continue
            value = item.get("value")
            if value is not None and not isinstance(value, str):
                failures.add(path, f"{here}: `value` must be a string")
                continue
            entry_path = parent + ((item["key"], value or None),)
            node = RuleNode(
                key=item["key"],
                value=value or None,
                has_rule=isinstance(item.get("rate_limit"), dict),
                path=entry_path,
            )
            node.children = build(item.get("descriptors"), entry_path, f"{here}.descriptors")
            nodes.append(node)
        return nodes

    return DescriptorConfig(document["domain"], build(document.get("descriptors"), (), "descriptors"))


def _select(nodes: list[RuleNode], key: str, value: str | None) -> list[RuleNode]:
    """The nodes an entry can land on, as envoyproxy/ratelimit looks it up: exact value, then the
    first matching wildcard, then the bare key. A request-supplied value (ANY) can land on any of
    them."""
    same_key = [node for node in nodes if node.key == key]
    bare = [node for node in same_key if node.value is None]
    if value is ANY:
        return bare + [node for node in same_key if node.value is not None]
    exact = [node for node in same_key if node.value == value]
    if exact:
        return exact[:1]
    for node in same_key:
        if node.value is not None and node.value.endswith("*") and value.startswith(node.value[:-1]):
            return [node]
    return bare[:1]


def generic_match(
    config: DescriptorConfig, descriptor: tuple[tuple[str, str | None], ...]
) -> RuleNode | None:
    """The node a descriptor reaches for values that are not special-cased in the config: a
    request-supplied value then only matches a bare key."""
    nodes = config.roots
    node: RuleNode | None = None
    for key, value in descriptor:
        candidates = _select(nodes, key, value)
        if value is ANY:
            candidates = [candidate for candidate in candidates if candidate.value is None]
        if not candidates:
            return None
        node = candidates[0]
        nodes = node.children
    return node


def reachable_rules(config: DescriptorConfig, descriptor: tuple[tuple[str, str | None], ...]) -> set[int]:
    """ids of every rule node some request could reach with this descriptor."""
    frontier = [(config.roots, None)]
    for key, value in descriptor:
        frontier = [(node.children, node) for nodes, _ in frontier for node in _select(nodes, key, value)]
    return {id(node) for _, node in frontier if node is not None and node.has_rule}


def compare_descriptors(
    config: DescriptorConfig,
    produced: dict[tuple[tuple[str, str | None], ...], list[str]],
    source: Path,
    failures: Failures,
) -> None:
    """Produced descriptors (with where each comes from) must equal the config's rule set."""
    covered: set[int] = set()
    for descriptor, origins in sorted(produced.items(), key=lambda item: describe(item[0])):
        node = generic_match(config, descriptor)
        if node is None or not node.has_rule:
            failures.add(
                source,
                f"actions produce descriptor {describe(descriptor)} ({'; '.join(origins)}) but the "
                f"config (domain {config.domain}) has no rule for it",
            )
        covered |= reachable_rules(config, descriptor)
    for node in config.rule_nodes():
        if id(node) not in covered:
            failures.add(source, f"config rule {node.label()} is never produced by any rate-limit action")


Bucket = tuple[tuple[str, str | None], ...]  # an RLQS BucketId's entries, sorted by key


def describe_bucket(bucket: Bucket) -> str:
    return "{" + ", ".join(key if value is None else f"{key}={value}" for key, value in bucket) + "}"


def bucket_match(config: DescriptorConfig, bucket: Bucket) -> RuleNode | None:
    """The node an RLQS bucket id reaches, as sluice maps the unordered map onto the tree: at each
    level, place an entry whose key a descriptor at that level names (entries tried in key order),
    looked up as an RLS entry is (exact value, first matching wildcard, bare key; a header value
    only on the bare key); backtrack to the next entry when the rest cannot be placed below. The
    first placement that uses every entry wins; None if there is none."""

    def place(nodes: list[RuleNode], remaining: Bucket) -> RuleNode | None:
        for index, (key, value) in enumerate(remaining):
            candidates = _select(nodes, key, value)
            if value is ANY:
                candidates = [node for node in candidates if node.value is None]
            if not candidates:
                continue
            node, rest = candidates[0], remaining[:index] + remaining[index + 1 :]
            reached = node if not rest else place(node.children, rest)
            if reached is not None:
                return reached
        return None

    return place(config.roots, tuple(sorted(bucket)))


def compare_buckets(
    config: DescriptorConfig, produced: dict[Bucket, list[str]], source: Path, failures: Failures
) -> list[str]:
    """Every bucket id the matchers build must reach a rule; returns "bucket -> rule" lines."""
    reached: list[str] = []
    for bucket, origins in sorted(produced.items(), key=lambda item: describe_bucket(item[0])):
        node = bucket_match(config, bucket)
        if node is None or not node.has_rule:
            failures.add(
                source,
                f"bucket_matchers build bucket id {describe_bucket(bucket)} ({'; '.join(origins)}) but "
                f"the config (domain {config.domain}) has no rule for it: sluice would assign ALLOW_ALL",
            )
            continue
        reached.append(f"{describe_bucket(bucket)} -> {node.label()}")
    return reached


# ---------------------------------------------------------------------------------------------
# Envoy protos


@functools.cache
def envoy_module(package: str) -> Any:
    with warnings.catch_warnings():
        # The generated classes use a pydantic idiom that pydantic 2.12+ flags as deprecated.
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(f"envoy_data_plane.{package}")


def register_type_urls(value: Any) -> list[str]:
    """Imports the module of every `@type` in `value` (which registers its messages for Any);
    returns the type URLs no module provides."""
    unknown: list[str] = []
    if isinstance(value, dict):
        type_url = value.get("@type")
        if isinstance(type_url, str):
            full_name = type_url.rsplit("/", 1)[-1]
            package = full_name.rpartition(".")[0]
            try:
                envoy_module(package)
            except ImportError:
                unknown.append(type_url)
        for item in value.values():
            unknown += register_type_urls(item)
    elif isinstance(value, list):
        for item in value:
            unknown += register_type_urls(item)
    return unknown


def parse_envoy(module: str, message: str, value: Any, where: Path, context: str, failures: Failures) -> Any:
    """Parses a JSON/YAML value as an Envoy v3 message, strictly; None (and a failure) if invalid."""
    for type_url in register_type_urls(value):
        failures.add(where, f"{context}: unknown @type {type_url}")
    try:
        cls = getattr(envoy_module(module), message)
        return cls.from_dict(value)
    except Exception as error:  # betterproto2 raises KeyError/ValueError/TypeError/pydantic errors
        text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        text = " ".join(str(text).split())
        failures.add(where, f"{context}: not a valid {module}.{message}: {text}")
        return None


def type_name(any_message: Any) -> str:
    return any_message.type_url.rsplit("/", 1)[-1] if any_message is not None else ""


def action_alternatives(action: Any) -> list[tuple[str, str | None] | None] | str:
    """The descriptor entries one rate-limit action can append (None: appends nothing and the
    descriptor is still sent), or an error string for actions this validator does not model."""
    if action.request_headers is not None:
        if action.request_headers.header_name.lower() in UNBOUNDED_HEADERS:
            return (
                f"request_headers keys on {action.request_headers.header_name}: every distinct path "
                "becomes its own bucket and metric series, and varying the path escapes the limit; "
                "use a generic_key on the route or a header_value_match with a fixed value"
            )
        entry = (action.request_headers.descriptor_key, ANY)
        return [entry, None] if action.request_headers.skip_if_absent else [entry]
    if action.remote_address is not None:
        return [("remote_address", ANY)]
    if action.masked_remote_address is not None:
        return [("masked_remote_address", ANY)]
    if action.generic_key is not None:
        key = action.generic_key.descriptor_key or "generic_key"
        return [(key, action.generic_key.descriptor_value)]
    if action.header_value_match is not None:
        match = action.header_value_match
        key = match.descriptor_key or "header_match"
        values = [match.descriptor_value] + ([match.default_value] if match.default_value else [])
        return [(key, value) for value in values]
    kinds = [name for name, value in vars(action).items() if value is not None and not name.startswith("_")]
    return f"rate-limit action {kinds or '(empty)'} is not modelled by validate.py"


def descriptors_of(
    rate_limits: list[Any], filter_stage: int, origin: str, where: Path, failures: Failures
) -> dict[tuple[tuple[str, str | None], ...], list[str]]:
    produced: dict[tuple[tuple[str, str | None], ...], list[str]] = {}
    for index, rate_limit in enumerate(rate_limits):
        here = f"{origin} rate_limits[{index}]"
        if (rate_limit.stage or 0) != filter_stage:
            failures.add(
                where, f"{here}: stage {rate_limit.stage} never reaches the filter (stage {filter_stage})"
            )
            continue
        if not rate_limit.actions:
            failures.add(where, f"{here}: no actions")
            continue
        shapes: list[tuple[tuple[str, str | None], ...]] = [()]
        for action in rate_limit.actions:
            alternatives = action_alternatives(action)
            if isinstance(alternatives, str):
                failures.add(where, f"{here}: {alternatives}")
                shapes = []
                break
            shapes = [shape + ((entry,) if entry else ()) for shape in shapes for entry in alternatives]
        for shape in shapes:
            if shape:
                produced.setdefault(shape, []).append(here)
    return produced


def merge_into(target: dict, source: dict) -> None:
    for descriptor, origins in source.items():
        known = target.setdefault(descriptor, [])
        known.extend(origin for origin in origins if origin not in known)


def vh_option(route: Any) -> str:
    """How a route combines its rate limits with its virtual host's: OVERRIDE, INCLUDE or IGNORE."""
    if route.route is not None and route.route.include_vh_rate_limits:
        return "INCLUDE"
    per_route = (route.typed_per_filter_config or {}).get(RATELIMIT_FILTER)
    if per_route is not None and type_name(per_route) == RATELIMIT_PER_ROUTE_TYPE:
        return per_route.unpack().vh_rate_limits.name
    return "OVERRIDE"


def route_descriptors(
    route: Any, vh_limits: dict, filter_stage: int, origin: str, where: Path, failures: Failures
) -> dict:
    own = route.route.rate_limits if route.route is not None else []
    produced = descriptors_of(own, filter_stage, origin, where, failures)
    option = vh_option(route)
    if option == "OVERRIDE" and own and vh_limits:
        # Envoy's default: a route with its own rate_limits silently drops the virtual host's.
        failures.add(
            where,
            f"{origin}: its own rate_limits hide the virtual host's; set vh_rate_limits: INCLUDE "
            "(or IGNORE, if that is the intent) in its RateLimitPerRoute",
        )
    if option == "INCLUDE" or (option == "OVERRIDE" and not own):
        merge_into(produced, vh_limits)
    return produced


def check_ratelimit_filter(
    config: Any, descriptor_config: DescriptorConfig | None, where: Path, context: str, failures: Failures
) -> None:
    if descriptor_config is not None and config.domain != descriptor_config.domain:
        failures.add(
            where,
            f"{context}: domain {config.domain!r} differs from the config's {descriptor_config.domain!r}",
        )
    if config.timeout is None:
        failures.add(where, f"{context}: set an explicit `timeout`")
    elif not 0 < config.timeout.total_seconds() <= 1:
        failures.add(where, f"{context}: timeout {config.timeout} is outside (0, 1s]")
    service = config.rate_limit_service
    if service is None or service.grpc_service is None or service.grpc_service.envoy_grpc is None:
        failures.add(where, f"{context}: rate_limit_service.grpc_service.envoy_grpc is required")
    elif service.transport_api_version is None or service.transport_api_version.name != "V3":
        failures.add(where, f"{context}: rate_limit_service.transport_api_version must be V3")


def ratelimit_cluster(config: Any) -> str | None:
    try:
        return config.rate_limit_service.grpc_service.envoy_grpc.cluster_name
    except AttributeError:
        return None


def check_bootstrap(
    path: Path, descriptor_config: DescriptorConfig | None, failures: Failures
) -> dict[tuple[tuple[str, str | None], ...], list[str]] | None:
    """Validates the bootstrap; returns the descriptors its actions produce (None: unparseable)."""
    document = load_yaml_document(path, failures)
    if document is None:
        return None
    bootstrap = parse_envoy("envoy.config.bootstrap.v3", "Bootstrap", document, path, "bootstrap", failures)
    if bootstrap is None:
        return None
    resources = bootstrap.static_resources
    if resources is None:
        failures.add(path, "bootstrap has no static_resources")
        return None
    clusters = {cluster.name: cluster for cluster in resources.clusters}
    produced: dict = {}
    ratelimit_filters = 0
    for listener in resources.listeners:
        for chain in listener.filter_chains:
            for network_filter in chain.filters:
                if type_name(network_filter.typed_config) != HCM_TYPE:
                    continue
                hcm = network_filter.typed_config.unpack()
                context = f"listener {listener.name!r}"
                names = [http_filter.name for http_filter in hcm.http_filters]
                if not names or names[-1] != ROUTER_FILTER:
                    failures.add(
                        path, f"{context}: {ROUTER_FILTER} must be the last HTTP filter, got {names}"
                    )
                if RATELIMIT_FILTER not in names:
                    continue
                ratelimit_filters += 1
                http_filter = hcm.http_filters[names.index(RATELIMIT_FILTER)]
                if type_name(http_filter.typed_config) != RATELIMIT_TYPE:
                    failures.add(path, f"{context}: {RATELIMIT_FILTER} needs a {RATELIMIT_TYPE} typed_config")
                    continue
                rl_config = http_filter.typed_config.unpack()
                check_ratelimit_filter(rl_config, descriptor_config, path, context, failures)
                check_rls_cluster(clusters.get(ratelimit_cluster(rl_config) or ""), rl_config, path, failures)
                if hcm.route_config is None:
                    failures.add(path, f"{context}: needs an inline route_config to check the actions")
                    continue
                for vhost in hcm.route_config.virtual_hosts:
                    vh_origin = f"virtual host {vhost.name!r}"
                    vh_limits = descriptors_of(
                        vhost.rate_limits, rl_config.stage or 0, vh_origin, path, failures
                    )
                    for route in vhost.routes:
                        target = route.route.cluster if route.route is not None else None
                        if target and target not in clusters:
                            failures.add(path, f"route {route.name!r} targets unknown cluster {target!r}")
                        origin = f"route {route.name or '(unnamed)'!r}"
                        merge_into(
                            produced,
                            route_descriptors(route, vh_limits, rl_config.stage or 0, origin, path, failures),
                        )
    if ratelimit_filters == 0:
        failures.add(path, f"no HTTP connection manager has the {RATELIMIT_FILTER} filter")
    return produced


def check_rls_cluster(cluster: Any, rl_config: Any, path: Path, failures: Failures) -> None:
    check_grpc_cluster(cluster, ratelimit_cluster(rl_config), "rate limit service", path, failures)


def check_grpc_cluster(cluster: Any, name: str | None, role: str, path: Path, failures: Failures) -> None:
    if cluster is None:
        failures.add(path, f"{role} cluster {name!r} is not defined")
        return
    options = (cluster.typed_extension_protocol_options or {}).get(HTTP_PROTOCOL_OPTIONS)
    http2 = False
    if options is not None and type_name(options) == HTTP_PROTOCOL_OPTIONS:
        explicit = options.unpack().explicit_http_config
        http2 = explicit is not None and explicit.http2_protocol_options is not None
    if not http2:
        failures.add(
            path,
            f"cluster {name!r} must speak HTTP/2 (typed_extension_protocol_options "
            f"{HTTP_PROTOCOL_OPTIONS} explicit_http_config.http2_protocol_options)",
        )


def check_rlqs_bootstrap(
    path: Path, descriptor_config: DescriptorConfig | None, failures: Failures
) -> dict[Bucket, list[str]] | None:
    """Validates the rate_limit_quota bootstrap; returns the bucket ids its matchers build (None:
    unparseable)."""
    document = load_yaml_document(path, failures)
    if document is None:
        return None
    bootstrap = parse_envoy("envoy.config.bootstrap.v3", "Bootstrap", document, path, "bootstrap", failures)
    if bootstrap is None:
        return None
    resources = bootstrap.static_resources
    if resources is None:
        failures.add(path, "bootstrap has no static_resources")
        return None
    clusters = {cluster.name: cluster for cluster in resources.clusters}
    produced: dict[Bucket, list[str]] = {}
    quota_filters = 0
    for listener in resources.listeners:
        for chain in listener.filter_chains:
            for network_filter in chain.filters:
                if type_name(network_filter.typed_config) != HCM_TYPE:
                    continue
                hcm = network_filter.typed_config.unpack()
                context = f"listener {listener.name!r}"
                names = [http_filter.name for http_filter in hcm.http_filters]
                if not names or names[-1] != ROUTER_FILTER:
                    failures.add(
                        path, f"{context}: {ROUTER_FILTER} must be the last HTTP filter, got {names}"
                    )
                if RATE_LIMIT_QUOTA_FILTER not in names:
                    continue
                quota_filters += 1
                http_filter = hcm.http_filters[names.index(RATE_LIMIT_QUOTA_FILTER)]
                if type_name(http_filter.typed_config) != RATE_LIMIT_QUOTA_TYPE:
                    failures.add(
                        path,
                        f"{context}: {RATE_LIMIT_QUOTA_FILTER} needs a {RATE_LIMIT_QUOTA_TYPE} typed_config",
                    )
                    continue
                config = http_filter.typed_config.unpack()
                cluster = check_quota_filter(config, descriptor_config, path, context, failures)
                if cluster is not None:
                    check_grpc_cluster(clusters.get(cluster), cluster, "rlqs_server", path, failures)
                actions = matcher_actions(config.bucket_matchers, "bucket_matchers", path, failures)
                for action, where in actions:
                    bucket = bucket_of(action, f"{context} {where}", path, failures)
                    if bucket is not None:
                        produced.setdefault(bucket, []).append(where)
    if quota_filters == 0:
        failures.add(path, f"no HTTP connection manager has the {RATE_LIMIT_QUOTA_FILTER} filter")
    return produced


def check_quota_filter(
    config: Any, descriptor_config: DescriptorConfig | None, path: Path, context: str, failures: Failures
) -> str | None:
    """Checks the filter's own fields; returns the rlqs_server cluster name."""
    if not config.domain:
        failures.add(path, f"{context}: rate_limit_quota needs a `domain`")
    elif descriptor_config is not None and config.domain != descriptor_config.domain:
        failures.add(
            path,
            f"{context}: domain {config.domain!r} differs from the config's {descriptor_config.domain!r}",
        )
    if config.bucket_matchers is None:
        failures.add(path, f"{context}: rate_limit_quota needs `bucket_matchers`")
    server = config.rlqs_server
    if server is None or server.envoy_grpc is None or not server.envoy_grpc.cluster_name:
        failures.add(path, f"{context}: rlqs_server.envoy_grpc.cluster_name is required")
        return None
    return server.envoy_grpc.cluster_name


def matcher_actions(matcher: Any, where: str, path: Path, failures: Failures) -> list[tuple[Any, str]]:
    """Every action (TypedExtensionConfig) an xds matcher tree can end in, with where it is."""
    if matcher is None:
        return []
    found: list[tuple[Any, str]] = []
    if matcher.matcher_list is not None:
        for index, field_matcher in enumerate(matcher.matcher_list.matchers):
            here = f"{where}.matcher_list.matchers[{index}]"
            found += on_match_actions(field_matcher.on_match, here, path, failures)
    if matcher.matcher_tree is not None:
        tree = matcher.matcher_tree
        if tree.custom_match is not None:
            failures.add(path, f"{where}.matcher_tree: custom_match is not modelled by validate.py")
        for map_name in ("exact_match_map", "prefix_match_map"):
            match_map = getattr(tree, map_name)
            for key, on_match in sorted((match_map.map if match_map is not None else {}).items()):
                found += on_match_actions(on_match, f"{where}.matcher_tree.{map_name}[{key}]", path, failures)
    if matcher.on_no_match is not None:
        found += on_match_actions(matcher.on_no_match, f"{where}.on_no_match", path, failures)
    return found


def on_match_actions(on_match: Any, where: str, path: Path, failures: Failures) -> list[tuple[Any, str]]:
    if on_match is not None and on_match.matcher is not None:
        return matcher_actions(on_match.matcher, f"{where}.matcher", path, failures)
    if on_match is None or on_match.action is None:
        failures.add(path, f"{where}: on_match needs an action or a nested matcher")
        return []
    return [(on_match.action, f"{where} ({on_match.action.name or 'unnamed'})")]


def bucket_of(action: Any, where: str, path: Path, failures: Failures) -> Bucket | None:
    """The bucket id an action builds (a header value as ANY), after checking its settings."""
    if type_name(action.typed_config) != BUCKET_SETTINGS_TYPE:
        failures.add(path, f"{where}: the action must be a {BUCKET_SETTINGS_TYPE}")
        return None
    settings = action.typed_config.unpack()
    interval = settings.reporting_interval
    if interval is None or interval.total_seconds() <= MIN_REPORTING_INTERVAL_SECONDS:
        failures.add(path, f"{where}: reporting_interval must be set and above 100ms")
    no_assignment = settings.no_assignment_behavior
    expired = settings.expired_assignment_behavior
    no_assignment_strategy = no_assignment.fallback_rate_limit if no_assignment else None
    if no_assignment_strategy is not None and no_assignment_strategy.token_bucket is not None:
        failures.add(
            path,
            f"{where}: no_assignment_behavior: a token_bucket crashes Envoy 1.36-1.40 (a null token "
            "bucket is consumed between a bucket's first request and its first assignment, and "
            "whenever an assignment expires with no expired_assignment_behavior left); use a "
            "blanket_rule (ALLOW_ALL, the default, or DENY_ALL) and put the token bucket in "
            "expired_assignment_behavior",
        )
    for name, strategy in (
        ("no_assignment_behavior", no_assignment_strategy),
        ("expired_assignment_behavior", expired.fallback_rate_limit if expired else None),
    ):
        problem = fallback_problem(strategy)
        if problem:
            failures.add(path, f"{where}: {name}: {problem}")
    builders = settings.bucket_id_builder.bucket_id_builder if settings.bucket_id_builder else {}
    if not builders:
        failures.add(
            path, f"{where}: no bucket_id_builder: its requests are never reported, sluice never limits them"
        )
        return None
    entries: list[tuple[str, str | None]] = []
    for key, builder in sorted(builders.items()):
        if builder.custom_value is None:
            if not builder.string_value:
                failures.add(path, f"{where}: bucket id entry {key!r} has an empty value")
                return None
            entries.append((key, builder.string_value))
            continue
        if type_name(builder.custom_value.typed_config) != HEADER_INPUT_TYPE:
            failures.add(
                path,
                f"{where}: bucket id entry {key!r}: custom_value "
                f"{type_name(builder.custom_value.typed_config) or '(empty)'} is not modelled by validate.py",
            )
            return None
        header = builder.custom_value.typed_config.unpack().header_name
        if header.lower() in UNBOUNDED_HEADERS:
            failures.add(
                path,
                f"{where}: bucket id entry {key!r} takes {header}: every distinct path becomes its own "
                "bucket, and varying the path escapes the limit",
            )
            return None
        entries.append((key, ANY))
    return tuple(entries)


def fallback_problem(strategy: Any) -> str | None:
    """Why Envoy would not enforce a fallback strategy as written (None: it would)."""
    if strategy is None:
        return None
    if strategy.requests_per_time_unit is not None:
        return "Envoy does not implement requests_per_time_unit; use a token_bucket"
    bucket = strategy.token_bucket
    if bucket is None:
        return None
    interval = bucket.fill_interval.total_seconds() if bucket.fill_interval is not None else 0
    if interval < 1 or interval != int(interval):
        return (
            f"token_bucket fill_interval {interval}s: Envoy truncates it to whole seconds; "
            "keep it whole and at least 1s"
        )
    if bucket.tokens_per_fill is None:
        return "token_bucket needs tokens_per_fill"
    return None


def check_envoyfilters(
    istio_dir: Path,
    descriptor_config: DescriptorConfig | None,
    sluice_service: dict | None,
    failures: Failures,
) -> tuple[int, dict | None]:
    """Validates every EnvoyFilter in istio_dir; returns (object count, produced descriptors),
    the descriptors None when a patch could not be parsed (the set would be incomplete)."""
    files = sorted(istio_dir.glob("*.yaml"))
    if not files:
        failures.add(istio_dir, "no EnvoyFilter manifests found")
        return 0, None
    before = len(failures.lines)
    vh_limit_lists: list[tuple[list[Any], str, Path]] = []
    route_patches: list[tuple[Any, str, Path]] = []
    filter_configs: list[tuple[Any, Path]] = []
    count = 0
    for path in files:
        for document in load_yaml_documents(path, failures):
            count += 1
            if not isinstance(document, dict):
                failures.add(path, "each YAML document must be a mapping")
                continue
            kind = (document.get("apiVersion"), document.get("kind"))
            if kind not in CRD_ALLOW_LIST:
                failures.add(path, f"{kind[1]} ({kind[0]}) is not an allow-listed kind for deploy/istio")
                continue
            errors = schema_errors(ENVOYFILTER_SCHEMA, document)
            for error in errors:
                failures.add(path, f"EnvoyFilter: {error}")
            if errors:
                continue
            name = document["metadata"]["name"]
            for index, patch in enumerate(document["spec"]["configPatches"]):
                context = f"EnvoyFilter {name} configPatches[{index}] ({patch['applyTo']})"
                if "value" not in patch["patch"]:
                    continue
                module, message = PATCH_VALUE_TYPES[patch["applyTo"]]
                value = parse_envoy(module, message, patch["patch"]["value"], path, context, failures)
                if value is None:
                    continue
                if patch["applyTo"] == "HTTP_FILTER" and value.name == RATELIMIT_FILTER:
                    if type_name(value.typed_config) != RATELIMIT_TYPE:
                        failures.add(path, f"{context}: needs a {RATELIMIT_TYPE} typed_config")
                        continue
                    subfilter = patch.get("match", {}).get("listener", {}).get("filterChain", {})
                    subfilter = subfilter.get("filter", {}).get("subFilter", {}).get("name")
                    if patch["patch"]["operation"] != "INSERT_BEFORE" or subfilter != ROUTER_FILTER:
                        failures.add(
                            path, f"{context}: insert the rate-limit filter INSERT_BEFORE {ROUTER_FILTER}"
                        )
                    filter_configs.append((value.typed_config.unpack(), path))
                elif patch["applyTo"] == "VIRTUAL_HOST":
                    vh_limit_lists.append((value.rate_limits, context, path))
                elif patch["applyTo"] == "HTTP_ROUTE":
                    route_patches.append((value, context, path))
    if len(failures.lines) > before:
        return count, None
    if len(filter_configs) != 1:
        failures.add(
            istio_dir,
            f"expected exactly one {RATELIMIT_FILTER} HTTP_FILTER patch, found {len(filter_configs)}",
        )
        return count, None
    rl_config, filter_path = filter_configs[0]
    check_ratelimit_filter(
        rl_config, descriptor_config, filter_path, "EnvoyFilter rate-limit filter", failures
    )
    check_istio_cluster(ratelimit_cluster(rl_config), sluice_service, filter_path, failures)
    stage = rl_config.stage or 0
    vh_limits: dict = {}
    for rate_limits, context, path in vh_limit_lists:
        merge_into(vh_limits, descriptors_of(rate_limits, stage, context, path, failures))
    # Routes the patches do not touch keep only the virtual host's actions.
    produced = dict(vh_limits)
    for route, context, path in route_patches:
        merge_into(produced, route_descriptors(route, vh_limits, stage, context, path, failures))
    return count, produced


def check_istio_cluster(name: str | None, service: dict | None, path: Path, failures: Failures) -> None:
    match = re.fullmatch(r"outbound\|(\d+)\|\|([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local", name or "")
    if not match:
        failures.add(
            path,
            f"rate limit cluster {name!r} is not of the form outbound|<port>||<svc>.<ns>.svc.cluster.local",
        )
        return
    if service is None:
        return
    port = next((p for p in service["spec"]["ports"] if p.get("name") == "grpc"), None)
    expected = (str(port["port"]) if port else "?", service["metadata"]["name"])
    if (match.group(1), match.group(2)) != expected:
        failures.add(
            path,
            f"rate limit cluster {name!r} does not name the Service {expected[1]!r} port {expected[0]} (grpc)",
        )


# ---------------------------------------------------------------------------------------------
# Kubernetes


def render_kustomization(directory: Path, failures: Failures) -> list[tuple[Path, dict]]:
    """The objects `kubectl kustomize` would emit, minus its name hashing and label injection."""
    path = directory / "kustomization.yaml"
    kustomization = load_yaml_document(path, failures)
    if kustomization is None:
        return []
    errors = schema_errors(KUSTOMIZATION_SCHEMA, kustomization)
    for error in errors:
        failures.add(path, error)
    if errors:
        return []
    objects: list[tuple[Path, dict]] = []
    for resource in kustomization["resources"]:
        resource_path = directory / resource
        if not resource_path.is_file():
            failures.add(
                path, f"resource {resource!r} is not a file in {directory.name}/ (no remote or nested bases)"
            )
            continue
        objects += [(resource_path, document) for document in load_yaml_documents(resource_path, failures)]
    for generator in kustomization.get("configMapGenerator", []):
        data: dict[str, str] = {}
        for entry in generator.get("files", []):
            key, _, file_name = entry.rpartition("=")
            source = directory / file_name
            if not source.is_file() or source.resolve().parent != directory.resolve():
                failures.add(
                    path,
                    f"configMapGenerator {generator['name']}: {file_name!r} must be a file in {directory.name}/",
                )
                continue
            data[key or source.name] = source.read_text()
        for literal in generator.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": generator["name"]},
            "data": data,
        }
        objects.append((path, config_map))
    return objects


@functools.cache
def _cached_schema_contents(filename: str, desired_version: str) -> Any:
    return _original_schema_contents(filename, desired_version)


# kubernetes-validate re-reads its 1.3 MB definitions file for every object; read each once.
_original_schema_contents = kubernetes_validate.utils.schema_contents
kubernetes_validate.utils.schema_contents = _cached_schema_contents


def validate_kubernetes_schema(objects: list[tuple[Path, dict]], failures: Failures) -> None:
    for path, document in objects:
        if not isinstance(document, dict) or "apiVersion" not in document or "kind" not in document:
            failures.add(path, "every document needs apiVersion and kind")
            continue
        label = f"{document['kind']}/{document.get('metadata', {}).get('name', '?')}"
        if (document["apiVersion"], document["kind"]) in CRD_ALLOW_LIST:
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(document, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                failures.add(
                    path, f"{label} (Kubernetes {version}): {json_path(error.absolute_path)}: {error.message}"
                )
            except kubernetes_validate.SchemaNotFoundError as error:
                failures.add(path, f"{label}: {error.message} (not in the CRD allow list either)")
            except kubernetes_validate.utils.VersionNotSupportedError as error:
                failures.add(path, error.message)


def pod_workloads(objects: list[tuple[Path, dict]]) -> Iterator[tuple[Path, dict]]:
    for path, document in objects:
        if document.get("kind") in ("Deployment", "StatefulSet", "DaemonSet"):
            yield path, document


def labels_match(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def port_of(address: str) -> int | None:
    match = re.fullmatch(r".*:(\d+)", address)
    return int(match.group(1)) if match else None


def check_kubernetes_policy(objects: list[tuple[Path, dict]], failures: Failures) -> dict:
    """Production requirements on the rendered objects; returns facts other checks use."""
    by_kind: dict[str, list[tuple[Path, dict]]] = {}
    for path, document in objects:
        by_kind.setdefault(document.get("kind", ""), []).append((path, document))
    config_maps = {document["metadata"]["name"] for _, document in by_kind.get("ConfigMap", [])}
    facts: dict[str, Any] = {}

    for path, workload in pod_workloads(objects):
        name = f"{workload['kind']}/{workload['metadata']['name']}"
        pod = workload["spec"]["template"]["spec"]
        pod_security = pod.get("securityContext", {})
        for container in pod.get("containers", []):
            here = f"{name} container {container['name']}"
            security = container.get("securityContext", {})
            if not (security.get("runAsNonRoot") or pod_security.get("runAsNonRoot")):
                failures.add(path, f"{here}: runAsNonRoot must be true")
            if not security.get("readOnlyRootFilesystem"):
                failures.add(path, f"{here}: readOnlyRootFilesystem must be true")
            if security.get("allowPrivilegeEscalation") is not False:
                failures.add(path, f"{here}: allowPrivilegeEscalation must be false")
            if "ALL" not in security.get("capabilities", {}).get("drop", []):
                failures.add(path, f"{here}: capabilities.drop must contain ALL")
            resources = container.get("resources", {})
            for section in ("requests", "limits"):
                missing = {"cpu", "memory"} - set(resources.get(section, {}))
                if missing:
                    failures.add(path, f"{here}: resources.{section} lacks {sorted(missing)}")
            for probe in ("readinessProbe", "livenessProbe"):
                if probe not in container:
                    failures.add(path, f"{here}: {probe} is required")
            for volume_mount in container.get("volumeMounts", []):
                volume = next((v for v in pod.get("volumes", []) if v["name"] == volume_mount["name"]), None)
                if volume is None:
                    failures.add(path, f"{here}: volumeMount {volume_mount['name']!r} has no volume")
                elif "configMap" in volume and volume["configMap"]["name"] not in config_maps:
                    failures.add(
                        path,
                        f"{name}: volume {volume['name']!r} uses unknown ConfigMap {volume['configMap']['name']!r}",
                    )
            if container["name"] == "sluice":
                facts["sluice"] = check_sluice_container(path, workload, container, failures)

    if "sluice" not in facts:
        failures.add("deploy/kubernetes", "no workload has a container named `sluice`")

    workloads = list(pod_workloads(objects))
    services = {}
    for path, service in by_kind.get("Service", []):
        name = service["metadata"]["name"]
        services[name] = service
        selector = service["spec"].get("selector", {})
        targets = [
            w
            for _, w in workloads
            if labels_match(selector, w["spec"]["template"]["metadata"].get("labels", {}))
        ]
        if not targets:
            failures.add(path, f"Service/{name}: selector {selector} matches no pod template")
            continue
        container_ports = {
            port.get("name"): port["containerPort"]
            for container in targets[0]["spec"]["template"]["spec"]["containers"]
            for port in container.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if isinstance(target, str) and target not in container_ports:
                failures.add(
                    path,
                    f"Service/{name} port {port.get('name')}: targetPort {target!r} is not a container port name",
                )
    sluice_service = services.get("sluice")
    if sluice_service is None:
        failures.add("deploy/kubernetes", "no Service named `sluice`")
    else:
        grpc = [p for p in sluice_service["spec"]["ports"] if p.get("name") == "grpc"]
        if not grpc or grpc[0].get("appProtocol") != "grpc":
            failures.add(
                "deploy/kubernetes", "Service/sluice needs a port named `grpc` with appProtocol grpc"
            )
    facts["sluice_service"] = sluice_service

    sluice = facts.get("sluice") or {}
    for path, hpa in by_kind.get("HorizontalPodAutoscaler", []):
        target = hpa["spec"]["scaleTargetRef"]
        if not any(
            w["kind"] == target["kind"] and w["metadata"]["name"] == target["name"] for _, w in workloads
        ):
            failures.add(
                path,
                f"HorizontalPodAutoscaler/{hpa['metadata']['name']}: scaleTargetRef "
                f"{target['kind']}/{target['name']} does not exist",
            )
        if hpa["spec"].get("minReplicas", 1) < 2:
            failures.add(path, "HorizontalPodAutoscaler: minReplicas must be at least 2")
    for path, pdb in by_kind.get("PodDisruptionBudget", []):
        selector = pdb["spec"].get("selector", {}).get("matchLabels", {})
        if not any(
            labels_match(selector, w["spec"]["template"]["metadata"].get("labels", {})) for _, w in workloads
        ):
            failures.add(
                path, f"PodDisruptionBudget/{pdb['metadata']['name']}: selector matches no pod template"
            )
    for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget"):
        if not by_kind.get(kind):
            failures.add("deploy/kubernetes", f"no {kind}")

    redis_url = sluice.get("env", {}).get("SLUICE_REDIS_URL", "")
    host = re.match(r"rediss?://(?:[^@/]*@)?([^:/,]+)", redis_url)
    if host and "." not in host.group(1) and host.group(1) not in services:
        failures.add(
            "deploy/kubernetes",
            f"SLUICE_REDIS_URL host {host.group(1)!r} is not a Service of this kustomization",
        )
    return facts


def check_sluice_container(path: Path, workload: dict, container: dict, failures: Failures) -> dict:
    name = f"{workload['kind']}/{workload['metadata']['name']}"
    pod = workload["spec"]["template"]["spec"]
    if workload["kind"] == "Deployment" and workload["spec"].get("replicas", 1) < 2:
        failures.add(path, f"{name}: at least 2 replicas")
    ports = {port.get("name"): port["containerPort"] for port in container.get("ports", [])}
    env = {item["name"]: item.get("value", "") for item in container.get("env", [])}
    for variable, port_name in (("SLUICE_GRPC_ADDR", "grpc"), ("SLUICE_METRICS_ADDR", "http-metrics")):
        address = env.get(variable, "")
        if not address.startswith("0.0.0.0:") or port_of(address) != ports.get(port_name):
            failures.add(
                path,
                f"{name}: {variable}={address!r} must listen on 0.0.0.0 at container port "
                f"{port_name!r} ({ports.get(port_name)})",
            )
    admin = env.get("SLUICE_ADMIN_ADDR", "")
    if not admin.startswith("127.0.0.1:") and not env.get("SLUICE_ADMIN_TOKEN_FILE"):
        failures.add(
            path,
            f"{name}: SLUICE_ADMIN_ADDR={admin!r} must stay on 127.0.0.1 unless "
            "SLUICE_ADMIN_TOKEN_FILE is set (it shows tenants' identifiers and takes resets)",
        )
    for probe, probe_path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        http_get = container.get(probe, {}).get("httpGet", {})
        if http_get.get("path") != probe_path or http_get.get("port") not in (
            "http-metrics",
            ports.get("http-metrics"),
        ):
            failures.add(path, f"{name}: {probe} must GET {probe_path} on the metrics port")
    pre_stop = container.get("lifecycle", {}).get("preStop", {})
    sleep = pre_stop.get("sleep", {}).get("seconds")
    if sleep is None:
        failures.add(path, f"{name}: preStop sleep is required so endpoints update before the drain")
        sleep = 0
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= sleep + SLUICE_DRAIN_SECONDS:
        failures.add(
            path,
            f"{name}: terminationGracePeriodSeconds {grace} must exceed "
            f"preStop {sleep}s + drain {SLUICE_DRAIN_SECONDS}s",
        )
    mounts = {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts", [])}
    return {"ports": ports, "env": env, "mounts": mounts}


# ---------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_instructions(path: Path, failures: Failures) -> list[tuple[str, str]]:
    try:
        text = path.read_text()
    except OSError as error:
        failures.add(path, f"cannot read: {error.strerror}")
        return []
    instructions, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        current += " " + stripped.removesuffix("\\") if current else stripped.removesuffix("\\")
        if not stripped.endswith("\\"):
            keyword, _, rest = current.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
            current = ""
    return instructions


def check_dockerfile(deploy_dir: Path, root: Path, sluice: dict | None, failures: Failures) -> None:
    path = deploy_dir / "Dockerfile"
    instructions = dockerfile_instructions(path, failures)
    stages: list[str] = []
    final: dict[str, list[str]] = {}
    for keyword, rest in instructions:
        if keyword == "FROM":
            parts = rest.split()
            stages.append(parts[2].lower() if len(parts) >= 3 and parts[1].upper() == "AS" else "")
            final = {"FROM": [parts[0]]}
            continue
        final.setdefault(keyword, []).append(rest)
        source = re.match(r"--from=(\S+)", rest) if keyword == "COPY" else None
        if source and source.group(1).lower() not in stages[:-1]:
            failures.add(path, f"COPY --from={source.group(1)} names no earlier stage")
    if len(stages) < 2:
        failures.add(path, "must be a multi-stage build")
    try:
        rust_version = tomllib.loads((root / "Cargo.toml").read_text())["package"]["rust-version"]
        builder = next(rest.split()[0] for keyword, rest in instructions if keyword == "FROM")
        if not builder.startswith(f"rust:{rust_version}"):
            failures.add(
                path, f"builder image {builder!r} does not match Cargo.toml rust-version {rust_version}"
            )
    except (OSError, KeyError, StopIteration, tomllib.TOMLDecodeError):
        failures.add(path, "cannot compare the builder image with Cargo.toml's rust-version")
    user = (final.get("USER") or ["root"])[-1].split(":")[0]
    if user in ("root", "0"):
        failures.add(path, "the runtime stage must set a non-root USER")
    try:
        entrypoint = json.loads((final.get("ENTRYPOINT") or ["null"])[-1])
    except json.JSONDecodeError:
        entrypoint = None
    if not isinstance(entrypoint, list) or "--config" not in entrypoint[:-1]:
        failures.add(path, "ENTRYPOINT must be exec form (a JSON list) with --config PATH")
        return
    config_path = entrypoint[entrypoint.index("--config") + 1]
    if not any(
        re.fullmatch(rf"config/?\s+{re.escape(config_path)}/?", rest) for rest in final.get("COPY", [])
    ):
        failures.add(path, f"the runtime stage must COPY config/ to {config_path}")
    exposed = {int(port.split("/")[0]) for rest in final.get("EXPOSE", []) for port in rest.split()}
    env_text = " ".join(final.get("ENV", []))
    for variable in ("SLUICE_GRPC_ADDR", "SLUICE_METRICS_ADDR"):
        match = re.search(rf"{variable}=0\.0\.0\.0:(\d+)", env_text)
        if not match or int(match.group(1)) not in exposed:
            failures.add(path, f"ENV {variable}=0.0.0.0:<port> with the port in EXPOSE is required")
    if not re.search(r"SLUICE_ADMIN_ADDR=127\.0\.0\.1:\d+", env_text):
        failures.add(path, "ENV SLUICE_ADMIN_ADDR=127.0.0.1:<port> is required (the admin listener stays on loopback)")
    ignore_path = deploy_dir / "Dockerfile.dockerignore"
    ignored = (
        [
            line.strip().rstrip("/")
            for line in ignore_path.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
        if ignore_path.is_file()
        else []
    )
    if "target" not in ignored:
        failures.add(ignore_path, "must exclude target/ from the build context")
    if any(fnmatch.fnmatch("config", pattern) or fnmatch.fnmatch("src", pattern) for pattern in ignored):
        failures.add(ignore_path, "excludes config/ or src/, which the build copies")
    if sluice:
        if sorted(exposed) != sorted(sluice["ports"].values()):
            failures.add(
                path,
                f"EXPOSE {sorted(exposed)} differs from the Deployment's container ports "
                f"{sorted(sluice['ports'].values())}",
            )
        if config_path.rstrip("/") not in {mount.rstrip("/") for mount in sluice["mounts"]}:
            failures.add(
                path, f"the Deployment mounts no config volume at the ENTRYPOINT's --config {config_path}"
            )


# ---------------------------------------------------------------------------------------------
# Observability: alert rules and the Grafana dashboard

PROMETHEUS_DURATION = r"^([0-9]+(ms|s|m|h|d|w|y))+$"
ALERT_RULES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["groups"],
    "additionalProperties": False,
    "properties": {
        "groups": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "rules"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": {"type": "string", "pattern": PROMETHEUS_DURATION},
                    "rules": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["alert", "expr", "for", "labels", "annotations"],
                            "additionalProperties": False,
                            "properties": {
                                "alert": {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]*$"},
                                "expr": {"type": "string", "minLength": 1},
                                "for": {"type": "string", "pattern": PROMETHEUS_DURATION},
                                "keep_firing_for": {"type": "string", "pattern": PROMETHEUS_DURATION},
                                "labels": {
                                    "type": "object",
                                    "required": ["severity"],
                                    "properties": {"severity": {"enum": ["critical", "warning", "info"]}},
                                    "additionalProperties": {"type": "string"},
                                },
                                "annotations": {
                                    "type": "object",
                                    "required": ["summary", "description"],
                                    "additionalProperties": {"type": "string"},
                                },
                            },
                        },
                    },
                },
            },
        }
    },
}


def expression_errors(expr: str) -> list[str]:
    """Unbalanced (), [], {} or an unterminated string: what a typo in PromQL usually leaves."""
    closing = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    quote: str | None = None
    escaped = False
    for char in expr:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "\"'`":
            quote = char
        elif char in "([{":
            stack.append(char)
        elif char in closing:
            if not stack or stack.pop() != closing[char]:
                return [f"unbalanced {char!r}"]
    if quote:
        return [f"unterminated string {quote}"]
    return [f"unclosed {stack[-1]!r}"] if stack else []


def check_alert_rules(path: Path, failures: Failures) -> int:
    document = load_yaml_document(path, failures)
    if document is None:
        return 0
    errors = schema_errors(ALERT_RULES_SCHEMA, document)
    for error in errors:
        failures.add(path, error)
    if errors:
        return 0
    seen: set[str] = set()
    count = 0
    for group in document["groups"]:
        for rule in group["rules"]:
            count += 1
            if rule["alert"] in seen:
                failures.add(path, f"alert {rule['alert']} is defined twice")
            seen.add(rule["alert"])
            for error in expression_errors(rule["expr"]):
                failures.add(path, f"alert {rule['alert']}: expr: {error}")
    return count


def check_dashboard(path: Path, failures: Failures) -> int:
    try:
        dashboard = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        failures.add(path, f"not a JSON document: {error}")
        return 0
    for field_name in ("uid", "title", "panels", "templating"):
        if field_name not in dashboard:
            failures.add(path, f"missing `{field_name}`")
            return 0
    variables = {v.get("name"): v for v in dashboard["templating"].get("list", [])}
    if variables.get("datasource", {}).get("type") != "datasource":
        failures.add(path, "needs a `datasource` template variable of type datasource")
    ids: set[int] = set()
    queries = 0
    for index, panel in enumerate(dashboard["panels"]):
        where = f"panels[{index}] ({panel.get('title', '?')})"
        if panel.get("id") in ids:
            failures.add(path, f"{where}: id {panel.get('id')} is used twice")
        ids.add(panel.get("id"))
        grid = panel.get("gridPos", {})
        if not all(isinstance(grid.get(k), int) for k in ("h", "w", "x", "y")):
            failures.add(path, f"{where}: gridPos needs integer h, w, x, y")
        elif grid["x"] + grid["w"] > 24:
            failures.add(path, f"{where}: gridPos x + w = {grid['x'] + grid['w']} exceeds the 24 columns")
        if panel.get("type") == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            failures.add(path, f"{where}: must query the `${{datasource}}` variable")
        targets = panel.get("targets") or []
        if not targets:
            failures.add(path, f"{where}: has no query")
        for target in targets:
            expr = target.get("expr", "")
            if not expr:
                failures.add(path, f"{where}: target {target.get('refId')} has no expr")
            for error in expression_errors(expr):
                failures.add(path, f"{where}: target {target.get('refId')}: {error}")
            queries += 1
    return queries


# ---------------------------------------------------------------------------------------------


def shown(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root", type=Path, default=Path(__file__).resolve().parent.parent, help="repository root"
    )
    parser.add_argument("--config", type=Path, help="descriptor config (default: ROOT/config/edge.yaml)")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    config_path: Path = args.config or root / "config" / "edge.yaml"
    deploy_dir = root / "deploy"
    failures = Failures(root)
    summary: list[str] = []

    descriptor_config = load_descriptor_config(config_path, failures)

    copy = deploy_dir / "kubernetes" / "edge.yaml"
    if config_path.is_file() and copy.is_file() and copy.read_bytes() != config_path.read_bytes():
        source, target = (shown(path, root) for path in (config_path, copy))
        failures.add(copy, f"differs from {source}; copy it over: cp {source} {target}")
    elif not copy.is_file():
        failures.add(copy, "missing (the ConfigMap's copy of the descriptor config)")

    objects = render_kustomization(deploy_dir / "kubernetes", failures)
    validate_kubernetes_schema(objects, failures)
    facts = check_kubernetes_policy(objects, failures) if objects else {}
    summary.append(f"kubernetes: {len(objects)} objects against {', '.join(KUBERNETES_VERSIONS)} (strict)")

    bootstrap_path = deploy_dir / "envoy" / "envoy.yaml"
    produced = check_bootstrap(bootstrap_path, descriptor_config, failures)
    envoyfilters, istio_produced = check_envoyfilters(
        deploy_dir / "istio", descriptor_config, facts.get("sluice_service"), failures
    )
    rlqs_path = deploy_dir / "envoy" / "envoy-rlqs.yaml"
    buckets = check_rlqs_bootstrap(rlqs_path, descriptor_config, failures)
    summary.append(
        f"envoy: RLS and RLQS bootstraps and {envoyfilters} EnvoyFilter(s) parsed against the v3 protos"
    )
    if descriptor_config is not None:
        if produced is not None:
            compare_descriptors(descriptor_config, produced, bootstrap_path, failures)
        if istio_produced is not None:
            compare_descriptors(descriptor_config, istio_produced, deploy_dir / "istio", failures)
        rules = ", ".join(node.label() for node in descriptor_config.rule_nodes())
        summary.append(
            f"descriptors: bootstrap and EnvoyFilter actions produce exactly the rules of {config_path.name}: {rules}"
        )
        if buckets is not None:
            reached = compare_buckets(descriptor_config, buckets, rlqs_path, failures)
            summary.append(f"buckets: every RLQS bucket id reaches a rule: {', '.join(reached)}")

    check_dockerfile(deploy_dir, root, facts.get("sluice"), failures)

    observability = deploy_dir / "observability"
    alerts = check_alert_rules(observability / "alerts.yaml", failures)
    queries = check_dashboard(observability / "grafana-dashboard.json", failures)
    summary.append(f"observability: {alerts} alert rules, dashboard with {queries} queries")

    if failures.lines:
        for line in failures.lines:
            print(f"FAIL {line}")
        print(f"validate.py: {len(failures.lines)} failure(s)")
        return 1
    for line in summary:
        print(f"ok   {line}")
    print("validate.py: all deployment files valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
