"""Reading a submitted job spec body (JSON, or YAML by its content type) without trusting
it. Each refusal is a 4xx; nothing the body holds can make it a 500:

- a body that does not parse (syntax, invalid UTF-8, an integer of more digits than
  Python converts) is 400;
- YAML is read by a SafeLoader: a tag naming a Python object
  (``!!python/object/apply:os.system``) is refused (422), never constructed;
- nesting deeper than ``MAX_DEPTH`` is 422: a job spec is a few levels deep, and
  validating or storing a deeper one could reach Python's recursion limit (a document
  far deeper reaches it, or libyaml's own bound, while it is built: 422 too);
- YAML anchors and aliases are allowed (a spec may reuse a block), but the document they
  expand to is held to the body limit (413): a "billion laughs" is small in memory, yet
  validating and storing it would expand it without bound. A recursive alias is 422.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import yaml
from fastapi import HTTPException, Request, status
from pydantic import ValidationError

from services.admission.limits import BodyTooLarge
from services.admission.openapi_errors import validation_detail
from shared.jobspec import JobSpec, parse_job_spec

MAX_DEPTH = 32
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")


class _Refused(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


# libyaml where the wheel has it: a large YAML body parses ~10x faster than in Python
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"


async def read_spec(request: Request, max_bytes: int) -> JobSpec:
    """The job spec a submit's body holds, by its content type; 4xx for anything else."""
    raw = await request.body()  # the body limit (limits.BodyLimit) holds it to its size
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
    data = await decode(raw, ctype, max_bytes)
    if not isinstance(data, dict):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[
            {"field": "(body)", "message": "a job spec must be a mapping", "type": "dict_type"}])
    try:
        return parse_job_spec(data)
    except ValidationError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            detail=validation_detail(exc)) from exc


async def decode(raw: bytes, content_type: str, max_bytes: int) -> Any:
    """The document the body holds, checked for depth and expanded size. Decoding a
    large body takes a while (about a second for a megabyte of YAML): it runs in a
    worker thread so the gateway keeps answering meanwhile."""
    return await asyncio.to_thread(_decode, raw, content_type, max_bytes)


def _decode(raw: bytes, content_type: str, max_bytes: int) -> Any:
    try:
        if content_type in YAML_TYPES:
            data = yaml.load(raw, Loader=_LOADER)  # a SafeLoader: builds no Python objects
        else:
            data = json.loads(raw or b"null")
        _check_shape(data, max_bytes)
    except _Refused as exc:
        raise _unprocessable(exc.kind, exc.message) from None
    except RecursionError:  # a document far deeper than MAX_DEPTH, met while building it
        raise _unprocessable("too_deep", _TOO_DEEP) from None
    except yaml.constructor.ConstructorError as exc:  # a tag, an unhashable key, bad base64
        raise _unprocessable("yaml_unsupported", f"YAML not accepted: {exc.problem}") from None
    except (yaml.YAMLError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        if "maximum nesting depth" in str(exc):  # libyaml's own bound, met before ours
            raise _unprocessable("too_deep", _TOO_DEEP) from None
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail=(
            f"body is not valid {content_type}: {str(exc)[:500]}")) from None
    return data


def _unprocessable(kind: str, message: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[
        {"field": "(body)", "message": message, "type": kind}])


def _check_shape(root: Any, max_bytes: int) -> None:
    """Walk the document once (iteratively: no recursion to exhaust), each shared node
    once, and refuse it if it nests deeper than ``MAX_DEPTH``, refers to itself, or
    expands past ``max_bytes`` (each string counts its length, each other value one)."""
    memo: dict[int, tuple[int, int]] = {}  # id of a container -> (expanded size, height)
    open_: set[int] = set()  # containers being walked: the path from the root
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        kids = _children(node)
        if kids is None or (key in memo and not children_done):
            continue
        if children_done:
            open_.discard(key)
            size, height = 1, 1
            for kid in kids:
                s, h = memo[id(kid)] if id(kid) in memo else (_scalar_size(kid), 0)
                size, height = size + s, max(height, h + 1)
            if height > MAX_DEPTH:
                raise _Refused("too_deep", _TOO_DEEP)
            if size > max_bytes:
                raise BodyTooLarge(max_bytes, "the job spec, its YAML aliases expanded,")
            memo[key] = (size, height)
            continue
        if key in open_:
            raise _Refused("recursive", "a YAML alias refers to a node that contains it")
        open_.add(key)
        stack.append((node, True))
        stack += [(kid, False) for kid in kids if _children(kid) is not None]


def _children(node: Any) -> list[Any] | None:
    if isinstance(node, dict):
        return [*node.keys(), *node.values()]
    if isinstance(node, list | tuple | set | frozenset):
        return list(node)
    return None


def _scalar_size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes) else 1
