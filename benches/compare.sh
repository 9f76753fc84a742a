#!/usr/bin/env bash
# Every benchmark of benches/README.md run once on an earlier commit and once on this
# tree, one after the other, each tree with its own release build and its own Python
# package (the earlier one's installed into a folder of its own, first on PYTHONPATH).
#
#   benches/compare.sh COMMIT [OUT]       # OUT: the logs' folder (default /tmp/featshard-compare)
#
# FEATSHARD_COMPARE_ONLY="soak one_axis" runs only the benchmarks named (the names
# below). A benchmark an earlier commit does not have runs on this tree alone. Needs the
# featshard virtual environment (scripts/test makes it); runs for about an hour on two
# cores. Nothing else should run meanwhile: every figure is a time.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
commit="${1:?usage: benches/compare.sh COMMIT [OUT]}"
out="${2:-/tmp/featshard-compare}"
before="$out/tree-$commit"
site="$out/site-$commit"
py="${FEATSHARD_VENV:-$HOME/.cache/featshard/venv}/bin/python"
mkdir -p "$out"

build() {  # a tree's release builds and its wheel
  (cd "$1" && . scripts/env.sh &&
    cargo build --release &&
    cargo build --release -p featshard-runtime --example time_blocks &&
    cargo bench --no-run --bench generate_large --bench hostile_specs &&
    cargo bench -p featshard-runtime --no-run --bench shard_boltz --bench distribute_gloo &&
    maturin build --release --quiet --strip -m python/Cargo.toml -o target/wheels)
}

[ -d "$before" ] || git -C "$here" worktree add -f "$before" "$commit"
if [ -z "${FEATSHARD_COMPARE_BUILT:-}" ]; then  # set it to reuse both trees' builds
  build "$before"
  rm -rf "$site" && "$py" -m pip install --quiet --no-deps --target "$site" "$before"/target/wheels/featshard-*.whl
  build "$here"
  "$py" -m pip install --quiet --no-deps --force-reinstall "$here"/target/wheels/featshard-*.whl
fi

checksum() {  # featshard assemble with and without the CRC check, 5 runs each
  local f=target/release/featshard d; d="$(mktemp -d)"
  $f shard examples/boltz2.yaml --features tests/data/real/prot60_smiles.safetensors \
    --mesh 8x8 --workflow inference --out "$d/b8" >/dev/null
  for v in "" --no-verify; do
    local t0; t0=$(date +%s%N)
    for _ in 1 2 3 4 5; do $f assemble examples/boltz2.yaml --shards "$d/b8" --out "$d/o" $v >/dev/null; rm -f "$d/o"; done
    echo "assemble ${v:-(checked)}: $(( ($(date +%s%N) - t0) / 5000000 )) ms a run"
  done
  rm -rf "$d"
}

benches=(
  "generate_large|cargo bench --bench generate_large"
  "hostile_specs|cargo bench --bench hostile_specs"
  "shard_boltz|cargo bench -p featshard-runtime --bench shard_boltz"
  "distribute_gloo|cargo bench -p featshard-runtime --bench distribute_gloo"
  "shard_disk|$py benches/shard_disk.py"
  "checksum|checksum"
  "presharded_read|$py benches/presharded_read.py"
  "python_vs_rust|$py benches/python_vs_rust.py"
  "distribute_memory|$py benches/distribute_memory.py 1024 20 boltz2"
  "place_speed|$py benches/place_speed.py"
  "cuda_expand_cpu|$py benches/cuda_expand.py cpu"
  "cp30k|$py benches/cp30k.py"
  "domain_scatter|$py benches/domain_scatter.py"
  "soak|$py benches/soak.py"
  "one_axis|$py benches/one_axis.py"
)

run() {  # run NAME COMMAND in TREE with PYTHONPATH, into OUT/NAME-LABEL.log
  local name="$1" cmd="$2" tree="$3" label="$4" path="$5"
  local script; script="$(echo "$cmd" | grep -o 'benches/[a-z_0-9]*\.py' || true)"
  if [ -n "$script" ] && [ ! -e "$tree/$script" ]; then
    echo "$name: not in $label"; return
  fi
  echo "== $name ($label)"
  (cd "$tree" && . scripts/env.sh && PYTHONPATH="$path" eval "$cmd") >"$out/$name-$label.log" 2>&1 \
    || echo "$name ($label) failed: see $out/$name-$label.log"
}

for b in "${benches[@]}"; do
  name="${b%%|*}" cmd="${b#*|}"
  case " ${FEATSHARD_COMPARE_ONLY:-$name} " in *" $name "*) ;; *) continue ;; esac
  run "$name" "$cmd" "$before" "$commit" "$site"
  run "$name" "$cmd" "$here" "after" ""
done
echo "logs: $out"
