"""The gateway's refusals in its OpenAPI document, in the shape they are sent.

Every error body is ``{"detail": <reason>}``, the reason a sentence or, for a bad
request, a list of ``{field, message, type}`` (the app's validation handler), not
FastAPI's default ``HTTPValidationError``. The document says so, and lists the refusals
each operation can answer, so a client (or schemathesis) can hold the API to it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

FIELD_ERROR = {
    "type": "object",
    "required": ["field", "message", "type"],
    "properties": {
        "field": {"type": "string", "description": "where: body.tasks.0.resources.gpu, "
                  "query.limit, header.idempotency-key ..."},
        "message": {"type": "string"},
        "type": {"type": "string"},
    },
}
ERROR = {
    "type": "object",
    "required": ["detail"],
    "properties": {"detail": {"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"$ref": "#/components/schemas/FieldError"}}]}},
}
_WHY = {
    "400": "the body does not parse (JSON, or YAML where accepted)",
    "401": "no token, or an unknown, expired or revoked one",
    "403": "the token's role or tenant may not do this",
    "404": "no such object, or another tenant's",
    "409": "not in a state that allows it",
    "422": "a field is invalid or the request is refused by admission policy; `field` names it",
    "429": "the tenant submits too fast; retry after `Retry-After` seconds",
}


def _codes(path: str, method: str, op: dict[str, Any]) -> list[str]:
    codes = ["422"]
    if op.get("security"):
        codes += ["401", "403"]
    if "{" in path:
        codes.append("404")
    if method in ("post", "put", "patch", "delete"):
        codes.append("409")
    if "requestBody" in op:
        codes.append("400")  # a body that does not parse
    if path == "/v1/jobs" and method == "post":
        codes.append("429")
    return codes


def document(schema: dict[str, Any]) -> dict[str, Any]:
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    comps["FieldError"], comps["Error"] = FIELD_ERROR, ERROR
    ref = {"$ref": "#/components/schemas/Error"}
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            codes = _codes(path, method, op) if path.startswith("/v1/") else []
            for code in codes if codes else (["422"] if "422" in responses else []):
                responses[code] = {"description": _WHY[code],
                                   "content": {"application/json": {"schema": ref}}}
            params = {p.get("name", "").lower() for p in op.get("parameters", [])}
            if "idempotency-key" in params and "201" in responses and "200" not in responses:
                responses["200"] = {**responses["201"], "description": (
                    "a retry with the same Idempotency-Key: what the first request created")}
            if "429" in responses:
                responses["429"]["headers"] = {"Retry-After": {
                    "description": "seconds to wait", "schema": {"type": "integer"}}}
    comps.pop("HTTPValidationError", None)
    comps.pop("ValidationError", None)
    return schema


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` return the document with the gateway's error shapes."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
