"""Money: the price book and its offerings (pricebook.py, pure), the versions kept in the store
(books.py), whether a node's measured shape fits its offering (fit.py, pure), what running on an
offering costs (estimate.py, pure: increments, minimum charge, p50/p90 bands, the expected charge),
placement's money rules (policy.py, pure: interruptible and rate filters, the Cost/Speed/Balanced
outlooks) and the GPU names that accelerators and requests are matched by (accelerators.py).

Every amount is a `Decimal` and travels as a decimal string; nothing here touches a float
(docs/adr/0021-price-book.md, docs/adr/0022-placement-by-price.md).
"""
