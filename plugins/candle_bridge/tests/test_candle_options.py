"""A profile's candle ``options`` are checked when ``werk serve`` starts (the rules the engine
settings apply), before the engine loads: an unknown option or a bad value refuses the profile
with one line naming the instance and the option."""

from __future__ import annotations

from pathlib import Path

import pytest
from werk_candle_bridge import plugin as candle_plugin

from werk_host.plugin import HostConfig
from werk_host.testing.host import Host, PluginHost, ProfileError, build_host


def _build(tmp_path: Path, model: Path, options: str) -> Host:
    profile = tmp_path / "deployments.toml"
    profile.write_text(f'[[instance]]\nid = "tiny"\nmodel = "{model}"\nbackend = "candle"\noptions = {{ {options} }}\n')
    plugins = PluginHost()
    plugins.register(candle_plugin, "candle")
    return build_host(HostConfig(home=tmp_path / "home", profile=profile), plugins=plugins)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ("frobnicate = 1", "unknown backend option candle.frobnicate"),
        ("max_seqs = 0", "candle.max_seqs must be an integer of at least 1"),
        ("prefix_cache_n = -1", "candle.prefix_cache_n must be an integer of at least 0"),
    ],
)
def test_bad_options_refuse_the_profile_at_start(tmp_path: Path, tiny_gguf: Path, options: str, fragment: str) -> None:
    with pytest.raises(ProfileError) as err:
        _build(tmp_path, tiny_gguf, options)
    assert "instance tiny: options: " in str(err.value) and fragment in str(err.value), err.value


def test_good_options_pass(tmp_path: Path, tiny_gguf: Path) -> None:
    _build(tmp_path, tiny_gguf, "max_seqs = 2, prefix_cache_n = 4").close()
