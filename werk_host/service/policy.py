"""Prefill policy resolution and capability gating.

Precedence (docs/protocol.md, "Prefill defaults"): a present ``policy`` object owns the whole
policy (``{}`` gets protocol defaults, not the server's); an absent one takes the server's
persistence defaults when configured, else the protocol defaults. A present
``allow_experimental`` (``false`` included) always wins; an absent one is ``true`` only under
server persistence. These defaults exist only for Prefill.
"""

from __future__ import annotations

from werk_host.config import PersistenceDefaults
from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol import CapabilityStatus, Policy, PrefillRequest


def resolve_prefill_policy(request: PrefillRequest, server: PersistenceDefaults | None) -> tuple[Policy, bool]:
    """The effective (policy, allow_experimental) of a prefill request."""
    if request.policy is not None:
        policy = request.policy
    elif server is not None:
        policy = Policy(mode=server.mode, reuse=server.reuse, ttl_seconds=server.ttl_seconds, pin=server.pin)
    else:
        policy = Policy()
    opt_in = request.allow_experimental if request.allow_experimental is not None else server is not None
    return policy, opt_in


def gate(
    capability_id: str, status: CapabilityStatus, detail: str, opted_in: bool, *, probe_on_use: bool = False
) -> None:
    """Raise the typed error the reported ``status`` implies for using ``capability_id``.

    ``supported`` passes; ``experimental`` needs the opt-in (428 otherwise); ``unavailable``
    is 503, except that an opted-in request passes when the adapter reports ``probe_on_use``
    (it then runs its functional probe and fails closed); everything else (``unsupported``,
    ``externally_managed``, ``metadata_only``) is 501.
    """
    if status is CapabilityStatus.SUPPORTED:
        return
    if status is CapabilityStatus.EXPERIMENTAL:
        if not opted_in:
            raise WerkError(
                ErrorCode.EXPERIMENTAL_OPT_IN_REQUIRED,
                f"{capability_id} is experimental; send allow_experimental: true to use it",
            )
        return
    if status is CapabilityStatus.UNAVAILABLE:
        if opted_in and probe_on_use:
            return
        raise WerkError(ErrorCode.UNAVAILABLE, f"{capability_id} is unavailable: {detail}", retryable=True)
    raise WerkError(ErrorCode.UNSUPPORTED, f"{capability_id} is {status.value}: {detail}")
