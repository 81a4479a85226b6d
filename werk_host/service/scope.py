"""One request's scope: who asks (the principal) and which instance serves it, resolved once.

The HTTP layer resolves both per request (docs/deployments.md, "Routing": ``X-Werk-Deployment``
on ``/werk/v1``, the default instance otherwise; ``model`` on ``/v1`` and chat planning names
another one through :meth:`RequestScope.on`) and passes the scope explicitly to every service
method that needs it. Nothing about the selection lives in a context variable, so two
concurrent requests can never see each other's instance.

The adapter is resolved at most once per instance and request too:

* :attr:`RequestScope.adapter` is discovery: what the instance has now, never starting it;
* :meth:`RequestScope.started` is an operation: it starts a cold instance, and from then on the
  instance counts as in flight (:meth:`Instance.enter`, the one in-flight count) until
  :meth:`RequestScope.close`, so keep-alive cannot stop it under the request.

A scope is used by one request (one thread) at a time; :meth:`close` is idempotent.
"""

from __future__ import annotations

from werk_host.deployments.instances import Instance
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest
from werk_host.seam import Adapter
from werk_host.service.principals import Principal


def no_backend(what: str) -> WerkError:
    return WerkError(ErrorCode.UNSUPPORTED, f"{what} is not supported: no backend adapter is active")


class RequestScope:
    """The principal and instance of one request (see the module docstring)."""

    __slots__ = ("principal", "instance", "_started", "_held")

    def __init__(self, principal: Principal, instance: Instance | None) -> None:
        self.principal = principal
        self.instance = instance
        self._started: Adapter | None = None
        #: instances this request holds in flight (shared with the scopes :meth:`on` made)
        self._held: list[Instance] = []

    def on(self, instance: Instance | None) -> RequestScope:
        """The same request on ``instance`` (an alias's replica): ``self`` when it is this
        scope's instance; otherwise a scope whose in-flight holds this scope releases."""
        if instance is None or instance is self.instance:
            return self
        other = RequestScope(self.principal, instance)
        other._held = self._held
        return other

    @property
    def adapter(self) -> Adapter | None:
        """The instance's adapter while it is ready (discovery); never starts it."""
        if self._started is not None:
            return self._started
        return self.instance.peek() if self.instance is not None else None

    @property
    def model(self) -> ModelManifest | None:
        return self.instance.manifest if self.instance is not None else None

    def model_ids(self) -> set[str]:
        model = self.model
        return {model.name} if model is not None else set()

    def started(self) -> Adapter | None:
        """The instance's adapter, starting a cold instance first (an operation is about to use
        it); ``None`` when nothing is deployed. The instance is in flight from here until
        :meth:`close`."""
        if self._started is not None or self.instance is None:
            return self._started
        instance = self.instance
        held = instance in self._held
        if not held:
            self._held.append(instance)
        # in flight from before the start on: keep-alive cannot stop it in between
        self._started = instance.use(enter=not held)
        return self._started

    def require_adapter(self, what: str) -> Adapter:
        adapter = self.started()
        if adapter is None:
            raise no_backend(what)
        return adapter

    def close(self) -> None:
        """Release every instance this request held in flight (idempotent)."""
        held, self._held[:] = list(self._held), []
        for instance in held:
            instance.leave()

    def __enter__(self) -> RequestScope:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
