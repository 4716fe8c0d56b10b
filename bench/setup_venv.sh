#!/usr/bin/env bash
# Installs the Python reference stack (torch CPU build, transformers, trl) into bench/.venv.
# Not part of the test suite or CI. Re-running is cheap: pip skips what is installed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --upgrade pip
# torch from PyPI (the only Python registry used); the benchmark runs it on CPU only.
"$venv/bin/pip" install --quiet -r "$here/python/requirements.txt"
"$venv/bin/python" -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
