"""A profile's llama.cpp ``options`` are checked when ``werk serve`` starts (werk_llamacpp.options):
an unknown option or a bad ``parallel`` stops it with exit status 2 and one ``werk: invalid profile:``
line naming the instance and the option, before anything starts; good options pass. No
llama-server is needed: the instance is not preloaded, so a profile that passes starts nothing
either.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from werk_llamacpp import plugin as llama_plugin
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.plugin import HostConfig
from werk_host.testing.host import Host, PluginHost, ProfileError, build_host, werk_main


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """``werk serve`` configures the root logger for its process; put the test run's back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_model(tmp_path_factory.mktemp("model") / "tiny-llama.gguf")


def _profile(tmp_path: Path, model: Path, options: str) -> Path:
    path = tmp_path / "deployments.toml"
    path.write_text(
        f'[[instance]]\nid = "tiny"\nmodel = "{model}"\nbackend = "llama.cpp"\noptions = {{ {options} }}\n'
        "preload = false\n"
    )
    return path


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ("frobnicate = 1", "unknown option frobnicate (llama.cpp takes "),
        ("parallel = 0", "parallel must be at least 1, not 0"),
        ("parallel = -2", "parallel must be at least 1"),
        ('parallel = "two"', "parallel must be an integer"),
        ("parallel = 1.5", "parallel must be an integer"),
        ("ctx = 0", "ctx must be at least 1"),
        ("slot_wait_s = 0", "slot_wait_s must be positive"),
        ('llama_server = ""', "llama_server must be the path"),
    ],
)
def test_werk_serve_refuses_bad_options_at_start(tmp_path: Path, model: Path, options: str, fragment: str) -> None:
    profile = _profile(tmp_path, model, options)
    home = tmp_path / "home"
    with pytest.raises(ProfileError) as err:  # werk serve: exit status 2, one line "werk: invalid profile: ..."
        _build(home, profile)
    message = str(err.value)
    assert message.startswith(f"{profile}: instance tiny: options: ") and fragment in message, message
    assert "\n" not in message


def test_werk_serve_exits_with_the_line(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    profile = _profile(tmp_path, model, "frobnicate = 1")
    with pytest.raises(ProfileError):  # checked first, so that the command below cannot start serving
        _build(tmp_path / "probe", profile)
    assert werk_main(["serve", "--home", str(tmp_path / "home"), "--profile", str(profile), "--port", "0"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("werk: invalid profile: ") and "unknown option frobnicate" in line, line


def _build(home: Path, profile: Path) -> Host:
    plugins = PluginHost()
    plugins.register(llama_plugin, "llamacpp")
    return build_host(HostConfig(home=home, profile=profile), plugins=plugins)


def test_good_options_pass_the_check(tmp_path: Path, model: Path) -> None:
    profile = _profile(tmp_path, model, "parallel = 2, ctx = 4096, threads = 1, warmup_tokens = 0, slot_wait_s = 2.5")
    host = _build(tmp_path / "home", profile)
    try:
        assert host.fleet.deployments is not None and list(host.fleet.deployments.instances) == ["tiny"]
    finally:
        host.close()
