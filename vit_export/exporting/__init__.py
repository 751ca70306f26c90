"""Export, by job: a model into a validated bundle (`export`: the TorchScript trace, the
programs, every file validated before the move), model.onnx from a model (`onnx_model`),
what an export makes and which options go together (`options`: ExportOptions), the ONNX
models derived from model.onnx (`variants`: fp16, optimized, int8, static int8) and static
int8 within an accuracy budget (`budget`).
`vit_export.export` is the front door to all of it."""
from ..lazy import lazy_names

_HOMES = {
    "DEFAULT_EXPORTER": "options",
    "EXPORTERS": "options",
    "ExportOptionError": "options",
    "ExportOptions": "options",
    "check_package_precision": "options",
    "example_size": "onnx_model",
    "export_bundle": "export",
    "export_onnx": "onnx_model",
    "trace_torchscript": "export",
}

__getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)
