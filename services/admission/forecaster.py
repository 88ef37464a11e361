"""The gateway's client of the forecaster service (a dry run's expected start).

The forecaster replays the live cluster through the scheduling core; asked
``POST {forecaster_url}/v1/what-if`` with candidate jobs, it answers for each, alone,
when it would start and finish, with a band and the nodes it would get (epoch seconds),
or 503 while it has no snapshot yet. A dry run must answer without it: every way the
call can fail is a ``ForecastUnavailable`` whose text says why, never an error of the
dry run itself.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from shared.events.reasons import WaitCode
from shared.logging import get_logger

log = get_logger(__name__)
WHAT_IF_PATH = "/v1/what-if"


class ForecastUnavailable(Exception):
    """No forecast; ``str()`` says why, in words a user reads."""


class CandidateForecast(BaseModel):
    job_id: str
    start: float | None = None
    finish: float | None = None
    start_low: float | None = None
    start_high: float | None = None
    nodes: list[str] = []
    waits_for: str | None = None
    reason: WaitCode | None = None


class WhatIfAnswer(BaseModel):
    as_of: float
    forecasts: list[CandidateForecast]


def _detail(r: httpx.Response) -> str:
    try:
        body = r.json()
        detail = body.get("detail", body) if isinstance(body, dict) else body
    except ValueError:
        detail = r.text
    return str(detail)[:300]


async def what_if(url: str, timeout_s: float,
                  candidates: list[dict[str, Any]]) -> tuple[float, dict[str, CandidateForecast]]:
    """The snapshot's time and each candidate's forecast by job id, or
    ``ForecastUnavailable``."""
    if not url:
        raise ForecastUnavailable("no forecaster is configured (KAIROS_FORECASTER_URL)")
    try:
        async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
            r = await client.post(WHAT_IF_PATH, json={"candidates": candidates})
    except httpx.TimeoutException as exc:
        raise ForecastUnavailable(
            f"the forecaster at {url} did not answer within {timeout_s:g} s") from exc
    except httpx.HTTPError as exc:
        log.info("forecaster unreachable", url=url, error=repr(exc))
        raise ForecastUnavailable(
            f"the forecaster at {url} cannot be reached ({type(exc).__name__})") from exc
    if r.status_code == 503:
        raise ForecastUnavailable(f"the forecaster has no snapshot of the cluster yet: "
                                  f"{_detail(r)}")
    if r.status_code != 200:
        raise ForecastUnavailable(f"the forecaster answered {r.status_code}: {_detail(r)}")
    try:
        answer = WhatIfAnswer.model_validate_json(r.content)
    except ValidationError as exc:
        log.warning("forecaster answer not understood", url=url, error=str(exc)[:500])
        raise ForecastUnavailable(
            f"the forecaster's answer was not understood ({exc.error_count()} errors)") from exc
    return answer.as_of, {f.job_id: f for f in answer.forecasts}
