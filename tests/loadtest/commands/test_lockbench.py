"""`manage.py lockbench`: argument handling, a short real run of every contender, the JSON report."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from loadtest import lockbench


@pytest.mark.parametrize("args", [
    ["--only", "nope"], ["--only", ""], ["--processes", "0"], ["--duration", "0"], ["--rounds", "0"],
    ["--locks", "5", "--processes", "2"], ["--work-ms", "-1"],
])
def test_bad_arguments_are_refused(args):
    with pytest.raises(CommandError):
        call_command("lockbench", *args, stdout=io.StringIO())


@pytest.mark.django_db(transaction=True)
def test_a_short_run_reports_every_contender_and_checks_the_counter(tmp_path):
    out = io.StringIO()
    report = tmp_path / "bench.json"
    call_command("lockbench", "--processes", "3", "--duration", "0.5", "--rounds", "1", "--work-ms", "0.5",
                 "--json", str(report), stdout=out)
    text = out.getvalue()
    for contender in lockbench.CONTENDERS:
        assert contender in text
    assert "FAIL" not in text and "ours / redis-py: throughput" in text
    data = json.loads(report.read_text())
    assert [r["contender"] for r in data["results"]] == list(lockbench.CONTENDERS)
    for result in data["results"]:
        assert result["counter_ok"] is True
        (round_,) = result["rounds"]
        assert round_["acquisitions"] == sum(round_["per_process"]) > 0
        assert len(round_["per_process"]) == 3
    assert {t["target"] for t in data["targets"]} == {label for label, _, _ in lockbench.targets(
        [lockbench.Summary(**{**r, "rounds": []}) for r in data["results"]], 3)}


def test_percentile_and_fairness():
    assert lockbench.percentile([], 0.5) == 0.0
    assert lockbench.percentile([1, 2, 3, 4], 0.5) == 3
    r = lockbench.RoundResult("x", 1, 10, [1, 9], 1.0, 0, 0, 0, 0, True, 0)
    assert r.fairness == pytest.approx(1 / 9)
    assert r.starved(2) == 1  # 1 < (10 / 2) / 4


@pytest.mark.parametrize(("module", "args", "named"), [
    ("redis_lock", [], "python-redis-lock"),  # a default contender
    ("pottery", ["--only", "pottery", "--redlock-urls", "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3"],
     "pottery"),
])
def test_a_missing_benchmark_extra_is_refused_with_the_pip_command(monkeypatch, module, args, named):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # a virtualenv of `./dev.sh run`: requirements.txt only
    with pytest.raises(CommandError, match=rf"{named}.* -m pip install -r \S*requirements-bench\.txt"):
        call_command("lockbench", "--duration", "0.1", "--rounds", "1", *args, stdout=io.StringIO())
