// Minimal reproductions of the synchronisation patterns of the prefill kernels, for compute-sanitizer: each mode
// runs one small kernel whose shared- or global-memory accesses follow one pattern of gdnPrefill*.cuh, so that
// a tool's verdict on the pattern can be told apart from a verdict on the kernels. Every mode is correctly
// synchronised; the ones the tools report anyway are their false positives. scripts/device_gpu_check.sh builds this
// file and runs every mode under the tool it concerns; docs/kernels.md ("Sanitizers") records each verdict.
//
//   nvcc -std=c++17 -O2 -lineinfo -gencode=arch=compute_90a,code=sm_90a sync_patterns.cu -o sync_patterns
//   compute-sanitizer --tool racecheck ./sync_patterns mbar_cpasync
//
// Modes (racecheck, shared memory):
//   mbar_cpasync       the wgmma scan's producer/consumer stages: a producer warp fills a stage by cp.async, waits
//                      for its copies, __syncwarp, lane 0 arrives on the stage's `full` mbarrier; 4 consumer warps
//                      wait on `full`, read the stage, __syncwarp, and their lane 0 arrives on `empty`, which the
//                      producer waits on before it refills the stage
//   mbar_st            mbar_cpasync with the stage written by st.shared instead of cp.async
//   named_arrive       the prep's pair barrier: warp 0 writes a tile and arrives (bar.arrive 1, 64), warp 2 waits
//                      (bar.sync 1, 64) and reads it; a CTA barrier, then the next round overwrites the tile
//   cpasync_syncthreads the mma.sync scan's double buffer: cp.async, cp.async.wait_group 0, __syncthreads
//   prep_pairs         the prep's inverse, per value head: each warp writes its rows of L, CTA barrier, warps 0-1
//                      read the diagonal blocks, CTA barrier, every warp reads L and X and writes its block, warps
//                      0-1 hand theirs to warps 2-3 by the pair barriers (bar.arrive / bar.sync 1 + c, 64), CTA
//                      barrier, every thread reads X; rounds repeat it
//   prep_pairs_sync    the same with bar.sync on both sides of the pair barriers
// Modes (initcheck, global memory):
//   tma_store          a tile written to fresh global memory by a bulk tensor store (cp.async.bulk.tensor), then
//                      read by a second kernel: every byte was written
//   bulk_store         the same by a plain bulk copy (cp.async.bulk.global.shared::cta)
//   generic_store      the same by st.global (the control: initcheck must be silent)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#define CHECK(x)                                                                                                       \
    do                                                                                                                 \
    {                                                                                                                  \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess)                                                                                         \
        {                                                                                                              \
            std::printf("%s: %s\n", #x, cudaGetErrorString(e_));                                                      \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

namespace
{

constexpr int kStageBytes = 4096, kStages = 2, kRounds = 8;

__device__ __forceinline__ unsigned smem(void const* p)
{
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbarInit(unsigned bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarArrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarWait(unsigned bar, unsigned parity)
{
    asm volatile("{\n.reg .pred p;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void cpAsync16(unsigned dst, void const* src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cpAsyncWaitAll()
{
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

// Producer warp 4 and consumer warps 0-3 over kStages stages of kStageBytes, kRounds rounds (the scan's pattern).
template <int Mode>  // 0: cp.async, 2: st.shared
__global__ void stages(int4 const* src, float* out)
{
    __shared__ __align__(16) int4 st[kStages][kStageBytes / 16];
    __shared__ __align__(8) unsigned long long full[kStages], empty[kStages];
    int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0)
        for (int s = 0; s < kStages; ++s)
        {
            mbarInit(smem(&full[s]), 1);
            mbarInit(smem(&empty[s]), 4);
        }
    __syncthreads();
    if (warp == 4)
    {
        for (int r = 0; r < kRounds; ++r)
        {
            int const s = r % kStages;
            if (r >= kStages)
                mbarWait(smem(&empty[s]), ((r / kStages) - 1) & 1);
            for (int i = lane; i < kStageBytes / 16; i += 32)
            {
                if (Mode == 2)
                    st[s][i] = src[r * (kStageBytes / 16) + i];
                else
                    cpAsync16(smem(&st[s][i]), src + r * (kStageBytes / 16) + i);
            }
            if (Mode != 2)
                cpAsyncWaitAll();
            __syncwarp();
            if (lane == 0)
                mbarArrive(smem(&full[s]));
        }
        return;
    }
    float acc = 0.f;
    for (int r = 0; r < kRounds; ++r)
    {
        int const s = r % kStages;
        mbarWait(smem(&full[s]), (r / kStages) & 1);
        int4 const x = st[s][(threadIdx.x * 7 + r) % (kStageBytes / 16)];  // another lane's word of the stage
        acc += float(x.x + x.y + x.z + x.w);
        __syncwarp();
        if (lane == 0)
            mbarArrive(smem(&empty[s]));
    }
    out[threadIdx.x] = acc;
}

// The prep's pair barrier (warps 0 and 2 of 4), with a CTA barrier between rounds.
__global__ void namedArrive(float* out)
{
    __shared__ float tile[4][32];
    int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float acc = 0.f;
    for (int r = 0; r < kRounds; ++r)
    {
        if (warp == 0)
        {
            tile[r % 4][lane] = float(r * 32 + lane);
            __syncwarp();
            asm volatile("bar.arrive 1, 64;" ::: "memory");
        }
        else if (warp == 2)
        {
            asm volatile("bar.sync 1, 64;" ::: "memory");
            acc += tile[r % 4][(lane + 5) % 32];
        }
        __syncthreads();
    }
    out[threadIdx.x] = acc;
}

// The prep's inverse phases (gdnPrefillPrep.cuh, prepItem), with plain arithmetic in place of the tensor-core block
// products; ArriveOnly: warps 0-1 only arrive on the pair barriers (as the kernel does), else they wait there too.
template <bool ArriveOnly>
__global__ void prepPairs(float* out)
{
    __shared__ float L[64][68], X[64][68], R[4][16][24];
    int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i = threadIdx.x; i < 64 * 68; i += blockDim.x)
        X[i / 68][i % 68] = 0.f;
    float acc = 0.f;
    for (int r = 0; r < kRounds; ++r)
    {
        for (int i = lane; i < 16 * 64; i += 32)  // warp w's rows of L
            L[16 * warp + i / 64][i % 64] = float(r + i % 7);
        __syncthreads();  // L
        if (warp < 2)
        {
            int const a = 2 * warp + (lane >> 4), cl = lane & 15, o = 16 * a;
            for (int i = 0; i < 16; ++i)  // forward substitution of diagonal block a, column cl
            {
                float x = i == cl ? 1.f : 0.f;
                for (int j = 0; j < i; ++j)
                    x -= L[o + i][o + j] * 1e-3f;
                X[o + i][o + cl] = x;
            }
            __syncwarp();
            int const lo = 32 * warp, hi = lo + 16;
            for (int i = lane; i < 256; i += 32)
                R[warp][i / 16][i % 16] = L[hi + i / 16][lo + i % 16] * X[lo + i / 16][lo + i % 16];
            __syncwarp();
            for (int i = lane; i < 256; i += 32)
                X[hi + i / 16][lo + i % 16] = -R[warp][i / 16][i % 16] * X[hi + i / 16][hi + i % 16];
        }
        __syncthreads();  // the 32x32 diagonal halves
        {
            int const rr = warp >> 1, c = warp & 1, row = 32 + 16 * rr;
            for (int i = lane; i < 256; i += 32)
                R[warp][i / 16][i % 16] = L[row + i / 16][16 + i % 16] * X[16 + i / 16][16 * c + i % 16];
            __syncwarp();
            if (rr == 0 && ArriveOnly)
            {
                if (c == 0)
                    asm volatile("bar.arrive 1, 64;" ::: "memory");
                else
                    asm volatile("bar.arrive 2, 64;" ::: "memory");
            }
            else
            {
                if (c == 0)
                    asm volatile("bar.sync 1, 64;" ::: "memory");
                else
                    asm volatile("bar.sync 2, 64;" ::: "memory");
            }
            float y[8];
            for (int k = 0; k < 8; ++k)  // T_0c, warp c's block, read by warps c and 2 + c
                y[k] = X[row + (lane + 32 * k) / 16][32 + (lane + 32 * k) % 16] * R[c][(lane + 32 * k) / 16][(lane + 32 * k) % 16];
            for (int k = 0; k < 8; ++k)
                X[row + (lane + 32 * k) / 16][16 * c + (lane + 32 * k) % 16] = -y[k];
        }
        __syncthreads();  // X
        for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x)
            acc += X[i / 64][i % 64];
    }
    out[threadIdx.x] = acc;
}

// The mma.sync scan's double buffer: each round refills the other buffer after the barrier.
__global__ void cpasyncSyncthreads(int4 const* src, float* out)
{
    __shared__ __align__(16) int4 st[2][kStageBytes / 16];
    float acc = 0.f;
    for (int i = threadIdx.x; i < kStageBytes / 16; i += blockDim.x)
        cpAsync16(smem(&st[0][i]), src + i);
    for (int r = 0; r < kRounds; ++r)
    {
        cpAsyncWaitAll();
        __syncthreads();
        if (r + 1 < kRounds)
            for (int i = threadIdx.x; i < kStageBytes / 16; i += blockDim.x)
                cpAsync16(smem(&st[(r + 1) & 1][i]), src + (r + 1) * (kStageBytes / 16) + i);
        int4 const x = st[r & 1][(threadIdx.x * 7 + r) % (kStageBytes / 16)];
        acc += float(x.x + x.y + x.z + x.w);
    }
    cpAsyncWaitAll();
    out[threadIdx.x] = acc;
}

// A 64 x 64 16-bit tile written to shared memory, then to global memory at dst by `Mode` (0: bulk tensor store,
// 1: plain bulk copy, 2: st.global).
template <int Mode>
__global__ void storeTile(__grid_constant__ CUtensorMap const map, unsigned short* dst)
{
    __shared__ __align__(1024) unsigned short tile[64 * 64];
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x)
        tile[i] = static_cast<unsigned short>(i);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (Mode == 2)
    {
        for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x)
            dst[i] = tile[i];
        return;
    }
    if (threadIdx.x == 0)
    {
        if (Mode == 0)
            asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(&map),
                "r"(0), "r"(0), "r"(smem(tile))
                : "memory");
        else
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem(tile)),
                "r"(64 * 64 * 2)
                : "memory");
        asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group 0;" ::: "memory");
    }
}

__global__ void readTile(unsigned short const* src, unsigned* out)
{
    unsigned s = 0;
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x)
        s += src[i];
    atomicAdd(out, s);
}

int runStore(int mode)
{
    unsigned short* buf = nullptr;
    unsigned* sum = nullptr;
    CHECK(cudaMalloc(&buf, 64 * 64 * 2));  // never initialised: only the store writes it
    CHECK(cudaMalloc(&sum, sizeof(unsigned)));
    CHECK(cudaMemset(sum, 0, sizeof(unsigned)));
    CUtensorMap map;
    std::memset(&map, 0, sizeof(map));
    if (mode == 0)
    {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
        cuuint64_t const dims[2] = {64, 64}, strides[1] = {64 * 2};
        cuuint32_t const box[2] = {64, 64}, es[2] = {1, 1};
        if (reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, buf, dims,
                strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
            != CUDA_SUCCESS)
        {
            std::printf("cuTensorMapEncodeTiled failed\n");
            return 1;
        }
        storeTile<0><<<1, 128>>>(map, buf);
    }
    else if (mode == 1)
        storeTile<1><<<1, 128>>>(map, buf);
    else
        storeTile<2><<<1, 128>>>(map, buf);
    readTile<<<1, 128>>>(buf, sum);
    CHECK(cudaDeviceSynchronize());
    unsigned host = 0;
    CHECK(cudaMemcpy(&host, sum, sizeof(host), cudaMemcpyDeviceToHost));
    unsigned want = 0;
    for (unsigned i = 0; i < 64 * 64; ++i)
        want += i;
    std::printf("tile sum %u (expected %u): %s\n", host, want, host == want ? "every element written" : "WRONG");
    return host == want ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
    char const* mode = argc > 1 ? argv[1] : "";
    int4* src = nullptr;
    float* out = nullptr;
    CHECK(cudaMalloc(&src, kRounds * kStageBytes));
    CHECK(cudaMemset(src, 1, kRounds * kStageBytes));
    CHECK(cudaMalloc(&out, 256 * sizeof(float)));
    if (!std::strcmp(mode, "mbar_cpasync"))
        stages<0><<<1, 160>>>(src, out);
    else if (!std::strcmp(mode, "mbar_st"))
        stages<2><<<1, 160>>>(src, out);
    else if (!std::strcmp(mode, "named_arrive"))
        namedArrive<<<1, 128>>>(out);
    else if (!std::strcmp(mode, "cpasync_syncthreads"))
        cpasyncSyncthreads<<<1, 128>>>(src, out);
    else if (!std::strcmp(mode, "prep_pairs"))
        prepPairs<true><<<1, 128>>>(out);
    else if (!std::strcmp(mode, "prep_pairs_sync"))
        prepPairs<false><<<1, 128>>>(out);
    else if (!std::strcmp(mode, "tma_store"))
        return runStore(0);
    else if (!std::strcmp(mode, "bulk_store"))
        return runStore(1);
    else if (!std::strcmp(mode, "generic_store"))
        return runStore(2);
    else
    {
        std::printf("usage: %s mbar_cpasync|mbar_st|named_arrive|cpasync_syncthreads|"
                    "prep_pairs|prep_pairs_sync|tma_store|bulk_store|generic_store\n",
            argv[0]);
        return 2;
    }
    CHECK(cudaDeviceSynchronize());
    std::printf("%s: done\n", mode);
    return 0;
}
