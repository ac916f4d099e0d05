"""The report's arithmetic on hand-made records: percentiles, rates, fairness, tables, files."""

from __future__ import annotations

import json

import pytest

from loadtest import report
from loadtest.runner import Phase, PhaseRun
from loadtest.strategies import OUTCOMES

P, OOS, BUSY = OUTCOMES.index("placed"), OUTCOMES.index("out_of_stock"), OUTCOMES.index("busy")


def phase_run(records_per_worker, server_before=None, server_after=None) -> PhaseRun:
    return PhaseRun(phase=Phase("main", requests=1), records=records_per_worker,
                    server_before=server_before or {}, server_after=server_after or {})


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert report.percentile(values, 0.50) == 50
    assert report.percentile(values, 0.99) == 99
    assert report.percentile(values, 1.0) == 100
    assert report.percentile([7.0], 0.99) == 7
    assert report.percentile([], 0.5) == 0


def test_summary_counts_rates_and_latency():
    # Worker 0: three orders of 10 ms each back to back; worker 1: one out of stock, one busy.
    w0 = [(0.00, 0.01, P, 3, 1), (0.01, 0.02, P, 3, 1), (0.02, 0.03, P, 3, 1)]
    w1 = [(0.00, 0.05, OOS, 1, 0), (0.05, 0.10, BUSY, 0, 0)]
    s = report.summarize("x", phase_run([w0, w1], {"mysql_questions": 10, "lock_acquired": 5},
                                        {"mysql_questions": 25, "lock_acquired": 7}))
    assert s.attempted == 5
    assert s.counts["placed"] == 3 and s.counts["out_of_stock"] == 1 and s.counts["busy"] == 1
    assert s.window == pytest.approx(0.10)
    assert s.orders_per_s == pytest.approx(30)
    assert s.rejections_per_s == pytest.approx(10)
    assert s.latency_ms["p50"] == pytest.approx(10)
    assert s.latency_ms["max"] == pytest.approx(50)
    assert s.queries == 10
    assert s.lock_acquisitions == 3 + 2  # client-side count plus the lock service's own counter
    assert s.server == {"mysql_questions": 15}
    assert s.placed_per_process == [3, 0]


def test_a_starved_process_shows_in_fairness():
    even = [[(0, 1, P, 0, 0)] * 4, [(0, 1, P, 0, 0)] * 4]
    starved = [[(0, 1, P, 0, 0)] * 4, [(0, 1, OOS, 0, 0)] * 4]
    assert report.summarize("x", phase_run(even)).fairness == 1.0
    assert report.summarize("x", phase_run(starved)).fairness == 0.0


def test_timeline_buckets_by_end_time():
    records = [(0.0, 0.1, P, 0, 0), (0.0, 0.1, P, 0, 0), (0.5, 0.9, OOS, 0, 0), (0.9, 1.0, OOS, 0, 0)]
    points = report.timeline(records, bins=2)
    assert [round(p["t"], 2) for p in points] == [0.25, 0.75, 1.25]  # the last end falls in its own slice
    assert points[0]["placed_per_s"] == pytest.approx(4)  # 2 orders in a 0.5 s slice
    assert points[1]["rejected_per_s"] == pytest.approx(2)
    assert points[0]["p99_ms"] == pytest.approx(100)


def test_table_aligns_numbers_right_and_text_left():
    text = report.table(("name", "n"), [["a", 1234], ["bbb", 5]])
    lines = text.splitlines()
    assert lines[0] == "name      n"
    assert lines[2] == "a     1,234"
    assert lines[3] == "bbb       5"


def aggregate(strategy: str, orders: float, p99: float, failures: int = 0) -> report.Aggregate:
    s = report.summarize(strategy, phase_run([[(0, 1, P, 0, 0)]]))
    s.orders_per_s, s.latency_ms["p99"] = orders, p99
    return report.aggregate(strategy, "hot", [s], failures=failures)


def test_comparison_gives_ratios_to_guarded_raw_and_cache_lock():
    text = report.comparison_table([aggregate("raw", 4000, 5), aggregate("guarded", 1000, 10),
                                    aggregate("redis_py", 500, 400), aggregate("ours", 800, 40),
                                    aggregate("naive", 1200, 8, failures=1)])
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:]}
    assert rows["ours"][2:5] == ["0.80x", "0.20x", "1.60x"]  # orders/s vs guarded, vs raw, vs cache.lock
    assert rows["ours"][7:9] == ["4.00x", "0.10x"]  # p99 vs guarded, vs cache.lock
    assert rows["naive"][-2:] == ["FAIL", "(1/1)"]
    assert rows["guarded"][-1] == "PASS"


def test_batch_summary_counts_orders_per_hold():
    got = report.batch_summary([1, 1, 2, 3, 4, 9, 32])
    assert (got["holds"], got["max"], got["p50"]) == (7, 32, 3)
    assert got["mean"] == round(52 / 7, 2)
    assert got["histogram"] == {"1": 2, "2": 1, "3-4": 2, "9-16": 1, "17-32": 1}
    assert report.batch_summary([])["holds"] == 0


def test_aggregate_takes_medians_over_repeats():
    runs = []
    for orders in (100, 300, 200):
        s = report.summarize("ours", phase_run([[(0, 1, P, 0, 0)]]))
        s.orders_per_s = orders
        runs.append(s)
    assert report.aggregate("ours", "hot", runs, failures=0).orders_per_s == 200


def test_sellout_table_shows_the_ratio_to_placed_orders():
    a = aggregate("ours", 0, 2)
    a.rejections_per_s = 5000
    text = report.sellout_table([a], {"ours": 500})
    assert "10.00x" in text


def test_json_and_plot_files(tmp_path):
    report.write_json(tmp_path / "r.json", {"a": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    records = [(i / 100, i / 100 + 0.01, P if i % 3 else OOS, 0, 0) for i in range(200)]
    report.plot(tmp_path / "r.png", {"ours": report.timeline(records)}, "test")
    png = (tmp_path / "r.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) < 150_000


def test_throughput_is_over_the_measured_window_not_the_nominal_duration():
    # A 10 s --duration phase whose requests ran from t=100.5 to t=102.5: 2 s measured.
    records = [[(100.5, 101.0, P, 0, 0), (101.0, 102.5, P, 0, 0)], [(100.6, 101.5, OOS, 0, 0)]]
    s = report.summarize("x", PhaseRun(phase=Phase("main", duration=10.0), records=records,
                                       server_before={}, server_after={}))
    assert s.window == pytest.approx(2.0)
    assert s.orders_per_s == pytest.approx(1.0)  # 2 orders / 2 s, not 2 / 10
    assert s.rejections_per_s == pytest.approx(0.5)


def test_the_storm_row_shows_no_orders_per_s_or_fairness():
    sold = report.summarize("x", PhaseRun(phase=Phase("sell-out", until_sold_out=True),
                                          records=[[(0, 1, P, 0, 0)], [(0, 1, P, 0, 0)]],
                                          server_before={}, server_after={}))
    storm = report.summarize("x", PhaseRun(phase=Phase("storm", requests=2), records=[[(1, 2, OOS, 0, 0)]] * 2,
                                           server_before={}, server_after={}))
    rows = report.run_rows([sold, storm])
    orders, fairness = report.RUN_HEADERS.index("orders/s"), report.RUN_HEADERS.index("fairness")
    assert rows[0][orders] == 2.0 and rows[0][fairness] == 1.0
    assert rows[1][orders] is None and rows[1][fairness] is None
    text = report.run_table([sold, storm]).splitlines()
    storm_line = next(line.split() for line in text if line.startswith("x") and " storm " in line)
    assert storm_line[report.RUN_HEADERS.index("orders/s")] == "-" and storm_line[-1] == "-"
    assert "orders_per_s" in storm.as_dict() and "fairness" in storm.as_dict()  # the JSON keeps the fields
