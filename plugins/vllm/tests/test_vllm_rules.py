"""Pure rules, no process: options, generated flags, APC injection and status, help parsing,
metrics parsing, plan redaction and the /tokenize body."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from werk_vllm.adapter import VllmAdapter, accepts, served_max_model_len
from werk_vllm.apc import APC_OFF, APC_ON, PrefixCaching, injected_flag, prefix_cache_report, prefix_caching
from werk_vllm.client import Endpoint
from werk_vllm.executable import ExecutableIdentity, ServeHelp, flag_name, parse_serve_help
from werk_vllm.launch import (
    LaunchSettings,
    RemoteSettings,
    display_args,
    env_args,
    generated_args,
    int_flag,
    last_value,
    parse_options,
)
from werk_vllm.metrics import parse_metrics

from werk_host.plugin import (
    CapabilityStatus,
    ChatRequest,
    ErrorCode,
    ModelFile,
    ModelManifest,
    PersistenceDefaults,
    PersistenceMode,
    ReusePolicy,
    WerkError,
)

MODEL_DIR = "/models/tiny"


def generated(persistence: PersistenceDefaults | None, trailing: list[str], **options: Any) -> list[str]:
    settings = parse_options(options)
    assert isinstance(settings, LaunchSettings)
    return [*generated_args(MODEL_DIR, "tiny", settings, injected_flag(persistence, trailing)), *trailing]


# -- options and generated flags ------------------------------------------------------------------


def test_options_map_to_flags_in_order() -> None:
    args = generated(None, [], max_model_len=512, gpu_memory_utilization=0.1, max_num_seqs=4, dtype="float32")
    assert args == [
        "serve",
        MODEL_DIR,
        "--host",
        "127.0.0.1",
        "--port",
        "<port>",
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "512",
        "--gpu-memory-utilization",
        "0.1",
        "--max-num-seqs",
        "4",
        "--dtype",
        "float32",
    ]
    assert generated(None, [])[-2:] == ["--served-model-name", "tiny"]  # nothing unasked


@pytest.mark.parametrize(
    "pooling, flags",
    [
        ("mean", ["--runner", "pooling", "--convert", "embed", "--pooler-config", '{"pooling_type":"MEAN"}']),
        ("cls", ["--runner", "pooling", "--convert", "embed", "--pooler-config", '{"pooling_type":"CLS"}']),
        ("last", ["--runner", "pooling", "--convert", "embed", "--pooler-config", '{"pooling_type":"LAST"}']),
        ("rank", ["--runner", "pooling", "--convert", "classify"]),
    ],
)
def test_pooling_starts_the_pooling_runner_after_the_other_options(pooling: str, flags: list[str]) -> None:
    args = generated(PersistenceDefaults(), ["--dtype", "float32"], pooling=pooling, max_model_len=512)
    assert args[8:] == ["--max-model-len", "512", APC_ON, *flags, "--dtype", "float32"]
    assert display_args(args[1:], [MODEL_DIR])[-len(flags) - 2 : -2] == flags  # shown as they are


def test_option_values_from_the_command_line_are_accepted() -> None:
    settings = parse_options({"max_model_len": "512", "gpu_memory_utilization": "0.25", "startup_timeout": 30})
    assert isinstance(settings, LaunchSettings)
    assert (settings.max_model_len, settings.gpu_memory_utilization, settings.startup_timeout) == (512, 0.25, 30.0)
    assert parse_options({}) == LaunchSettings()
    assert LaunchSettings().startup_timeout == 600.0


@pytest.mark.parametrize(
    "options, names",
    [
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_model_len": True}, "max_model_len"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": "lots"}, "gpu_memory_utilization"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
        ({"dtype": "float32; rm -rf /"}, "dtype"),
        ({"startup_timeout": 0}, "startup_timeout"),
        ({"max_model_length": 5}, "max_model_length"),
        ({"api_key_env": "X"}, "api_key_env"),
        ({"endpoint": "ftp://x"}, "endpoint"),
        ({"endpoint": "http://h:1", "api_key_env": "1BAD"}, "api_key_env"),
        ({"pooling": "max"}, "pooling"),
        ({"pooling": "MEAN"}, "pooling"),
        ({"pooling": True}, "pooling"),
    ],
)
def test_bad_options_are_invalid_requests_naming_the_option(options: dict[str, Any], names: str) -> None:
    with pytest.raises(WerkError) as err:
        parse_options(options)
    assert err.value.code is ErrorCode.INVALID_REQUEST
    assert names in err.value.message


def test_an_endpoint_makes_the_instance_remote_and_ignores_launch_options() -> None:
    settings = parse_options({"endpoint": "https://gpu-box:8000/v1", "api_key_env": "GPU_KEY", "max_model_len": 9})
    assert settings == RemoteSettings("https://gpu-box:8000/v1", "GPU_KEY")
    assert Endpoint.parse("https://gpu-box:8000/v1") == Endpoint(True, "gpu-box", 8000, "")
    assert Endpoint.parse("http://h/proxy/vllm/") == Endpoint(False, "h", 80, "/proxy/vllm")


def test_werk_vllm_args_are_split_like_a_shell() -> None:
    assert env_args({"WERK_VLLM_ARGS": "--dtype 'float32' --max-num-seqs=8"}) == [
        "--dtype",
        "float32",
        "--max-num-seqs=8",
    ]
    assert env_args({}) == []
    with pytest.raises(WerkError) as err:
        env_args({"WERK_VLLM_ARGS": "--dtype 'float32"})
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_trailing_args_override_and_are_read_back() -> None:
    args = generated(None, ["--max-num-seqs=8", "--max_model_len", "1024"], max_num_seqs=2, max_model_len=512)
    assert int_flag(args, "--max-num-seqs") == 8
    assert int_flag(args, "--max-model-len") == 1024
    assert last_value(args, "--port") == "<port>"
    assert int_flag(args, "--port") is None
    assert flag_name("--max_model_len=3") == "--max-model-len"
    assert flag_name("-1") is None and flag_name("0.5") is None and flag_name(MODEL_DIR) is None


# -- APC: flag injection ------------------------------------------------------------------------


def persistence(reuse: ReusePolicy = ReusePolicy.PREFER) -> PersistenceDefaults:
    return PersistenceDefaults(mode=PersistenceMode.AUTO, reuse=reuse)


def test_persistence_enables_prefix_caching() -> None:
    assert injected_flag(persistence(), []) == APC_ON
    assert injected_flag(persistence(ReusePolicy.REQUIRED), []) == APC_ON
    assert generated(persistence(), [])[-1] == APC_ON


def test_reuse_disabled_disables_prefix_caching() -> None:
    assert injected_flag(persistence(ReusePolicy.DISABLED), []) == APC_OFF
    assert generated(persistence(ReusePolicy.DISABLED), [])[-1] == APC_OFF


def test_without_persistence_nothing_is_injected() -> None:
    assert injected_flag(None, []) is None
    assert APC_ON not in generated(None, []) and APC_OFF not in generated(None, [])


@pytest.mark.parametrize("explicit", [[APC_ON], [APC_OFF], ["--enable_prefix_caching"], [APC_OFF, APC_ON]])
@pytest.mark.parametrize("reuse", [ReusePolicy.PREFER, ReusePolicy.DISABLED])
def test_werk_vllm_args_take_precedence_over_injection(explicit: list[str], reuse: ReusePolicy) -> None:
    assert injected_flag(persistence(reuse), explicit) is None
    args = generated(persistence(reuse), explicit)
    assert sum(1 for a in args if flag_name(a) in (APC_ON, APC_OFF)) == len(explicit)  # only the user's own


# -- APC: status from the effective argv --------------------------------------------------------------


def test_explicitly_enabled_local_is_externally_managed() -> None:
    report = prefix_cache_report(["vllm", "serve", "m", APC_ON], remote=False)
    assert report.status is CapabilityStatus.EXTERNALLY_MANAGED
    assert report.operations == ("automatic_reuse",)


def test_a_later_disable_wins() -> None:
    argv = ["vllm", "serve", "m", APC_ON, "--dtype", "auto", APC_OFF]
    assert prefix_caching(argv) is PrefixCaching.DISABLED
    assert prefix_cache_report(argv, remote=False).status is CapabilityStatus.UNSUPPORTED
    again = [*argv, "--enable_prefix_caching"]
    assert prefix_cache_report(again, remote=False).status is CapabilityStatus.EXTERNALLY_MANAGED


def test_ambiguous_local_is_metadata_only() -> None:
    report = prefix_cache_report(["vllm", "serve", "m", "--max-model-len", "512"], remote=False)
    assert report.status is CapabilityStatus.METADATA_ONLY and report.operations is None


def test_remote_is_metadata_only_whatever_it_says() -> None:
    assert prefix_cache_report((), remote=True).status is CapabilityStatus.METADATA_ONLY
    assert prefix_cache_report([APC_ON], remote=True).status is CapabilityStatus.METADATA_ONLY


def test_no_active_process_is_unavailable() -> None:
    assert prefix_cache_report(None, remote=False).status is CapabilityStatus.UNAVAILABLE
    assert prefix_cache_report(None, remote=True).status is CapabilityStatus.UNAVAILABLE


# -- help, metrics, plans ------------------------------------------------------------------------------

HELP = """usage: vllm serve [model_tag] [options]

options:
  --api-key API_KEY [API_KEY ...]
                        If provided, the server will require one of these keys, --not-a-flag
  --api-server-count API_SERVER_COUNT, -asc API_SERVER_COUNT
                        How many API server processes to run.
  --dtype {auto,bfloat16,float,float16,float32,half}
  --host HOST           Host name. (default: None) --neither-this
  --enable-prefix-caching, --no-enable-prefix-caching
                        Whether to enable prefix caching. (default: None)
  -h, --help            show this help message and exit
"""


def test_serve_help_parsing() -> None:
    flags = parse_serve_help(HELP)
    assert flags == {
        "--api-key",
        "--api-server-count",
        "-asc",
        "--dtype",
        "--host",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "-h",
        "--help",
    }
    found = ServeHelp(ExecutableIdentity(Path("/x"), 1, 1), "0.1", flags)
    assert found.missing(["serve", MODEL_DIR, "--host", "h", "--port", "1", "--dtype=auto", "--port", "2"]) == [
        "--port"
    ]


METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 860.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.79e+09
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 384.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",kv_cache_size_tokens="961408",num_gpu_blocks="7511"} 1.0
"""


def test_metrics_parsing() -> None:
    sample = parse_metrics(METRICS)
    assert (sample.requests_running, sample.requests_waiting) == (3, 3)
    assert sample.kv_cache_usage == pytest.approx(0.375)
    assert sample.prefix_cache_hit_rate == pytest.approx(384 / 860)
    assert sample.kv_capacity_tokens == 961408


def test_hit_rate_is_null_before_any_query() -> None:
    fresh = METRICS.replace("860.0", "0.0").replace("384.0", "0.0")
    assert parse_metrics(fresh).prefix_cache_hit_rate is None
    assert parse_metrics("").prefix_cache_hit_rate is None
    assert parse_metrics("").requests_running is None


def test_plan_arguments_hide_paths_and_secrets(tmp_path: Path) -> None:
    args = [
        "serve",
        str(tmp_path),
        "--api-key",
        "sk-one",
        "sk-two",
        "--hf-token=hf_secret",
        "--download-dir",
        "/var/cache/hf",
        "--chat-template=/etc/t.jinja",
        "--max-model-len",
        "512",
    ]
    shown = display_args(args, [str(tmp_path)])
    assert shown == [
        "serve",
        "<path>",
        "--api-key",
        "<redacted>",
        "<redacted>",
        "--hf-token=<redacted>",
        "--download-dir",
        "<path>",
        "--chat-template=<path>",
        "--max-model-len",
        "512",
    ]


# -- manifests, limits, counting ---------------------------------------------------------------------


def manifest(*names: str, backend: str | None = None, params: dict[str, Any] | None = None) -> ModelManifest:
    files = tuple(ModelFile(f"/m/{n}", 1, "0" * 64) for n in names)
    return ModelManifest("m", files, backend, dict(params or {}))


def test_accepts() -> None:
    assert accepts(manifest("config.json", "model.safetensors"))
    assert accepts(manifest("x.gguf", backend="vllm"))
    assert accepts(ModelManifest("remote", (), "vllm"))
    assert not accepts(manifest("x.gguf"))
    assert not accepts(manifest("config.json", "model.safetensors", backend="llama.cpp"))
    assert not accepts(None)


def test_limits_inputs() -> None:
    capped = ModelManifest("m", (), "vllm", {"max_output_tokens": 64, "max_new_tokens": {"max": 32}})
    assert capped.output_ceiling() == 32 and ModelManifest("m", (), "vllm", {}).output_ceiling() is None
    models = {"data": [{"id": "other", "max_model_len": 9}, {"id": "tiny", "max_model_len": 512}]}
    assert served_max_model_len(models, "tiny") == 512
    assert served_max_model_len(models, "nope") is None
    assert served_max_model_len(None, "tiny") is None


def test_tokenize_body_mirrors_the_chat_template_inputs() -> None:
    adapter = VllmAdapter.__new__(VllmAdapter)
    adapter.served_name = "tiny"
    request = ChatRequest.model_validate(
        {
            "model": "alias",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "stream": True,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "reasoning_effort": "low",
            "chat_template_kwargs": {"x": 1},
        }
    )
    body = adapter.tokenize_body(request)
    assert body["model"] == "tiny" and body["add_generation_prompt"] is True
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["tools"][0]["function"]["name"] == "f"
    assert body["chat_template_kwargs"] == {"x": 1, "reasoning_effort": "low", "enable_thinking": True}
    assert "max_tokens" not in body and "stream" not in body
    plain = adapter.tokenize_body(ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]}))
    assert set(plain) == {"model", "messages", "add_generation_prompt"}
