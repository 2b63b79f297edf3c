#!/usr/bin/env python3
"""stub_libs.py — stand-ins for shared libraries that a carried binary's closure names but never calls.

Used by scripts/gpu-check.sh pack only (never by the product): Debian's libopencv_imgcodecs links GDAL,
GDCM (DICOM) and OpenEXR, whose own closures (PROJ, GEOS, HDF5, Poppler, ICU data, ...) are ~150 MB and
too large to carry to the GPU machine. vigil reads images with cv::imread's built-in JPEG/PNG/BMP/TIFF/WebP
codecs, and OpenCV reaches GDAL only with IMREAD_LOAD_GDAL, DICOM and EXR only for such files, so each of
these libraries is replaced by a stub with the same SONAME that defines exactly the symbols the consumer
imports from it (imgcodecs is linked with BIND_NOW, so all of them must resolve at load time): functions
that print the symbol's name and abort if they are ever called, and zero-filled data objects of the real
size. A stubbed call therefore fails loudly, never silently. The few functions the consumer calls at
start-up whatever it reads (GDALAllRegister, from OpenCV's codec registry) are named with --return-zero.

    stub_libs.py --consumer /lib/x86_64-linux-gnu/libopencv_imgcodecs.so.406 --out DIR \
        --return-zero GDALAllRegister /lib/x86_64-linux-gnu/libgdal.so.32 ...

Needs binutils (nm, readelf) and gcc.
"""
import argparse
import pathlib
import re
import subprocess
import sys


def nm(path, *flags):
    out = subprocess.run(["nm", "-D", *flags, path], check=True, capture_output=True, text=True).stdout
    return out.splitlines()


def soname(path):
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[(.+)\]", out)
    if not m:
        sys.exit(f"stub_libs: {path} has no SONAME")
    return m.group(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--consumer", required=True, help="the library whose imports the stubs satisfy")
    ap.add_argument("--out", required=True, help="directory for the stub libraries")
    ap.add_argument("--return-zero", default="", help="comma-separated functions that return 0 instead of "
                    "aborting (registration calls the consumer makes at start-up, e.g. GDALAllRegister)")
    ap.add_argument("libs", nargs="+", help="the real libraries to stand in for")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    zero = set(filter(None, args.return_zero.split(",")))
    imports = {line.split()[-1] for line in nm(args.consumer, "--undefined-only")}
    for lib in args.libs:
        name = soname(lib)
        # vigil_stub_abort(name in %rsi): fprintf(stderr, fmt, name); abort(). Entered by jmp from a stub, so
        # the stack is as at a function's entry; 8 bytes re-align it to 16 for the calls.
        asm = [".text", "vigil_stub_abort:", "  sub $8, %rsp", "  mov %rsi, %rdx",
               "  mov stderr@GOTPCREL(%rip), %rax", "  mov (%rax), %rdi", "  lea .Lfmt(%rip), %rsi",
               "  xor %eax, %eax", "  call fprintf@PLT", "  call abort@PLT",
               ".section .rodata", f'.Lfmt: .asciz "stub of {name}: %s called (tools/gpu/stub_libs.py)\\n"']
        count = 0
        # Lines: "VALUE SIZE TYPE NAME" (with -S); defined symbols only.
        for line in nm(lib, "--defined-only", "-S"):
            parts = line.split()
            if len(parts) != 4 or parts[3] not in imports:
                continue
            _, size, kind, sym = parts
            count += 1
            if kind in "TtWiI" and sym in zero:
                asm += [".text", f".globl {sym}", f".type {sym},@function", f"{sym}:", "  xor %eax, %eax", "  ret"]
            elif kind in "TtWiI":
                asm += [".text", f".globl {sym}", f".type {sym},@function", f"{sym}:",
                        f"  lea .Ls{count}(%rip), %rsi", "  jmp vigil_stub_abort",
                        ".section .rodata", f'.Ls{count}: .asciz "{sym}"']
            else:  # data: D, B, R, V, u
                asm += [".data", ".balign 16", f".globl {sym}", f".type {sym},@object",
                        f".size {sym},{int(size, 16)}", f"{sym}:", f"  .zero {max(int(size, 16), 1)}"]
        src = out / f"{name}.s"
        src.write_text("\n".join(asm) + "\n")
        subprocess.run(["gcc", "-shared", "-nostartfiles", f"-Wl,-soname,{name}", "-o", str(out / name), str(src)],
                       check=True)
        src.unlink()
        print(f"{name}: {count} symbols stubbed")


if __name__ == "__main__":
    main()
