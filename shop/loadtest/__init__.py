"""Load tests for checkout: many OS processes placing orders, then a check of the books.

    strategies.py    the ways to take stock (naive, guarded UPDATE, ..., ours): one class each
    workload.py      the products, users and coupon a run creates (tagged "lt-<run id>-") and removes
    runner.py        forks the worker processes, starts them together, records every request
    report.py        the tables (every table of the package renders through `report.table`),
                     percentiles, comparison, JSON and plot
    scenarios.py     one run end to end, the side-by-side comparison, the coupon storm
    appservers.py    several gunicorn app servers on this process's database and lock service
    lockservices.py  the registry of lock services on private servers (Redis, Sentinel, Cluster,
                     Redlock, ZooKeeper, MySQL): backendbench and the HTTP faults start them here
    faults.py        fault injection in process: the inject/heal plug-in interface, the buyers'
                     plumbing, the verdict and `FaultOutcome`, shared with ...
    httpfaults.py    ... fault injection over HTTP (app servers killed, lock services failing
                     over); `HttpFaultOutcome` extends `FaultOutcome`

The management commands `loadtest`, `coupon_storm` and `backendbench` are thin layers over
these modules.
"""
