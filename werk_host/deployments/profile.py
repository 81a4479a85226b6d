"""Deployment profiles: the model instances one host serves and the aliases over them.

A profile is TOML (docs/deployments.md, "Profiles"), read from ``werk serve --profile FILE`` or
``WERK_HOME/deployments.toml``; repeated ``--model NAME`` is shorthand for one instance per model
(:func:`profile_from_models`). Everything is checked before anything starts, so a profile is
either wholly valid or refused with a :class:`ProfileError` that names the source, the line (when
it can be found) and the field at fault::

    deployments.toml:7: instance[1].keep_alive: "30x" is not a duration (use 45s, 30m, 2h, ...)

Instances are numbered from 0 in document order (``instance[0]`` is the first ``[[instance]]``).
"""

from __future__ import annotations

import copy
import datetime as dt
import difflib
import json
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import NoReturn

from pydantic import JsonValue

from werk_host.deployments.durations import DURATION_HINT, MAX_DURATION_S, bound_message
from werk_host.deployments.durations import parse_duration as parse_duration
from werk_host.deployments.rules import ResidencyRules, parse_groups, parse_memory, parse_residency
from werk_host.deployments.toml_lines import DocPath, statement_lines
from werk_host.models import NAME_RE as MODEL_NAME_RE

#: The profile ``werk serve`` reads from ``WERK_HOME`` when neither --profile nor --model is given.
PROFILE_FILENAME = "deployments.toml"

#: Instance ids and alias names: 1-64 characters, letters, digits, ``.``, ``_``, ``-``; starting
#: with a letter or digit.
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ID_MAX_LEN = 64

INSTANCE_KEYS = (
    "id",
    "model",
    "backend",
    "options",
    "preload",
    "keep_alive",
    "keep_alive_max",
    "default",
    "endpoint",
    "api_key_env",
    "output_limit",
    "pin",
    "memory",
    "prompt_cache",
    "loading_notice",
    "model_cache_release",
)
#: ``output_limit``: how ``/v1`` admission treats a requested output above the ceiling
#: (werk_host/service/inference.py): ``refuse`` (``output_limit_exceeded``) or ``clamp``.
OUTPUT_LIMITS = ("refuse", "clamp")
#: ``model_cache_release`` (werk_host/memory/filecache.py)
CACHE_RELEASE_MODES = ("auto", "on", "off")
_ENDPOINT_RE = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[^\s]*)?")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ALIAS_KEYS = ("replicas", "match")
ROUTING_KEYS = ("fallback",)
TOP_LEVEL_KEYS = ("instance", "alias", "routing", "residency", "group")
#: A ``match`` pattern: a model name with ``*``/``?`` wildcards (``fnmatch``, case-sensitive).
PATTERN_RE = re.compile(r"[A-Za-z0-9._:/*?-]{1,256}")

_ID_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"

_DocPath = DocPath


class ProfileError(ValueError):
    """A deployment profile that cannot be served. ``str(err)`` is the whole message; ``line``
    and ``field`` repeat its parts when they are known."""

    def __init__(self, message: str, *, line: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.field = field


@dataclass(frozen=True)
class InstanceSpec:
    """One ``[[instance]]``: a model on a backend, with its options and lifecycle settings.

    ``model`` is a registered model name or a model file path (relative paths in a profile file
    are made absolute against the file's directory). ``backend`` ``None`` lets the manifest or
    the installed plugins choose. ``options`` is a read-only copy (nested values are copies, not
    shared with the caller). ``keep_alive_s`` ``None`` means never stopped for idleness; ``0``
    means stopped right after each request. ``keep_alive_max_s`` is the longest idle time a
    client's request may ask for (:meth:`client_hold`; ``math.inf``: forever, ``None``: the
    instance's ``keep_alive_s``).
    """

    id: str
    model: str
    backend: str | None = None
    options: Mapping[str, JsonValue] = field(default_factory=lambda: MappingProxyType({}))
    preload: bool = False
    keep_alive_s: float | None = None
    default: bool = False
    #: a remote backend's base URL (``model`` is then the name it serves, not a local file)
    endpoint: str | None = None
    #: the environment variable holding the remote endpoint's API key (the key itself never
    #: appears in a profile, a log or a response)
    api_key_env: str | None = None
    keep_alive_max_s: float | None = None
    #: ``"refuse"`` or ``"clamp"`` (:data:`OUTPUT_LIMITS`)
    output_limit: str = "refuse"
    #: never unloaded to make room (docs/deployments.md, "Residency limits")
    pin: bool = False
    #: the memory the instance needs loaded, as the operator declared it (``None``: estimated)
    memory_bytes: int | None = None
    #: the disk budget of the instance's prompt caches (``0``: off; ``None``: the host's,
    #: ``werk serve --prompt-cache-budget``; docs/prompt-cache.md)
    prompt_cache_bytes: int | None = None
    #: a loading notice on streamed chat while it starts (``None``: ``[residency]``'s)
    loading_notice: bool | None = None
    #: ``auto``, ``on`` or ``off``: the model files' page-cache release at unload (``None``: the
    #: host's, ``werk serve --model-cache-release``; docs/operations.md, "Model file cache")
    model_cache_release: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(copy.deepcopy(dict(self.options))))

    def client_hold(self, seconds: float) -> float | None:
        """The idle time a request of a client that is not an operator gets when it asks for
        ``seconds`` (``math.inf``: forever; docs/deployments.md, "Residency"): the request is
        clamped into ``[keep_alive, keep_alive_max]``, so a client never shortens the profile's
        ``keep_alive`` (never stops a shared instance sooner than the operator chose) and never
        extends it past ``keep_alive_max``. ``None``: the profile's own ``keep_alive``."""
        floor = math.inf if self.keep_alive_s is None else self.keep_alive_s
        ceiling = floor if self.keep_alive_max_s is None else self.keep_alive_max_s
        held = min(max(seconds, floor), ceiling)
        return None if held == floor else held


@dataclass(frozen=True)
class DeploymentProfile:
    """The instances (in profile order) and aliases one host serves; ``source`` names where the
    profile came from (a file path, or ``--model``) for messages."""

    instances: tuple[InstanceSpec, ...]
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    source: str = "<profile>"
    #: ``(pattern, alias)`` in profile order: model names an alias's ``match`` claims
    patterns: tuple[tuple[str, str], ...] = ()
    #: the instance id or alias serving model names nothing else names (``[routing] fallback``)
    fallback: str | None = None
    #: ``[residency]`` and ``[group.NAME]`` (werk_host/deployments/rules.py)
    residency: ResidencyRules = field(default_factory=ResidencyRules)

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", tuple(self.instances))
        object.__setattr__(self, "aliases", MappingProxyType({k: tuple(v) for k, v in self.aliases.items()}))
        object.__setattr__(self, "patterns", tuple(self.patterns))

    def instance(self, id: str) -> InstanceSpec | None:
        """The instance with this id, or ``None``."""
        return next((spec for spec in self.instances if spec.id == id), None)

    @property
    def default_instance(self) -> InstanceSpec:
        """The instance with ``default = true``, else the first one."""
        return next((spec for spec in self.instances if spec.default), self.instances[0])

    def ids(self) -> tuple[str, ...]:
        """Instance ids in profile order."""
        return tuple(spec.id for spec in self.instances)


def load_profile(path: Path, *, known_model: Callable[[str], bool]) -> DeploymentProfile:
    """Read and validate the profile file at ``path`` (see :func:`parse_profile`). Relative model
    paths in it are taken relative to the file's directory."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ProfileError(f"{path}: cannot read the profile: {err.strerror or err}") from err
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProfileError(f"{path}: the profile is not UTF-8 text (bad byte at offset {err.start})") from err
    return parse_profile(text, source=str(path), known_model=known_model, base_dir=path.absolute().parent)


def parse_profile(
    text: str, *, source: str, known_model: Callable[[str], bool], base_dir: Path | None = None
) -> DeploymentProfile:
    """Validate profile TOML ``text``; ``source`` names it in messages.

    ``known_model(name)`` says whether a model name is registered; it is asked only about values
    that are valid model names. A ``model`` that is not registered must be an existing file
    (relative paths against ``base_dir``, the working directory when ``None``), else the profile
    is refused as naming an unknown model.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise _syntax_error(source, err) from err
    return _Checker(text, source, known_model, base_dir).profile(data)


def profile_from_models(models: Sequence[str], *, known_model: Callable[[str], bool]) -> DeploymentProfile:
    """The profile ``--model NAME`` (repeatable) stands for: one instance per model, in order.

    The id is the model name, or for a file path its file stem, made to fit the id pattern
    (other characters become ``-``, leading non-alphanumerics dropped, at most 64 characters); a
    clash between two models' ids is settled with ``-2``, ``-3``, ... on the later one. The first
    model is the default; every instance is preloaded and kept forever. Naming one model twice
    (the same name, or paths to the same file) is an error.
    """
    source = "--model"
    if not models:
        raise ProfileError(f"{source}: no model given")
    specs: list[InstanceSpec] = []
    seen: dict[str, str] = {}
    taken: set[str] = set()
    for index, name in enumerate(models):
        field_name = f"{source}[{index}]"
        if not name:
            raise ProfileError(f"{field_name}: the model name is empty", field=field_name)
        if MODEL_NAME_RE.fullmatch(name) and known_model(name):
            identity, stem = f"name:{name}", name
        else:
            path = Path(name).expanduser()
            if not _is_file(path):
                raise ProfileError(f"{field_name}: {_unknown_model(name)}", field=field_name)
            identity, stem = f"file:{path.resolve()}", path.stem
        if identity in seen:
            raise ProfileError(
                f"{field_name}: {_quote(name)} is given more than once (also {seen[identity]})", field=field_name
            )
        seen[identity] = field_name
        instance_id = _unique_id(_sanitise_id(stem), taken)
        taken.add(instance_id)
        specs.append(InstanceSpec(id=instance_id, model=name, preload=True, keep_alive_s=None, default=index == 0))
    return DeploymentProfile(tuple(specs), {}, source)


# -- validation --------------------------------------------------------------------------------


class _Checker:
    """Turns a parsed profile into a :class:`DeploymentProfile`, or fails on the first fault."""

    def __init__(self, text: str, source: str, known_model: Callable[[str], bool], base_dir: Path | None) -> None:
        self.text = text
        self.source = source
        self.known_model = known_model
        self.base_dir = base_dir
        self._lines: dict[_DocPath, int] | None = None

    def fail(self, path: _DocPath, detail: str) -> NoReturn:
        if self._lines is None:
            self._lines = statement_lines(self.text)
        line = next((self._lines[path[:k]] for k in range(len(path), 0, -1) if path[:k] in self._lines), None)
        name = _field_name(path) or None
        where = self.source if line is None else f"{self.source}:{line}"
        message = f"{where}: {name}: {detail}" if name else f"{where}: {detail}"
        raise ProfileError(message, line=line, field=name)

    def profile(self, data: dict[str, object]) -> DeploymentProfile:
        for key in data:
            if key not in TOP_LEVEL_KEYS:
                self.fail(
                    (key,),
                    _unknown_key(
                        key, TOP_LEVEL_KEYS, "a profile holds only [[instance]], [alias.NAME] and [routing] tables"
                    ),
                )
        raw_instances = data.get("instance")
        if raw_instances is None:
            self.fail((), "no [[instance]] table: a profile needs at least one instance")
        if not isinstance(raw_instances, list):
            self.fail(("instance",), "must be an array of tables: write each instance as [[instance]]")
        if not raw_instances:
            self.fail(("instance",), "is empty: a profile needs at least one instance")
        specs: list[InstanceSpec] = []
        ids: dict[str, int] = {}
        default_at: int | None = None
        for index, raw in enumerate(raw_instances):
            spec = self.instance(index, raw)
            if spec.id in ids:
                self.fail(
                    ("instance", index, "id"), f"duplicate id {_quote(spec.id)} (instance[{ids[spec.id]}] has it)"
                )
            ids[spec.id] = index
            if spec.default:
                if default_at is not None:
                    self.fail(
                        ("instance", index, "default"),
                        f"only one instance may have default = true (instance[{default_at}] has it)",
                    )
                default_at = index
            specs.append(spec)
        aliases, patterns = self.aliases(data.get("alias", {}), ids)
        fallback = self.fallback(data.get("routing", {}), ids, aliases)
        return DeploymentProfile(tuple(specs), aliases, self.source, patterns, fallback, self.residency(data, ids))

    def residency(self, data: dict[str, object], ids: Mapping[str, int]) -> ResidencyRules:
        """``[residency]`` and ``[group.NAME]`` (werk_host/deployments/rules.py)."""
        max_loaded, timeout, queue, notice, handoff_wait = parse_residency(self.fail, data.get("residency", {}))
        groups = parse_groups(self.fail, data.get("group", {}), ids)
        for name in groups:
            if not ID_RE.fullmatch(name) or name in ids:
                self.fail(("group", name), f"{_quote(name)} is not a valid group name ({_ID_RULE}, not an instance id)")
        return ResidencyRules(max_loaded, timeout, queue, groups, loading_notice=notice, handoff_wait_s=handoff_wait)

    def instance(self, index: int, raw: object) -> InstanceSpec:
        at: _DocPath = ("instance", index)
        if not isinstance(raw, dict):
            self.fail(at, f"must be a table, not {_toml_type(raw)}")
        for key in raw:
            if key not in INSTANCE_KEYS:
                self.fail((*at, key), _unknown_key(key, INSTANCE_KEYS, "an instance takes " + ", ".join(INSTANCE_KEYS)))
        instance_id = self.string(raw, at, "id")
        if instance_id is None:
            self.fail(at, 'missing required key "id"')
        if not ID_RE.fullmatch(instance_id):
            self.fail((*at, "id"), f"{_quote(instance_id)} is not a valid instance id ({_ID_RULE})")
        model = self.string(raw, at, "model")
        if model is None:
            self.fail(at, 'missing required key "model"')
        endpoint = self.string(raw, at, "endpoint")
        if endpoint is not None and not _ENDPOINT_RE.fullmatch(endpoint):
            self.fail((*at, "endpoint"), f"{_quote(endpoint)} is not an http:// or https:// URL")
        api_key_env = self.string(raw, at, "api_key_env")
        if api_key_env is not None and endpoint is None:
            self.fail((*at, "api_key_env"), "only a remote instance (with endpoint) takes an API key variable")
        if api_key_env is not None and not _ENV_NAME_RE.fullmatch(api_key_env):
            self.fail((*at, "api_key_env"), f"{_quote(api_key_env)} is not an environment variable name")
        if endpoint is not None and self.string(raw, at, "backend") is None:
            self.fail(at, 'a remote instance (with endpoint) needs "backend"')
        keep_alive = self.keep_alive((*at, "keep_alive"), raw.get("keep_alive", "forever"))
        return InstanceSpec(
            id=instance_id,
            model=model if endpoint is not None else self.model((*at, "model"), model),
            endpoint=endpoint,
            api_key_env=api_key_env,
            backend=self.string(raw, at, "backend"),
            options=self.options((*at, "options"), raw.get("options", {})),
            preload=self.boolean(raw, at, "preload"),
            keep_alive_s=keep_alive,
            keep_alive_max_s=self.keep_alive_max(at, raw, keep_alive),
            output_limit=self.output_limit(at, raw),
            default=self.boolean(raw, at, "default"),
            pin=self.boolean(raw, at, "pin"),
            memory_bytes=parse_memory(self.fail, (*at, "memory"), raw["memory"]) if "memory" in raw else None,
            prompt_cache_bytes=(
                parse_memory(self.fail, (*at, "prompt_cache"), raw["prompt_cache"], allow_zero=True)
                if "prompt_cache" in raw
                else None
            ),
            loading_notice=self.boolean(raw, at, "loading_notice") if "loading_notice" in raw else None,
            model_cache_release=self.cache_release(at, raw),
        )

    def cache_release(self, at: _DocPath, raw: dict[str, object]) -> str | None:
        value = self.string(raw, at, "model_cache_release")
        if value is not None and value not in CACHE_RELEASE_MODES:
            self.fail((*at, "model_cache_release"), f"{_quote(value)} is not one of {', '.join(CACHE_RELEASE_MODES)}")
        return value

    def keep_alive_max(self, at: _DocPath, raw: dict[str, object], keep_alive: float | None) -> float | None:
        if "keep_alive_max" not in raw:
            return None
        value = self.keep_alive((*at, "keep_alive_max"), raw["keep_alive_max"])
        ceiling = math.inf if value is None else value
        if ceiling < (math.inf if keep_alive is None else keep_alive):
            self.fail((*at, "keep_alive_max"), "is shorter than keep_alive: it bounds how far a client may extend it")
        return ceiling

    def output_limit(self, at: _DocPath, raw: dict[str, object]) -> str:
        value = self.string(raw, at, "output_limit")
        if value is not None and value not in OUTPUT_LIMITS:
            self.fail((*at, "output_limit"), f"{_quote(value)} is not one of {', '.join(OUTPUT_LIMITS)}")
        return value or "refuse"

    def string(self, raw: dict[str, object], at: _DocPath, key: str) -> str | None:
        value = raw.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail((*at, key), f"must be a string, not {_toml_type(value)}")
        if not value.strip():
            self.fail((*at, key), "must not be empty")
        return value

    def boolean(self, raw: dict[str, object], at: _DocPath, key: str) -> bool:
        value = raw.get(key, False)
        if not isinstance(value, bool):
            self.fail((*at, key), f"must be true or false, not {_toml_type(value)}")
        return value

    def model(self, at: _DocPath, name: str) -> str:
        if MODEL_NAME_RE.fullmatch(name) and self.known_model(name):
            return name
        path = Path(name).expanduser()
        if not path.is_absolute() and self.base_dir is not None:
            path = self.base_dir / path
        if not _is_file(path):
            self.fail(at, _unknown_model(name))
        return str(path)

    def options(self, at: _DocPath, value: object) -> dict[str, JsonValue]:
        if not isinstance(value, dict):
            self.fail(at, f"must be a table such as {{ parallel = 2 }}, not {_toml_type(value)}")
        return {key: self.json_value((*at, key), item) for key, item in value.items()}

    def json_value(self, at: _DocPath, value: object) -> JsonValue:
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(at, "nan and inf cannot be backend options")
        if isinstance(value, str | bool | int | float):
            return value
        if isinstance(value, list):
            return [self.json_value((*at, index), item) for index, item in enumerate(value)]
        if isinstance(value, dict):
            return {key: self.json_value((*at, key), item) for key, item in value.items()}
        self.fail(at, f"{_toml_type(value)} cannot be a backend option; quote it as a string")

    def keep_alive(self, at: _DocPath, value: object) -> float | None:
        if isinstance(value, str):
            try:
                return parse_duration(value)
            except ValueError as err:
                self.fail(at, str(err))
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                self.fail(at, f"{value} is negative: a keep_alive in seconds must be 0 or more")
            if value > MAX_DURATION_S:
                self.fail(at, bound_message(f"{value}s"))
            return float(value)
        self.fail(at, f"must be a duration string {DURATION_HINT} or whole seconds, not {_toml_type(value)}")

    def aliases(
        self, value: object, ids: Mapping[str, int]
    ) -> tuple[dict[str, tuple[str, ...]], tuple[tuple[str, str], ...]]:
        """The aliases by name, and the ``(pattern, alias)`` pairs of their ``match`` lists."""
        if not isinstance(value, dict):
            self.fail(("alias",), f"must be a table of aliases ([alias.NAME] tables), not {_toml_type(value)}")
        aliases: dict[str, tuple[str, ...]] = {}
        patterns: dict[str, str] = {}
        for name, body in value.items():
            at: _DocPath = ("alias", name)
            if not ID_RE.fullmatch(name):
                self.fail(at, f"{_quote(name)} is not a valid alias name ({_ID_RULE})")
            if name in ids:
                self.fail(at, f"alias {name} has the same name as instance[{ids[name]}]; an alias needs its own name")
            if not isinstance(body, dict):
                self.fail(at, f"must be a table with replicas = [...], not {_toml_type(body)}")
            for key in body:
                if key not in ALIAS_KEYS:
                    self.fail((*at, key), _unknown_key(key, ALIAS_KEYS, "an alias takes only replicas and match"))
            replicas = body.get("replicas")
            if replicas is None:
                self.fail(at, 'missing required key "replicas"')
            if not isinstance(replicas, list):
                self.fail((*at, "replicas"), f"must be an array of instance ids, not {_toml_type(replicas)}")
            if not replicas:
                self.fail((*at, "replicas"), "is empty: an alias needs at least one replica")
            seen: set[str] = set()
            for index, replica in enumerate(replicas):
                where: _DocPath = (*at, "replicas", index)
                if not isinstance(replica, str):
                    self.fail(where, f"must be an instance id, not {_toml_type(replica)}")
                if replica not in ids:
                    if replica in value:
                        self.fail(where, f"{_quote(replica)} is an alias; an alias's replicas must be instance ids")
                    known = ", ".join(ids)
                    self.fail(where, f"{_quote(replica)} is not an instance id (instances: {known})")
                if replica in seen:
                    self.fail(where, f"{_quote(replica)} is listed more than once")
                seen.add(replica)
            aliases[name] = tuple(replicas)
            for pattern in self.match(body.get("match", []), at):
                if pattern in patterns:
                    self.fail((*at, "match"), f"{_quote(pattern)} is matched by alias {patterns[pattern]} already")
                patterns[pattern] = name
        return aliases, tuple(patterns.items())

    def match(self, value: object, at: _DocPath) -> list[str]:
        """An alias's ``match``: model-name patterns with ``*`` and ``?`` wildcards."""
        where: _DocPath = (*at, "match")
        if not isinstance(value, list):
            self.fail(where, f'must be an array of model-name patterns such as ["claude-*"], not {_toml_type(value)}')
        for index, pattern in enumerate(value):
            if not isinstance(pattern, str) or not PATTERN_RE.fullmatch(pattern):
                self.fail(
                    (*where, index),
                    "must be a model-name pattern: 1-256 letters, digits, '.', '_', ':', '/', '-' and the "
                    "wildcards '*' and '?'",
                )
        return list(value)

    def fallback(self, value: object, ids: Mapping[str, int], aliases: Mapping[str, object]) -> str | None:
        """``[routing] fallback``: the instance id or alias unknown model names go to."""
        if not isinstance(value, dict):
            self.fail(("routing",), f"must be a table ([routing]), not {_toml_type(value)}")
        for key in value:
            if key not in ROUTING_KEYS:
                self.fail(("routing", key), _unknown_key(key, ROUTING_KEYS, "[routing] takes only fallback"))
        fallback = value.get("fallback")
        if fallback is None:
            return None
        if not isinstance(fallback, str) or (fallback not in ids and fallback not in aliases):
            known = ", ".join([*ids, *aliases])
            self.fail(("routing", "fallback"), f"must be an instance id or an alias (known: {known})")
        return fallback


# -- helpers -----------------------------------------------------------------------------------


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, dt.date | dt.time):
        return "a date/time"
    return type(value).__name__


def _field_name(path: _DocPath) -> str:
    """``("instance", 1, "keep_alive")`` → ``instance[1].keep_alive``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else _quote(part)
            out += f".{text}" if out else text
    return out


def _unknown_key(key: str, known: Sequence[str], note: str) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown key{hint} ({note})"


def _unknown_model(name: str) -> str:
    return f"unknown model {_quote(name)}: not a registered model name (werk models list) and not an existing file"


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _sanitise_id(stem: str) -> str:
    text = re.sub(r"[^A-Za-z0-9._-]", "-", stem)
    text = re.sub(r"^[^A-Za-z0-9]+", "", text)[:ID_MAX_LEN]
    return text or "model"


def _unique_id(base: str, taken: set[str]) -> str:
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        suffix = f"-{n}"
        candidate = base[: ID_MAX_LEN - len(suffix)] + suffix
    return candidate


def _syntax_error(source: str, err: tomllib.TOMLDecodeError) -> ProfileError:
    message = str(err)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match is None:
        return ProfileError(f"{source}: invalid TOML: {message}")
    line = int(match.group(1))
    return ProfileError(f"{source}:{line}:{match.group(2)}: invalid TOML: {message[: match.start()]}", line=line)
