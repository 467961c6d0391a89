"""The garbage collector through a process's start: off while the imports run, then the imported heap frozen.

A front or a model worker imports mlx-lm and transformers (and the front Quart): about 225,000 objects that live as
long as the process. With the collector on, the imports pay for its passes over the objects they have made so far (a
worker's imports took 1.22 s of CPU with it on and 1.02 s with it off, the front's 1.40 s and 1.15 s); and every
full collection afterwards walks them all again, 30-40 ms with the event loop or the model thread stopped. Frozen,
later collections skip them. The price: the imports' own cyclic garbage (about 10,000 objects, 2 MB) is frozen with
them and never freed, since the collection that would free it costs what this saves. What the process makes after
its imports (the tokenizer, the model) is collected as usual.
"""

from __future__ import annotations

import gc


def pause_for_imports() -> None:
    """First thing in an entry module, before its heavy imports."""
    gc.disable()


def freeze_imports() -> None:
    """Once the entry module's imports are done."""
    gc.freeze()
    gc.enable()
