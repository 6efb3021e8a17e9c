#!/usr/bin/env python3
"""Write abi/src/pfn.rs: one `unsafe extern "C" fn` pointer type per CUDA driver and NVML
entry point, read from NVIDIA's headers.

    python3 abi/gen/pfn.py --cuda-include DIR --nvml-include DIR [--tsv FILE] [--out FILE]

DIR holds cuda.h and cudaTypedefs.h (the `nvidia-cuda-runtime-cu12` wheel's
nvidia/cuda_runtime/include) and nvml.h (`nvidia-nvml-dev-cu12`'s nvidia/nvml_dev/include).
Python 3 standard library only; see abi/gen/README.md.

Driver signatures come from cudaTypedefs.h's (and cudaProfilerTypedefs.h's) `PFN_<base>_v<version>[_ptsz|_ptds]` typedefs
(the legacy ones under __CUDA_API_VERSION_INTERNAL included), NVML's from nvml.h's prototypes.
Each type is named after the symbol the library exports (`cuMemAlloc_v2`, `cuMemcpy_ptds`,
`nvmlInit_v2`): a base name's versions, oldest first, are exported as `base`, `base_v2`,
`base_v3`...; per-thread variants take the suffix of the newest default versions, counted from
the newest. The rule is checked against cuda.h's own `#define base base_vN` lines, and with
--tsv against a real driver's cuGetProcAddress table (shared/reference/driver-535-proc-address.tsv).

C types map exactly: size_t -> usize, unsigned int -> c_uint, unsigned long long -> u64, and so
on; a name the abi crate defines (abi/src/types.rs, abi/src/result.rs) is used by that name; an
opaque handle the crate does not define is `*mut c_void`, an enum it does not define is `c_uint`
(`c_int` when it has a negative enumerator), a callback type is spelled out as
`Option<unsafe extern "C" fn(..)>`, and a pointer to a struct the crate does not define points
to `c_void` (the pointer's width and constness are still checked, the pointee is not). An entry
point that takes such a struct by value is left out and listed in the generated header.
"""

import argparse
import os
import re
import sys
from collections import defaultdict

PRIMITIVES = {
    "void": "()",
    "char": "c_char",
    "signed char": "i8",
    "unsigned char": "u8",
    "short": "c_short",
    "unsigned short": "u16",
    "int": "c_int",
    "signed int": "c_int",
    "unsigned int": "c_uint",
    "unsigned": "c_uint",
    "long": "c_long",
    "unsigned long": "c_ulong",
    "long long": "i64",
    "unsigned long long": "u64",
    "float": "f32",
    "double": "f64",
    "size_t": "usize",
    "uint8_t": "u8",
    "uint16_t": "u16",
    "uint32_t": "u32",
    "uint64_t": "u64",
    "int32_t": "i32",
    "int64_t": "i64",
    "cuuint32_t": "u32",
    "cuuint64_t": "u64",
}

# Names whose C typedef differs between platforms: the LP64 (Linux x86_64/aarch64) meaning.
PLATFORM = {"CUdeviceptr_v2": "unsigned long long"}

# Struct typedefs cuda.h builds with a token-pasting macro the parser does not expand:
# `typedef _CONCAT_OUTER(CUdevResource_v, RESOURCE_ABI_VERSION) CUdevResource;`.
MACRO_STRUCTS = {"CUdevResource": "CUdevResource_st"}

# C status types and the abi crate's names for them.
RENAMED = {"nvmlReturn_t": "NvmlReturn"}

RUST_KEYWORDS = {
    "as", "async", "await", "box", "break", "const", "continue", "crate", "dyn", "else", "enum",
    "extern", "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move",
    "mut", "priv", "pub", "ref", "return", "self", "static", "struct", "super", "trait", "true",
    "type", "unsafe", "use", "where", "while", "yield", "macro", "abstract", "final", "override",
    "typeof", "unsized", "virtual", "become", "do", "try",
}


def strip(text):
    """Source without comments, preprocessor lines and `extern "C" {`."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    out, cont = [], False
    for line in text.split("\n"):
        s = line.strip()
        if cont or s.startswith("#"):
            cont = s.endswith("\\")
            continue
        out.append(line)
    text = "\n".join(out)
    return text.replace('extern "C" {', " ")


def statements(text):
    """Top-level `;`-terminated statements (braces nest)."""
    depth, cur, out = 0, [], []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(0, depth - 1)
        if ch == ";" and depth == 0:
            out.append(" ".join("".join(cur).split()))
            cur = []
        else:
            cur.append(ch)
    return out


class Types:
    """What the headers say each type name is."""

    def __init__(self):
        self.alias = {}  # name -> C type text (`unsigned int`, `CUdeviceptr_v2`, `struct X_st`)
        self.handle = set()  # pointer-to-opaque-struct names
        self.struct_tag = {}  # typedef name -> struct/union tag (or the name, for untagged ones)
        self.enum_signed = {}  # enum typedef name -> has a negative enumerator
        self.callback = {}  # name -> (return C type, [param text])

    def read(self, text):
        for st in statements(strip(text)):
            if not st.startswith("typedef "):
                continue
            body = st[len("typedef "):].strip()
            m = re.match(r"(struct|union|enum)\s*(\w*)\s*\{(.*)\}\s*(.*)$", body, re.S)
            if m:
                kind, tag, inner, names = m.groups()
                for n in [x.strip() for x in names.split(",") if x.strip()]:
                    ptr = n.startswith("*")
                    n = n.lstrip("*").strip()
                    if ptr:
                        self.alias.setdefault(n, None)  # pointer-to-struct typedef: not used by value
                        continue
                    if kind == "enum":
                        self.enum_signed.setdefault(n, bool(re.search(r"=\s*-\s*\d", inner)))
                    else:
                        self.struct_tag.setdefault(n, tag or n)
                continue
            m = re.match(r"(?:struct|union)\s+(\w+)\s*\*\s*(\w+)$", body)
            if m:
                self.handle.add(m.group(2))
                continue
            m = re.match(r"(?:struct|union)\s+(\w+)\s+(\w+)$", body)
            if m:
                self.struct_tag.setdefault(m.group(2), m.group(1))
                continue
            m = re.match(r"enum\s+(\w+)\s+(\w+)$", body)
            if m:
                self.alias.setdefault(m.group(2), "enum " + m.group(1))
                continue
            m = re.match(r"(.+?)\(\s*(?:\w+\s+)?\*\s*(\w+)\s*\)\s*\((.*)\)$", body)
            if m:
                ret, name, params = m.groups()
                self.callback.setdefault(name, (ret.strip(), split_params(params)))
                continue
            m = re.match(r"(.+?)\s*\b(\w+)$", body)
            if m and "(" not in body:
                self.alias.setdefault(m.group(2), m.group(1).strip())


def split_params(text):
    text = text.strip()
    if text in ("", "void"):
        return []
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return out


class Unmappable(Exception):
    pass


class Mapper:
    def __init__(self, types, abi_names):
        self.t = types
        self.abi = abi_names
        # reverse aliases: name -> names that are typedefs of it
        self.aliased_by = defaultdict(list)
        for n, target in types.alias.items():
            if target and re.fullmatch(r"\w+", target):
                self.aliased_by[target].append(n)
        self.void_structs = set()  # structs seen behind pointers only (reported)

    def family(self, name):
        """`name`, what it is a typedef of, and what is a typedef of it, nearest first."""
        seen, order, todo = set(), [], [name]
        while todo:
            n = todo.pop(0)
            if n in seen:
                continue
            seen.add(n)
            order.append(n)
            target = PLATFORM.get(n, self.t.alias.get(n))
            if target and re.fullmatch(r"\w+", target) and target not in PRIMITIVES:
                todo.append(target)
            todo.extend(self.aliased_by.get(n, []))
        return order

    def base(self, words, behind_pointer):
        """Rust type for a C type name without pointers (`unsigned int`, `CUstream`)."""
        text = " ".join(words)
        text = re.sub(r"^(struct|union|enum) ", "", text)
        if text in RENAMED:
            return RENAMED[text]
        if text in self.abi:
            return text
        if text in PRIMITIVES:
            return PRIMITIVES[text]
        if not re.fullmatch(r"\w+", text):
            raise Unmappable(f"type `{text}`")
        fam = self.family(text)
        for n in fam:
            if n in self.abi:
                return n
        # structs are identified by tag: a typedef of the same tag the crate defines
        tags = {self.t.struct_tag[n] for n in fam if n in self.t.struct_tag}
        if tags:
            for n, tag in self.t.struct_tag.items():
                if tag in tags and n in self.abi:
                    return n
        for n in fam:
            if n in self.t.handle:
                return "*mut c_void"
            if n in self.t.enum_signed:
                return "c_int" if self.t.enum_signed[n] else "c_uint"
            if n in self.t.callback:
                ret, params = self.t.callback[n]
                return "Option<unsafe extern \"C\" fn(" + ", ".join(
                    self.param(p)[1] for p in params) + ")" + self.ret(ret) + ">"
            target = PLATFORM.get(n, self.t.alias.get(n))
            if target and target.startswith("enum "):
                return "c_uint"
            if target and target in PRIMITIVES:
                return PRIMITIVES[target]
        if tags or any(n in self.t.alias and self.t.alias[n] is None for n in fam):
            if behind_pointer:
                self.void_structs.add(text)
                return "c_void"
            raise Unmappable(f"struct `{text}` by value (the abi crate does not define it)")
        if text in self.t.struct_tag.values():
            if behind_pointer:
                self.void_structs.add(text)
                return "c_void"
        raise Unmappable(f"unknown type `{text}`")

    def ctype(self, text):
        """Rust type of a C type written without a parameter name."""
        toks = re.findall(r"\w+|\*|\[|\]", text)
        words, stars, base_const = [], [], False
        for t in toks:
            if t == "const":
                if stars:
                    stars[-1] = True
                else:
                    base_const = True
            elif t == "*":
                stars.append(False)
            elif t in ("[", "]"):
                raise Unmappable(f"array parameter `{text}`")
            elif t in ("CUDAAPI", "CUDA_CB", "DECLDIR", "volatile"):
                continue
            else:
                if stars:
                    raise Unmappable(f"`{text}`")
                words.append(t)
        ty = self.base(words, behind_pointer=bool(stars))
        if ty == "()" and stars:
            ty = "c_void"
        const = base_const
        for star_const in stars:
            ty = ("*const " if const else "*mut ") + ty
            const = star_const
        return ty

    def param(self, text):
        """(name, Rust type) of one C parameter; name is None when the C text has none."""
        m = re.match(r"(.*?[\s\*])(\w+)\s*$", text)
        name = None
        if m:
            words = re.findall(r"\w+", m.group(1))
            candidate = m.group(2)
            type_words = [w for w in words if w not in ("const", "struct", "enum", "union")]
            if type_words and candidate not in PRIMITIVES and candidate not in (
                "int", "char", "long", "short", "unsigned", "float", "double", "const"
            ):
                name, text = candidate, m.group(1)
        ty = self.ctype(text)
        if name is not None:
            if name in RUST_KEYWORDS:
                name = name + "_"
        return name, ty

    def ret(self, text):
        ty = self.ctype(text)
        return "" if ty == "()" else " -> " + ty


def abi_names(abi_src):
    """Type names the abi crate defines (type aliases, structs, unions, opaque handles)."""
    names = set()
    for f in ("types.rs", "result.rs"):
        src = open(os.path.join(abi_src, f)).read()
        names.update(re.findall(r"pub\s+(?:type|struct|union)\s+(\w+)", src))
        m = re.search(r"opaque_handles!\((.*?)\)", src, re.S)
        if m:
            names.update(re.findall(r"\w+", m.group(1)))
    return names


def pfn_typedefs(text):
    """(base, version, variant, return, [params]) of every PFN_ typedef."""
    out = []
    for m in re.finditer(
        r"typedef\s+(\w+)\s*\(\s*CUDAAPI\s*\*\s*PFN_(\w+?)_v(\d+)(_ptsz|_ptds)?\s*\)\s*\((.*?)\)\s*;",
        strip(text), re.S,
    ):
        ret, base, ver, variant, params = m.groups()
        out.append((base, int(ver), variant or "", ret, split_params(" ".join(params.split()))))
    return out


def export_names(pfns):
    """{(base, version, variant): exported symbol} by the ordinal rule (see the module doc)."""
    by_base = defaultdict(lambda: defaultdict(list))
    for base, ver, variant, _, _ in pfns:
        by_base[base][variant].append(ver)
    names = {}
    for base, variants in by_base.items():
        default = sorted(set(variants.get("", [])))
        plain = [base if i == 0 else f"{base}_v{i + 1}" for i in range(len(default))]
        for ver, name in zip(default, plain):
            names[(base, ver, "")] = name
        for variant in ("_ptsz", "_ptds"):
            pts = sorted(set(variants.get(variant, [])))
            if not pts:
                continue
            if len(pts) > len(plain):
                sys.exit(f"{base}{variant}: more per-thread versions than default ones")
            for ver, name in zip(reversed(pts), reversed(plain)):
                names[(base, ver, variant)] = name + variant
    return names


def check_against_cuda_h(cuda_h, names):
    """Every `#define cuX cuX_suffix` in cuda.h (PTDS/PTSZ wrappers included) must name an
    export the rule names for that base: the default cuda.h picks is not always the newest
    version (cuCtxCreate is cuCtxCreate_v2), so this checks membership, not order."""
    by_base = defaultdict(set)
    for (base, _ver, _variant), name in names.items():
        by_base[base].add(name)
    bad = []
    for m in re.finditer(r"^\s*#define\s+(cu\w+)\s+(?:__CUDA_API_PT[DS][SZ]\()?(cu\w+?)\)?\s*$",
                         cuda_h, re.M):
        base, target = m.groups()
        if base in by_base and target.startswith(base) and target not in (base, *by_base.keys()):
            if target not in by_base[base]:
                bad.append(f"{base}: cuda.h names {target}, the rule does not")
    return bad


def check_against_tsv(tsv, names):
    """A real driver's cuGetProcAddress table: from each row's min_version on, `base` resolves
    to that row's symbol; where that version is a PFN_ version, the rule must name the same."""
    bad, checked = [], [0]
    for line in open(tsv):
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 4 or parts[3] == "-":
            continue
        base, flags, minver, sym = parts
        variant = ""
        if flags == "2" and sym.endswith(("_ptsz", "_ptds")):
            variant = sym[-5:]
        ours = names.get((base, int(minver), variant))
        checked[0] += ours is not None
        if ours is not None and ours != sym:
            bad.append(f"{base} v{minver} flags {flags}: the driver returns {sym}, the rule says {ours}")
    if checked[0] < 1000:
        bad.append(f"only {checked[0]} rows of {tsv} matched a PFN_ version: wrong file?")
    print(f"{tsv}: {checked[0]} rows agree with the naming rule", file=sys.stderr)
    return sorted(set(bad))


def nvml_prototypes(text):
    out = []
    for st in statements(strip(text)):
        m = re.match(r"(.*?)\bDECLDIR\b(.*?)\b(nvml\w+)\s*\((.*)\)$", st)
        if m:
            ret1, ret2, name, params = m.groups()
            out.append((name, (ret1 + " " + ret2).strip(), split_params(params)))
    return out


def enumerators(text, name):
    """{enumerator: value} of the C enum typedef'd as `name`."""
    for st in statements(strip(text)):
        m = re.match(r"typedef enum\s*\w*\s*\{(.*)\}\s*" + name + r"$", st, re.S)
        if m:
            out = {}
            for e in m.group(1).split(","):
                mm = re.match(r"\s*(\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*$", e)
                if mm:
                    out[mm.group(1)] = int(mm.group(2), 0)
            return out
    sys.exit(f"no enum {name} in the header")


def check_results(result_rs, cuda_h, nvml_h):
    """abi/src/result.rs's status lists must be exactly the headers' CUresult and nvmlReturn_t."""
    ours = {n: int(v) for n, v in re.findall(r"^\s+((?:CUDA|NVML)_\w+) = (\d+),$",
                                             open(result_rs).read(), re.M)}
    theirs = enumerators(cuda_h, "CUresult")
    theirs.update(enumerators(nvml_h, "nvmlReturn_t"))
    bad = [f"{n} = {v} in the header, {ours.get(n)} in result.rs"
           for n, v in sorted(theirs.items()) if ours.get(n) != v]
    bad += [f"{n} is in result.rs, not in the header" for n in sorted(set(ours) - set(theirs))]
    return bad


def version_of(path, pattern):
    m = re.search(pattern, open(path).read(), re.M)
    return m.group(1) if m else "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda-include", required=True)
    ap.add_argument("--nvml-include", required=True)
    ap.add_argument("--tsv", help="a real driver's cuGetProcAddress table, to check the names")
    ap.add_argument("--cuda13-include", help="CUDA 13's cuda.h and cudaTypedefs.h: adds the "
                    "entry points 13.x has and the main headers lack (cuCtxSynchronize_v2)")
    ap.add_argument("--cuda-wheel", default="", help="wheel name and version, for the header")
    ap.add_argument("--nvml-wheel", default="", help="wheel name and version, for the header")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "src", "pfn.rs")))
    a = ap.parse_args()

    cuda_h_path = os.path.join(a.cuda_include, "cuda.h")
    typedefs_path = os.path.join(a.cuda_include, "cudaTypedefs.h")
    nvml_h_path = os.path.join(a.nvml_include, "nvml.h")
    cuda_h = open(cuda_h_path).read()
    nvml_h = open(nvml_h_path).read()

    types = Types()
    cuda13_h = open(os.path.join(a.cuda13_include, "cuda.h")).read() if a.cuda13_include else ""
    types.read(cuda13_h)  # first, so the main headers' definitions win
    types.read(cuda_h)
    profiler_h = os.path.join(a.cuda_include, "cudaProfiler.h")  # not in every wheel
    if os.path.exists(profiler_h):
        types.read(open(profiler_h).read())
    types.read(nvml_h)
    types.struct_tag.update(MACRO_STRUCTS)
    mapper = Mapper(types, abi_names(os.path.join(here, "..", "src")))

    pfns = pfn_typedefs(open(typedefs_path).read())
    pfns += pfn_typedefs(open(os.path.join(a.cuda_include, "cudaProfilerTypedefs.h")).read())
    names = export_names(pfns)
    problems = check_against_cuda_h(cuda_h, names)
    if a.tsv:
        problems += check_against_tsv(a.tsv, names)
    if problems:
        sys.exit("export names disagree:\n  " + "\n  ".join(problems))
    problems = check_results(os.path.join(here, "..", "src", "result.rs"), cuda_h, nvml_h)
    if problems:
        sys.exit("abi/src/result.rs disagrees with the headers:\n  " + "\n  ".join(problems))

    items, skipped = {}, []

    def add(sym, source, ret, params):
        try:
            args = []
            for i, p in enumerate(params):
                n, ty = mapper.param(p)
                args.append((n or f"arg{i}", ty))
            ret_ty = mapper.ctype(ret)
            line = "unsafe extern \"C\" fn(" + ", ".join(f"{n}: {t}" for n, t in args) + ")"
            line += mapper.ret(ret)
        except Unmappable as e:
            skipped.append(f"{sym} ({source}): {e}")
            return
        if sym in items and items[sym][1] != line:
            sys.exit(f"{sym}: two signatures ({items[sym][0]}, {source})")
        items.setdefault(sym, (source, line, args, ret_ty))

    for base, ver, variant, ret, params in pfns:
        add(names[(base, ver, variant)], f"PFN_{base}_v{ver}{variant}", ret, params)
    # cudaTypedefs.h omits a few typedefs (it #defines PFN_cuLibraryGetKernelCount but never
    # declares it): take those from cuda.h's prototype. Only names cuda.h does not #define to
    # another symbol, so a prototype's name is the symbol it declares.
    renamed = set(re.findall(r"^\s*#define\s+(cu\w+)\s+\S", cuda_h, re.M))
    for st in statements(strip(cuda_h)):
        m = re.match(r"CUresult\s+CUDAAPI\s+(cu\w+)\s*\((.*)\)$", st)
        if m and m.group(1) not in items and m.group(1) not in renamed:
            add(m.group(1), "cuda.h: no PFN_ typedef", "CUresult", split_params(m.group(2)))
    for name, ret, params in nvml_prototypes(nvml_h):
        add(name, "nvml.h", ret, params)
    if a.cuda13_include:
        # Only symbols the main headers lack: their signatures stay the main headers'.
        pfns13 = pfn_typedefs(open(os.path.join(a.cuda13_include, "cudaTypedefs.h")).read())
        names13 = export_names(pfns13)
        have = set(items)
        for base, ver, variant, ret, params in pfns13:
            sym = names13[(base, ver, variant)]
            if sym not in have:
                add(sym, f"PFN_{base}_v{ver}{variant} (CUDA 13)", ret, params)
        cuda13_version = version_of(os.path.join(a.cuda13_include, "cuda.h"),
                                    r"^#define CUDA_VERSION (\d+)")

    cuda_version = version_of(cuda_h_path, r"^#define CUDA_VERSION (\d+)")
    nvml_version = version_of(nvml_h_path, r"^#define NVML_API_VERSION\s+(\d+)")
    ncuda = sum(1 for s in items if s.startswith("cu"))
    nnvml = len(items) - ncuda
    out = []
    w = out.append
    w("// @generated by abi/gen/pfn.py: do not edit; see abi/gen/README.md to regenerate.")
    w("//")
    w(f"// Sources: cuda.h, cudaTypedefs.h and cudaProfilerTypedefs.h with CUDA_VERSION {cuda_version}"
      + (f" ({a.cuda_wheel})" if a.cuda_wheel else "") + ",")
    w(f"// nvml.h with NVML_API_VERSION {nvml_version}"
      + (f" ({a.nvml_wheel})" if a.nvml_wheel else "") + ".")
    if a.cuda13_include:
        w(f"// Entry points those lack, from cudaTypedefs.h with CUDA_VERSION {cuda13_version}.")
    w(f"// {ncuda} driver and {nnvml} NVML entry points.")
    if skipped:
        w("//")
        w("// Left out (a parameter type the generator cannot map):")
        for s in sorted(skipped):
            w(f"//   {s}")
    if mapper.void_structs:
        w("//")
        w("// Pointers to these structs are pointers to c_void here (the abi crate does not")
        w("// define them):")
        line = "//  "
        for s in sorted(mapper.void_structs):
            if len(line) + len(s) + 1 > 100:
                w(line)
                line = "//  "
            line += " " + s
        w(line)
    w("")
    w("//! One function pointer type per CUDA driver and NVML entry point, named after the symbol")
    w("//! the library exports, with the exact C signature of NVIDIA's headers.")
    w("//!")
    w("//! Every table in gpuslice that declares or defines one of these functions is checked")
    w("//! against this module at compile time, so a signature that disagrees with the header")
    w("//! does not build:")
    w("//!")
    w("//! ```compile_fail,E0308")
    w("//! use core::ffi::c_uint;")
    w("//! use gpuslice_abi::{pfn, CUdeviceptr, CUresult};")
    w("//! // cuMemAlloc_v2 takes the size as size_t, not unsigned int:")
    w("//! unsafe extern \"C\" fn alloc(_p: *mut CUdeviceptr, _n: c_uint) -> CUresult { 0 }")
    w("//! const _: pfn::cuMemAlloc_v2 = alloc;")
    w("//! ```")
    w("//!")
    w("//! and the same function with the header's types does:")
    w("//!")
    w("//! ```")
    w("//! use gpuslice_abi::{pfn, CUdeviceptr, CUresult};")
    w("//! unsafe extern \"C\" fn alloc(_p: *mut CUdeviceptr, _n: usize) -> CUresult { 0 }")
    w("//! const _: pfn::cuMemAlloc_v2 = alloc;")
    w("//! ```")
    w("")
    w("#![allow(non_camel_case_types, non_snake_case)]")
    w("")
    w("use crate::*;")
    w("#[allow(unused_imports)]")
    w("use core::ffi::{c_char, c_int, c_long, c_short, c_uint, c_ulong, c_void};")
    w("")
    order = sorted(items, key=lambda s: (not s.startswith("cu"), s))
    for sym in order:
        source, line, _, _ = items[sym]
        w(f"/// `{source}`")
        w(f"pub type {sym} = {line};")

    def qualify(ty):
        ty = re.sub(r"\b(c_void|c_char|c_int|c_uint|c_long|c_ulong|c_short)\b", r"::core::ffi::\1", ty)
        return re.sub(r"(?<![:\w])([A-Za-z_]\w*)\b",
                      lambda m: "$crate::" + m.group(1) if m.group(1) in mapper.abi else m.group(1), ty)

    w("")
    w("/// The C signature of a driver or NVML entry point, as tokens, for a table that needs the")
    w("/// parameter names too (an exported wrapper) and so cannot use the [`pfn`](crate::pfn) type.")
    w("///")
    w("/// `signature!(cuMemAlloc_v2 => m!(a b))` expands to")
    w("/// `m!(a b (dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult)`, every type path absolute:")
    w("///")
    w("/// ```")
    w("/// macro_rules! define {")
    w("///     ($name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty) => {")
    w("///         unsafe extern \"C\" fn $name($($arg: $ty),*) -> $ret { 0 }")
    w("///     };")
    w("/// }")
    w("/// gpuslice_abi::signature!(cuMemAlloc_v2 => define!(alloc));")
    w("/// const _: gpuslice_abi::pfn::cuMemAlloc_v2 = alloc;")
    w("/// ```")
    w("#[macro_export]")
    w("macro_rules! signature {")
    for sym in order:
        _, _, args, ret_ty = items[sym]
        params = ", ".join(f"{n}: {qualify(t)}" for n, t in args)
        ret = "" if ret_ty == "()" else f" -> {qualify(ret_ty)}"
        w(f"    ({sym} => $m:ident!($($pass:tt)*)) => {{ $m!{{$($pass)* ({params}){ret}}} }};")
    w("}")
    open(a.out, "w").write("\n".join(out) + "\n")
    print(f"wrote {a.out}: {ncuda} driver, {nnvml} NVML entry points, {len(skipped)} left out")


if __name__ == "__main__":
    main()
