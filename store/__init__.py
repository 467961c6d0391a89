"""The Responses store: `previous_response_id` and `GET/DELETE /v1/responses/{id}` kept in memory, SQLite or PostgreSQL.

I/O and locks, so above `wire/` (the formats) and beside the edge that calls it off the loop (`edge/store.py`).
`policy.py` holds the records and the one policy every backend keeps; `opening.py` picks a backend from the URL.
"""
