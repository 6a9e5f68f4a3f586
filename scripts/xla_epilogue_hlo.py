"""What XLA makes of matmul_bias_gelu's reference on this GPU: the optimized HLO's custom
calls and fusions, so docs/benchmarks.md can say whether the bias and GELU run inside the GEMM.

  python3 scripts/xla_epilogue_hlo.py [M N K]
"""

import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from generated.matmul_bias_gelu.reference import matmul_bias_gelu_reference


def main() -> None:
    m, n, k = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (8192, 8192, 8192)
    args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16),
            jax.ShapeDtypeStruct((1, n), jnp.bfloat16))
    text = jax.jit(matmul_bias_gelu_reference).lower(*args).compile().as_text()
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    for line in text.splitlines():
        if "custom_call_target" in line or re.search(r"\bfusion\(|ENTRY", line):
            print(line.strip()[:400])


if __name__ == "__main__":
    main()
