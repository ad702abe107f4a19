"""GPU tests (CUDA kernels and their torch binding); skipped without a CUDA GPU."""
