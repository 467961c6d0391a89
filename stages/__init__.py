"""The LLM stages, in rooms that say where a module runs and what flows through it.

`prompt/` turns a parsed request into prepared rows (event loop and preparation threads); `model_thread/` runs
them on the one MLX thread; `reply/` turns its step outputs into completion events; `engine/` builds and wires
the three. `messages.py` is the catalogue of what travels between them, `adapters.py` the LoRA ids all of them
share, `stops.py` the stop-string hold-back the reply side and the families share, and `grammar_faults.py`
llguidance's errors as the prompt side and the reply side word them: pieces two rooms share live here, below both,
so no room imports another that imports it back.
"""
