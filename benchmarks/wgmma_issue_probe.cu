// Probe of one warpgroup's wgmma issue on sm_90a: how long issuing a group of m64n64k16 (A in registers,
// B from shared memory) holds the issuing warps, how long the group then runs, and whether dependent
// scalar work overlaps it. The numbers behind "one warpgroup cannot hide its scalar work behind its own
// wgmma" (docs/performance.md, One warpgroup's wgmma issue). Build and run on an H100:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a benchmarks/wgmma_issue_probe.cu -o /tmp/p && /tmp/p
// Per line (clock64 of thread 0, second launch): cycles to issue group A (NA instructions, one
// accumulator), then ALU dependent FMAs, then to issue one more HGMMA into another accumulator (B), then
// the waits for A and B.
#include "../plugins_cpp/kernels/gdnCommon.cuh"  // GDN_CUDA_TRY
#include "../plugins_cpp/kernels/gdnPrefillWgmma.cuh"
#include "../plugins_cpp/kernels/gdnPrefillMma.cuh"
#include <cstdio>

using namespace gdn::prefill_wgmma;
using namespace gdn::prefill_mma;
using T = __nv_bfloat16;

__device__ __forceinline__ long long clk() { long long c; asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)); return c; }

template <int NA, int ALU>
__global__ void probe(long long* out, float* sink)
{
    __shared__ __align__(1024) unsigned char sm[64 * 128 * 2];
    for (int i = threadIdx.x; i < 64 * 128; i += 128) reinterpret_cast<T*>(sm)[i] = __float2bfloat16(0.001f * (i % 7));
    fenceProxyAsync();
    __syncthreads();
    uint32_t base = smemAddr(sm);
    uint32_t a[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
    float d1[8][4], d2[8][4];
    float x = sink[threadIdx.x];
    long long t[6];
    wgFence();
    t[0] = clk();
#pragma unroll
    for (int i = 0; i < NA; ++i) Wgmma<T, 64, 0>::run(d1, a, descKMajor<64>(base, i & 3), i > 0);
    wgCommit();
    t[1] = clk();
#pragma unroll
    for (int i = 0; i < ALU; ++i) x = fmaf(x, 1.0001f, 0.5f);
    asm volatile("" : "+f"(x));
    t[2] = clk();
    wgFence();
    Wgmma<T, 64, 0>::run(d2, a, descKMajor<64>(base, 0), 0);
    wgCommit();
    t[3] = clk();
    wgWait<1>();
    t[4] = clk();
    wgWait<0>();
    t[5] = clk();
    fenceAcc(d1); fenceAcc(d2);
    if (threadIdx.x == 0)
        for (int i = 0; i < 5; ++i) out[i] = t[i + 1] - t[i];
    float s = x;
    for (int j = 0; j < 8; ++j) for (int e = 0; e < 4; ++e) s += d1[j][e] + d2[j][e];
    sink[128 + threadIdx.x] = s;
}

template <int NA, int ALU>
cudaError_t run(long long* dout, float* sink)
{
    for (int launch = 0; launch < 2; ++launch)  // the second one is reported (warm instruction cache)
    {
        probe<NA, ALU><<<1, 128>>>(dout, sink);
        GDN_CUDA_TRY(cudaGetLastError());
    }
    long long h[5];
    GDN_CUDA_TRY(cudaMemcpy(h, dout, sizeof(h), cudaMemcpyDeviceToHost));
    printf("group A = %2d x m64n64k16, %3d dependent FMA after it | issue A %5lld | ALU %5lld | issue B (1 HGMMA) %5lld | wait A %5lld | wait B %5lld cycles\n",
        NA, ALU, h[0], h[1], h[2], h[3], h[4]);
    return cudaSuccess;
}

cudaError_t runAll()
{
    long long* dout;
    float* sink;
    GDN_CUDA_TRY(cudaMalloc(&dout, 64));
    GDN_CUDA_TRY(cudaMalloc(&sink, 4096));
    GDN_CUDA_TRY(cudaMemset(sink, 0, 4096));
    GDN_CUDA_TRY((run<1, 0>(dout, sink)));
    GDN_CUDA_TRY((run<8, 0>(dout, sink)));
    GDN_CUDA_TRY((run<16, 0>(dout, sink)));
    GDN_CUDA_TRY((run<32, 0>(dout, sink)));
    GDN_CUDA_TRY((run<8, 50>(dout, sink)));
    GDN_CUDA_TRY((run<8, 200>(dout, sink)));
    GDN_CUDA_TRY((run<16, 200>(dout, sink)));
    GDN_CUDA_TRY((run<32, 200>(dout, sink)));
    return cudaDeviceSynchronize();
}

int main()
{
    cudaError_t const e = runAll();
    if (e != cudaSuccess)
        std::printf("CUDA error: %s\n", cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 1;
}
