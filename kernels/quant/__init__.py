"""Weight quantisation of routed experts: int4 (asymmetric, grouped) and fp8 (e4m3, per row).

The byte layouts are those of :mod:`kernels.expert_layout`; the MoE kernels dequantise inside
their K loop, these functions are for conversion, loading and the reference path.
"""
from kernels.quant.calibrate import quantize_int4_calibrated
from kernels.quant.expert import dequantize_expert_matrix, quantize_expert, quantize_matrix
from kernels.quant.fp8 import FP8_MAX, dequantize_fp8, quantize_fp8
from kernels.quant.int4 import (INT4_GROUP_SIZES, check_group_size, dequantize_int4, pack_nibbles,
                               quantize_int4, unpack_nibbles)

__all__ = [
    "FP8_MAX", "INT4_GROUP_SIZES", "check_group_size", "dequantize_expert_matrix", "dequantize_fp8",
    "dequantize_int4", "pack_nibbles", "quantize_expert", "quantize_fp8", "quantize_int4",
    "quantize_int4_calibrated", "quantize_matrix", "unpack_nibbles",
]
