"""The prompt side: a request made ready for the model thread, on the event loop and the preparation threads.

Inbox: `Parsed` (a typed request from `parse.py`). Outbox: `Prepared` (token ids, sampling, stops, a compiled
constraint, whether the template's generation prompt opened a think block) for the gateway.
"""
