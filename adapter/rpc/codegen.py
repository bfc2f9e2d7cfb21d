"""Regenerate adapter/rpc/generated/ from adapter/rpc/proto/ (needs grpcio-tools, a dev dependency).

    python -m adapter.rpc.codegen

The .proto files are mapped to the import path `adapter/rpc/generated/`, so the generated modules
import each other as `adapter.rpc.generated.*` and work from inside the package.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).parent / "proto"
PACKAGE_PATH = "adapter/rpc/generated"
REPO_ROOT = Path(__file__).parents[2]


def generate(root: Path) -> list[Path]:
    """Write the generated modules under `root`/adapter/rpc/generated; return their paths."""
    from grpc_tools import protoc  # dev dependency: imported only when regenerating

    protos = sorted(PROTO_DIR.glob("*.proto"))
    (root / PACKAGE_PATH).mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PACKAGE_PATH}={PROTO_DIR}",
        f"--python_out={root}",
        f"--pyi_out={root}",
        f"--grpc_python_out={root}",
        *(f"{PACKAGE_PATH}/{proto.name}" for proto in protos),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(p.name for p in protos)}")
    return sorted(path for path in (root / PACKAGE_PATH).iterdir() if path.suffix in (".py", ".pyi"))


if __name__ == "__main__":
    for written in generate(REPO_ROOT):
        print(written.relative_to(REPO_ROOT))
    sys.exit(0)
