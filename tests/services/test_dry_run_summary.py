"""A dry run's one-line summary (``services/admission/dry_run.summary``), from answers
built here: the wording a user reads for each shape of answer."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from services.admission.dry_run import summary
from services.admission.models.dry_run import DryRunForecast, DryRunOut, DryRunQuota, QuotaDemand
from shared.durations import in_words

NOW = 1_800_000_000.0
ASK = QuotaDemand(gpus=8, cpu_milli=0, memory_mib=0)


def at(s: float | None) -> datetime | None:
    return None if s is None else datetime.fromtimestamp(NOW + s, UTC)


def answer(forecast: dict[str, Any] | None = None, blocked: str | None = None,
           array: int | None = None, why: str | None = None) -> DryRunOut:
    quota = DryRunQuota(admitted=blocked is None, blocked_by=blocked, detail="", ask=ASK)
    f = None
    if forecast is not None:
        f = DryRunForecast(as_of=at(0), start=at(forecast.get("start")),
                           finish=at(forecast.get("finish")), start_low=at(forecast.get("low")),
                           start_high=at(forecast.get("high")), in_seconds=None,
                           nodes=forecast.get("nodes", []), waits_for=forecast.get("waits"))
    return DryRunOut(name="j", queue="research", tenant="t", user="u", array_size=array,
                     quota=quota, forecast=f, forecast_unavailable=why, summary="")


@pytest.mark.parametrize(("out", "text"), [
    (answer({"start": 720, "low": 480, "high": 1200, "finish": 7800,
             "nodes": ["node3-1", "node3-2"]}, blocked="quota of queue `research`"),
     "would start in about 12 min (between 8 and 20) on node3-1, node3-2; would finish "
     "about 2 h 10 min from now; blocked meanwhile by: quota of queue `research`"),
    (answer({"start": 2, "finish": 600, "nodes": ["n1"]}),
     "would start now on n1; would finish about 10 min from now"),
    (answer({"start": 3600, "low": 0, "high": 7200, "waits": "job j-1 (priority)"}),
     "would start in about 1 h (between now and 2 h); blocked meanwhile by: job j-1 "
     "(priority)"),
    (answer({"start": 45, "low": 30, "high": 50, "nodes": [f"n{i}" for i in range(9)]}),
     "would start in about 45 s (between 30 and 50) on n0, n1, n2, n3, n4, n5 and 3 more"),
    (answer(why="the forecaster is down"),
     "would be accepted; the quota of queue `research` admits it now; no forecast: the "
     "forecaster is down"),
    (answer(blocked="reclaim in cohort `lab`", why="x", array=10),
     "an array of 10 jobs would be accepted; blocked meanwhile by: reclaim in cohort "
     "`lab`; no forecast: x"),
    (answer({"start": 60}, array=10),
     "an array of 10 jobs, forecast for one element alone; would start in about 1 min"),
])
def test_the_summary_reads_as_one_sentence(out: DryRunOut, text: str) -> None:
    assert summary(out, NOW) == text


def test_durations_in_words() -> None:
    assert [in_words(s) for s in (-3, 0, 44.6, 59.4, 60, 719, 3600, 7800, 86400, 273600)] == [
        "0 s", "0 s", "45 s", "59 s", "1 min", "12 min", "1 h", "2 h 10 min", "1 d", "3 d 4 h"]
