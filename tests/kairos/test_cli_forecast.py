"""Forecasts in words, as ``kairos describe`` and ``kairos jobs --start`` print them."""

from __future__ import annotations

from datetime import UTC, datetime

from kairos.cli_forecast import forecast_line, in_words, span

NOW = 1_800_000_000.0


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def test_a_forecast_reads_as_a_sentence() -> None:
    f = {"start": iso(NOW + 720), "start_low": iso(NOW + 480), "start_high": iso(NOW + 1200),
         "finish": iso(NOW + 7800), "nodes": ["node3-1", "node3-2"], "waits_for": None}
    assert forecast_line(f, NOW) == ("Expected start: in about 12 min (between 8 and 20) on "
                                     "node3-1, node3-2; finish in about 2 h 10 min")
    f = {**f, "start_high": None, "waits_for": "j-ahead"}
    assert forecast_line(f, NOW) == (
        "Expected start: in about 12 min (between 8 min and beyond the horizon) on node3-1, "
        "node3-2, waiting behind j-ahead; finish in about 2 h 10 min")
    assert forecast_line({"start": None, "reason": "quota"}, NOW).endswith("(waiting for quota)")
    assert "horizon" in forecast_line({"start": None, "reason": "no_fit"}, NOW)


def test_spans_and_bands() -> None:
    assert [span(s) for s in (0, 45, 600, 7200, 7800, 3 * 86400 + 4 * 3600)] == [
        "0 s", "45 s", "10 min", "2 h", "2 h 10 min", "3 d 4 h"]
    assert in_words(NOW, NOW) == "now"
    assert in_words(NOW + 30, NOW, NOW, NOW + 50) == "in about 30 s (between now and 50 s)"
    assert in_words(NOW + 600, NOW, NOW + 600, NOW + 600) == "in about 10 min"
    assert in_words(NOW + 600, NOW, NOW + 60, NOW + 7200) == (
        "in about 10 min (between 60 s and 2 h)")
