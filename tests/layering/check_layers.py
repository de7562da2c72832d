#!/usr/bin/env python3
"""The layering of src/: a file may include only its own layer and the layers below it, and no
tensor-name literal appears outside src/model (a family's weights are named in its manifest).

Layers, bottom up: core; tensor, tokenizer, sampling (each on core only); backend (kernels,
device memory and streams, on core and tensor only); kv; model; runtime; engine; server; cli. KNOWN lists what the one-model-definition redesign has still to
move, file by file; an entry that no longer offends fails too, so the list only shrinks.
Usage: check_layers.py SRC_DIR
"""
import os
import re
import sys

BELOW = {
    "core": set(),
    "tensor": {"core"},
    "tokenizer": {"core"},
    "sampling": {"core"},
    "backend": {"core", "tensor"},
    "kv": {"core", "tensor", "backend"},
    "model": {"core", "tensor", "backend", "kv"},
}
BELOW["runtime"] = BELOW["model"] | {"model", "sampling"}
BELOW["engine"] = BELOW["runtime"] | {"runtime", "tokenizer"}
BELOW["server"] = BELOW["engine"] | {"engine"}
BELOW["router"] = BELOW["server"] | {"server"}
BELOW["cli"] = BELOW["router"] | {"router"}

# (file, included layer): includes still to move, each with why; none left.
KNOWN_INCLUDES = {}
# Tensor names still spelled by the GPU loaders of the families without a manifest yet.
KNOWN_NAMES = {}
NAME = re.compile(r'"[^"\n]*(_proj\b|\.weight\b|\.bias\b|layernorm|embed_tokens|lm_head|_norm\.)[^"\n]*"')


def main(src):
    problems, model_includes, seen_includes, seen_names = [], {}, set(), set()
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith((".h", ".cpp", ".cu", ".cuh")):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)
            layer = rel.split(os.sep)[0]
            if layer not in BELOW:
                problems.append(f"{rel}: layer '{layer}' is not in the layer list")
                continue
            text = open(path, encoding="utf-8", errors="replace").read()
            for m in re.finditer(r'^\s*#\s*include\s+"([a-z_]+)/', text, re.M):
                target = m.group(1)
                if target == layer or target not in BELOW or target in BELOW[layer]:
                    continue
                key = (rel, target)
                if key in KNOWN_INCLUDES:
                    seen_includes.add(key)
                    continue
                problems.append(f"{rel}: includes {target}/, which {layer}/ may not include")
            if layer == "model":
                continue
            code = re.sub(r"//[^\n]*", "", text)
            if NAME.search(code):
                if rel in KNOWN_NAMES:
                    seen_names.add(rel)
                else:
                    problems.append(f"{rel}: spells a tensor name ({NAME.search(code).group(0)}); name it in the manifest")
    for key, why in KNOWN_INCLUDES.items():
        if key not in seen_includes:
            problems.append(f"{key[0]} no longer includes {key[1]}/: remove it from KNOWN_INCLUDES ({why})")
    for rel, why in KNOWN_NAMES.items():
        if rel not in seen_names:
            problems.append(f"{rel} no longer spells tensor names: remove it from KNOWN_NAMES ({why})")
    for p in problems:
        print(p)
    print(f"layering: {len(problems)} problem(s); {len(KNOWN_INCLUDES)} known includes and {len(KNOWN_NAMES)} known loaders still to move")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
