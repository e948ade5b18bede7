#!/usr/bin/env bash
# A static embedding model for intent routing (`kvmesh serve --embedding-model DIR`), from a
# package registry: WordLlama's wheel on PyPI ships its 32000×256 F16 matrix and its
# tokenizer (Llama 2's vocabulary; mind the Llama 2 licence). Nothing is fetched at build or
# run time: this script lays out DIR once, in the model2vec layout kvmesh reads
# (`tokenizer.json`, `model.safetensors`).
#
# Usage: scripts/fetch-static-embedding.sh DIR
set -euo pipefail
DIR=${1:?usage: $0 DIR}
VERSION=0.4.0.post1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The wheels of every platform hold the same weights; only the compiled helpers differ.
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$WORK" \
    --platform manylinux2014_x86_64 --python-version 3.11 "wordllama==$VERSION"
WHEEL=$(ls "$WORK"/wordllama-*.whl)
python3 - "$WHEEL" "$DIR" <<'PY'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    pairs = {
        "wordllama/weights/l2_supercat_256.safetensors": "model.safetensors",
        "wordllama/tokenizers/l2_supercat_tokenizer_config.json": "tokenizer.json",
    }
    for src, dst in pairs.items():
        with z.open(src) as f, open(os.path.join(out, dst), "wb") as g:
            g.write(f.read())
PY
echo "static embedding model (WordLlama $VERSION, l2_supercat_256) in $DIR"
ls -l "$DIR"
