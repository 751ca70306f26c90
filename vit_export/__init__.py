"""vit-export: Vision Transformers from PyTorch to TorchScript and ONNX, with proven parity."""
__version__ = "0.1.0"
