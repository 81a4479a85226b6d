"""Deployment profiles (werk_host/deployments/profile.py): the TOML format, its validation with
line numbers, durations and the ``--model`` shorthand. Every profile is a real file under tmp_path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from werk_host.deployments import (
    DeploymentProfile,
    InstanceSpec,
    ProfileError,
    load_profile,
    parse_duration,
    parse_profile,
    profile_from_models,
)
from werk_host.models import NAME_RE

REGISTERED = {"tiny", "small", "chat-model"}
HINT = '(use 45s, 30m, 2h, 1h30m, "0" or "forever")'


def known_model(name: str) -> bool:
    # Like ModelRegistry.get, refuse to be asked about a string that cannot be a model name.
    assert NAME_RE.fullmatch(name), f"known_model asked about {name!r}"
    return name in REGISTERED


def write(tmp_path: Path, text: str, name: str = "deployments.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load(tmp_path: Path, text: str) -> DeploymentProfile:
    return load_profile(write(tmp_path, text), known_model=known_model)


def refused(tmp_path: Path, text: str) -> tuple[Path, ProfileError]:
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as caught:
        load_profile(path, known_model=known_model)
    return path, caught.value


# -- a valid profile ---------------------------------------------------------------------------


def test_full_profile(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    gguf = tmp_path / "models" / "local.gguf"
    gguf.write_bytes(b"GGUF")
    profile = load(
        tmp_path,
        """
        # two replicas of tiny behind one alias, and a local file
        [[instance]]
        id = "tiny-a"
        model = "tiny"
        backend = "llama.cpp"
        options = { parallel = 2, flags = ["--mlock"], nested = { a = 1.5 } }
        preload = true
        keep_alive = "30m"

        [[instance]]
        id = "tiny-b"
        model = "tiny"
        keep_alive = 0
        default = true

        [[instance]]
        id = "local"
        model = "models/local.gguf"
        keep_alive = 90

        [instance.options]
        ctx_size = 4096

        [alias.chat]
        replicas = ["tiny-a", "tiny-b"]

        [alias."all.of-them"]
        replicas = ["local", "tiny-a", "tiny-b"]
        """,
    )
    assert profile.source == str(tmp_path / "deployments.toml")
    assert profile.ids() == ("tiny-a", "tiny-b", "local")
    a, b, local = profile.instances
    assert a == InstanceSpec(
        id="tiny-a",
        model="tiny",
        backend="llama.cpp",
        options={"parallel": 2, "flags": ["--mlock"], "nested": {"a": 1.5}},
        preload=True,
        keep_alive_s=1800.0,
        default=False,
    )
    assert (b.backend, dict(b.options), b.preload, b.keep_alive_s, b.default) == (None, {}, False, 0.0, True)
    assert local.model == str(gguf)  # relative to the profile's directory, made absolute
    assert dict(local.options) == {"ctx_size": 4096}
    assert local.keep_alive_s == 90.0
    assert dict(profile.aliases) == {"chat": ("tiny-a", "tiny-b"), "all.of-them": ("local", "tiny-a", "tiny-b")}
    assert profile.default_instance is b
    assert profile.instance("local") is local
    assert profile.instance("chat") is None
    with pytest.raises(TypeError):
        a.options["parallel"] = 3  # type: ignore[index]
    with pytest.raises(TypeError):
        profile.aliases["x"] = ("tiny-a",)  # type: ignore[index]


def test_defaults_and_first_instance_is_default(tmp_path: Path) -> None:
    profile = load(
        tmp_path,
        """
        [[instance]]
        id = "one"
        model = "tiny"

        [[instance]]
        id = "two"
        model = "small"
        """,
    )
    one, two = profile.instances
    assert one == InstanceSpec(id="one", model="tiny")
    assert (one.backend, one.preload, one.keep_alive_s, one.default) == (None, False, None, False)
    assert profile.default_instance is one
    assert dict(profile.aliases) == {}


def test_instances_as_an_inline_array(tmp_path: Path) -> None:
    profile = load(tmp_path, 'instance = [{ id = "a", model = "tiny" }, { id = "b", model = "small" }]\n')
    assert profile.ids() == ("a", "b")


def test_absolute_model_path_and_options_are_copies(tmp_path: Path) -> None:
    gguf = tmp_path / "elsewhere.gguf"
    gguf.write_bytes(b"GGUF")
    profile = parse_profile(f'[[instance]]\nid = "x"\nmodel = "{gguf}"\n', source="inline", known_model=known_model)
    assert profile.instances[0].model == str(gguf)
    options: dict[str, object] = {"list": [1]}
    spec = InstanceSpec(id="x", model="tiny", options=options)  # type: ignore[arg-type]
    options["list"].append(2)  # type: ignore[attr-defined]
    options["new"] = 1
    assert dict(spec.options) == {"list": [1]}


def test_relative_model_path_without_a_base_dir_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    text = '[[instance]]\nid = "x"\nmodel = "m.gguf"\n'
    monkeypatch.chdir(tmp_path)
    assert parse_profile(text, source="inline", known_model=known_model).instances[0].model == "m.gguf"
    monkeypatch.chdir(tmp_path.parent)
    with pytest.raises(ProfileError, match=r'^inline:3: instance\[0\]\.model: unknown model "m.gguf"'):
        parse_profile(text, source="inline", known_model=known_model)


# -- validation: each fault names the file, the line and the field ---------------------------------

TWO = """
[[instance]]
id = "a"
model = "tiny"

[[instance]]
id = "b"
model = "small"

"""

CASES: list[tuple[str, str, int | None, str]] = [
    # (profile text, field, line, the message's detail after "field: ")
    (
        """
        [[instance]]
        id = "tiny-a"
        model = "tiny"

        [[instance]]
        id = "tiny-b"
        keep_alive = "30x"
        model = "tiny"
        """,
        "instance[1].keep_alive",
        7,
        f'"30x" is not a duration {HINT}',
    ),
    ("", "", None, "no [[instance]] table: a profile needs at least one instance"),
    ('[alias.chat]\nreplicas = ["a"]\n', "", None, "no [[instance]] table: a profile needs at least one instance"),
    ("# nothing\ninstance = []\n", "instance", 2, "is empty: a profile needs at least one instance"),
    (
        '[instance]\nid = "a"\nmodel = "tiny"\n',
        "instance",
        1,
        "must be an array of tables: write each instance as [[instance]]",
    ),
    ("instance = [1]\n", "instance[0]", 1, "must be a table, not an integer"),
    (
        "instances = 2\n" + TWO,
        "instances",
        1,
        "unknown key; did you mean instance? (a profile holds only [[instance]], [alias.NAME] and [routing] tables)",
    ),
    (
        TWO + "[server]\nport = 1\n",
        "server",
        9,
        "unknown key (a profile holds only [[instance]], [alias.NAME] and [routing] tables)",
    ),
    (
        TWO + 'keepalive = "1h"\n',
        "instance[1].keepalive",
        9,
        "unknown key; did you mean keep_alive? (an instance takes id, model, backend, options, preload, "
        "keep_alive, keep_alive_max, default, endpoint, api_key_env, output_limit, pin, memory, prompt_cache, "
        "loading_notice, model_cache_release)",
    ),
    ('[[instance]]\nmodel = "tiny"\n', "instance[0]", 1, 'missing required key "id"'),
    ('[[instance]]\nid = "a"\n\n[[instance]]\nid = "b"\n', "instance[0]", 1, 'missing required key "model"'),
    ('[[instance]]\nid = 3\nmodel = "tiny"\n', "instance[0].id", 2, "must be a string, not an integer"),
    ('[[instance]]\nid = ""\nmodel = "tiny"\n', "instance[0].id", 2, "must not be empty"),
    (
        '[[instance]]\nid = "-a"\nmodel = "tiny"\n',
        "instance[0].id",
        2,
        "\"-a\" is not a valid instance id (1-64 letters, digits, '.', '_' or '-', starting with a letter or digit)",
    ),
    (
        f'[[instance]]\nid = "{"x" * 65}"\nmodel = "tiny"\n',
        "instance[0].id",
        2,
        f"\"{'x' * 65}\" is not a valid instance id (1-64 letters, digits, '.', '_' or '-', starting with a letter "
        "or digit)",
    ),
    ('[[instance]]\nid = "a b"\nmodel = "tiny"\n', "instance[0].id", 2, '"a b" is not a valid instance id'),
    (TWO.replace('id = "b"', 'id = "a"'), "instance[1].id", 6, 'duplicate id "a" (instance[0] has it)'),
    ('[[instance]]\nid = "a"\nmodel = ["tiny"]\n', "instance[0].model", 3, "must be a string, not an array"),
    ('[[instance]]\nid = "a"\nmodel = " "\n', "instance[0].model", 3, "must not be empty"),
    (
        TWO.replace('"small"', '"nope"'),
        "instance[1].model",
        7,
        'unknown model "nope": not a registered model name (werk models list) and not an existing file',
    ),
    (
        '[[instance]]\nid = "a"\nmodel = "missing/file.gguf"\n',
        "instance[0].model",
        3,
        'unknown model "missing/file.gguf"',
    ),
    ('[[instance]]\nid = "a"\nmodel = "tiny"\nbackend = ""\n', "instance[0].backend", 4, "must not be empty"),
    ('[[instance]]\nid = "a"\nmodel = "tiny"\nbackend = 1\n', "instance[0].backend", 4, "must be a string"),
    (
        '[[instance]]\nid = "a"\nmodel = "tiny"\noptions = 2\n',
        "instance[0].options",
        4,
        "must be a table such as { parallel = 2 }, not an integer",
    ),
    (
        '[[instance]]\nid = "a"\nmodel = "tiny"\n\n[instance.options]\nparallel = 2\nwhen = 1979-05-27\n',
        "instance[0].options.when",
        7,
        "a date/time cannot be a backend option; quote it as a string",
    ),
    (
        '[[instance]]\nid = "a"\nmodel = "tiny"\noptions = { x = [nan] }\n',
        "instance[0].options.x[0]",
        4,
        "nan and inf cannot be backend options",
    ),
    (
        '[[instance]]\nid = "a"\nmodel = "tiny"\npreload = "yes"\n',
        "instance[0].preload",
        4,
        "must be true or false, not a string",
    ),
    (
        '[[instance]]\nid = "a"\nmodel = "tiny"\ndefault = 1\n',
        "instance[0].default",
        4,
        "must be true or false, not an integer",
    ),
    (
        TWO.replace('model = "tiny"', 'model = "tiny"\ndefault = true') + "default = true\n",
        "instance[1].default",
        10,
        "only one instance may have default = true (instance[0] has it)",
    ),
    (
        '[[instance]]\nid = "a"\nmodel = "tiny"\nkeep_alive = -5\n',
        "instance[0].keep_alive",
        4,
        "-5 is negative: a keep_alive in seconds must be 0 or more",
    ),
    (
        '[[instance]]\nid = "a"\nmodel = "tiny"\nkeep_alive = "-5m"\n',
        "instance[0].keep_alive",
        4,
        f'"-5m" is not a duration {HINT}',
    ),
    (
        '[[instance]]\nid = "a"\nmodel = "tiny"\nkeep_alive = 1.5\n',
        "instance[0].keep_alive",
        4,
        f"must be a duration string {HINT} or whole seconds, not a float",
    ),
    (
        '[[instance]]\nid = "a"\nmodel = "tiny"\nkeep_alive = true\n',
        "instance[0].keep_alive",
        4,
        f"must be a duration string {HINT} or whole seconds, not a boolean",
    ),
    # aliases
    ("alias = 3\n" + TWO, "alias", 1, "must be a table of aliases ([alias.NAME] tables), not an integer"),
    (TWO + '[alias]\nchat = ["a"]\n', "alias.chat", 10, "must be a table with replicas = [...], not an array"),
    (
        TWO + '[alias."bad name"]\nreplicas = ["a"]\n',
        'alias."bad name"',
        9,
        "\"bad name\" is not a valid alias name (1-64 letters, digits, '.', '_' or '-', starting with a letter or digit)",
    ),
    (
        TWO + '[alias.a]\nreplicas = ["b"]\n',
        "alias.a",
        9,
        "alias a has the same name as instance[0]; an alias needs its own name",
    ),
    (TWO + "[alias.chat]\n", "alias.chat", 9, 'missing required key "replicas"'),
    (TWO + "[alias.chat]\nreplicas = []\n", "alias.chat.replicas", 10, "is empty: an alias needs at least one replica"),
    (
        TWO + '[alias.chat]\nreplicas = "a"\n',
        "alias.chat.replicas",
        10,
        "must be an array of instance ids, not a string",
    ),
    (TWO + "[alias.chat]\nreplicas = [1]\n", "alias.chat.replicas[0]", 10, "must be an instance id, not an integer"),
    (
        TWO + '[alias.chat]\nreplicas = ["a", "c"]\n',
        "alias.chat.replicas[1]",
        10,
        '"c" is not an instance id (instances: a, b)',
    ),
    (
        TWO + '[alias.chat]\nreplicas = ["a"]\n\n[alias.both]\nreplicas = [\n  "b",\n  "chat",\n]\n',
        "alias.both.replicas[1]",
        13,
        '"chat" is an alias; an alias\'s replicas must be instance ids',
    ),
    (TWO + '[alias.chat]\nreplicas = ["a", "b", "a"]\n', "alias.chat.replicas[2]", 10, '"a" is listed more than once'),
    (
        TWO + '[alias.chat]\nreplicas = ["a"]\nreplica = ["b"]\n',
        "alias.chat.replica",
        11,
        "unknown key; did you mean replicas? (an alias takes only replicas and match)",
    ),
    # Lines are found past multi-line strings and arrays that look like headers, and in inline arrays.
    (
        '''
        [[instance]]
        id = "a"
        model = "tiny"

        [instance.options]
        note = """
        [[instance]]
        id = "fake"
        """
        list = [
          ["[[instance]]"],
          '[[instance]]',
        ]

        [[instance]]
        id = "b"
        model = "tiny"
        preload = "no"
        ''',
        "instance[1].preload",
        18,
        "must be true or false, not a string",
    ),
    (
        'instance = [\n  { id = "a", model = "tiny" },\n  { id = "b", model = "nope" },\n]\n',
        "instance[1].model",
        1,
        'unknown model "nope"',
    ),
    (
        '[[instance]]\n"id" = "a"\n  model   =   "tiny"\n"keep_alive" = "1y"\n',
        "instance[0].keep_alive",
        4,
        f'"1y" is not a duration {HINT}',
    ),
]


@pytest.mark.parametrize(("text", "field", "line", "detail"), CASES)
def test_validation_error_names_line_and_field(
    tmp_path: Path, text: str, field: str, line: int | None, detail: str
) -> None:
    path, err = refused(tmp_path, text)
    where = str(path) if line is None else f"{path}:{line}"
    prefix = f"{where}: {field}: " if field else f"{where}: "
    assert str(err).startswith(prefix + detail), str(err)
    assert (err.line, err.field) == (line, field or None)


def test_the_documented_example_message_exactly(tmp_path: Path) -> None:
    path, err = refused(tmp_path, CASES[0][0])
    assert str(err) == f'{path}:7: instance[1].keep_alive: "30x" is not a duration {HINT}'


# -- syntax and file errors -----------------------------------------------------------------------


def test_toml_syntax_error_keeps_line_and_column(tmp_path: Path) -> None:
    path, err = refused(tmp_path, '[[instance]]\nid = "a\nmodel = "tiny"\n')
    assert str(err).startswith(f"{path}:2:")
    assert "invalid TOML: " in str(err)
    assert err.line == 2


def test_toml_syntax_error_column(tmp_path: Path) -> None:
    path, err = refused(tmp_path, '[[instance]]\nid = "a"\nmodel = = "tiny"\n')
    assert str(err) == f"{path}:3:9: invalid TOML: Invalid value"


def test_redefined_key_is_a_syntax_error(tmp_path: Path) -> None:
    path, err = refused(tmp_path, '[[instance]]\nid = "a"\nid = "b"\nmodel = "tiny"\n')
    assert str(err).startswith(f"{path}:3:")


def test_missing_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read the profile"):
        load_profile(tmp_path / "absent.toml", known_model=known_model)
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[[instance]]\nid = "caf\xe9"\n')
    with pytest.raises(ProfileError, match=r"is not UTF-8 text \(bad byte at offset 22\)"):
        load_profile(bad, known_model=known_model)


# -- durations -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("forever", None),
        ("0", 0.0),
        ("0s", 0.0),
        ("45s", 45.0),
        ("90s", 90.0),
        ("2m", 120.0),
        ("30m", 1800.0),
        ("90m", 5400.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1h30s", 3630.0),
        ("1h0m30s", 3630.0),
        ("2m30s", 150.0),
        ("1.5h", 5400.0),
        ("0.5s", 0.5),
        ("1h0.5m", 3630.0),
    ],
)
def test_durations(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        "30x",
        "-5m",
        "-0",
        "+5m",
        "5",
        "00",
        "1ms",
        "1d",
        "30m1h",
        "1h1h",
        "1s2m",
        " 30m",
        "30m ",
        "30 m",
        "1h 30m",
        "30M",
        "Forever",
        "FOREVER",
        ".5h",
        "1.h",
        "1e3s",
        "inf",
        "nan",
        "h",
        "m30",
        "٣s",
        "30m\n",
        "9" * 400 + "h",
    ],
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "seconds"), [('"0"', 0.0), ("0", 0.0), ("90", 90.0), ('"forever"', None), ('"1h30m"', 5400.0)]
)
def test_keep_alive_in_a_profile(tmp_path: Path, value: str, seconds: float | None) -> None:
    profile = load(tmp_path, f'[[instance]]\nid = "a"\nmodel = "tiny"\nkeep_alive = {value}\n')
    assert profile.instances[0].keep_alive_s == seconds


# -- the --model shorthand -------------------------------------------------------------------------


def test_model_shorthand_for_registered_names() -> None:
    profile = profile_from_models(["tiny", "chat-model"], known_model=known_model)
    assert profile.source == "--model"
    assert profile.instances == (
        InstanceSpec(id="tiny", model="tiny", preload=True, keep_alive_s=None, default=True),
        InstanceSpec(id="chat-model", model="chat-model", preload=True, keep_alive_s=None, default=False),
    )
    assert profile.default_instance.id == "tiny"
    assert dict(profile.aliases) == {}


def test_single_model_shorthand_is_todays_behaviour() -> None:
    (spec,) = profile_from_models(["small"], known_model=known_model).instances
    assert (spec.id, spec.model, spec.preload, spec.keep_alive_s, spec.default) == ("small", "small", True, None, True)


def test_model_shorthand_for_paths(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    files = [
        tmp_path / "My Model (v2).Q4_K_M.gguf",
        tmp_path / "__hidden.gguf",
        tmp_path / f"{'L' * 80}.gguf",
        tmp_path / "a" / "model.gguf",
        tmp_path / "b" / "model.gguf",
        tmp_path / "%%%.gguf",
    ]
    for path in files:
        path.write_bytes(b"GGUF")
    profile = profile_from_models([*map(str, files), "tiny"], known_model=known_model)
    assert profile.ids() == ("My-Model--v2-.Q4_K_M", "hidden", "L" * 64, "model", "model-2", "model-3", "tiny")
    assert [s.model for s in profile.instances] == [*map(str, files), "tiny"]
    assert [s.default for s in profile.instances] == [True] + [False] * 6


def test_model_shorthand_suffix_keeps_ids_within_64_characters(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    long = "n" * 70
    first, second = tmp_path / f"{long}.gguf", tmp_path / "a" / f"{long}.gguf"
    first.write_bytes(b"GGUF")
    second.write_bytes(b"GGUF")
    profile = profile_from_models([str(first), str(second)], known_model=known_model)
    assert profile.ids() == ("n" * 64, "n" * 62 + "-2")


def test_model_shorthand_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProfileError, match=r'^--model\[1\]: "tiny" is given more than once \(also --model\[0\]\)$'):
        profile_from_models(["tiny", "tiny"], known_model=known_model)
    with pytest.raises(ProfileError, match=r'^--model\[1\]: "\./m.gguf" is given more than once'):
        profile_from_models([str(gguf), "./m.gguf"], known_model=known_model)
    with pytest.raises(ProfileError, match=r'^--model\[0\]: unknown model "nope": not a registered model name'):
        profile_from_models(["nope"], known_model=known_model)
    with pytest.raises(ProfileError, match=r"^--model\[0\]: the model name is empty$"):
        profile_from_models([""], known_model=known_model)
    with pytest.raises(ProfileError, match=r"^--model: no model given$"):
        profile_from_models([], known_model=known_model)


def test_a_remote_instance_names_its_endpoint_and_key_variable(tmp_path: Path) -> None:
    text = (
        '[[instance]]\nid = "far"\nmodel = "served-elsewhere"\nbackend = "vllm"\n'
        'endpoint = "http://10.0.0.5:8000"\napi_key_env = "FAR_KEY"\n'
    )
    profile = parse_profile(text, source="p.toml", known_model=lambda name: False)
    (spec,) = profile.instances
    assert (spec.model, spec.endpoint, spec.api_key_env) == ("served-elsewhere", "http://10.0.0.5:8000", "FAR_KEY")


@pytest.mark.parametrize(
    ("extra", "field", "detail"),
    [
        ('backend = "vllm"\nendpoint = "ftp://x"\n', "instance[0].endpoint", "is not an http:// or https:// URL"),
        ('endpoint = "http://x:1"\n', "instance[0]", 'a remote instance (with endpoint) needs "backend"'),
        ('backend = "vllm"\napi_key_env = "K"\n', "instance[0].api_key_env", "only a remote instance"),
        ('backend = "vllm"\nendpoint = "http://x:1"\napi_key_env = "1bad"\n', "instance[0].api_key_env", "not an"),
    ],
)
def test_remote_instance_errors(extra: str, field: str, detail: str) -> None:
    text = '[[instance]]\nid = "far"\nmodel = "tiny"\n' + extra
    with pytest.raises(ProfileError) as err:
        parse_profile(text, source="p.toml", known_model=lambda name: True)
    assert f"{field}: " in str(err.value) and detail in str(err.value)
