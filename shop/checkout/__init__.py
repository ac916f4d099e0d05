"""How an order is placed, inside `shop.services.place_order`: the request and its result
(protocol), combining on a product's lock or a lane (combining), the purchase caps and unpaid
limit (purchase_limits), and the one writer (writer: the transaction), with its allocation (pure),
its hand-written SQL (sql) and its replays. Not an API: call the services."""
