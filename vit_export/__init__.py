"""vit-export: Vision Transformers from PyTorch to TorchScript and ONNX, with proven parity.

The front door, one function per command, with the command's names (`api`):

    import vit_export

    vit_export.export("vit_small_patch16_224", "out/small")   # vit-export export
    vit_export.validate("out/small")                          # vit-export validate
    vit_export.open("out/small")                              # a runner: runner(x)
    vit_export.infer("out/small", ["photos/"])                # vit-export infer
    vit_export.bench("out/small")                             # vit-export bench
    vit_export.serve("out/small")                             # vit-export serve

Importing the package loads none of the heavy libraries; each function loads what it needs.
"""
import os

from .lazy import lazy_names

# onnxruntime-gpu's telemetry looks up a Microsoft host some seconds after it is imported (8
# DNS packets, measured with strace): a command that runs a model touches no network unless
# the user asks it to. The user's own setting wins.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

__version__ = "0.1.0"

_HOMES = {name: "api" for name in ("Inferred", "Model", "bench", "export", "infer", "load",
                                   "open", "serve", "validate")}

__getattr__, __dir__ = lazy_names(__name__, globals(), _HOMES)
