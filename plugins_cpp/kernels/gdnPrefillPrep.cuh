// Prep kernel of the chunked prefill (gdnPrefillChunked.cuh has the workspace layout and the math),
// private to gdnPrefill.cu: per (chunk id, key head) item, q.k^T, k.k^T and the diagonal of q.q^T (the
// squared norms) on tensor cores (mma.sync), then per value head of the group the gates' cumulative sum,
// the decayed L and Aqk, (I + L)^-1 by 16x16 blocks (fp32 forward substitution on the diagonal blocks,
// tf32 tensor-core products below them) and the workspace slot (Tm', Aqk, per-token factors). One item per
// CTA, or beside the scan a persistent grid that keeps SMs free for it and publishes ready counters.
#pragma once

#include "gdnPrefillChunked.cuh"

namespace gdn
{
namespace prefill_chunked
{

template <typename T, int K>
struct PrepSmem
{
    static constexpr int KS = K + 8;  // padded row (16 B): conflict-free ldmatrix
    static constexpr int LS = kC + 4;  // conflict-free tf32 A-fragment loads
    static constexpr int RS = 24;      // conflict-free tf32 B-fragment loads
    union
    {
        struct
        {
            T q[kC][KS];
            T k[kC][KS];
        } in;
        struct  // after q and k are consumed (Gram products in registers)
        {
            float L[kC][LS];       // decayed, beta-scaled strictly lower k.k^T of the current value head
            float X[kC][LS];       // (I + L)^-1
            float R[4][16][RS];    // per-warp 16x16 scratch of the block-row products
        } inv;
    } u;
    alignas(16) float G[kC];  // (16-byte aligned: read as float2 / float4 vectors)
    alignas(16) float beta[kC];
    alignas(16) float qs[kC];
    alignas(16) float rk[kC];
    float scanTmp[2];
};

// One work item (chunk id, key head): q, k and their Gram products are shared by the Hv/Hk value heads
// of the group, which then run the gate-dependent part one after the other.
// Returns the chunk's index in its sequence, or -1 for an unused id.
template <typename T, int K>
__device__ __forceinline__ int prepItem(GdnPrefillParams const& p, ChunkWs const& ws, PrepSmem<T, K>& sm, int id, int hk)
{
    constexpr int KS = PrepSmem<T, K>::KS;
    int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int const n = seqOfChunk(p.cuSeqlens, p.N, id);
    int const bos = p.cuSeqlens[n], L = p.cuSeqlens[n + 1] - bos;
    int const c = id - (bos / kC + n);
    if (c < 0 || c * kC >= L)
        return -1;  // unused id (gap after a short or empty sequence)
    int const t0 = bos + c * kC, len = min(kC, L - c * kC);
    int const Hv = p.Hv, Hk = p.Hk, grp = Hv / Hk;
    if (ws.throttle > 0 && c >= ws.throttle)
    {
        // stay within `throttle` chunks of the slowest scan CTA of this key head (bounded wait)
        if (tid == 0)
        {
            int const* cons = consumedCounter(ws, p, hk, id - c + (c - ws.throttle) / kReadyBlock * kReadyBlock);
            int const need = grp * (p.V / 64);
            unsigned long long const tStart = globalTimerNs();
            while (loadAcquire(cons) < need && globalTimerNs() - tStart < kThrottleNs)
                __nanosleep(128);
        }
        __syncthreads();
    }

    // raw q, k rows -> shared (16 B copies, zero rows past the end)
    constexpr int VEC = 8;  // 16-bit elements per 16 B
    for (int i = tid; i < kC * (K / VEC); i += 128)
    {
        int const r = i / (K / VEC), cc = (i % (K / VEC)) * VEC;
        bool const ok = r < len;
        int64_t const off = ((int64_t)(t0 + (ok ? r : 0)) * Hk + hk) * K + cc;
        cpAsync16(&sm.u.in.q[r][cc], static_cast<T const*>(p.q) + off, ok ? 16 : 0);
        cpAsync16(&sm.u.in.k[r][cc], static_cast<T const*>(p.k) + off, ok ? 16 : 0);
    }
    cpAsyncCommit();
    // raw gate inputs of token t0 + tid (tid < len) for value head hh
    float gRaw = 0.f, bRaw = 0.f;
    auto loadGateRaw = [&](int hh)
    {
        int64_t const gi = (int64_t)(t0 + tid) * Hv + hh;
        gRaw = loadAny(p.g, p.gateType, gi);
        bRaw = loadAny(p.beta, p.gateType, gi);
    };
    if (tid < len)
        loadGateRaw(hk * grp);
    cpAsyncWaitAll();
    __syncthreads();
    // k.k^T and q.k^T for rows 16w..16w+15 (8 n8 tiles over the 64 columns), and the diagonal block
    // of q.q^T: the squared norms |q_i|^2, |k_i|^2 come out of the diagonals (exact bf16/fp16
    // products, fp32 accumulation, as a scalar fp32 loop would give).
    float kk[8][4], qk[8][4], qq[2][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            kk[j][e] = qk[j][e] = qq[j & 1][e] = 0.f;
#pragma unroll
    for (int s = 0; s < K / 16; ++s)
    {
        uint32_t ak[4], aq[4];
        ldsmX4(ak, ldsmRowsNK(&sm.u.in.k[16 * warp][0], KS, 0, s, lane));
        ldsmX4(aq, ldsmRowsNK(&sm.u.in.q[16 * warp][0], KS, 0, s, lane));
        // ldsmRowsNK with j = 0 over 16 rows yields (rows 0-7|8-15) x (k lo|hi) as r0=(0-7,lo),
        // r1=(0-7,hi), r2=(8-15,lo), r3=(8-15,hi); the A fragment wants (0-7,lo),(8-15,lo),(0-7,hi),(8-15,hi).
        uint32_t const a1[4] = {ak[0], ak[2], ak[1], ak[3]};
        uint32_t const a2[4] = {aq[0], aq[2], aq[1], aq[3]};
        {
            uint32_t b[4];
            ldsmX4(b, ldsmRowsNK(&sm.u.in.q[0][0], KS, warp, s, lane));
            mma16816<T>(qq[0], a2, b[0], b[1]);
            mma16816<T>(qq[1], a2, b[2], b[3]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
        {
            if (j > warp)
                break;  // only the lower triangle (column blocks <= row block) is used
            uint32_t b[4];
            ldsmX4(b, ldsmRowsNK(&sm.u.in.k[0][0], KS, j, s, lane));
            mma16816<T>(kk[2 * j], a1, b[0], b[1]);
            mma16816<T>(kk[2 * j + 1], a1, b[2], b[3]);
            mma16816<T>(qk[2 * j], a2, b[0], b[1]);
            mma16816<T>(qk[2 * j + 1], a2, b[2], b[3]);
        }
    }
    // inverse norms: diagonal element r of the 16x16 block sits in n8 tile r/8, row g = r%8 (c index
    // 2 (r/8) + r%2) of the lane with g = r%8, q = g/2: 8 lanes hold two rows each
    float const scale = effectiveScale(p.scale, K);
    if ((lane & 3) == (lane >> 3))
    {
        int const g = lane >> 2, e = g & 1;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
        {
            float sk = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (j == warp)
                    sk = e ? kk[2 * j + hh][2 * hh + 1] : kk[2 * j + hh][2 * hh];
            float const sq = e ? qq[hh][2 * hh + 1] : qq[hh][2 * hh];
            int const r = 16 * warp + g + 8 * hh;
            bool const ok = r < len;
            float const rq = p.useQkL2norm ? rsqrtf(sq + p.l2normEps) : 1.f;
            float const rkk = p.useQkL2norm ? rsqrtf(sk + p.l2normEps) : 1.f;
            sm.qs[r] = ok ? scale * rq : 0.f;
            sm.rk[r] = ok ? rkk : 0.f;
        }
    }
    for (int h = hk * grp; h < (hk + 1) * grp; ++h)
    {
        __syncthreads();  // norms written; the previous head's reads of G, beta and X done
        // gates and their cumulative sum (warps 0, 1: 32 tokens each)
        if (tid < kC)
        {
            float g = 0.f, b = 0.f;
            if (tid < len)
            {
                Gate const gt = computeGate(p.gateMode, gRaw, bRaw, p.ALog, p.dtBias, h);
                g = gt.g;
                b = gt.beta;
                if (h + 1 < (hk + 1) * grp)
                    loadGateRaw(h + 1);  // the next head's gates, in flight during this head's work
            }
#pragma unroll
            for (int o = 1; o < 32; o <<= 1)
            {
                float const y = __shfl_up_sync(0xffffffffu, g, o);
                if (lane >= o)
                    g += y;
            }
            if (tid == 31)
                sm.scanTmp[0] = g;
            sm.G[tid] = g;
            sm.beta[tid] = b;
        }
        __syncthreads();
        if (tid >= 32 && tid < kC)
            sm.G[tid] += sm.scanTmp[0];
        __syncthreads();
        int64_t const slot = (int64_t)id * Hv + h;
        T* aqkOut = static_cast<T*>(ws.aqk) + slot * (kC * kC);
        T* tmOut = static_cast<T*>(ws.tm) + slot * (kC * kC);
        float* gqOut = ws.gq + slot * (4 * kC);
        // L_ij = beta_i rk_i rk_j e^{G_i - G_j} k_i.k_j (j < i) and Aqk_ij = qs_i rk_j e^{G_i - G_j} q_i.k_j
        // (j <= i) from the accumulators of rows i = 8 rg + lane/4 (rg = 2 warp + hh), columns 8 j + 2 (lane%4)
        // + {0, 1}. Per warp-uniform n8 block: below the row group all entries, the diagonal 8x8 block
        // masked, above it Aqk = 0 and L not written (the inverse reads only its lower blocks).
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
        {
            int const rg = 2 * warp + hh, i = 8 * rg + (lane >> 2);
            float const Gi = sm.G[i], bi = sm.beta[i] * sm.rk[i], qi = sm.qs[i];
#pragma unroll
            for (int j = 0; j < 8; ++j)
            {
                int const jj = 8 * j + 2 * (lane & 3);
                uint32_t packed = 0u;
                if (j <= rg)
                {
                    float2 const Gj = *reinterpret_cast<float2 const*>(&sm.G[jj]);
                    float2 const rj = *reinterpret_cast<float2 const*>(&sm.rk[jj]);
                    // (e^{G_i - G_j} of j > i may overflow: only selected away below, never multiplied in)
                    float const d0 = __expf(Gi - Gj.x) * rj.x, d1 = __expf(Gi - Gj.y) * rj.y;
                    float l0 = bi * d0 * kk[j][2 * hh], l1 = bi * d1 * kk[j][2 * hh + 1];
                    float a0 = qi * d0 * qk[j][2 * hh], a1 = qi * d1 * qk[j][2 * hh + 1];
                    if (j == rg)
                    {
                        l0 = jj < i ? l0 : 0.f;
                        l1 = jj + 1 < i ? l1 : 0.f;
                        a0 = jj <= i ? a0 : 0.f;
                        a1 = jj + 1 <= i ? a1 : 0.f;
                    }
                    *reinterpret_cast<float2*>(&sm.u.inv.L[i][jj]) = make_float2(l0, l1);
                    packed = pack2<T>(a0, a1);
                }
                *reinterpret_cast<uint32_t*>(aqkOut + i * kC + jj) = packed;
            }
        }
        __syncthreads();
        // (I + L)^-1 by 16x16 blocks: X_aa = (I + L_aa)^-1 by forward substitution (one column per
        // thread, fp32), then warp b builds column block b downwards on tensor cores (tf32 operands, fp32
        // accumulate): X_ab = -X_aa (sum_{m=b}^{a-1} L_am X_mb), a = b+1..3. The tf32 rounding (2^-11) is
        // below the 16-bit rounding of the Tm' that is stored.
        if (tid < kC)
        {
            int const a = tid >> 4, cl = tid & 15, o = 16 * a;
            float x[16];
#pragma unroll
            for (int i = 0; i < 16; ++i)
            {
                float acc = (i == cl) ? 1.f : 0.f;
#pragma unroll
                for (int j = 0; j < i; ++j)
                    acc = fmaf(-sm.u.inv.L[o + i][o + j], x[j], acc);
                x[i] = acc;
            }
#pragma unroll
            for (int i = 0; i < 16; ++i)
                sm.u.inv.X[o + i][o + cl] = x[i];
        }
        __syncthreads();
        {
            constexpr int LS = PrepSmem<T, K>::LS, RS = PrepSmem<T, K>::RS;
            int const b = warp, gr = lane >> 2, qd = lane & 3;
            float(&R)[16][RS] = sm.u.inv.R[warp];
            for (int a = b + 1; a < 4; ++a)
            {
                float acc[2][4] = {};
                for (int m = b; m < a; ++m)
                    mmaBlock16Tf32(acc, &sm.u.inv.L[16 * a][16 * m], LS, &sm.u.inv.X[16 * m][16 * b], LS, lane);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
                {
                    *reinterpret_cast<float2*>(&R[gr][8 * nt + 2 * qd]) = make_float2(acc[nt][0], acc[nt][1]);
                    *reinterpret_cast<float2*>(&R[gr + 8][8 * nt + 2 * qd]) = make_float2(acc[nt][2], acc[nt][3]);
                }
                __syncwarp();
                float x[2][4] = {};
                mmaBlock16Tf32(x, &sm.u.inv.X[16 * a][16 * a], LS, &R[0][0], RS, lane);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
                {
                    float* xo = &sm.u.inv.X[16 * a + gr][16 * b + 8 * nt + 2 * qd];
                    *reinterpret_cast<float2*>(xo) = make_float2(-x[nt][0], -x[nt][1]);
                    *reinterpret_cast<float2*>(xo + 8 * LS) = make_float2(-x[nt][2], -x[nt][3]);
                }
                __syncwarp();
            }
        }
        __syncthreads();
        // Tm' = X diag(beta) (zero above the block diagonal: those blocks of X are never written), 8
        // columns per 16-byte store, and the per-token scalars
#pragma unroll
        for (int it = 0; it < kC * kC / 8 / 128; ++it)
        {
            int const idx = tid + 128 * it, i = idx >> 3, c8 = 8 * (idx & 7);
            uint4 out = make_uint4(0u, 0u, 0u, 0u);
            if ((c8 >> 4) <= (i >> 4))
            {
                float4 const x0 = *reinterpret_cast<float4 const*>(&sm.u.inv.X[i][c8]);
                float4 const x1 = *reinterpret_cast<float4 const*>(&sm.u.inv.X[i][c8 + 4]);
                float4 const b0 = *reinterpret_cast<float4 const*>(&sm.beta[c8]);
                float4 const b1 = *reinterpret_cast<float4 const*>(&sm.beta[c8 + 4]);
                out = make_uint4(pack2<T>(x0.x * b0.x, x0.y * b0.y), pack2<T>(x0.z * b0.z, x0.w * b0.w),
                    pack2<T>(x1.x * b1.x, x1.y * b1.y), pack2<T>(x1.z * b1.z, x1.w * b1.w));
            }
            *reinterpret_cast<uint4*>(tmOut + i * kC + c8) = out;
        }
        if (tid < kC)
        {
            float const G = sm.G[tid], GC = sm.G[kC - 1], eg = __expf(G);
            *reinterpret_cast<float4*>(gqOut + 4 * tid)
                = make_float4(eg * sm.rk[tid], eg * sm.qs[tid], __expf(GC - G) * sm.rk[tid], __expf(GC));
        }
    }
    return c;
}

// Prep kernel: items (chunk id, key head) in chunk-major order, item = blockIdx.x, blockIdx.x + gridDim.x, ...
// (one item per CTA, or a persistent grid when it runs beside the scan). Beside the scan, each item ends
// by adding 1 (release, gpu scope) to the counter of its block of kReadyBlock chunks, which the scan
// waits on. On sm_90 the kernel lets a programmatically dependent scan launch at once
// (griddepcontrol.launch_dependents).
// Beside the scan (ws.ctl set) the grid is persistent and SM-aware: the first prep CTA to start on an SM
// (on either SM of a TPC when the scan runs as clusters of 2: consecutive SM ids) claims it; claims 1 ..
// scanCtas / scanCluster mark the SM (TPC) as kept for the scan and every prep CTA there exits at once
// (claim 0 always works, so some SM always runs prep items and the scan, which waits on them, cannot
// starve). The other CTAs take items from a shared counter, in order.
__device__ __forceinline__ bool prepKeepsSmForScan(ChunkWs const& ws, int* bcast)
{
    enum : int { kFree = 0, kClaiming = 1, kForScan = 2, kWorker = 3 };
    if (threadIdx.x == 0)
    {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        int role = kWorker;
        unsigned const unit = smid / unsigned(ws.scanCluster);  // the SM, or its TPC
        if (unit < unsigned(kCtlSmIds))
        {
            int* slot = ws.ctl + 2 + unit;
            if (atomicCAS(slot, kFree, kClaiming) == kFree)
            {
                int const r = atomicAdd(ws.ctl + 1, 1);
                role = (r >= 1 && r <= ws.scanCtas / ws.scanCluster) ? kForScan : kWorker;
                atomicExch(slot, role);
            }
            else
            {
                while ((role = loadAcquire(slot)) == kClaiming)
                    __nanosleep(32);
            }
        }
        *bcast = role;
    }
    __syncthreads();
    return *bcast == kForScan;
}

// Prep CTAs per SM (registers <= 128 for 4: H100, 16x1K 0.505 -> 0.494 ms, 1x64K after the prep 1.840 ->
// 1.829; K = 256 keeps 3)
template <int K>
constexpr int kPrepCtasPerSm = K <= 128 ? 4 : 3;

// Beside the scan, the prep CTAs of slot s on an SM (blockIdx.x / SMs: the persistent grid fills the SMs slot by
// slot) take their first item s x kStaggerNs after the start, so that the first chunks' items share their SMs
// with fewer others and the scan's first block is ready sooner (without it every item of chunks 0-16 ends
// ~23 us after the start, notes v16). H100, same-process A/Bs, outputs bitwise equal: queued calls 1x4K
// 0.107 -> 0.103 ms, 1x16K 0.329 -> 0.326, 1x64K 1.235 -> 1.233; single calls 0.109 -> 0.107, 0.339 ->
// 0.335, 1.223 -> 1.219; 1 or 3 us per slot equal to 2.
constexpr unsigned long long kStaggerNs = 2000;
template <int K>
__device__ __forceinline__ void prepStaggeredStart()
{
    unsigned const slot = blockIdx.x / max(1u, gridDim.x / unsigned(kPrepCtasPerSm<K>));
    if (slot > 0 && threadIdx.x == 0)
    {
        unsigned long long const t0 = globalTimerNs();
        do
            __nanosleep(256);
        while (globalTimerNs() - t0 < slot * kStaggerNs);
    }
    __syncthreads();
}

template <typename T, int K>
__global__ void __launch_bounds__(128, kPrepCtasPerSm<K>) gdnPrefillPrepKernel(GdnPrefillParams const p, ChunkWs const ws, int nItems)
{
    extern __shared__ __align__(16) unsigned char smemRaw[];
    auto& sm = *reinterpret_cast<PrepSmem<T, K>*>(smemRaw);
    __shared__ int bcast;
    bool const beside = ws.ctl != nullptr;
    if (beside && prepKeepsSmForScan(ws, &bcast))
        return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    if (beside && ws.throttle > 0)  // (every scan CTA has a kept SM: a few long sequences)
        prepStaggeredStart<K>();
    for (int item = blockIdx.x;;)
    {
        __syncthreads();  // the previous item's shared-memory reads (and bcast) are done
        if (beside)
        {
            if (threadIdx.x == 0)
                bcast = atomicAdd(ws.ctl, 1);
            __syncthreads();
            item = bcast;
        }
        if (item >= nItems)
            break;
        int const id = item / p.Hk, hk = item % p.Hk;
        int const c = prepItem<T, K>(p, ws, sm, id, hk);
        if (beside && c >= 0)
        {
            fenceProxyAsyncGlobal();  // the scan reads the slot with bulk copies (async proxy)
            __syncthreads();  // every thread's workspace stores precede the release
            if (threadIdx.x == 0)
                addRelease(readyCounter(ws, p, hk, id - c % kReadyBlock), 1);
        }
        if (!beside)
            item += gridDim.x;
    }
}

} // namespace prefill_chunked
} // namespace gdn
