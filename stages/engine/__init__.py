"""One model's engine: what it decides at start-up, the model side it builds, and the actors it wires and drains.

Inbox: the settings and a loaded model; requests through `Engine.submit` and the routes' model work. Outbox:
the running rooms (prompt, model thread, reply) and their statistics.
"""
