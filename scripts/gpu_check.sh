#!/usr/bin/env bash
# GPU check: our rollout engine's tokens/s against plain `generate`, one RL step's time and peak
# memory (torchrun, one process, FSDP2), and a few asynchronous RL steps (rollout.mode=async: a
# rollout worker process on a second GPU if any, else the same one; their time and staleness; then
# the same steps with rollout.weight_transport=broadcast, NCCL, when there is a second GPU),
# on a random ~0.5B Qwen2 model; writes one JSON of figures. Needs a CUDA GPU, torch, transformers
# and searchrl's own light dependencies; no network, no vLLM. The work is done by
# bench/gpu_check.py, one part per process, each under its own timeout (90 + 150 + 240 + 240 s at
# most on GPU; TIMEOUT_* below).
#
#   scripts/gpu_check.sh                       # GPU; JSON to runs/gpu_check/gpu_check-<date>.json
#   scripts/gpu_check.sh --out FILE.json       # JSON elsewhere
#   scripts/gpu_check.sh --dry   (or DRY=1)    # CPU, tiny-random model, a handful of tokens (CI)
#   scripts/gpu_check.sh --tokenizer DIR       # another tokenizer for the random model (vocab <= 151936)
#
# Environment: PYTHON (default python3), SEARCHRL_HOME (the cache: tiny-random model with the
# tokenizer, the toy world and its BM25 index; on an offline machine carry a copy of it, see
# docs/scale.md), GPU_CHECK_KEEP=1 keeps the work folder (model, training runs), TIMEOUT_PREPARE,
# TIMEOUT_ROLLOUT, TIMEOUT_TRAIN, TIMEOUT_ASYNC (seconds per part).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY="${DRY:-0}"
OUT=""
TOKENIZER="tiny-random"  # SmolLM2's tokenizer, shipped offline (searchrl.assets)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry) DRY=1; shift ;;
    --out) OUT="${2:?--out needs a file}"; shift 2 ;;
    --tokenizer) TOKENIZER="${2:?--tokenizer needs a name or folder}"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ "$DRY" == 1 || "$DRY" == true ]] && DRY=1 || DRY=0

PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="${OUT:-$ROOT/runs/gpu_check/gpu_check-$([[ $DRY == 1 ]] && echo dry- || true)$STAMP.json}"
FLAGS=()
if [[ $DRY == 1 ]]; then
  FLAGS=(--dry)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # CI and shared CPUs: one thread is steadier (docs/getting-started.md)
  T_PREPARE="${TIMEOUT_PREPARE:-120}" T_ROLLOUT="${TIMEOUT_ROLLOUT:-120}" T_TRAIN="${TIMEOUT_TRAIN:-180}"
  T_ASYNC="${TIMEOUT_ASYNC:-240}"
else
  T_PREPARE="${TIMEOUT_PREPARE:-90}" T_ROLLOUT="${TIMEOUT_ROLLOUT:-150}" T_TRAIN="${TIMEOUT_TRAIN:-240}"
  T_ASYNC="${TIMEOUT_ASYNC:-240}"
fi

die() { echo "gpu_check: $*" >&2; exit 1; }

# -- preflight: clear errors before any minute is spent ---------------------------------------------
command -v "$PYTHON" >/dev/null || die "no '$PYTHON' on PATH; set PYTHON=/path/to/python"
command -v timeout >/dev/null || die "the 'timeout' command (coreutils) is missing"
missing="$("$PYTHON" - <<'EOF'
import importlib.util
need = ["torch", "transformers", "pydantic", "yaml", "typer", "rich", "numpy", "bm25s", "tqdm"]  # PyStemmer: optional
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
EOF
)"
[[ -z "$missing" ]] || die "missing Python modules: $missing (pip names: pydantic pyyaml typer rich numpy bm25s tqdm;
  offline, carry wheels: docs/scale.md, 'GPU figures')"
if [[ $DRY == 0 ]]; then
  "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' \
    || die "CUDA is not available to $PYTHON (torch $("$PYTHON" -c 'import torch; print(torch.__version__)')): run this on a GPU machine, or use --dry for the CPU smoke run"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
if [[ "${GPU_CHECK_KEEP:-0}" == 1 ]]; then
  echo "gpu_check: work folder kept: $WORK"
else
  trap 'rm -rf "$WORK"' EXIT
fi

declare -A SECONDS_OF
part() {  # part NAME TIMEOUT COMMAND...
  local name="$1" limit="$2"; shift 2
  echo "== $name (timeout ${limit}s) $(date -u +%H:%M:%S)"
  local t0=$SECONDS rc=0
  timeout --kill-after=15 "$limit" "$@" || rc=$?
  SECONDS_OF[$name]=$((SECONDS - t0))
  if [[ $rc == 124 || $rc == 137 ]]; then die "part '$name' ran past its ${limit}s timeout (raise TIMEOUT_${name^^})"; fi
  [[ $rc == 0 ]] || die "part '$name' failed (exit $rc); its output is above"
  echo "   $name done in ${SECONDS_OF[$name]}s"
}

echo "gpu_check: mode=$([[ $DRY == 1 ]] && echo 'dry (CPU)' || echo GPU) python=$PYTHON work=$WORK"
HELPER="$ROOT/bench/gpu_check.py"
part prepare "$T_PREPARE" "$PYTHON" "$HELPER" prepare --work "$WORK" --tokenizer "$TOKENIZER" ${FLAGS[@]+"${FLAGS[@]}"}
part rollout "$T_ROLLOUT" "$PYTHON" "$HELPER" rollout --work "$WORK" ${FLAGS[@]+"${FLAGS[@]}"}
part train "$T_TRAIN" "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 1 \
  "$HELPER" train --work "$WORK" ${FLAGS[@]+"${FLAGS[@]}"}
part async "$T_ASYNC" "$PYTHON" "$HELPER" async --work "$WORK" ${FLAGS[@]+"${FLAGS[@]}"}
times="{\"prepare\": ${SECONDS_OF[prepare]}, \"rollout\": ${SECONDS_OF[rollout]}, \"train\": ${SECONDS_OF[train]}, \"async\": ${SECONDS_OF[async]}}"
"$PYTHON" "$HELPER" report --work "$WORK" --out "$OUT" --part-seconds "$times" ${FLAGS[@]+"${FLAGS[@]}"}
echo "gpu_check: wrote $OUT"
