"""The model thread: the one thread that runs MLX, its batch rows and the work it does between steps.

Inbox: `Prepared` rows, `Abort`s and exclusive jobs (embeddings, scores). Outbox: one `StepOutputs` parcel per
step (tokens, admissions, failed rows) handed to the event loop, and the jobs' results.
"""
