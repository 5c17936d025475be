"""Repack a wheel without the parts a job never imports, and with its ELF files stripped of symbol tables, so that
it fits the 64 MiB a device call carries (dev/gpu/pack.sh --graph: Ray's 75.6 MiB wheel becomes 31.3 MiB).

Usage: python slim_wheel.py WHEEL OUT_DIR PREFIX... : every member whose path starts with a PREFIX is left out
(``*.map`` as a PREFIX drops the files of that suffix), the RECORD lists what remains with its new hash and size.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ELF = b"\x7fELF"


def stripped(data: bytes) -> bytes:
    """``data`` (an ELF file) without its symbol table and debug sections; the dynamic symbols stay."""
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        subprocess.run(["strip", "--strip-unneeded", f.name], check=True)
        return Path(f.name).read_bytes()


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(wheel: Path, out_dir: Path, drop: list[str]) -> Path:
    def dropped(name: str) -> bool:
        return any(name.endswith(p[1:]) if p.startswith("*") else name.startswith(p) for p in drop)

    target = out_dir / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in src.infolist():
            if info.filename == record_name or dropped(info.filename) or info.is_dir():
                continue
            data = src.read(info)
            if data.startswith(ELF):
                data = stripped(data)
            info.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(info, data, compresslevel=9)
            lines.append(record_line(info.filename, data))
        dst.writestr(record_name, "\n".join([*lines, f"{record_name},,"]) + "\n")
    return target


if __name__ == "__main__":
    wheel, out_dir, *prefixes = sys.argv[1:]
    path = slim(Path(wheel), Path(out_dir), prefixes)
    print(f"{path}: {Path(wheel).stat().st_size / 2**20:.1f} MiB -> {path.stat().st_size / 2**20:.1f} MiB")
