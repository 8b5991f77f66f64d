#!/usr/bin/env bash
# GPU check of the PyTorch reference server: set up a venv from the repo's own files, then run
# `python -m servers.torch_ref.gpu_check` (a Llama-3.1-8B-shaped bf16 model on cuda, loadtest at
# concurrency 1, 8, 32, 64, measured ITL/TTFT next to the embedded engine's H200 prediction).
# Usage: servers/torch_ref/gpu_check.sh [gpu_check options, e.g. --ladder 1,8 --duration 15 | --tiny]
# Environment: GPU_CHECK_VENV (default .venv, the one dev.py uses), WHEELS=DIR to install from a local wheel folder
# (no index; make one on a connected machine with `pip wheel -w DIR '.[torch]'`).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${GPU_CHECK_VENV:-.venv}"
PIP_OPTS=(--quiet --disable-pip-version-check)
if [[ -n "${WHEELS:-}" ]]; then PIP_OPTS+=(--no-index --find-links "$WHEELS"); fi
start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    # The machine's own CUDA build of torch is kept (no 5 GB download, matches its driver).
    python3 -m venv --system-site-packages "$VENV"
  else
    python3 -m venv "$VENV"
  fi
fi
if ! "$VENV/bin/python" -c "import torch, safetensors, loadtest" 2>/dev/null; then
  if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/python" -m pip install "${PIP_OPTS[@]}" -e . safetensors
  else
    "$VENV/bin/python" -m pip install "${PIP_OPTS[@]}" -e ".[torch]"
  fi
fi
echo "setup_s: $(( $(date +%s) - start )) s"
exec "$VENV/bin/python" -m servers.torch_ref.gpu_check "$@"
