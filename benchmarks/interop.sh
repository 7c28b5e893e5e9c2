#!/usr/bin/env bash
# Does every inference engine people run read our checkpoints as we do? One table row per consumer:
# loads? greedy tokens equal to ours (transformers 5, this venv)? tok/s (3 prompts, up to 48 new tokens each).
#
#   benchmarks/interop.sh CHECKPOINT [CHECKPOINT ...]      (best/, final/ or a utils.consolidate folder)
#
# Consumers: transformers 4.x and CTranslate2 (one side venv), optimum ONNX export + onnxruntime (its own venv:
# optimum pins transformers < 4.58), llama.cpp's llama-simple (built from the llama.cpp that the llama-cpp-python
# sdist vendors, patched to an f32 KV cache: an f16 cache flips near-ties of greedy decoding) on the f32 GGUF of
# `python -m utils.to_gguf`. Venvs and the build are cached under $INTEROP_CACHE (default .cache/interop,
# git-ignored); the first run downloads ~2 GB and builds for a while (make -j2, nice 10).
set -euo pipefail
# Ctrl-C: the Python child stops cleanly and may exit 0; the script must stop too, with 130, not go on.
trap 'echo "error: interrupted" >&2; exit 130' INT TERM
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "error: give at least one checkpoint folder (e.g. checkpoints/<run>/best)" >&2; exit 2; }
for ckpt in "$@"; do
  [ -f "$ckpt/config.json" ] && [ -f "$ckpt/model.safetensors" ] || {
    echo "error: $ckpt is not a from_pretrained folder (best/, final/ or python -m utils.consolidate's output)" >&2; exit 2; }
done
export NO_GCE_CHECK=true GCE_METADATA_HOST=127.0.0.1:9 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
CACHE=${INTEROP_CACHE:-.cache/interop}
LLAMA_PY=0.3.36  # llama-cpp-python sdist whose vendored llama.cpp is built
mkdir -p "$CACHE"

side_venv() {  # side_venv NAME PACKAGES...: a cached venv (python3.11, the torch CPU wheel)
  local dir=$CACHE/venv-$1; shift
  if [ ! -f "$dir/.ok" ]; then
    echo "==> building $dir ($*)" >&2
    rm -rf "$dir" && python3.11 -m venv "$dir"
    nice -n 10 "$dir/bin/pip" install -q torch==2.13.0 "$@" >&2
    touch "$dir/.ok"
  fi
  echo "$dir/bin/python"
}

llama_simple() {  # the cached llama-simple binary
  local src=$CACHE/llama.cpp-src bin=$CACHE/llama.cpp-src/build/bin/llama-simple
  if [ ! -x "$bin" ]; then
    if [ ! -d "$src" ]; then
      echo "==> fetching llama.cpp from the llama-cpp-python $LLAMA_PY sdist" >&2
      .venv/bin/python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_PY" -d "$CACHE" >&2
      tar xzf "$CACHE/llama_cpp_python-$LLAMA_PY.tar.gz" -C "$CACHE"
      mv "$CACHE/llama_cpp_python-$LLAMA_PY/vendor/llama.cpp" "$src" && rm -rf "$CACHE/llama_cpp_python-$LLAMA_PY"
      sed -i 's|    ctx_params.no_perf = false;|    ctx_params.no_perf = false;\n    ctx_params.type_k = GGML_TYPE_F32;  // piconeox interop: f32 KV cache so greedy ties match\n    ctx_params.type_v = GGML_TYPE_F32;|' \
        "$src/examples/simple/simple.cpp"
    fi
    echo "==> building llama-simple (make -j2, nice 10)" >&2
    nice -n 10 cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DGGML_NATIVE=ON >&2
    nice -n 10 cmake --build "$src/build" --target llama-simple -j2 >&2
  fi
  echo "$bin"
}

HF4=$(side_venv hf4 "transformers>=4.45,<5" ctranslate2==4.8.5)
ONNX=$(side_venv onnx optimum-onnx onnxruntime)
LLAMA=$(llama_simple)
ROWS=$CACHE/rows.jsonl
: > "$ROWS"
for ckpt in "$@"; do
  name=$(basename "$(dirname "$(realpath "$ckpt")")")/$(basename "$ckpt")
  work=$CACHE/work/${name//\//-}
  rm -rf "$work" && mkdir -p "$work"
  echo "==> $name" >&2
  .venv/bin/python -m utils.to_gguf "$ckpt" --out "$work/model.gguf" --type f32 >&2
  run() { "$@" 2>>"$work/log.txt" | tail -n 1 | sed "s|\"model\": \"[^\"]*\"|\"model\": \"$name\"|" >> "$ROWS"; }
  run .venv/bin/python benchmarks/interop_run.py reference "$ckpt" "$work/ref.json"
  run "$HF4" benchmarks/interop_run.py hf "$ckpt" "$work/ref.json" "$work"
  run "$HF4" benchmarks/interop_run.py ct2 "$ckpt" "$work/ref.json" "$work"
  run "$ONNX" benchmarks/interop_run.py onnx "$ckpt" "$work/ref.json" "$work"
  run .venv/bin/python benchmarks/interop_run.py llama "$ckpt" "$work/ref.json" "$work/model.gguf" "$LLAMA"
done
.venv/bin/python benchmarks/interop_run.py table "$ROWS"
