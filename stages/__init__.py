"""The LLM stages, in rooms that say where a module runs and what flows through it.

`prompt/` turns a parsed request into prepared rows (event loop and preparation threads); `model_thread/` runs
them on the one MLX thread; `reply/` turns its step outputs into completion events; `engine/` builds and wires
the three. `messages.py` is the catalogue of what travels between them, `adapters.py` the LoRA ids all of them
share.
"""
