"""Load tests, benchmarks and fault injection: many OS processes placing orders, then a check of the books.

An app of its own, above `shop` and `locks`: it drives the shop through its services and never
the other way round (neither shop nor locks imports it).

    strategies.py    the ways to take stock (naive, guarded UPDATE, ..., ours): one class each
    workload.py      the products, users and coupon a run creates (tagged "lt-<run id>-") and removes
    runner.py        forks the worker processes, starts them together, records every request
    report.py        the tables (every table of the package renders through `report.table`),
                     percentiles, comparison, JSON and plot
    scenarios.py     one run end to end, the side-by-side comparison, the coupon storm
    openloop.py      a crowd over HTTP, open loop (requests at scheduled times: `loadtest --url --profile`)
    profile.py       where one order's time goes (`checkoutprofile`)
    appservers.py    several gunicorn app servers on this process's database and lock service
    lockservices.py  the registry of lock services on private servers (Redis, Sentinel, Cluster,
                     Redlock, ZooKeeper, MySQL): backendbench and the HTTP faults start them here
    fault_harness.py what both fault harnesses share: the inject/heal plug-in interface, the
                     buyers' plumbing, the verdict and `FaultOutcome`
    inprocess_harness.py  fault injection in process: forked buyers, the checkout's test hook
    faults.py        the in-process faults, one scenario each (`loadtest --fault NAME`)
    httpfaults.py    fault injection over HTTP (app servers killed, lock services failing
                     over); `HttpFaultOutcome` extends `FaultOutcome`
    lockbench.py     the lock alone against redis-py's Lock and python-redis-lock (`lockbench`)
    servers/         private Redis, Sentinel, Cluster, Redlock and ZooKeeper servers, started and
                     stopped by pid (the lock backends' tests use them too)
    mysql8/          MariaDB dressed as MySQL 8.4 (`DATABASE_ENGINE=loadtest.mysql8`)
    models.py        `DbLock`, the lock table of the `lock_table` strategy

The management commands `loadtest`, `coupon_storm`, `backendbench`, `checkoutprofile` and
`lockbench` are thin layers over these modules.
"""
