"""Run an export folder: feed the graphs and carry every layer's state between calls (PyTorch, onnxruntime,
TensorRT), and generate greedily from a batch of prompts.

- :mod:`.folder`:     :class:`ExportFolder` (what a gdn-export folder holds, its state convention, tokenizer)
- :mod:`.backends`:   :func:`make_backend` ("torch", "onnxruntime", "tensorrt"): ``run(graph, feed) -> outputs``
- :mod:`.generation`: :func:`generate`: one packed prefill, then one decode call per step for the whole batch
"""
