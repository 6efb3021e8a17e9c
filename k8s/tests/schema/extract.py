#!/usr/bin/env python3
"""Writes resource.k8s.io-v1.json: the OpenAPI schema of a ResourceSlice (every type it reaches),
descriptions left out, as k8s-openapi generated it from the OpenAPI document of Kubernetes 1.37
(crate k8s-openapi 0.29.0, feature v1_37; its `schemars` impls hold the document's schemas).

    python3 k8s/tests/schema/extract.py ~/.cargo/registry/src/*/k8s-openapi-0.29.0

The strict fake API server of the tests (k8s/tests/common/apiserver.rs) checks every object the
plugin sends against it, with every object closed (unknown fields refused), as the API server
does for `fieldValidation=Strict`.
"""
import json
import pathlib
import re
import sys

VERSION = "v1_37"
ROOT = "crate::api::resource::v1::ResourceSlice"


def schema_name(path):
    return "io.k8s." + path.removeprefix("crate::").replace("::", ".")


def source(crate, path):
    parts = path.removeprefix("crate::").split("::")
    ty = re.sub(r"(?<!^)(?=[A-Z])", "_", parts[-1]).lower()
    ty = re.sub(r"_(?=[A-Z0-9])", "", ty)
    return pathlib.Path(crate) / "src" / VERSION / "/".join(parts[:-1]) / f"{ty}.rs"


def schema_of(crate, path):
    text = source(crate, path).read_text()
    body = text[text.index("json_schema!(") + len("json_schema!("):]
    body = body[: body.index("\n        })\n    }\n}") + len("\n        }")]
    body = re.sub(r'^\s*"description": ".*",\n', "", body, flags=re.M)
    body = re.sub(
        r"\(\{\s*let mut schema_obj = __gen\.subschema_for::<([\w:]+)>\(\);.*?schema_obj\s*\}\)",
        lambda m: json.dumps({"$ref": m.group(1)}), body, flags=re.S)
    body = re.sub(r"\(__gen\.subschema_for::<([\w:]+)>\(\)\)",
                  lambda m: json.dumps({"$ref": m.group(1)}), body)
    body = re.sub(r",(\s*[}\]])", r"\1", body)
    return json.loads(body)


def refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def main(crate):
    defs, todo = {}, [ROOT]
    while todo:
        path = todo.pop()
        if schema_name(path) in defs:
            continue
        s = schema_of(crate, path)
        todo.extend(refs(s))
        defs[schema_name(path)] = s
    text = json.dumps(defs, sort_keys=True)
    text = re.sub(r'"crate::([\w:]+)"', lambda m: json.dumps(schema_name("crate::" + m.group(1))), text)
    out = {
        "kubernetes": "1.37",
        "source": "k8s-openapi 0.29.0 (feature v1_37), generated from the OpenAPI document of "
                  "Kubernetes 1.37; descriptions left out",
        "root": schema_name(ROOT),
        "definitions": json.loads(text),
    }
    dest = pathlib.Path(__file__).with_name("resource.k8s.io-v1.json")
    dest.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{dest}: {len(defs)} types")


main(sys.argv[1])
