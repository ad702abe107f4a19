// Small-M GEMV for the decode step: y[M, N] = x[M, K] @ W[N, K]^T (+ residual[M, N]) for M = 1..16.
// Framework-free like gdnKernels.h: one plain params struct, one launcher, a C ABI for ctypes (gdn_deploy/kernels/gemv.py).
// x, W, residual and y share one dtype (fp32 / fp16 / bf16); accumulation in fp32; rows may be strided
// (ld* in elements, >= the row length). Deterministic: every output is one fixed-order sum (the split-K partials of
// a row are reduced inside one block in a fixed order), so results do not depend on timing.
#pragma once

#include "gdnKernels.h"

namespace gdn
{

constexpr int kGemvMaxM = 16;

struct GemvParams
{
    int32_t M = 0;          // rows of x and y, 1..kGemvMaxM
    int32_t N = 0;          // rows of W = columns of y
    int32_t K = 0;          // reduction length
    DType dtype = DType::kBFloat16;
    int32_t ldx = 0;        // row strides in elements
    int32_t ldw = 0;
    int32_t ldy = 0;
    int32_t ldr = 0;
    int32_t splitK = 0;     // warps per output row inside a block (1, 2, 4, 8); 0 chooses from the shape
    void const* x = nullptr;
    void const* w = nullptr;
    void const* residual = nullptr;   // optional, added to the result
    void* y = nullptr;
};

// Empty string when launchGemvSmallM supports `p`, else why not. No CUDA calls.
char const* gemvSmallMSupports(GemvParams const& p);
// Enqueue on `stream` (no host sync, no allocation: graph capturable). Unsupported params: cudaErrorInvalidValue.
cudaError_t launchGemvSmallM(GemvParams const& p, cudaStream_t stream);

} // namespace gdn

extern "C"
{
    // cudaError_t as int; -1 when the params are unsupported (gdnGemvSupportsC says why).
    int gdnGemvLaunchC(gdn::GemvParams const* p, void* stream);
    char const* gdnGemvSupportsC(gdn::GemvParams const* p);
    // out[0] = sizeof(GemvParams), out[1..] = offsetof of each field in order; returns the count.
    int gdnGemvLayoutC(size_t* out, int cap);
}
