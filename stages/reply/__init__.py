"""The reply side: a row's step outputs made into what its client reads, on the event loop.

Inbox: `StepOutputs` (token ids per row). Outbox: `CompletionEvent`s (text, reasoning, tool calls, the end)
for the API's stream protocol.
"""
