"""The benchmark's rounds fold into medians with min-max, and the targets read them."""

from __future__ import annotations

from benchmarks.report import spread, targets
from benchmarks.rounds import fold_entries, fold_limits


def test_rounds_fold_into_the_median_with_min_and_max_per_measurement() -> None:
    rounds = [[{"mode": "a", "events": 100, "eps": 10.0, "note": "x"},
               {"mode": "a", "events": 200, "eps": 1.0}],
              [{"mode": "a", "events": 100, "eps": 30.0, "note": "y"}],
              [{"mode": "a", "events": 100, "eps": 20.0, "note": "z"}]]
    folded = fold_entries(rounds)
    assert [(e["mode"], e["events"], e["rounds"]) for e in folded] == [("a", 100, 3), ("a", 200, 1)]
    first = folded[0]
    assert (first["eps"], first["eps_min"], first["eps_max"]) == (20.0, 10.0, 30.0)
    assert first["note"] == "z", "non-numeric fields come from the median round"
    assert "eps_min" not in folded[1], "one round has no spread"
    assert spread(first, "eps") == "20 (10-30)" and spread(folded[1], "eps") == "1"


def test_limits_fold_per_backlog_size() -> None:
    folded = fold_limits([{"100": {"producer_eps": 5.0}}, {"100": {"producer_eps": 7.0}},
                          {"100": {"producer_eps": 6.0}}])
    assert folded["100"]["producer_eps"] == 6.0 and folded["100"]["producer_eps_max"] == 7.0


def test_targets_mark_each_ratio_met_or_not() -> None:
    limits = {"pg_recvlogical_wal2json_eps": 100.0, "pg_recvlogical_pgoutput_eps": 100.0,
              "pg_recvlogical_eps": 100.0, "producer_eps": 1000.0}
    wal = {"mode": "wal-wal2json", "events": 100, "eps": 90.0, "steady_eps": 90.0, "seconds": 1.0,
           "acked_s": 1.5, "relay_cpu_us_per_event": 5.0, "relay_peak_rss_mb": 60.0}
    results = {"limits": {"100": limits}, "latency": [], "latency_floor": [],
               "throughput": [wal, {"mode": "poll-classic", "events": 100, "eps": 10.0},
                              {"mode": "poll-1s", "events": 100, "eps": 15.0}]}
    lines = "\n".join(targets(results))
    assert "0.90 x pg_recvlogical wal2json (target ≥ 0.85): met" in lines
    assert "steady 0.90 x (target ≥ 0.95): **NOT met**" in lines
    assert "slot confirmed 500 ms after" in lines and "(target ≤ 100 ms): **NOT met**" in lines
    assert "poll-1s, 100 events: 1.50 x the classic relay (target ≥ 2): **NOT met**" in lines
