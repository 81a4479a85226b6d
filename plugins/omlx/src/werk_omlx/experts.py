"""Expert residency through a worker: its observations fed to the host's policy engine, and actions.

The worker names an expert by ``(layer, expert)``; Werk's id for it is ``L<layer>E<expert>``
(opaque to clients). A resident expert is in tier ``ram`` (the worker's expert cache, Apple
unified memory on a Mac); any other is ``external`` (read from the checkpoint when needed).
Sizes are the exact byte lengths of the expert's tensors in the checkpoint.

Listing refreshes the worker's :class:`~werk_host.experts.ExpertPolicy` from ``GET
/werk/experts`` (cumulative access counts become hotness) and pages it. An action is claimed in
the policy first, then sent to the worker; only the worker's reported outcome is committed. A
dry run sends ``dry_run`` to the worker, which plans without changing anything, and answers the
projected experts: the named ones and any the plan would evict.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from werk_host.plugin import (
    ErrorCode,
    ExpertActionKind,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertListQuery,
    ExpertObservation,
    ExpertPage,
    ExpertTier,
    Tier,
    WerkError,
)

from .workers import WorkerProcess

_ID = re.compile(r"L(\d{1,6})E(\d{1,6})")

Key = tuple[int, int]


def expert_id(layer: int, expert: int) -> str:
    return f"L{layer}E{expert}"


def parse_expert_id(value: str) -> Key:
    match = _ID.fullmatch(value)
    if match is None:
        raise WerkError(ErrorCode.NOT_FOUND, "no such expert")
    return int(match.group(1)), int(match.group(2))


def _int(view: dict[str, Any], name: str) -> int | None:
    value = view.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def observations(model_id: str, views: Iterable[Any]) -> list[ExpertObservation]:
    """Policy observations of the worker's expert views (malformed entries are skipped)."""
    out = []
    for view in views:
        if not isinstance(view, dict):
            continue
        layer, expert = _int(view, "layer"), _int(view, "expert")
        if layer is None or expert is None:
            continue
        out.append(
            ExpertObservation(
                expert_id=expert_id(layer, expert),
                model_id=model_id,
                tier=ExpertTier.RAM if view.get("resident") is True else ExpertTier.EXTERNAL,
                bytes=_int(view, "bytes"),
                pinned=view.get("pinned") is True,
                accesses=_int(view, "accesses"),
                last_used_unix_ms=_int(view, "last_used_ms"),
            )
        )
    return out


def refresh(worker: WorkerProcess, model_id: str) -> None:
    """Feed the worker's current expert observations to its policy."""
    payload = worker.request("GET", "/werk/experts")
    views = payload.get("experts")
    worker.policy.observe(model_id, observations(model_id, views if isinstance(views, list) else []))


def list_page(worker: WorkerProcess, model_id: str, query: ExpertListQuery) -> ExpertPage:
    refresh(worker, model_id)
    return worker.policy.page(query)


def _projected(views: list[Any], plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The worker's current ``views`` with ``plan`` applied (what a dry run would leave)."""

    def keys(name: str) -> set[Key]:
        entries = plan.get(name)
        return (
            {(k[0], k[1]) for k in entries if isinstance(k, list) and len(k) == 2}
            if isinstance(entries, list)
            else set()
        )

    load, evict, pin, unpin = keys("load"), keys("evict"), keys("pin"), keys("unpin")
    out = []
    for view in views:
        if not isinstance(view, dict):
            continue
        key = (view.get("layer"), view.get("expert"))
        changed = dict(view)
        if key in load:
            changed["resident"] = True
        if key in evict:
            changed["resident"] = False
        if key in pin:
            changed["pinned"] = True
        if key in unpin:
            changed["pinned"] = False
        out.append(changed)
    return out


def act(worker: WorkerProcess, model_id: str, request: ExpertActionRequest) -> ExpertActionResult:
    """Run ``request`` on ``worker`` (bound to it until it returns): validate, claim, act, commit."""
    if request.action is ExpertActionKind.PREFETCH and request.target_tier is not Tier.RAM:
        raise WerkError(ErrorCode.INVALID_REQUEST, "this backend prefetches experts into ram only")
    keys = [parse_expert_id(i) for i in request.expert_ids]
    refresh(worker, model_id)
    policy = worker.policy
    with policy.claim(request.expert_ids) as claim:
        body = {"action": request.action.value, "experts": [list(k) for k in keys], "dry_run": request.dry_run}
        answer = worker.request("POST", "/werk/experts/actions", body)
        views = answer.get("experts")
        views = views if isinstance(views, list) else []
        plan = answer.get("plan") if isinstance(answer.get("plan"), dict) else {}
        assert isinstance(plan, dict)
        changed = answer.get("changed") is True
        if request.dry_run:
            projected = {o.expert_id: o for o in observations(model_id, _projected(views, plan))}
            summaries = [
                s.model_copy(update={"tier": projected[s.id].tier, "pinned": projected[s.id].pinned})
                for s in policy.summaries(projected)
            ]
            return ExpertActionResult(experts=summaries, changed=changed, dry_run=True)
        committed = claim.commit(observations(model_id, views))
    return ExpertActionResult(experts=policy.summaries(r.expert_id for r in committed), changed=changed, dry_run=False)
