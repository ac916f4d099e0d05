"""Load tests for checkout: many OS processes placing orders, then a check of the books.

    strategies.py   the ways to take stock (naive, guarded UPDATE, ..., ours): one class each
    workload.py     the products, users and coupon a run creates (tagged "lt-<run id>-") and removes
    runner.py       forks the worker processes, starts them together, records every request
    report.py       the table, percentiles, comparison, JSON and plot

The management commands `loadtest` and `coupon_storm` are thin layers over these modules.
"""
