"""gdn-deploy: Gated DeltaNet models from PyTorch to ONNX and TensorRT."""
__version__ = "0.1.0"
