# Source this to build and run the tch runtime by hand:
#   . scripts/env.sh && cargo test --workspace --all-features
# It points torch-sys at torch==2.13.0 in the featshard virtual environment
# (created by scripts/test).
VENV="${FEATSHARD_VENV:-$HOME/.cache/featshard/venv}"
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
FEATSHARD_TORCH_LIB="$("$VENV/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$FEATSHARD_TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
