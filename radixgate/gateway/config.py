"""Gateway configuration: the TOML file of docs/USAGE.md (Config file), overridden by CLI flags.

Frozen dataclasses inside; pydantic only at the HTTP edge. Loading a config never loads a
model. ``load_config(path, overrides)`` is the one entry point::

    cfg = load_config("radixgate.toml", {"port": 9000, "tiny": True})

The ``[cache]`` section (and its ``[cache.credit]`` and ``[cache.disk]`` tables) is parsed
once into ``kv.CacheConfig`` (``GatewayConfig.cache``), which the engine, the tree and the
disk tier get as it is. The cache keys that used to sit under ``[model]``
(``MOVED_MODEL_KEYS``) are still read, onto ``[cache]``, with a ``FutureWarning`` (once per
key and process); the disk tier's keys that used to sit under ``[cache]``
(``MOVED_DISK_KEYS``) onto ``[cache.disk]``, with one ``FutureWarning`` naming them.
"""
from __future__ import annotations

import dataclasses
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixgate.kv import PUBLIC_NAMESPACE, CacheConfig, CreditParams, DiskTierConfig
from radixgate.runtime.engine.spec import SpecConfig

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
MIN_QUEUE_SHARE = 8     # a tenant's default queue share never drops below this


class ConfigError(ValueError):
    """The config file or a flag has an invalid value."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_queue: int = 256             # waiting requests beyond this: overloaded
    strict_max_tokens: bool = False  # True: prompt + max_tokens over the context is 400 (else clamped)
    json_schema_open_objects: bool = False  # True: a schema's object without additionalProperties
                                            # allows more properties (else closed, as vLLM)
    cors_allow_origins: tuple[str, ...] = ()   # browser origins allowed (CORS); "*": any; () off
    request_timeout_s: float = 600.0
    max_body_bytes: int = 8 * 1024 * 1024
    body_timeout_s: float = 30.0     # the whole body must arrive within this: else 408
    max_unsent_events: int = 4096    # a stream's events its client left unread: beyond, it ends
    stream_send_buffer_bytes: int = 262144   # kernel send buffer of a stream (0: the kernel's)
    shutdown_grace_s: float = 10.0
    log_level: str = "info"
    kv_events_endpoint: str = ""     # publish KV events (vLLM format, ZMQ PUB) here; "" off
    kv_events_allow_remote: bool = False   # bind kv_events_endpoint to a non-loopback host
    kv_events_replay_endpoint: str = ""    # answer replay requests (ZMQ ROUTER) here; "" off
    state_dir: str = ""              # the gateway's state folder (gateway/state_dir.py); ""
                                     # beside the disk tier's folder, or none without one


@dataclass(frozen=True, slots=True)
class ModelSettings:
    path: str = "default"            # "default", a .gguf file or an HF directory
    name: str = "smollm2-135m-instruct"
    aliases: tuple[str, ...] = ("claude-*", "gpt-*", "gemini-*")
    max_model_len: int = 8192
    tiny: bool = False
    threads: int = 0                     # torch CPU threads; 0 = torch's default
    deterministic: bool | None = None    # logits independent of scheduling (ARCHITECTURE 5c);
                                         # None: on where the model and CPU allow, said at start
    weights_dtype: str = "auto"          # auto | float32 | bfloat16 | int8 | int4 (radixgate/runtime/model/linear.py)


# [model] keys that moved to [cache]: old key -> its place now ("credit.x": [cache.credit] x)
MOVED_MODEL_KEYS = {
    "kv_cache_gb": "kv_cache_gb", "block_size": "block_size",
    "enable_prefix_cache": "enable_prefix_cache", "page_rounded_match": "page_rounded_match",
    "continuation_ticks": "credit.continuation_ticks", "branch_ticks": "credit.branch_ticks",
    "probation_ticks": "credit.probation_ticks",
    "partial_tails_first": "credit.partial_tails_first",
}

# [cache] keys of the disk tier that moved to [cache.disk]: old key -> its name there
MOVED_DISK_KEYS = {"disk_dir": "dir", "disk_gb": "gb"}


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``[cluster]``: engine replicas on Ray Serve behind the prefix router (``radixgate/cluster/``).
    ``replicas`` 1 and no ``ray_address`` / ``max_replicas``: one engine in this process."""

    replicas: int = 1
    ray_address: str = ""            # join this Ray cluster ("": start a local one)
    min_replicas: int = 0            # max_replicas > 0: Ray Serve autoscaling in [min, max]
    max_replicas: int = 0
    num_cpus: int = 0                # a local Ray cluster's CPUs (0: Ray's count)
    balance_abs: int = 2             # routing: cache-aware while a replica's load is within
    balance_rel: float = 1.5         # min + balance_abs or min x balance_rel ...
    load_tokens: int = 128           # ... and a queued request weighs this many tokens
    routed_ttl_s: float = 30.0       # a routed prefix counts as cached there until its KV
                                     # events confirm it, or for this long
    events_host: str = "127.0.0.1"   # replicas bind their KV-event endpoints here
    ray_host: str = "127.0.0.1"      # a local Ray cluster's processes bind here (another
                                     # address: Ray's token authentication is required)

    @property
    def enabled(self) -> bool:
        return self.replicas > 1 or bool(self.ray_address) or self.max_replicas > 0


@dataclass(frozen=True, slots=True)
class TenantConfig:
    name: str
    api_keys: tuple[str, ...] = ()
    max_running: int = 16
    max_pinned_tokens: int = 200_000
    requests_per_minute: int = 600   # 0 = unlimited
    use_public_prefixes: bool = True
    max_queued: int = 0              # waiting requests; 0 = an equal share of max_queue (>= 8)
    max_preparing: int = 1           # prompts read, parsed and rendered at once (more wait, bounded)
    max_namespaces: int = 64         # live cache namespaces (one per cache_salt); LRU idle ones go


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    model: ModelSettings = field(default_factory=ModelSettings)
    cache: CacheConfig = field(default_factory=CacheConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    admin_keys: tuple[str, ...] = ()
    tenants: tuple[TenantConfig, ...] = ()

    def queue_share(self, tenant: TenantConfig) -> int:
        """Waiting requests ``tenant`` may have: its ``max_queued``, or by default an equal
        share of ``server.max_queue`` among the configured tenants, at least 8."""
        if tenant.max_queued > 0:
            return tenant.max_queued
        return max(MIN_QUEUE_SHARE, self.server.max_queue // max(1, len(self.tenants)))

    @property
    def has_api_keys(self) -> bool:
        return bool(self.admin_keys) or any(t.api_keys for t in self.tenants)

    def check_host_allowed(self) -> None:
        """Without API keys the server is single-tenant and open: loopback only."""
        if not self.has_api_keys and self.server.host not in LOOPBACK_HOSTS:
            raise ConfigError(
                f"refusing to serve on non-loopback host {self.server.host!r} with no API keys "
                "configured; add [admin] / [tenants.*] api_keys or use --host 127.0.0.1")


# flag name -> (section, field)
_FLAG_FIELDS = {
    "host": ("server", "host"), "port": ("server", "port"), "log_level": ("server", "log_level"),
    "max_queue": ("server", "max_queue"),
    "body_timeout_s": ("server", "body_timeout_s"),
    "max_unsent_events": ("server", "max_unsent_events"),
    "stream_send_buffer_bytes": ("server", "stream_send_buffer_bytes"),
    "model": ("model", "path"), "tiny": ("model", "tiny"),
    "max_model_len": ("model", "max_model_len"), "model_name": ("model", "name"),
    "threads": ("model", "threads"), "deterministic": ("model", "deterministic"),
    "spec": ("spec", "mode"),
    "weights_dtype": ("model", "weights_dtype"),
    "kv_cache_gb": ("cache", "kv_cache_gb"), "block_size": ("cache", "block_size"),
    "policy": ("cache", "policy"), "kv_dtype": ("cache", "kv_dtype"),
    "window_ratio": ("cache", "window_ratio"),
    "kv_disk_dir": ("cache.disk", "dir"), "kv_disk_gb": ("cache.disk", "gb"),
    "enable_prefix_cache": ("cache", "enable_prefix_cache"),
    "page_rounded_match": ("cache", "page_rounded_match"),
    "kv_events_endpoint": ("server", "kv_events_endpoint"),
    "state_dir": ("server", "state_dir"),
    "json_schema_open_objects": ("server", "json_schema_open_objects"),
    "replicas": ("cluster", "replicas"), "ray_address": ("cluster", "ray_address"),
}


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None
                ) -> GatewayConfig:
    """Read the TOML file (if any), then apply flag overrides whose value is not None."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from e
    return config_from_dict(raw, overrides or {})


def config_from_dict(raw: dict[str, Any], overrides: dict[str, Any] | None = None
                     ) -> GatewayConfig:
    sections = {"server": _section(raw, "server", ServerConfig),
                "model": _section(raw, "model", ModelSettings, moved=MOVED_MODEL_KEYS),
                "cache": _section(raw, "cache", CacheConfig, moved=MOVED_DISK_KEYS),
                "cluster": _section(raw, "cluster", ClusterConfig),
                "spec": _section(raw, "spec", SpecConfig)}
    credit = _table(sections["cache"].pop("credit", {}), "cache.credit", CreditParams)
    sections["cache.disk"] = _table(sections["cache"].pop("disk", {}), "cache.disk",
                                    DiskTierConfig)
    _move_deprecated_keys(sections["model"], sections["cache"], credit)
    _move_disk_keys(sections["cache"], sections["cache.disk"])
    for flag, value in (overrides or {}).items():
        if value is None:
            continue
        if flag not in _FLAG_FIELDS:
            raise ConfigError(f"unknown override {flag!r}")
        section, name = _FLAG_FIELDS[flag]
        sections[section][name] = value
    admin = raw.get("admin", {})
    if set(admin) - {"api_keys"}:
        raise ConfigError(f"unknown keys in [admin]: {sorted(set(admin) - {'api_keys'})}")
    unknown_sections = set(raw) - {"server", "model", "cache", "cluster", "spec", "admin",
                                   "tenants"}
    if unknown_sections:
        raise ConfigError(f"unknown config sections: {sorted(unknown_sections)}")
    tenants = tuple(_tenant(name, body) for name, body in raw.get("tenants", {}).items())
    cfg = GatewayConfig(
        server=_build(ServerConfig, sections["server"]),
        model=_build(ModelSettings, sections["model"]),
        cache=_cache_config(sections["cache"], credit, sections["cache.disk"]),
        cluster=_build(ClusterConfig, sections["cluster"]),
        spec=_build(SpecConfig, sections["spec"]),
        admin_keys=tuple(_str_list(admin.get("api_keys", []), "admin.api_keys")),
        tenants=tenants)
    _validate(cfg)
    return cfg


def _section(raw: dict[str, Any], name: str, cls: type, moved=()) -> dict[str, Any]:
    return _table(raw.get(name, {}), name, cls, moved)


def _table(body: Any, name: str, cls: type, moved=()) -> dict[str, Any]:
    """The keys of the TOML table ``[name]``, each a field of ``cls`` (or in ``moved``)."""
    if not isinstance(body, dict):
        raise ConfigError(f"[{name}] must be a table")
    unknown = set(body) - {f.name for f in dataclasses.fields(cls)} - set(moved)
    if unknown:
        raise ConfigError(f"unknown keys in [{name}]: {sorted(unknown)}")
    return dict(body)


def _move_deprecated_keys(model: dict[str, Any], cache: dict[str, Any],
                          credit: dict[str, Any]) -> None:
    """Moves the cache keys still found under ``[model]`` onto ``[cache]`` /
    ``[cache.credit]``, with a FutureWarning (shown once per key: the warning registry
    keeps one per message)."""
    for old, new in MOVED_MODEL_KEYS.items():
        if old not in model:
            continue
        table, key = (credit, new.split(".", 1)[1]) if new.startswith("credit.") else (cache, new)
        place = f"[cache.credit] {key}" if table is credit else f"[cache] {key}"
        _move_key(model, old, f"[model] {old}", table, key, place)
        warnings.warn(f"config: [model] {old} is deprecated and will be removed; set {place} "
                      "instead", FutureWarning, stacklevel=2)


def _move_disk_keys(cache: dict[str, Any], disk: dict[str, Any]) -> None:
    """Moves the disk tier's keys still found under ``[cache]`` onto ``[cache.disk]``, with
    one FutureWarning naming them all (shown once per process)."""
    found = [old for old in MOVED_DISK_KEYS if old in cache]
    if not found:
        return
    for old in found:
        new = MOVED_DISK_KEYS[old]
        _move_key(cache, old, f"[cache] {old}", disk, new, f"[cache.disk] {new}")
    verb = "is" if len(found) == 1 else "are"
    warnings.warn(f"config: [cache] {', '.join(found)} {verb} deprecated and will be removed; "
                  f"set [cache.disk] {', '.join(MOVED_DISK_KEYS[o] for o in found)} instead",
                  FutureWarning, stacklevel=2)


def _move_key(source: dict[str, Any], old: str, old_place: str, target: dict[str, Any],
              new: str, new_place: str) -> None:
    """``source[old]`` becomes ``target[new]``; both set is an error."""
    if new in target:
        raise ConfigError(f"{old_place} and {new_place} are both set: keep {new_place} only")
    target[new] = source.pop(old)


def _cache_config(values: dict[str, Any], credit: dict[str, Any],
                  disk: dict[str, Any]) -> CacheConfig:
    """``[cache]``, ``[cache.credit]`` and ``[cache.disk]`` (flags applied) as the one
    ``CacheConfig``; refuses credit parameters that no policy would read. The disk tier's
    ``dir`` is expanded (``~``)."""
    policy = values.get("policy", CacheConfig().policy)
    if credit and policy != "credit":
        raise ConfigError(f'[cache.credit] applies to policy = "credit" only (policy is '
                          f'{policy!r}): remove the table or the policy')
    if isinstance(disk.get("dir"), str) and disk["dir"]:
        disk = {**disk, "dir": str(Path(disk["dir"]).expanduser())}
    return _build(CacheConfig, values, credit=_build(CreditParams, credit),
                  disk=_build(DiskTierConfig, disk))


def _build(cls: type, values: dict[str, Any], **ready: Any):
    """``cls`` from TOML values (type-checked), plus ``ready`` fields built already; the
    dataclass's own checks become ConfigErrors."""
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    out = dict(ready)
    for key, value in values.items():
        out[key] = _coerce(value, types[key], f"{cls.__name__}.{key}")
    try:
        return cls(**out)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _coerce(value: Any, type_name: str, where: str) -> Any:
    type_name = type_name.removesuffix(" | None")       # TOML has no null: a value is given
    if type_name == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if type_name == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if type_name == "str" and isinstance(value, str):
        return value
    if type_name == "bool" and isinstance(value, bool):
        return value
    if type_name.startswith("tuple[str"):
        return tuple(_str_list(value, where))
    raise ConfigError(f"{where}: expected {type_name}, got {value!r}")


def _str_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of strings")
    return value


def _tenant(name: str, body: dict[str, Any]) -> TenantConfig:
    if not isinstance(body, dict):
        raise ConfigError(f"[tenants.{name}] must be a table")
    fields = {k: v for k, v in body.items()}
    unknown = set(fields) - {f.name for f in dataclasses.fields(TenantConfig)} - {"name"}
    if unknown:
        raise ConfigError(f"unknown keys in [tenants.{name}]: {sorted(unknown)}")
    fields["name"] = name
    return _build(TenantConfig, fields)


def _validate(cfg: GatewayConfig) -> None:
    m, s = cfg.model, cfg.server
    if m.max_model_len < 2:
        raise ConfigError("model.max_model_len >= 2 required")
    if m.threads < 0:
        raise ConfigError("model.threads must be >= 0 (0 = torch's default)")
    if not (0 <= s.port <= 65535) or s.max_queue < 1:
        raise ConfigError("server.port must be 0..65535 and max_queue >= 1")
    if s.body_timeout_s <= 0 or s.max_unsent_events < 1 or s.stream_send_buffer_bytes < 0:
        raise ConfigError("server.body_timeout_s must be > 0, max_unsent_events >= 1 and "
                          "stream_send_buffer_bytes >= 0 (0: the kernel's choice)")
    _validate_cluster(cfg)
    seen: dict[str, str] = {k: "admin" for k in cfg.admin_keys}
    for t in cfg.tenants:
        if t.name in (PUBLIC_NAMESPACE, "admin") or not t.name:
            raise ConfigError(f"tenant name {t.name!r} is reserved")
        if t.max_running < 1 or t.max_pinned_tokens < 0 or t.requests_per_minute < 0:
            raise ConfigError(f"[tenants.{t.name}] limits must be non-negative")
        if t.max_namespaces < 1:
            raise ConfigError(f"[tenants.{t.name}] max_namespaces must be >= 1")
        if t.max_queued < 0 or t.max_preparing < 1:
            raise ConfigError(f"[tenants.{t.name}] max_queued must be >= 0 (0: an equal "
                              "share of server.max_queue) and max_preparing >= 1")
        for key in t.api_keys:
            if key in seen:
                raise ConfigError(f"an API key of tenant {t.name!r} is also used by {seen[key]!r}")
            seen[key] = t.name


def _validate_cluster(cfg: GatewayConfig) -> None:
    c = cfg.cluster
    if c.replicas < 1 or c.min_replicas < 0 or c.num_cpus < 0:
        raise ConfigError("cluster.replicas must be >= 1, min_replicas and num_cpus >= 0")
    if c.max_replicas and not c.min_replicas <= c.replicas <= c.max_replicas:
        raise ConfigError("cluster autoscaling needs min_replicas <= replicas <= max_replicas")
    if c.balance_abs < 0 or c.balance_rel < 1.0 or c.load_tokens < 0:
        raise ConfigError("cluster.balance_abs and load_tokens must be >= 0, balance_rel >= 1")
    if not c.routed_ttl_s >= 0:
        raise ConfigError("cluster.routed_ttl_s must be >= 0")
    server = cfg.server
    if server.kv_events_replay_endpoint and not server.kv_events_endpoint:
        raise ConfigError("server.kv_events_replay_endpoint needs server.kv_events_endpoint")
    for name in ("kv_events_endpoint", "kv_events_replay_endpoint"):
        if getattr(server, name):
            _check_events_endpoint(name, getattr(server, name), server.kv_events_allow_remote)


def _check_events_endpoint(name: str, endpoint: str, allow_remote: bool) -> None:
    from radixgate.kv.events.publisher import EndpointError, check_endpoint
    try:
        check_endpoint(endpoint, allow_remote)
    except EndpointError as e:
        raise ConfigError(f"server.{name}: {e}") from None
