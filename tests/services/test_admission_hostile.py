"""Hostile job specs over real HTTP (uvicorn) against real PostgreSQL, one table: each
gets its exact 4xx (naming the field where there is one), never a 500, and the gateway
goes on serving a normal submit after each. What is accepted is stored verbatim:
commands are argv lists, never given to a shell, so shell metacharacters are just text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import text

from services.admission.db_errors import UNSTORABLE
from tests.services.gateway_helpers import JOB, Gateway, auth, gateway

pytestmark = pytest.mark.db
YAML = "application/yaml"
JSON = "application/json"
LIMIT = "the limit is 1048576 bytes"
SHELL = ["sh", "-c", "$(rm -rf /); `id` | cat /etc/passwd && echo $HOME > /dev/null"]
ODD = ["../../etc/passwd", "name/with/slash", "\u202eevil\u202c", "x;y", "'q'", '"dq"',
       "日本語", "🚀", "\\x00 (an escape, not a NUL)", "a\tb\nc"]


def spec(**fields: Any) -> bytes:
    return json.dumps({**JOB, **fields}).encode()


def task(**fields: Any) -> bytes:
    return spec(tasks=[{"name": "w", **fields}])


def laughs(levels: int = 9) -> bytes:
    """The "billion laughs": 9 levels of 9 aliases each, 1 KB expanding to 10^9."""
    out = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    out += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return ("\n".join(out) + f"\nname: lol\ntasks: [{{name: w, command: *a{levels - 1}}}]\n"
            ).encode()


@dataclass
class Case:
    name: str
    body: bytes
    status: int
    expect: str | None = None  # 422: a field it names; 400/413: part of the detail
    ctype: str = JSON
    verbatim: dict[str, Any] | None = None  # 201: the task as it must be stored


CASES = [
    # size
    Case("5 MB body", task(command=["x" * 5_000_000]), 413, LIMIT),
    Case("10,000 tasks", spec(tasks=[{"name": f"t{i}"} for i in range(10_000)]), 422, "tasks"),
    Case("4,096+ replicas", spec(tasks=[{"name": f"t{i}", "replicas": 1000} for i in range(5)]),
         422, "tasks"),
    Case("elastic past 4,096", spec(tasks=[{"name": f"t{i}", "minReplicas": 1,
                                            "maxReplicas": 1000} for i in range(5)]), 422, "tasks"),
    Case("20,000 bad values", task(env={f"V{i}": i for i in range(20_000)}), 422,
         "tasks.0.env.V0"),
    # depth
    Case("JSON nested 10,000 deep", b'{"name":"x","tasks":' + b"[" * 10_000 + b"]" * 10_000
         + b"}", 422, "(body)"),
    Case("JSON nested 100 deep", b"[" * 100 + b"]" * 100, 422, "(body)"),
    Case("YAML flow nested 10,000 deep", b"name: x\ntasks: " + b"[" * 10_000 + b"]" * 10_000,
         422, "(body)", YAML),
    Case("YAML block nested 10,000 deep", b"- " * 10_000 + b"x", 422, "(body)", YAML),
    Case("YAML nested 50 deep in a field", b"name: x\ntasks: [{name: w, env: " + b"[" * 50
         + b"]" * 50 + b"}]", 422, "(body)", YAML),
    # YAML tags and aliases
    Case("python/object/apply tag", b'!!python/object/apply:os.system ["echo x"]', 422,
         "(body)", YAML),
    Case("python/name tag in a field", b"name: x\ntasks: [{name: w, image: "
         b"!!python/name:os.system }]", 422, "(body)", YAML),
    Case("billion laughs", laughs(), 413, "YAML aliases expanded", YAML),
    Case("aliases of a long string", b'x: &x "' + b"y" * 100_000 + b'"\nname: x\ntasks: '
         b"[{name: w, command: [" + b", ".join([b"*x"] * 20) + b"]}]", 413, LIMIT, YAML),
    Case("recursive alias", b"name: x\ntasks: &t [*t]", 422, "(body)", YAML),
    Case("an alias reused, harmless", b"name: anchors\ntasks:\n- name: a\n  resources: &r "
         b"{gpu: 1}\n- name: b\n  resources: *r\n", 201, ctype=YAML),
    # names
    Case("name ../../etc/passwd", spec(name="../../etc/passwd"), 422, "name"),
    Case("name/with/slash", spec(name="name/with/slash"), 422, "name"),
    Case("name with RTL override", spec(name="train\u202egnp"), 422, "name"),
    Case("name with NUL", spec(name="a\u0000b"), 422, "name"),
    Case("name $(rm -rf /)", spec(name="$(rm -rf /)"), 422, "name"),
    Case("task name with ;", spec(tasks=[{"name": "w;reboot"}]), 422, "tasks.0.name"),
    Case("queue ../x", spec(queue="../x"), 422, "queue"),
    Case("dataset ../../etc/passwd", spec(dataset="../../etc/passwd"), 422, "dataset"),
    # commands, environment and labels: verbatim, or the field named
    Case("shell metacharacters kept verbatim", task(
        command=SHELL + ODD, env={"PAYLOAD": "$(rm -rf /); `id`", "RTL": "\u202eabc",
                                  "PATHY": "../../etc/passwd"}), 201,
         verbatim={"command": SHELL + ODD, "env": {"PAYLOAD": "$(rm -rf /); `id`",
                                                   "RTL": "\u202eabc",
                                                   "PATHY": "../../etc/passwd"}}),
    Case("labels with metacharacters", spec(labels={"team/../x": "`id`; $(reboot)"}), 201),
    Case("NUL in a command", task(command=["echo", "a\u0000b"]), 422, "tasks.0.command.1"),
    Case("NUL in an env value", task(env={"X": "\u0000"}), 422, "tasks.0.env.X"),
    Case("env name with =", task(env={"A=B": "x"}), 422, "tasks.0.env.A=B.[key]"),
    Case("env name $(x)", task(env={"$(x)": "x"}), 422, "tasks.0.env.$(x).[key]"),
    Case("NUL in a label", spec(labels={"k": "\u0000"}), 422, "labels.k"),
    # numbers
    Case("Infinity", b'{"name": "x", "runtimeEstimate": Infinity, "tasks": [{"name": "w"}]}',
         422, "runtimeEstimate"),
    Case("NaN", b'{"name": "x", "duration": NaN, "tasks": [{"name": "w"}]}', 422, "duration"),
    Case("YAML .inf", b"name: x\ntimeLimit: .inf\ntasks: [{name: w}]", 422, "timeLimit", YAML),
    Case("timeLimit of 30,000 years", spec(timeLimit=10**12), 422, "timeLimit"),
    Case("a 5,000-digit integer", b'{"name": "x", "priority": ' + b"9" * 5000 + b"}", 400,
         "integer"),
    Case("a 5,000-digit YAML integer", b"name: x\npriority: " + b"9" * 5000, 400, "integer",
         YAML),
    # wrong types
    Case("name is a number", spec(name=5), 422, "name"),
    Case("tasks is a string", spec(tasks="w"), 422, "tasks"),
    Case("a task is a number", spec(tasks=[5]), 422, "tasks.0"),
    Case("replicas is text", task(replicas="many"), 422, "tasks.0.replicas"),
    Case("resources is a list", task(resources=[]), 422, "tasks.0.resources"),
    Case("command is a string", task(command="rm -rf /"), 422, "tasks.0.command"),
    Case("env value is a number", task(env={"A": 1}), 422, "tasks.0.env.A"),
    Case("YAML date as a name", b"name: 2020-01-01\ntasks: [{name: w}]", 422, "name", YAML),
    Case("a field no spec has", spec(tenant="nlp"), 422, "tenant"),
    # not an object, not parseable
    *[Case(f"body {b!r}", b, 422, "(body)") for b in (b"[]", b'"text"', b"42", b"null", b"")],
    Case("YAML list body", b"- a\n- b", 422, "(body)", YAML),
    Case("YAML scalar body", b"hello", 422, "(body)", YAML),
    Case("invalid UTF-8 JSON", b'{"name": "\xff\xfe"}', 400, "utf-8"),
    Case("invalid UTF-8 YAML", b"name: \xff\xfe", 400, "UTF-8", YAML),
    Case("a NUL byte in YAML", b"name: a\x00b\ntasks: [{name: w}]", 400, "#x0000", YAML),
    Case("broken JSON", b'{"name":', 400, "not valid application/json"),
    Case("broken YAML", b"name: [x", 400, "not valid application/yaml", YAML),
    Case("two YAML documents", b"name: a\n---\nname: b", 400, "single document", YAML),
]


async def _jobs(gw: Gateway) -> int:
    async with gw.engine.connect() as conn:
        return int(await conn.scalar(text("SELECT count(*) FROM jobs")) or 0)


async def test_hostile_specs_get_a_clear_4xx_and_the_gateway_goes_on(db_url: str) -> None:
    async with gateway(db_url) as gw:
        user = await gw.token("vision")
        created = 0
        for case in CASES:
            started = time.monotonic()
            r = await gw.http.post("/v1/jobs", content=case.body, headers={
                **auth(user), "Content-Type": case.ctype})
            took = time.monotonic() - started
            where = (case.name, r.status_code, r.text[:400])
            assert r.status_code == case.status, where
            assert took < 10, where  # nothing expands or recurses for long
            body = r.json()
            if case.status == 422:
                assert case.expect in [d["field"] for d in body["detail"]], where
                assert len(body["detail"]) <= 51, where  # bounded, however many errors
            elif case.expect is not None:
                assert case.expect in body["detail"], where
            if case.status == 201:
                created += 1
                if case.verbatim is not None:
                    got = (await gw.http.get(f"/v1/jobs/{body['id']}", headers=auth(user))
                           ).json()["spec"]["tasks"][0]
                    assert {k: got[k] for k in case.verbatim} == case.verbatim, where
            await gw.submit(user)  # and a normal submit still works
            created += 1
        assert await _jobs(gw) == created  # what was refused wrote nothing

        # the billion laughs is refused at once, not after expanding it
        started = time.monotonic()
        r = await gw.http.post("/v1/jobs", content=laughs(), headers={
            **auth(user), "Content-Type": YAML})
        assert r.status_code == 413 and time.monotonic() - started < 2


async def test_nul_in_a_path_or_query_is_400_on_any_route(db_url: str) -> None:
    async with gateway(db_url) as gw:
        user = await gw.token("vision")
        for path in ("/v1/jobs/%00", "/v1/jobs?queue=%00", "/v1/jobs?user=a%00b",
                     "/v1/jobs/%00/events", "/v1/jobs/%00/logs", "/v1/environments/%00",
                     "/v1/queues/%00"):
            r = await gw.http.get(path, headers=auth(user))
            assert (r.status_code, r.json()) == (400, {"detail": UNSTORABLE}), path
        for method, path in (("GET", "/v1/tokens?tenant=%00"), ("DELETE", "/v1/tokens/%00"),
                             ("POST", "/v1/nodes/%00/cordon")):
            r = await gw.http.request(method, path, headers=auth(gw.admin))
            assert (r.status_code, r.json()) == (400, {"detail": UNSTORABLE}), path
        r = await gw.http.get("/v1/jobs/%ff%fe", headers=auth(user))  # not UTF-8: no such job
        assert r.status_code == 404
        await gw.submit(user)


async def test_a_body_of_many_bad_values_gets_a_bounded_422_on_any_route(db_url: str) -> None:
    async with gateway(db_url) as gw:
        user = await gw.token("vision")
        many = {f"V{i}": i for i in range(20_000)}
        for path, body in (("/v1/jobs", {**JOB, "tasks": [{"name": "w", "env": many}]}),
                           ("/v1/environments", {"env": many})):
            r = await gw.http.post(path, json=body, headers=auth(user))
            assert r.status_code == 422, (path, r.text[:300])
            detail = r.json()["detail"]
            assert len(detail) == 51 and detail[-1] == {
                "field": "(body)", "type": "too_many_errors", "message": "and 19950 more errors"}
        await gw.submit(user)
