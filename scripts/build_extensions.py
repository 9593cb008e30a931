"""Build the compiled extensions with this interpreter, in place or into a copy of the package.

    python scripts/build_extensions.py                     # in place (as the editable install)
    python scripts/build_extensions.py --sanitize --out build/sanitize

Every ``cdc_relay/**/_c*.c`` is one extension module, compiled with the flags setup.py
uses. ``--out DIR`` first copies the package's Python sources to DIR/cdc_relay, so
``PYTHONPATH=DIR`` runs the package with those builds and leaves the checkout's own
alone. ``--sanitize`` adds AddressSanitizer and UndefinedBehaviorSanitizer (gcc or clang):
such modules load only with the ASan runtime preloaded (``make sanitize``,
scripts/sanitize.sh; docs/design.md, "The compiled paths"). Prints the directory to
put on PYTHONPATH. Exits non-zero, with the compiler's output, when a module does not build.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer", "-g", "-O1"]


def sources() -> list[Path]:
    """Every extension's C file, relative to the checkout."""
    return sorted(p.relative_to(ROOT) for p in (ROOT / "cdc_relay").rglob("_c*.c"))


def copy_package(out: Path) -> None:
    """The package's Python files (no built modules, no caches) under ``out``/cdc_relay."""
    target = out / "cdc_relay"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(ROOT / "cdc_relay", target,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))


def build(source: Path, out: Path, sanitize: bool) -> None:
    """Compile and link one module next to its source's place under ``out``."""
    cc = os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "cc").split()[0]
    module = out / source.with_suffix("").as_posix()
    target = f"{module}{sysconfig.get_config_var('EXT_SUFFIX')}"
    flags = [*FLAGS, *(SANITIZE if sanitize else [])]
    include = sysconfig.get_paths()["include"]
    command = [cc, *flags, "-fPIC", "-shared", f"-I{include}", str(ROOT / source), "-o", target]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"build_extensions: {source} did not build ({' '.join(command)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="build into a copy of the package there (default: in place)")
    parser.add_argument("--sanitize", action="store_true", help="with ASan and UBSan")
    args = parser.parse_args()
    out = ROOT if args.out is None else args.out.resolve()
    if args.out is not None:
        copy_package(out)
    for source in sources():
        build(source, out, args.sanitize)
    print(out)


if __name__ == "__main__":
    main()
