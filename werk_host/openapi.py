"""OpenAPI 3.1 document for ``/werk/v1``, generated from the protocol DTOs.

``python -m werk_host.openapi > docs/openapi.json`` regenerates the committed copy; a test
fails when the committed file is stale.

Response schemas carry no ``writeOnly``: pydantic marks secret fields (a handoff) write-only,
which is right for a request but would say that an answer's handoff is never returned, so
clients generated from the document could drop it (:func:`_readable`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema

from werk_host import protocol as p
from werk_host.http.middleware import PROTOCOL_VERSION_HEADER_PATTERN
from werk_host.http.resources import ModelQuery, ReasoningQuery

REF = "#/components/schemas/{model}"

# (method, path, summary, request body model, query model, data model or list-of model)
_OPERATIONS: list[tuple[str, str, str, type[BaseModel] | None, type[BaseModel] | None, Any]] = [
    ("get", "/werk/v1/info", "Runtime info and limits", None, None, p.RuntimeInfo),
    ("get", "/werk/v1/capabilities", "Capability array", None, None, list[p.Capability]),
    ("get", "/werk/v1/memory", "Memory telemetry and accounting", None, None, p.MemoryReport),
    ("get", "/werk/v1/observability", "Chat, worker and memory observations", None, None, p.Observability),
    ("post", "/werk/v1/chat/count_tokens", "Exact native input token count", p.ChatRequest, None, p.TokenCount),
    ("post", "/werk/v1/chat/admission", "Planning budget for a chat request", p.ChatRequest, None, p.Admission),
    ("get", "/werk/v1/chat/reasoning", "Reasoning tiers", None, ReasoningQuery, p.ReasoningProfile),
    ("get", "/werk/v1/chat/limits", "Context, output and concurrency limits", None, ModelQuery, p.ChatLimits),
    ("get", "/werk/v1/states", "One page of runtime states", None, p.StateListQuery, p.StatePage),
    ("post", "/werk/v1/states/{state_id}/actions", "Act on a state", p.StateActionRequest, None, p.StateActionResult),
    ("post", "/werk/v1/states/prune", "Prune states by explicit selector", p.PruneRequest, None, p.PruneResult),
    ("get", "/werk/v1/prompt-caches", "This key's prompt caches", None, p.PromptCacheListQuery, p.PromptCacheList),
    (
        "post",
        "/werk/v1/prompt-caches/{instance}/{entry}/actions",
        "Pin, unpin or evict one of this key's prompt caches",
        p.PromptCacheActionRequest,
        None,
        p.PromptCacheActionResult,
    ),
    (
        "post",
        "/werk/v1/prompt-caches/prune",
        "Prune this key's prompt caches by explicit selector",
        p.PromptCachePruneRequest,
        None,
        p.PruneResult,
    ),
    ("get", "/werk/v1/experts", "One page of expert metadata", None, p.ExpertListQuery, p.ExpertPage),
    ("post", "/werk/v1/experts/actions", "Act on explicit experts", p.ExpertActionRequest, None, p.ExpertActionResult),
    ("post", "/werk/v1/prefill", "Prefill and issue a handoff", p.PrefillRequest, None, p.PrefillResult),
    ("post", "/werk/v1/decode", "Decode from a handoff", p.DecodeRequest, None, p.DecodeResult),
    ("get", "/werk/v1/deployments", "Deployment inventory, plans and slots", None, None, p.Deployments),
    (
        "post",
        "/werk/v1/deployments/{instance_id}/actions",
        "Load, unload, pin or unpin an instance (operator key)",
        p.DeploymentActionRequest,
        None,
        p.DeploymentActionResult,
    ),
    (
        "get",
        "/werk/v1/deployments/{instance_id}/logs",
        "An instance's lifecycle log tail (operator key)",
        None,
        p.DeploymentLogsQuery,
        p.DeploymentLogs,
    ),
    ("get", "/werk/v1/jobs", "This key's jobs (docs/media.md)", None, None, list[p.JobView]),
    ("post", "/werk/v1/jobs", "Submit a job: answered 202 with it, queued", p.JobCreate, None, p.JobView),
    ("get", "/werk/v1/jobs/{job_id}", "One of this key's jobs", None, None, p.JobView),
    ("post", "/werk/v1/jobs/{job_id}/cancel", "Cancel one of this key's jobs", None, None, p.JobView),
]
#: Operations whose success status is not 200.
_SUCCESS_STATUS = {("post", "/werk/v1/jobs"): "202"}
_JOB_ID = {"type": "string", "pattern": "^job_[0-9a-f]{24}$"}

_ERROR_STATUSES = {
    "400": "invalid_request",
    "401": "unauthorized",
    "403": "forbidden (an operator-only action with a client key)",
    "404": "not_found",
    "406": "incompatible_protocol",
    "409": "conflict or incompatible_state",
    "410": "expired_handoff",
    "413": "resource_exhausted (body limit)",
    "428": "experimental_opt_in_required",
    "429": "resource_exhausted",
    "500": "internal or corrupt_state",
    "501": "unsupported",
    "503": "unavailable",
}


def _envelope_schema(data_schema: dict[str, Any]) -> dict[str, Any]:
    """The success envelope's schema, from :class:`SuccessEnvelope`, with this route's ``data``."""
    schema = p.SuccessEnvelope.model_json_schema(ref_template=REF)
    schema.pop("$defs", None)
    schema["properties"]["data"] = data_schema
    return schema


_DESCRIPTION = (
    "Every /werk/v1 request may send `X-Werk-Protocol-Version`: a comma-separated list of "
    "MAJOR.MINOR versions the client can consume, matching the regular expression "
    f"`{PROTOCOL_VERSION_HEADER_PATTERN}`; any other value is refused with 406 "
    "`incompatible_protocol`, as is an `Accept` header that excludes application/json. "
    "(The header is described here rather than as a parameter of each operation because "
    "OpenAPI tools generate header values from letters and digits only.)"
)


def _readable(schema: Any) -> Any:
    """``schema`` without ``writeOnly`` anywhere (for response schemas)."""
    if isinstance(schema, dict):
        return {k: _readable(v) for k, v in schema.items() if k != "writeOnly"}
    if isinstance(schema, list):
        return [_readable(v) for v in schema]
    return schema


def _query_value(schema: dict[str, Any]) -> dict[str, Any]:
    """A query parameter is present with a value or absent: drop the model's ``null`` option."""
    schema = {k: v for k, v in schema.items() if k not in ("title", "default")}
    options = [o for o in schema.pop("anyOf", []) if o != {"type": "null"}]
    if len(options) == 1:
        schema.update(options[0])
    elif options:
        schema["anyOf"] = options
    return schema


def build_openapi() -> dict[str, Any]:
    request_models = {m for _, _, _, m, _, _ in _OPERATIONS if m is not None}
    response_models: set[type[BaseModel]] = {p.ProtocolVersion, p.ErrorEnvelope}
    for *_, data in _OPERATIONS:
        response_models.add(data.__args__[0] if getattr(data, "__origin__", None) is list else data)
    inputs = [(m, "validation") for m in sorted(request_models, key=lambda m: m.__name__)]
    outputs = [(m, "serialization") for m in sorted(response_models, key=lambda m: m.__name__)]
    _, defs = models_json_schema(
        [*inputs, *outputs],  # type: ignore[list-item]
        ref_template=REF,
    )
    schemas: dict[str, Any] = dict(sorted(defs.get("$defs", {}).items()))
    for model in response_models - request_models:
        schemas[model.__name__] = _readable(schemas[model.__name__])
    paths: dict[str, Any] = {}
    for method, path, summary, body, query, data in _OPERATIONS:
        data_schema = _readable(TypeAdapter(data).json_schema(mode="serialization", ref_template=REF))
        operation: dict[str, Any] = {
            "summary": summary,
            "operationId": method + path.replace("/werk/v1", "").replace("/", "_").replace("{", "").replace("}", ""),
            "security": [{"bearer": []}, {"apiKey": []}],
            "parameters": [],
            "responses": {
                _SUCCESS_STATUS.get((method, path), "200"): {
                    "description": "Success envelope",
                    "content": {"application/json": {"schema": _envelope_schema(data_schema)}},
                },
                **{
                    status: {
                        "description": meaning,
                        "content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorEnvelope")}}},
                    }
                    for status, meaning in _ERROR_STATUSES.items()
                },
            },
        }
        if "{state_id}" in path:
            state_id = TypeAdapter(p.StateId).json_schema()
            operation["parameters"].append({"name": "state_id", "in": "path", "required": True, "schema": state_id})
        if "{instance_id}" in path:
            instance_id = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"}
            operation["parameters"].append(
                {"name": "instance_id", "in": "path", "required": True, "schema": instance_id}
            )
        if "{job_id}" in path:
            operation["parameters"].append({"name": "job_id", "in": "path", "required": True, "schema": _JOB_ID})
        if "{entry}" in path:
            store = {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"}
            entry = {"type": "string", "pattern": "^st_[A-Za-z0-9_-]+$"}
            operation["parameters"] += [
                {"name": "instance", "in": "path", "required": True, "schema": store},
                {"name": "entry", "in": "path", "required": True, "schema": entry},
            ]
        if query is not None:
            # The model's own schema, so that every Field constraint (minLength, minimum, ...)
            # the server enforces is in the document too.
            query_schema = query.model_json_schema(ref_template=REF)
            schemas.update(query_schema.pop("$defs", {}))
            required = set(query_schema.get("required", ()))
            for name, schema in query_schema["properties"].items():
                schema = _query_value(schema)
                operation["parameters"].append(
                    {"name": name, "in": "query", "required": name in required, "schema": schema}
                )
        if body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": REF.format(model=body.__name__)}}},
            }
        paths.setdefault(path, {})[method] = operation
    paths["/werk/v1/jobs/{job_id}/result/{name}"] = {
        "get": {
            "summary": "A result file of one of this key's jobs (its bytes, its own content type)",
            "operationId": "get_jobs_job_id_result_name",
            "security": [{"bearer": []}, {"apiKey": []}],
            "parameters": [
                {"name": "job_id", "in": "path", "required": True, "schema": _JOB_ID},
                {
                    "name": "name",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": "^image-[0-9]{1,2}\\.png$"},
                },
            ],
            "responses": {
                "200": {"description": "The file", "content": {"image/png": {}}},
                **{
                    status: {
                        "description": _ERROR_STATUSES[status],
                        "content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorEnvelope")}}},
                    }
                    for status in ("400", "401", "404", "406", "500")
                },
            },
        }
    }
    paths["/werk/v1/openapi.json"] = {
        "get": {
            "summary": "This document",
            "operationId": "get_openapi",
            "security": [{"bearer": []}, {"apiKey": []}],
            "responses": {"200": {"description": "Success envelope holding this OpenAPI document"}},
        }
    }
    paths["/openapi.json"] = {
        "get": {
            "summary": "This document, bare (no envelope, no key needed)",
            "operationId": "get_openapi_raw",
            "security": [],
            "responses": {"200": {"description": "This OpenAPI document", "content": {"application/json": {}}}},
        }
    }

    return {
        "openapi": "3.1.0",
        "info": {"title": "Werk Protocol", "version": "1.0", "description": _DESCRIPTION},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
    }


def main() -> None:
    print(json.dumps(build_openapi(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
