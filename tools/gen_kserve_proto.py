"""Regenerates loadtest/contracts/kserve_v2_pb2.py from kserve_v2.proto with grpcio-tools' protoc (the
messages only: the client and the engine bind the service's methods by name, without generated stubs)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "loadtest" / "contracts"


def main() -> int:
    try:
        from grpc_tools import protoc
    except ImportError:
        print(
            "error: grpcio-tools is not installed (pip install 'grpcio-tools>=1.85,<1.86')", file=sys.stderr
        )
        return 2
    return protoc.main(
        ["protoc", f"-I{HERE}", f"--python_out={HERE}", f"--pyi_out={HERE}", "kserve_v2.proto"]
    )


if __name__ == "__main__":
    sys.exit(main())
