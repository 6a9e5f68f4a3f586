"""Peak throughput per device kind: the roofline `kspec bench` reports against.

Dense (no sparsity) vendor figures. `kspec bench --measure-ceilings` replaces the
bandwidth with a copy measured on the spot, and the FLOP/s with a bf16 matmul.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Peak:
    name: str
    tflops: dict  # compute dtype -> dense TFLOP/s
    bandwidth_gbs: float  # HBM bytes per second / 1e9
    l2_bytes: int

    def flops_for(self, dtype: str | None) -> float | None:
        value = self.tflops.get(dtype or "float32")
        return value * 1e12 if value else None


_HOPPER_TENSOR = {"bfloat16": 989.4, "float16": 989.4, "float8_e4m3fn": 1978.9, "float8_e5m2": 1978.9,
                  "float32": 494.7, "int8": 1978.9}
PEAKS = (
    # device_kind prefix, peak. The first match wins.
    ("NVIDIA H200", Peak("NVIDIA H200 SXM", _HOPPER_TENSOR, 4800.0, 60 << 20)),
    ("NVIDIA H100 PCIe", Peak("NVIDIA H100 PCIe", {k: v * 756 / 989.4 for k, v in _HOPPER_TENSOR.items()}, 2000.0, 50 << 20)),
    ("NVIDIA H100", Peak("NVIDIA H100 SXM", _HOPPER_TENSOR, 3350.0, 50 << 20)),
    ("NVIDIA A100", Peak("NVIDIA A100 SXM", {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0}, 2039.0, 40 << 20)),
    ("TPU v6", Peak("TPU v6e", {"bfloat16": 918.0, "float32": 918.0 / 4}, 1640.0, 0)),
    ("TPU v5 lite", Peak("TPU v5e", {"bfloat16": 197.0, "float32": 197.0 / 4}, 819.0, 0)),
    ("TPU v5", Peak("TPU v5p", {"bfloat16": 459.0, "float32": 459.0 / 4}, 2765.0, 0)),
    ("TPU v4", Peak("TPU v4", {"bfloat16": 275.0, "float32": 275.0 / 4}, 1228.0, 0)),
)


def peak_for(device_kind: str) -> Peak | None:
    for prefix, peak in PEAKS:
        if device_kind.startswith(prefix):
            return peak
    return None
