"""vLLM automatic prefix caching (APC): which flag Werk adds, and what status it may report.

Flag injection (:func:`injected_flag`), for a Werk-started local server:

* ``WERK_VLLM_ARGS`` that enables or disables APC itself (``--enable-prefix-caching`` or
  ``--no-enable-prefix-caching``, in either spelling vLLM accepts) wins: Werk adds neither flag.
* otherwise, with ``werk serve --persistence`` (``config.persistence`` set): reuse ``disabled``
  adds ``--no-enable-prefix-caching``, any other reuse policy adds ``--enable-prefix-caching``;
* otherwise nothing is added (vLLM's own default applies, which Werk cannot see).

Status of ``runtime.state.prefix_cache`` (:func:`prefix_cache_report`), from evidence only:

* no active server: ``unavailable``;
* a Werk-started local server whose effective argv contains ``--enable-prefix-caching`` with no
  later ``--no-enable-prefix-caching``: ``externally_managed``, operations ``("automatic_reuse",)``
  (vLLM reuses cached prefixes by itself; Werk cannot name, pin or move them);
* a local server whose effective argv disables it last: ``unsupported``;
* a remote endpoint, or a local argv with neither flag (vLLM's default, not verifiable from the
  launch): ``metadata_only``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from werk_host.plugin import CapabilityReport, CapabilityStatus, PersistenceDefaults, ReusePolicy

from .executable import flag_name

__all__ = [
    "APC_OFF",
    "APC_ON",
    "AUTOMATIC_REUSE",
    "PrefixCaching",
    "injected_flag",
    "prefix_cache_report",
    "prefix_caching",
]

APC_ON = "--enable-prefix-caching"
APC_OFF = "--no-enable-prefix-caching"
AUTOMATIC_REUSE = ("automatic_reuse",)


class PrefixCaching(StrEnum):
    """What an argument list says about APC: the last of the two flags wins."""

    ENABLED = "enabled"
    DISABLED = "disabled"
    UNSPECIFIED = "unspecified"


def prefix_caching(args: Sequence[str]) -> PrefixCaching:
    """``ENABLED``/``DISABLED`` by the last APC flag in ``args``, ``UNSPECIFIED`` without one."""
    found = PrefixCaching.UNSPECIFIED
    for arg in args:
        name = flag_name(arg)
        if name == APC_ON:
            found = PrefixCaching.ENABLED
        elif name == APC_OFF:
            found = PrefixCaching.DISABLED
    return found


def injected_flag(persistence: PersistenceDefaults | None, env_args: Sequence[str]) -> str | None:
    """The APC flag Werk generates for a local server (module docstring), or ``None``."""
    if prefix_caching(env_args) is not PrefixCaching.UNSPECIFIED:
        return None
    if persistence is None:
        return None
    return APC_OFF if persistence.reuse is ReusePolicy.DISABLED else APC_ON


def prefix_cache_report(argv: Sequence[str] | None, *, remote: bool) -> CapabilityReport:
    """The ``runtime.state.prefix_cache`` report (module docstring). ``argv`` is the effective
    argument list of the active Werk-started server, ``None`` when no server is active (or, for
    a remote endpoint, when it is not answering)."""
    if argv is None:
        where = "the remote vLLM endpoint is not answering" if remote else "no vLLM server is running"
        return CapabilityReport(CapabilityStatus.UNAVAILABLE, where)
    if remote:
        return CapabilityReport(
            CapabilityStatus.METADATA_ONLY,
            "a remote vLLM endpoint's prefix caching is configured where it runs; Werk cannot verify it",
        )
    setting = prefix_caching(argv)
    if setting is PrefixCaching.ENABLED:
        return CapabilityReport(
            CapabilityStatus.EXTERNALLY_MANAGED,
            "vLLM automatic prefix caching is on (--enable-prefix-caching); vLLM reuses cached prefixes "
            "by itself, Werk cannot name, pin or move them",
            operations=AUTOMATIC_REUSE,
        )
    if setting is PrefixCaching.DISABLED:
        return CapabilityReport(
            CapabilityStatus.UNSUPPORTED, "vLLM was started with --no-enable-prefix-caching: no prefix reuse"
        )
    return CapabilityReport(
        CapabilityStatus.METADATA_ONLY,
        "vLLM was started without an explicit prefix-caching flag; its default is not verifiable from the launch",
    )
