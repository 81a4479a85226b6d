"""A profile's vllm ``options`` are checked when ``werk serve`` starts (the rules of
``werk_vllm.launch.parse_options``), before anything starts or connects: an unknown option or a
bad value refuses the profile with one line naming the instance and the option."""

from __future__ import annotations

from pathlib import Path

import pytest
from werk_vllm import plugin as vllm_plugin

from werk_host.plugin import HostConfig
from werk_host.testing.host import Host, PluginHost, ProfileError, build_host

REMOTE = '[[instance]]\nid = "far"\nmodel = "m"\nbackend = "vllm"\nendpoint = "http://127.0.0.1:9"\n'


def _build(tmp_path: Path, text: str) -> Host:
    profile = tmp_path / "deployments.toml"
    profile.write_text(text)
    plugins = PluginHost()
    plugins.register(vllm_plugin, "vllm")
    return build_host(HostConfig(home=tmp_path / "home", profile=profile), plugins=plugins)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ("frobnicate = 1", "unknown vllm backend option(s): frobnicate"),
        ("request_timeout = -1", "request_timeout"),
        ('pooling = "max"', "vllm.pooling must be one of mean, cls, last, rank"),
    ],
)
def test_bad_options_refuse_the_profile_at_start(tmp_path: Path, options: str, fragment: str) -> None:
    with pytest.raises(ProfileError) as err:
        _build(tmp_path, f"{REMOTE}options = {{ {options} }}\n")
    assert "instance far: options: " in str(err.value) and fragment in str(err.value), err.value


def test_good_options_pass(tmp_path: Path) -> None:
    host = _build(tmp_path, f'{REMOTE}api_key_env = "SOME_KEY"\noptions = {{ request_timeout = 30 }}\n')
    host.close()
