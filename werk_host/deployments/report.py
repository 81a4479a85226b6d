"""The ``GET /werk/v1/deployments`` document: inventory, resolved plans and slots per instance
(docs/deployments.md, "Inventory")."""

from __future__ import annotations

from werk_host.deployments.registry import DeploymentSet
from werk_host.hooks import BackendHooks
from werk_host.protocol.deployments import (
    DeploymentPlan,
    Deployments,
    EndpointKind,
    InstanceInventory,
    InstancePlan,
    InstanceSlots,
)


def deployment_report(deployments: DeploymentSet, hooks: BackendHooks) -> Deployments:
    """Observe every instance now. Never starts one: a cold instance has no pid, plan or slots.
    Worker observations come through ``deployments.watch``: a hung backend delays the report by
    at most its bound, and leaves the last known observation or null fields
    (werk_host/deployments/observe.py)."""
    inventory: list[InstanceInventory] = []
    plans: list[InstancePlan] = []
    slots: list[InstanceSlots] = []
    for instance in deployments.instances.values():
        view = instance.view()
        adapter = instance.peek()
        plan: DeploymentPlan | None = None
        pid: int | None = None
        worker_slots: int | None = None
        if adapter is not None:
            plan = hooks.deployment_plan(adapter)
            workers = deployments.watch.observe(instance.id, adapter, hooks.workers) or []
            pid = next((w.pid for w in workers if w.pid is not None), None)
            known = [w.slots for w in workers]
            worker_slots = sum(s for s in known if s is not None) if known and None not in known else None
        total = plan.parallel_slots if plan is not None and plan.parallel_slots is not None else worker_slots
        inventory.append(
            InstanceInventory(
                id=instance.id,
                backend=view.backend,
                model=view.model,
                aliases=sorted(name for name, ids in deployments.aliases.items() if instance.id in ids),
                default=instance.id == deployments.default_id,
                state=view.state,
                pid=pid,
                endpoint=plan.endpoint if plan is not None else EndpointKind.LOCAL,
                started_unix_ms=view.started_unix_ms,
                last_used_unix_ms=view.last_used_unix_ms,
                in_flight=view.in_flight,
                keep_alive_seconds=view.keep_alive_s,
                error=view.error,
                state_since_unix_ms=view.since_unix_ms,
                load_seconds=None if view.load_s is None else round(view.load_s, 3),
                pinned=view.pinned,
                group=group.name if (group := deployments.residency.rules.group_of(instance.id)) else None,
                memory_estimate_bytes=deployments.residency.estimate(instance) or None,
                file_cache=instance.file_cache(),
            )
        )
        plans.append(InstancePlan(instance=instance.id, plan=plan))
        busy = min(view.in_flight, total) if total is not None else view.in_flight
        slots.append(
            InstanceSlots(
                instance=instance.id, total=total, busy=busy, free=total - busy if total is not None else None
            )
        )
    return Deployments(inventory=inventory, plans=plans, slots=slots)
