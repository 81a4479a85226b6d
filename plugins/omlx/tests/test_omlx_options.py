"""A profile's omlx ``options`` are checked when ``werk serve`` starts (the rules of the worker
settings), before any worker starts: an unknown option or a bad value refuses the profile with
one line naming the instance and the option."""

from __future__ import annotations

from pathlib import Path

import pytest
from werk_omlx import plugin as omlx_plugin

from werk_host.plugin import HostConfig
from werk_host.testing.host import Host, PluginHost, ProfileError, build_host


def _build(tmp_path: Path, options: str) -> Host:
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"not really weights")
    profile = tmp_path / "deployments.toml"
    profile.write_text(f'[[instance]]\nid = "m"\nmodel = "{model}"\nbackend = "omlx"\noptions = {{ {options} }}\n')
    plugins = PluginHost()
    plugins.register(omlx_plugin, "omlx")
    return build_host(HostConfig(home=tmp_path / "home", profile=profile), plugins=plugins)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ("frobnicate = 1", "unknown omlx backend option(s): frobnicate"),
        ("max_workers = 0", "must be positive"),
        ('startup_timeout = "soon"', "are numbers"),
    ],
)
def test_bad_options_refuse_the_profile_at_start(tmp_path: Path, options: str, fragment: str) -> None:
    with pytest.raises(ProfileError) as err:
        _build(tmp_path, options)
    assert "instance m: options: " in str(err.value) and fragment in str(err.value), err.value


def test_good_options_pass(tmp_path: Path) -> None:
    _build(tmp_path, "max_workers = 2, startup_timeout = 30").close()
