"""The gateway's refusals in its OpenAPI document, in the shape they are sent.

Every error body is ``{"detail": <reason>}``, the reason a sentence or, for a bad
request, a list of ``{field, message, type}`` (the app's validation handler), not
FastAPI's default ``HTTPValidationError``. The document says so, and lists the refusals
each operation can answer, so a client (or schemathesis) can hold the API to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

MAX_FIELD_ERRORS = 50  # field errors listed in a 422

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
    "400": "the body does not parse (JSON, or YAML where accepted), or the request holds "
           "text that cannot be stored (a NUL character)",
    "401": "no token, or an unknown, expired or revoked one",
    "403": "the token's role or tenant may not do this",
    "404": "no such object, or another tenant's",
    "409": "not in a state that allows it",
    "422": "a field is invalid or the request is refused by admission policy; `field` names it",
    "413": "the request body (or a job spec's expanded YAML aliases) is over the limit",
    "429": "the tenant submits too fast; retry after `Retry-After` seconds",
    "503": "the database is unreachable for now; retry after `Retry-After` seconds",
}


def field_errors(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic's errors as every 422 lists them, at most ``MAX_FIELD_ERRORS`` of them
    and then their count: a body of many bad values must not get a larger answer."""
    out = [{"field": ".".join(str(p) for p in e["loc"]) or "(body)", "message": e["msg"],
            "type": e["type"]} for e in errors[:MAX_FIELD_ERRORS]]
    if len(errors) > MAX_FIELD_ERRORS:
        out.append({"field": "(body)", "type": "too_many_errors",
                    "message": f"and {len(errors) - MAX_FIELD_ERRORS} more errors"})
    return out


def validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    """A pydantic model's refusal as a 422's detail."""
    return field_errors(
        exc.errors(include_url=False, include_context=False, include_input=False))


async def request_refused(_: Request, exc: Exception) -> JSONResponse:
    """The app's handler of a request FastAPI could not validate: 422 in our shape."""
    assert isinstance(exc, RequestValidationError)  # the only exception it is installed for
    return JSONResponse(status_code=422, content={"detail": field_errors(exc.errors())})


def _codes(path: str, method: str, op: dict[str, Any]) -> list[str]:
    codes = ["422"]
    if op.get("security"):
        codes += ["401", "403"]
    if "{" in path:
        codes.append("404")
    if method in ("post", "put", "patch", "delete"):
        codes.append("409")
    codes.append("400")  # NUL in a path or query parameter, or a body that does not parse
    if "requestBody" in op:
        codes.append("413")
    if path == "/v1/jobs" and method == "post":
        codes.append("429")
    codes.append("503")  # every /v1 route reads the database (the token, at least)
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
                why = _WHY[code]
                if code == "503" and "503" in responses:  # the route's own 503s, and ours
                    why = f"{responses['503']['description']}; or {why}"
                responses[code] = {"description": why,
                                   "content": {"application/json": {"schema": ref}}}
            params = {p.get("name", "").lower() for p in op.get("parameters", [])}
            if "idempotency-key" in params and "201" in responses and "200" not in responses:
                responses["200"] = {**responses["201"], "description": (
                    "a retry with the same Idempotency-Key: what the first request created")}
            for code in ("429", "503"):
                if code in responses:
                    responses[code]["headers"] = {"Retry-After": {
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
