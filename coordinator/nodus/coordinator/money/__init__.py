"""Money: the price book and its offerings (pricebook.py, pure), the versions kept in the store
(books.py), whether a node's measured shape fits its offering (fit.py, pure), and what running on an
offering costs (estimate.py, pure: increments, minimum charge, p50/p90 bands).

Every amount is a `Decimal` and travels as a decimal string; nothing here touches a float
(docs/adr/0021-price-book.md).
"""
