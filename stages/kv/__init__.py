"""The batch's KV policy: what a model's KV costs, how the budget splits, and which rows run.

`shape.py` reads a model's figures (layers, KV heads, head dim, sliding
windows) and prices its KV in mlx-lm's cache blocks; `machine.py` reads
the machine; `plan.py` splits the memory budget at start (weights, the
prefill working set of the backend in use, the prompt cache, the KV);
`scheduler.py` is the gateway's running account of the KV rows hold, which
admits waiting rows and picks the row to preempt under pressure;
`tensors.py` is one KV tensor as plain bytes, the record the disk tier
(`stages/cache/`) and the layer rebuild (`stages/models/`) share. Pure
arithmetic and data: nothing here touches MLX arrays, and nothing here
imports another room.
"""
