#!/usr/bin/env python3
"""make CUDA=1 cuda-check: every nvcc object holds machine code (an ELF cubin) for each arch of CUDA_ARCHS
and the PTX of the first one, which newer GPUs compile at load time. Without them a GPU of another
generation fails its first kernel launch with "no kernel image is available for execution on the device".

    scripts/check_cuda_archs.py "80 86 89 90" OBJ...

What `cuobjdump --list-elf --list-ptx` lists, read from the object's .nv_fatbin section directly (the
toolkit here has no cuobjdump): fatbins of a 16-byte header (magic 0xBA55ED50, u16 version, u16 header
size, u64 size) followed by entries (u16 kind: 1 PTX, 2 ELF; u16; u32 header size; u64 payload size;
... u32 arch at offset 28), each entry's payload after its header.
Exits 1 with one line per missing arch.
"""
import struct
import subprocess
import sys
import tempfile

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "elf"}


def fatbin_section(path):
    with tempfile.NamedTemporaryFile() as f:
        subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", path, f.name], check=True)
        return open(f.name, "rb").read()


def entries(data, path):
    """(kind, arch) of every entry of every fatbin in data."""
    at = 0
    while at + 16 <= len(data):
        magic, _version, header, size = struct.unpack_from("<IHHQ", data, at)
        if magic != FATBIN_MAGIC:
            if any(data[at:]):  # sections are padded with zeros between fatbins
                sys.exit(f"check_cuda_archs: {path}: no fatbin header at offset {at} of .nv_fatbin")
            break
        e, end = at + header, at + header + size
        while e + 32 <= end:
            kind, _, eh, payload = struct.unpack_from("<HHIQ", data, e)
            arch = struct.unpack_from("<I", data, e + 28)[0]
            yield KINDS.get(kind, f"kind{kind}"), arch
            e += eh + payload
        at = (end + 7) & ~7


def main():
    if len(sys.argv) < 3:
        sys.exit('usage: check_cuda_archs.py "80 86 89 90" OBJ...')
    archs = [int(a) for a in sys.argv[1].split()]
    bad = 0
    for path in sys.argv[2:]:
        found = set(entries(fatbin_section(path), path))
        want = [("elf", a) for a in archs] + [("ptx", archs[0])]
        for kind, arch in want:
            if (kind, arch) not in found:
                print(f"check_cuda_archs: {path} has no {'sm' if kind == 'elf' else 'compute'}_{arch} "
                      f"{'machine code' if kind == 'elf' else 'PTX'}")
                bad = 1
        have = ", ".join(f"{k} sm_{a}" for k, a in sorted(found, key=lambda x: (x[0], x[1])))
        print(f"check_cuda_archs: {path}: {have}")
    sys.exit(bad)


if __name__ == "__main__":
    main()
