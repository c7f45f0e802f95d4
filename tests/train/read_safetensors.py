#!/usr/bin/env python3
"""An independent reader of baton's checkpoints: the safetensors format read with nothing but
Python's struct and json (https://huggingface.co/docs/safetensors, "Format"), and the tensors
compared with what the C++ model held when it saved (expected.txt, written beside the checkpoint
by test_checkpoint's [interop] case):

    <name> <dtype> <shape, comma-separated> <value> <value> ...   (values as %.17g)

Usage: read_safetensors.py DIR  (DIR holds `latest`, the checkpoints and expected.txt).
Exits 1 naming the first problem."""
import json
import os
import struct
import sys

FORMATS = {"F32": ("f", 4), "F64": ("d", 8), "I64": ("q", 8), "I32": ("i", 4), "U8": ("B", 1)}


def fail(message):
    print("read_safetensors.py: " + message)
    sys.exit(1)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        fail(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        fail(f"{path}: header length {n} past the end")
    header_bytes = data[8 : 8 + n]
    if (8 + n) % 8 != 0:
        fail(f"{path}: the data do not start 8-byte aligned (header length {n})")
    if not header_bytes.startswith(b"{"):
        fail(f"{path}: the header does not start with '{{'")
    header = json.loads(header_bytes.decode("utf-8"))  # trailing spaces are JSON whitespace
    payload = data[8 + n :]
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in metadata.values()):
        fail(f"{path}: __metadata__ values must be strings")
    tensors = {}
    spans = []
    for name, entry in header.items():
        if set(entry) != {"dtype", "shape", "data_offsets"}:
            fail(f"{path}: tensor {name} has the fields {sorted(entry)}")
        code, size = FORMATS[entry["dtype"]]
        count = 1
        for d in entry["shape"]:
            count *= d
        begin, end = entry["data_offsets"]
        if end - begin != count * size:
            fail(f"{path}: tensor {name}: {end - begin} bytes for {count} elements of {entry['dtype']}")
        values = struct.unpack("<%d%s" % (count, code), payload[begin:end])
        tensors[name] = (entry["dtype"], list(entry["shape"]), values)
        spans.append((begin, end, name))
    spans.sort()
    covered = 0
    for begin, end, name in spans:
        if begin != covered:
            fail(f"{path}: tensor {name} starts at {begin}, not at {covered} (a gap or an overlap)")
        covered = end
    if covered != len(payload):
        fail(f"{path}: {len(payload) - covered} data bytes belong to no tensor")
    return metadata, tensors


def main():
    root = sys.argv[1]
    with open(os.path.join(root, "latest")) as f:
        checkpoint = os.path.join(root, f.read().strip())
    with open(os.path.join(checkpoint, "manifest.json")) as f:
        manifest = json.load(f)
    found = {}
    for entry in manifest["files"]:
        path = os.path.join(checkpoint, entry["name"])
        if os.path.getsize(path) != entry["bytes"]:
            fail(f"{path}: {os.path.getsize(path)} bytes, the manifest says {entry['bytes']}")
        metadata, tensors = read_safetensors(path)
        if metadata.get("format") != "pt":
            fail(f"{path}: __metadata__ lacks format: pt (what Hugging Face's loaders look for)")
        if sorted(tensors) != sorted(entry["tensors"]):
            fail(f"{path}: holds {sorted(tensors)}, the manifest lists {sorted(entry['tensors'])}")
        for name, tensor in tensors.items():
            if name in found:
                fail(f"tensor {name} is in two files")
            found[name] = tensor
    expected = {}
    with open(os.path.join(root, "expected.txt")) as f:
        for line in f:
            parts = line.split()
            shape = [int(d) for d in parts[2].split(",")] if parts[2] != "-" else []
            expected[parts[0]] = (parts[1], shape, [float(v) if parts[1][0] == "F" else int(v) for v in parts[3:]])
    if sorted(found) != sorted(expected):
        fail(f"the checkpoint holds {len(found)} tensors, the model {len(expected)}: "
             f"{sorted(set(found) ^ set(expected))[:5]} differ")
    for name, (dtype, shape, values) in expected.items():
        got_dtype, got_shape, got_values = found[name]
        if (got_dtype, got_shape) != (dtype, shape):
            fail(f"tensor {name}: {got_dtype} {got_shape} in the file, {dtype} {shape} in the model")
        if list(got_values) != values:  # exact: %.17g of a float or double reads back to its value
            bad = next(i for i, (a, b) in enumerate(zip(got_values, values)) if a != b)
            fail(f"tensor {name}: element {bad} is {got_values[bad]} in the file, {values[bad]} in the model")
    print(f"read_safetensors.py: {len(found)} tensors in {len(manifest['files'])} files match the model "
          f"(names, dtypes, shapes, every value)")


if __name__ == "__main__":
    main()
