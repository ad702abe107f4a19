// Framework-free CUDA kernels of the gdn op contract (gdn_deploy/spec/gdn_ops.json).
// No TensorRT and no torch types: one plain params struct per op is the whole contract
// between callers (torch binding, TensorRT plugins) and the kernels.
//
// Layouts (all contiguous, row-major):
//   prefill: q,k [T,Hk,K]  v [T,Hv,V]  g,beta [T,Hv]  cu_seqlens [N+1] int32
//            initial_state / final_state [N,Hv,K,V] float32   o [T,Hv,V]
//   decode:  q,k [B,Hk,K]  v [B,Hv,V]  g,beta [B,Hv]
//            state_mode 0: stateIn/stateOut [B,Hv,K,V]; 1: pool [P,Hv,K,V] + slots [B] (-1 = skip)
//   verify:  q,k [T,Hk,K]  v [T,Hv,V]  g,beta [T,Hv]  cu_seqlens [N+1]  state [N,Hv,K,V] or pool [P,Hv,K,V] + slots [N]
//            (read only)  o [T,Hv,V]  commitK [T,Hk,K]  commitDelta [T,Hv,V]  commitG [T,Hv] (float32)
//   commit:  commitK/Delta/G as verify wrote them, cu_seqlens [N+1], accepted [N] int32, state/pool updated in place
// Value head h reads q/k head h / (Hv/Hk). State is always float32.
#pragma once

#include <cuda_runtime.h>
#include <cstddef>
#include <cstdint>

namespace gdn
{

enum class DType : int32_t
{
    kFloat32 = 0,
    kFloat16 = 1,
    kBFloat16 = 2,
};

struct GdnPrefillParams
{
    int32_t T = 0;  // total packed tokens
    int32_t N = 0;  // sequences (cu_seqlens has N+1 entries)
    int32_t Hk = 0, Hv = 0, K = 0, V = 0;
    DType ioType = DType::kFloat32;    // q, k, v, o
    DType gateType = DType::kFloat32;  // g, beta (or raw a, b)
    int32_t gateMode = 0;              // 0: precomputed g/beta; 1: raw a/b with ALog, dtBias
    int32_t useQkL2norm = 0;
    float scale = 0.f;                 // 0 means 1/sqrt(K)
    float l2normEps = 1e-6f;

    void const* q = nullptr;
    void const* k = nullptr;
    void const* v = nullptr;
    void const* g = nullptr;
    void const* beta = nullptr;
    int32_t const* cuSeqlens = nullptr;
    float const* initialState = nullptr;  // may be nullptr: zeros
    float const* ALog = nullptr;           // gateMode 1
    float const* dtBias = nullptr;         // gateMode 1
    void* o = nullptr;
    float* finalState = nullptr;           // may alias initialState

    void* workspace = nullptr;             // gdnPrefillWorkspaceSize(params) bytes, 256-byte aligned
    size_t workspaceBytes = 0;
};

struct GdnDecodeParams
{
    int32_t B = 0;  // sequences (one token each)
    int32_t P = 0;  // state rows: B (stateMode 0) or pool size (stateMode 1)
    int32_t Hk = 0, Hv = 0, K = 0, V = 0;
    DType ioType = DType::kFloat32;
    DType gateType = DType::kFloat32;
    int32_t gateMode = 0;
    int32_t useQkL2norm = 0;
    int32_t stateMode = 0;  // 0: dense; 1: pool + slots, updated in place (stateOut == stateIn)
    float scale = 0.f;
    float l2normEps = 1e-6f;

    void const* q = nullptr;
    void const* k = nullptr;
    void const* v = nullptr;
    void const* g = nullptr;
    void const* beta = nullptr;
    float const* stateIn = nullptr;
    float* stateOut = nullptr;             // may alias stateIn
    int32_t const* slots = nullptr;        // stateMode 1
    float const* ALog = nullptr;
    float const* dtBias = nullptr;
    void* o = nullptr;
};

// GatedDeltaVerify (speculative_ops of gdn_ops.json): <= kMaxDraftTokens tokens per sequence from a state it
// only reads; o of every token and the per-step factors GatedDeltaCommit replays. Offsets and slots are not
// trusted: each sequence's range is clamped to [0, T] and to kMaxDraftTokens tokens, a slot outside [0, P)
// skips the sequence (o and factors 0), so no index reads or writes out of bounds.
struct GdnVerifyParams
{
    int32_t T = 0;  // packed tokens
    int32_t N = 0;  // sequences
    int32_t P = 0;  // state rows: N (stateMode 0) or pool size (stateMode 1)
    int32_t Hk = 0, Hv = 0, K = 0, V = 0;
    DType ioType = DType::kFloat32;
    DType gateType = DType::kFloat32;
    int32_t gateMode = 0;
    int32_t useQkL2norm = 0;
    int32_t stateMode = 0;
    float scale = 0.f;
    float l2normEps = 1e-6f;

    void const* q = nullptr;
    void const* k = nullptr;
    void const* v = nullptr;
    void const* g = nullptr;
    void const* beta = nullptr;
    int32_t const* cuSeqlens = nullptr;
    float const* state = nullptr;
    int32_t const* slots = nullptr;        // stateMode 1
    float const* ALog = nullptr;
    float const* dtBias = nullptr;
    void* o = nullptr;
    float* commitK = nullptr;
    float* commitDelta = nullptr;
    float* commitG = nullptr;
};

// GatedDeltaCommit, in place: S <- exp(g_t) S + k_t delta_t^T for the first accepted[n] tokens of sequence n
// (clamped to [0, T_n]); rows with nothing to replay or an invalid slot are not touched.
struct GdnCommitParams
{
    int32_t T = 0, N = 0, P = 0;
    int32_t Hk = 0, Hv = 0, K = 0, V = 0;
    int32_t stateMode = 0;
    float const* commitK = nullptr;
    float const* commitDelta = nullptr;
    float const* commitG = nullptr;
    int32_t const* cuSeqlens = nullptr;
    int32_t const* accepted = nullptr;
    int32_t const* slots = nullptr;        // stateMode 1
    float* state = nullptr;                // updated in place
};

// Host functions: cheap, no CUDA calls, no allocation.
// Returns an empty string when the kernels support `p`, otherwise a message saying why not.
char const* gdnPrefillSupports(GdnPrefillParams const& p);
char const* gdnDecodeSupports(GdnDecodeParams const& p);
char const* gdnVerifySupports(GdnVerifyParams const& p);
char const* gdnCommitSupports(GdnCommitParams const& p);
// Scratch memory the prefill launch needs (the caller provides it); depends on sizes only.
size_t gdnPrefillWorkspaceSize(GdnPrefillParams const& p);

// Enqueue on `stream`. No host synchronisation, no allocation: CUDA-graph capturable.
cudaError_t launchGdnPrefill(GdnPrefillParams const& p, cudaStream_t stream);
cudaError_t launchGdnDecode(GdnDecodeParams const& p, cudaStream_t stream);
cudaError_t launchGdnVerify(GdnVerifyParams const& p, cudaStream_t stream);
cudaError_t launchGdnCommit(GdnCommitParams const& p, cudaStream_t stream);

} // namespace gdn

// C ABI for ctypes callers (the torch binding): return cudaError_t as int; 
// a negative value means the params are unsupported (see gdn*Supports).
extern "C"
{
    int gdnPrefillLaunchC(gdn::GdnPrefillParams const* p, void* stream);
    int gdnDecodeLaunchC(gdn::GdnDecodeParams const* p, void* stream);
    size_t gdnPrefillWorkspaceSizeC(gdn::GdnPrefillParams const* p);
    char const* gdnPrefillSupportsC(gdn::GdnPrefillParams const* p);
    char const* gdnDecodeSupportsC(gdn::GdnDecodeParams const* p);
    int gdnVerifyLaunchC(gdn::GdnVerifyParams const* p, void* stream);
    int gdnCommitLaunchC(gdn::GdnCommitParams const* p, void* stream);
    char const* gdnVerifySupportsC(gdn::GdnVerifyParams const* p);
    char const* gdnCommitSupportsC(gdn::GdnCommitParams const* p);
}
