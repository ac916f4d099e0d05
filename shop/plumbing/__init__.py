"""The shop's database and Redis plumbing under the services: the database's clock (clock), the
names of its Redis keys and locks (redis_keys, lock_names), durable transactions and retries
(transactions), the shop's locks (locking), sold-out markers (soldout), idempotency records
(idempotency), paused holders' transactions (stale_transactions), fence refusal counts
(fence_refusals), the checkout's test hook (hooks) and the project's MySQL backend (mysql).
Not an API: call the services."""
