#!/usr/bin/env python3
"""Generates crates/client/src/entry_points_generated.rs from the CUDA toolkit headers.

cudaTypedefs.h names every driver entry point with the CUDA version it appeared
in (`PFN_cuMemAlloc_v3020`, `PFN_cuMemcpyHtoD_v7000_ptds`); cuda.h declares the
exported symbols (`cuMemAlloc`, `cuMemAlloc_v2`, `cuMemcpyHtoD_v2_ptds`). This
script pairs the two, and emits stubs for every symbol the client does not
implement (found by scanning src/exports/*.rs for `extern "C" fn cu…`).

usage: python3 crates/client/gen/entry_points.py [CUDA_INCLUDE_DIR ...]

With no argument it reads the toolkits `scripts/setup-nvcc` installs: CUDA
13.0 (.venv) and the CUDA 13.5 runtime's headers (.venv/cuda135), and takes
their union, so every (name, version) either runtime asks for is answered;
error texts come from the last (newest) directory.
"""
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(CRATE))
DEFAULT_INCS = [
    os.path.join(ROOT, ".venv/lib/python3.11/site-packages/nvidia/cu13/include"),
    os.path.join(ROOT, ".venv/cuda135/nvidia/cu13/include"),
]


def declared_symbols(inc):
    """Every `CUresult cuXxx(` cuda.h declares, in internal, default and ptds modes."""
    syms = set()
    with tempfile.NamedTemporaryFile("w", suffix=".c", delete=False) as f:
        f.write("#include <cuda.h>\n")
        src = f.name
    try:
        for defs in (["-D__CUDA_API_VERSION_INTERNAL"], [], ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"]):
            out = subprocess.run(["gcc", "-E", *defs, "-I", inc, src], check=True,
                                 capture_output=True, text=True).stdout
            out = " ".join(out.split())
            syms |= set(re.findall(r"CUresult (?:CUDAAPI )?(cu\w+) ?\(", out))
    finally:
        os.unlink(src)
    # The interop headers need GL/EGL/VDPAU headers to preprocess; read their
    # declarations (all modes at once) straight from the text.
    for header in ("cudaGL.h", "cudaEGL.h", "cudaVDPAU.h", "cudaProfiler.h"):
        path = os.path.join(inc, header)
        if os.path.exists(path):
            text = " ".join(open(path).read().split())
            syms |= set(re.findall(r"CUresult CUDAAPI (cu\w+) ?\(", text))
    return syms


def typedef_versions(inc):
    text = ""
    for header in ("cudaTypedefs.h", "cudaGLTypedefs.h", "cudaEGLTypedefs.h",
                   "cudaVDPAUTypedefs.h", "cudaProfilerTypedefs.h"):
        path = os.path.join(inc, header)
        if os.path.exists(path):
            text += open(path).read()
    plain = defaultdict(set)
    ptds = defaultdict(dict)  # base -> version -> suffix
    for base, ver, suffix in re.findall(r"\*PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)", text):
        if suffix:
            ptds[base][int(ver)] = suffix
        else:
            plain[base].add(int(ver))
    return plain, ptds


def error_codes(inc):
    """(code, name, first sentence of its doc comment) for every CUresult."""
    text = open(os.path.join(inc, "cuda.h")).read()
    body = text[text.index("typedef enum cudaError_enum"):]
    body = body[: body.index("} CUresult;")]
    out = []
    for doc, name, code in re.findall(r"/\*\*(.*?)\*/\s*(CUDA_\w+)\s*=\s*(\d+)", body, re.S):
        words = " ".join(w.strip("* ") for w in doc.split("\n"))
        words = " ".join(words.replace("::", "").split())
        sentence = words.split(". ")[0].rstrip(".")
        sentence = sentence.replace("\\deprecated ", "Deprecated: ").replace("\\", "")
        out.append((int(code), name, sentence.replace('"', "'")))
    return out


def implemented_symbols():
    impl = set()
    d = os.path.join(CRATE, "src", "exports")
    for name in sorted(os.listdir(d)):
        if name.endswith(".rs") and name != "stubs_generated.rs":
            text = open(os.path.join(d, name)).read()
            # `fn cuFoo | cuFoo_ptds (` inside `driver_fn!` blocks, or plain
            # `extern "C" fn cuFoo(`.
            for names in re.findall(r"\bfn ((?:cu\w+)(?:\s*\|\s*cu\w+)*)\s*\(", text):
                impl |= {n.strip() for n in names.split("|")}
    return impl


def main():
    incs = sys.argv[1:] or DEFAULT_INCS
    for d in incs:
        if not os.path.exists(os.path.join(d, "cudaTypedefs.h")):
            sys.exit(f"{d} has no cudaTypedefs.h: run scripts/setup-nvcc")
    inc = incs[-1]
    syms = set()
    plain, ptds = defaultdict(set), defaultdict(dict)
    for d in incs:
        syms |= declared_symbols(d)
        p, t = typedef_versions(d)
        for base, versions in p.items():
            plain[base] |= versions
        for base, forms in t.items():
            ptds[base].update(forms)
    rows = []  # (base, version, per_thread, symbol)
    for base in sorted(plain):
        versions = sorted(plain[base])
        cands = [base] + [f"{base}_v{i}" for i in range(2, 10) if f"{base}_v{i}" in syms]
        if base not in syms:
            cands = cands[1:]
        if not cands:
            # Declared in a header this toolkit does not ship (cudaProfiler.h):
            # the base name is the symbol.
            cands = [base]
            syms.add(base)
        if len(cands) < len(versions):
            # More typedef versions than symbols: the newest versions take the
            # newest symbols, the oldest ones share the first symbol.
            cands = [cands[0]] * (len(versions) - len(cands)) + cands
        elif len(cands) > len(versions):
            cands = cands[len(cands) - len(versions):]
        by_version = dict(zip(versions, cands))
        for v in versions:
            rows.append((base, v, False, by_version[v]))
        for v, suffix in sorted(ptds.get(base, {}).items()):
            older = [pv for pv in versions if pv <= v]
            sym = by_version[max(older)] if older else cands[-1]
            rows.append((base, v, True, sym + suffix))
    for base in ptds:
        if base not in plain:
            for v, suffix in sorted(ptds[base].items()):
                rows.append((base, v, True, base + suffix))
    # The interop headers declare some per-thread forms only through macros;
    # those symbols are exported (as stubs) all the same.
    missing = sorted({r[3] for r in rows} - syms)
    for m in missing:
        if not m.startswith(("cuGL", "cuEGL", "cuVDPAU", "cuGraphicsGL", "cuGraphicsEGL")):
            print(f"warning: {m} is not declared by the toolkit headers", file=sys.stderr)
    all_syms = sorted(syms | {r[3] for r in rows})
    impl = implemented_symbols()
    stubs = [s for s in all_syms if s not in impl]
    out = []
    out.append("// @generated by crates/client/gen/entry_points.py from the CUDA toolkit's")
    out.append("// cudaTypedefs.h and cuda.h (13.0 and the 13.5 runtime's, united).")
    out.append("// Do not edit by hand; rerun the script.")
    out.append("")
    out.append("use super::EntryPoint;")
    out.append("")
    out.append("/// Every (name, version, per-thread) the driver answers, sorted by name then version.")
    out.append("pub static ENTRY_POINTS: &[EntryPoint] = &[")
    for base, v, pt, sym in sorted(rows, key=lambda r: (r[0], r[2], r[1])):
        out.append(f'    EntryPoint {{ name: "{base}", version: {v}, per_thread: {str(pt).lower()}, symbol: "{sym}" }},')
    out.append("];")
    out.append("")
    out.append("/// Every CUresult: code, name, description (from cuda.h's comments).")
    out.append("pub static ERRORS: &[(u32, &std::ffi::CStr, &std::ffi::CStr)] = &[")
    for code, name, desc in error_codes(inc):
        out.append(f'    ({code}, c"{name}", c"{desc}"),')
    out.append("];")
    out.append("")
    out.append("/// The address of an exported driver symbol, implemented or stubbed.")
    out.append("pub fn symbol_address(symbol: &str) -> Option<*const std::ffi::c_void> {")
    out.append("    use crate::exports::*;")
    out.append("    let f: *const std::ffi::c_void = match symbol {")
    for s in all_syms:
        out.append(f'        "{s}" => {s} as *const std::ffi::c_void,')
    out.append("        _ => return None,")
    out.append("    };")
    out.append("    Some(f)")
    out.append("}")
    out.append("")
    out.append("crate::not_implemented_stubs! {")
    for s in stubs:
        out.append(f"    {s},")
    out.append("}")
    path = os.path.join(CRATE, "src", "exports", "stubs_generated.rs")
    # Generated table lives beside the entry-point module; stubs are exports.
    table_path = os.path.join(CRATE, "src", "entry_points_generated.rs")
    table = "\n".join(out[: out.index("crate::not_implemented_stubs! {")]) + "\n"
    stub_text = ("// @generated by crates/client/gen/entry_points.py. Do not edit by hand.\n"
                 "// One exported stub per driver symbol cumux does not implement.\n\n"
                 + "\n".join(out[out.index("crate::not_implemented_stubs! {"):]) + "\n")
    open(table_path, "w").write(table)
    open(path, "w").write(stub_text)
    # Committed in `cargo fmt` form, so regenerating changes nothing.
    subprocess.run(["rustfmt", "--edition", "2021", table_path, path], check=False)
    print(f"{len(rows)} entry points, {len(all_syms)} symbols, {len(stubs)} stubs", file=sys.stderr)


if __name__ == "__main__":
    main()
