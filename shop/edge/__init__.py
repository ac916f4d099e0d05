"""The overload edge: what stands between a crowd and the checkout (docs/design.md, "Before the app: the
shop's gunicorn worker").

    order_requests  which requests are orders, read from their raw bytes (the worker's triage)
    deadlines       every order request's deadline: the time its answer is due
    admission       how many buyers one process lets wait in the products' lines
    ratelimits      rate limits of the endpoints worth hammering
    overload        what the crowd is told, counted for the whole cluster (the dashboard's panel)
    middleware      a lost database connection answered 503, never 500

The gunicorn worker that refuses orders before the app is the project's (config/gunicorn_worker.py)."""
