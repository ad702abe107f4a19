// Prep kernel of the chunked prefill (gdnPrefillChunked.cuh has the workspace layout and the math),
// private to gdnPrefill.cu: per (chunk id, key head) item, q.k^T, k.k^T and the diagonal of q.q^T (the
// squared norms) on tensor cores (mma.sync), then per value head of the group the gates' cumulative sum (each
// warp its own copy), the decayed L and Aqk (each warp's rows compiled for that warp; left of its diagonal
// block a decay is a row factor times a column factor, no ex2 per entry), (I + L)^-1 by 16x16 blocks (fp32
// forward substitution on the diagonal blocks, tf32 tensor-core products below them, in two levels: the 32x32
// diagonal halves, then their off-diagonal block) and the workspace slot (Tm', Aqk, per-token factors): 3 CTA
// barriers per value head. One item per CTA, or beside the scan a persistent grid that keeps SMs free for it
// and publishes ready counters.
#pragma once

#include "gdnPrefillChunked.cuh"

namespace gdn
{
namespace prefill_chunked
{

// 2^x by ex2.approx.ftz: one MUFU where __expf adds a multiply and the denormal range scaling (results below
// 2^-126 flush to 0: decays where such values are noise). The gate sums are kept in log2 units (G log2 e).
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float exp2Ftz(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

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
            float R[4][16][RS];    // per-warp 16x16 block products (T_0c is read by warp 2 + c too)
        } inv;
    } u;
    // the current value head's gate sums and betas, one copy per warp (each warp computes them itself: no CTA
    // barrier between the gates and their use; 16-byte aligned: read as float2 / float4 vectors)
    alignas(16) float G[4][kC];
    alignas(16) float beta[4][kC];
    alignas(16) float cf[4][kC];  // warp w's column factors rk_j 2^(G_16w - G_j), j < 16w (its own copy)
    alignas(16) float qs[kC];
    alignas(16) float rk[kC];
};

// Named barrier 1 + c (c = 0, 1) of the 64 threads of warps c and 2 + c (immediate ids: ptxas then reserves only
// the barriers used). Both warps wait (bar.sync), although the producing warp c need only arrive: racecheck mis-tracks
// bar.arrive beside a second named barrier and then reports the next value head's L stores against this head's reads
// (a false positive, tests/kernels/sanitizer/sync_patterns.cu, mode prep_pairs); the wait costs nothing measurable
// (both warps reach the barrier after the same block products; docs/kernels.md, Sanitizers).
__device__ __forceinline__ void pairBarSync(int c)
{
    if (c == 0)
        asm volatile("bar.sync 1, 64;\n" ::: "memory");
    else
        asm volatile("bar.sync 2, 64;\n" ::: "memory");
}

// acc (16x16, C layout of two n8 tiles) -> a row-major fp32 block at dst (row stride ld), negated if neg
__device__ __forceinline__ void storeBlock16(float* dst, int ld, float const (&acc)[2][4], bool neg, int lane)
{
    int const gr = lane >> 2, qd = lane & 3;
    float const sg = neg ? -1.f : 1.f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
    {
        float* d = dst + gr * ld + 8 * nt + 2 * qd;
        *reinterpret_cast<float2*>(d) = make_float2(sg * acc[nt][0], sg * acc[nt][1]);
        *reinterpret_cast<float2*>(d + 8 * ld) = make_float2(sg * acc[nt][2], sg * acc[nt][3]);
    }
}

// Gram products of warp W (rows 16W..16W+15): k.k^T and q.k^T (n8 tiles of the column blocks <= W) and the
// diagonal block of q.q^T. (W stays a run-time value here: a copy per warp, as prepRows has, was not faster
// beside the scan; docs/performance.md, Prep rows per warp.)
template <typename T, int K>
__device__ __forceinline__ void prepGram(
    PrepSmem<T, K>& sm, float (&kk)[8][4], float (&qk)[8][4], float (&qq)[2][4], int W, int lane)
{
    constexpr int KS = PrepSmem<T, K>::KS;
    int const aRow = ((lane >> 3) & 1) * 8 + (lane & 7), aCol = (lane >> 4) * 8;
    uint32_t const aBaseK = smemAddr(&sm.u.in.k[16 * W + aRow][aCol]);
    uint32_t const aBaseQ = aBaseK - uint32_t(sizeof(sm.u.in.q));  // (q precedes k: an immediate offset)
#pragma unroll
    for (int s = 0; s < K / 16; ++s)
    {
        // A fragments straight from ldmatrix (lanes 8m..8m+7: rows 8 (m & 1) + 0..7, columns 8 (m >> 1) of the k16
        // step: (0-7,lo), (8-15,lo), (0-7,hi), (8-15,hi), the fragment's register order, so no moves)
        uint32_t a1[4], a2[4];
        ldsmX4(a1, aBaseK + 32u * s);
        ldsmX4(a2, aBaseQ + 32u * s);
        {
            uint32_t b[4];
            ldsmX4(b, ldsmRowsNK(&sm.u.in.q[0][0], KS, W, s, lane));
            mma16816<T>(qq[0], a2, b[0], b[1]);
            mma16816<T>(qq[1], a2, b[2], b[3]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
        {
            if (j > W)
                break;  // only the lower triangle (column blocks <= row block) is used
            uint32_t b[4];
            ldsmX4(b, ldsmRowsNK(&sm.u.in.k[0][0], KS, j, s, lane));
            mma16816<T>(kk[2 * j], a1, b[0], b[1]);
            mma16816<T>(kk[2 * j + 1], a1, b[2], b[3]);
            mma16816<T>(qk[2 * j], a2, b[0], b[1]);
            mma16816<T>(qk[2 * j + 1], a2, b[2], b[3]);
        }
    }
}

// Warp W's rows of L and Aqk for one value head (gate sums Gw in log2 units, betas bw, column factors cfw):
// L_ij = beta_i rk_i rk_j 2^{G_i - G_j} k_i.k_j (j < i) into shared memory and Aqk_ij = qs_i rk_j 2^{G_i - G_j}
// q_i.k_j (j <= i) to the workspace, from the accumulators of rows i = 8 rg + lane/4 (rg = 2W + hh), columns
// 8 j + 2 (lane%4) + {0, 1}. Left of the warp's diagonal 16x16 block the decay is the product of a row factor
// 2^{G_i - G_16W} and the column factor rk_j 2^{G_16W - G_j} (both <= 1: no overflow, and the product
// underflows only where the decay does); in the diagonal block it is one ex2 per entry, the 8x8 diagonal
// block masked; above it Aqk = 0 and L is not written (the inverse reads only its lower blocks).
template <typename T, int LS, int W>
__device__ __forceinline__ void prepRows(float const (&kk)[8][4], float const (&qk)[8][4], float const* Gw,
    float const* bw, float const* cfw, float const* rk, float const* qs, float (*L)[LS], T* aqkOut, int lane)
{
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
    {
        int const rg = 2 * W + hh, i = 8 * rg + (lane >> 2);
        float const Gi = Gw[i], bi = bw[i] * rk[i], qi = qs[i];
        float const rowf = W == 0 ? 1.f : exp2Ftz(Gi - Gw[16 * W]);
        float const Bi = bi * rowf, Qi = qi * rowf;
#pragma unroll
        for (int j = 0; j < 8; ++j)
        {
            int const jj = 8 * j + 2 * (lane & 3);
            uint32_t packed = 0u;
            if (j < 2 * W)
            {
                float2 const cj = *reinterpret_cast<float2 const*>(&cfw[jj]);
                float const l0 = Bi * (cj.x * kk[j][2 * hh]), l1 = Bi * (cj.y * kk[j][2 * hh + 1]);
                *reinterpret_cast<float2*>(&L[i][jj]) = make_float2(l0, l1);
                packed = pack2<T>(Qi * (cj.x * qk[j][2 * hh]), Qi * (cj.y * qk[j][2 * hh + 1]));
            }
            else if (j <= rg)
            {
                float2 const Gj = *reinterpret_cast<float2 const*>(&Gw[jj]);
                float2 const rj = *reinterpret_cast<float2 const*>(&rk[jj]);
                // (2^{G_i - G_j} of j > i may overflow: only selected away below, never multiplied in)
                float const d0 = exp2Ftz(Gi - Gj.x) * rj.x, d1 = exp2Ftz(Gi - Gj.y) * rj.y;
                float l0 = bi * d0 * kk[j][2 * hh], l1 = bi * d1 * kk[j][2 * hh + 1];
                float a0 = qi * d0 * qk[j][2 * hh], a1 = qi * d1 * qk[j][2 * hh + 1];
                if (j == rg)
                {
                    l0 = jj < i ? l0 : 0.f;
                    l1 = jj + 1 < i ? l1 : 0.f;
                    a0 = jj <= i ? a0 : 0.f;
                    a1 = jj + 1 <= i ? a1 : 0.f;
                }
                *reinterpret_cast<float2*>(&L[i][jj]) = make_float2(l0, l1);
                packed = pack2<T>(a0, a1);
            }
            *reinterpret_cast<uint32_t*>(aqkOut + i * kC + jj) = packed;
        }
    }
}

// One work item (chunk id, key head): q, k and their Gram products are shared by the Hv/Hk value heads
// of the group, which then run the gate-dependent part one after the other.
// Returns the chunk's index in its sequence, or -1 for an unused id.
template <typename T, int K>
__device__ __forceinline__ int prepItem(GdnPrefillParams const& p, ChunkWs const& ws, PrepSmem<T, K>& sm, int id, int hk)
{
    constexpr int KS = PrepSmem<T, K>::KS;
    int const tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int const n = seqOfChunk(p.cuSeqlens, p.N, id);
    SeqRange const seq = seqRange(p.cuSeqlens, n, p.T);
    int const bos = seq.begin, L = seq.end - seq.begin;
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

    // raw q, k rows -> shared (16 B copies, zero rows past the end): thread tid copies the 16-byte column tid % CPR
    // of the rows tid / CPR + RPI m (rows past the end read nothing from row 0's address)
    {
        constexpr int VEC = 8, CPR = K / VEC, RPI = 128 / CPR;  // 16-bit elements per 16 B, copies per row, rows
        int const r0 = tid / CPR, cc = (tid % CPR) * VEC;
        int64_t const rowStride = (int64_t)Hk * K;
        T const* const q0 = static_cast<T const*>(p.q) + (int64_t)t0 * rowStride + (int64_t)hk * K + cc;
        T const* const k0 = static_cast<T const*>(p.k) + (int64_t)t0 * rowStride + (int64_t)hk * K + cc;
        uint32_t const sq0 = smemAddr(&sm.u.in.q[r0][cc]), sk0 = smemAddr(&sm.u.in.k[r0][cc]);
#pragma unroll
        for (int m = 0; m < kC / RPI; ++m)
        {
            int const r = r0 + RPI * m;
            bool const ok = r < len;
            int64_t const off = ok ? r * rowStride : 0;
            constexpr uint32_t kRowBytes = PrepSmem<T, K>::KS * sizeof(T);
            cpAsync16(sq0 + RPI * m * kRowBytes, q0 + off, ok ? 16 : 0);
            cpAsync16(sk0 + RPI * m * kRowBytes, k0 + off, ok ? 16 : 0);
        }
    }
    cpAsyncCommit();
    // raw gate inputs of tokens t0 + lane and t0 + lane + 32 for value head hh (every warp: each computes the
    // gates itself)
    float gRaw[2] = {0.f, 0.f}, bRaw[2] = {0.f, 0.f};
    auto loadGateRaw = [&](int hh)
    {
#pragma unroll
        for (int e = 0; e < 2; ++e)
            if (lane + 32 * e < len)
            {
                int64_t const gi = (int64_t)(t0 + lane + 32 * e) * Hv + hh;
                gRaw[e] = loadAny(p.g, p.gateType, gi);
                bRaw[e] = loadAny(p.beta, p.gateType, gi);
            }
    };
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
    prepGram<T, K>(sm, kk, qk, qq, warp, lane);
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
    __syncthreads();  // norms written; every warp's reads of q and k done (L and X overlay them)
    for (int h = hk * grp; h < (hk + 1) * grp; ++h)
    {
        // The gates and their cumulative sum, computed by every warp into its own copy (lane: tokens lane and
        // lane + 32). The previous head's last reads of the copy were this warp's own (Tm' and factor stores):
        // a warp barrier orders them before the new values (the shuffles below order execution, not memory).
        __syncwarp();
        float* const Gw = sm.G[warp];
        float* const bw = sm.beta[warp];
        {
            float g[2], b[2];
#pragma unroll
            for (int e = 0; e < 2; ++e)
            {
                g[e] = b[e] = 0.f;
                if (lane + 32 * e < len)
                {
                    Gate const gt = computeGate(p.gateMode, gRaw[e], bRaw[e], p.ALog, p.dtBias, h);
                    g[e] = gt.g;
                    b[e] = gt.beta;
                }
            }
            if (h + 1 < (hk + 1) * grp)
                loadGateRaw(h + 1);  // the next head's gates, in flight during this head's work
#pragma unroll
            for (int o = 1; o < 32; o <<= 1)
            {
                float const y0 = __shfl_up_sync(0xffffffffu, g[0], o);
                float const y1 = __shfl_up_sync(0xffffffffu, g[1], o);
                if (lane >= o)
                    g[0] += y0, g[1] += y1;
            }
            g[1] += __shfl_sync(0xffffffffu, g[0], 31);
            Gw[lane] = g[0] * kLog2e;  // (log2 units: the decays below are single ex2)
            Gw[lane + 32] = g[1] * kLog2e;
            bw[lane] = b[0];
            bw[lane + 32] = b[1];
            // column factors rk_j 2^{G_16w - G_j} of the columns j < 16 w left of the warp's diagonal block
            float const gd = __shfl_sync(0xffffffffu, warp < 2 ? g[0] : g[1], (16 * warp) & 31);
            if (lane < 16 * warp)
                sm.cf[warp][lane] = sm.rk[lane] * exp2Ftz((gd - g[0]) * kLog2e);
            if (lane + 32 < 16 * warp)
                sm.cf[warp][lane + 32] = sm.rk[lane + 32] * exp2Ftz((gd - g[1]) * kLog2e);
            __syncwarp();
        }
        int64_t const slot = (int64_t)id * Hv + h;
        T* aqkOut = static_cast<T*>(ws.aqk) + slot * (kC * kC);
        T* tmOut = static_cast<T*>(ws.tm) + slot * (kC * kC);
        float* gqOut = ws.gq + slot * (4 * kC);
        {
            constexpr int LS = PrepSmem<T, K>::LS;
            switch (warp)  // (compile-time rows: no branch on the warp in the unrolled loop)
            {
            case 0: prepRows<T, LS, 0>(kk, qk, Gw, bw, sm.cf[0], sm.rk, sm.qs, sm.u.inv.L, aqkOut, lane); break;
            case 1: prepRows<T, LS, 1>(kk, qk, Gw, bw, sm.cf[1], sm.rk, sm.qs, sm.u.inv.L, aqkOut, lane); break;
            case 2: prepRows<T, LS, 2>(kk, qk, Gw, bw, sm.cf[2], sm.rk, sm.qs, sm.u.inv.L, aqkOut, lane); break;
            default: prepRows<T, LS, 3>(kk, qk, Gw, bw, sm.cf[3], sm.rk, sm.qs, sm.u.inv.L, aqkOut, lane); break;
            }
        }
        // (I + L)^-1 by 16x16 blocks X_ab (tf32 tensor-core products, fp32 accumulate; their rounding, 2^-11, is
        // below the 16-bit rounding of the Tm' that is stored). The previous head's reads of X (Tm' stores)
        // are done: every thread passed them before this barrier.
        __syncthreads();  // L
        constexpr int LS = PrepSmem<T, K>::LS, RS = PrepSmem<T, K>::RS;
        auto& L = sm.u.inv.L;
        auto& X = sm.u.inv.X;
        float(&R)[16][RS] = sm.u.inv.R[warp];
        if (warp < 2)
        {
            // warp w: X_aa = (I + L_aa)^-1 of a = 2w (lanes 0-15) and 2w + 1 (lanes 16-31) by forward substitution
            // (one column per lane, fp32), then X_{2w+1, 2w} = -X_{2w+1, 2w+1} L_{2w+1, 2w} X_{2w, 2w}
            int const a = 2 * warp + (lane >> 4), cl = lane & 15, o = 16 * a;
            float x[16];
#pragma unroll
            for (int i = 0; i < 16; ++i)
            {
                float acc = (i == cl) ? 1.f : 0.f;
#pragma unroll
                for (int j = 0; j < i; ++j)
                    acc = fmaf(-L[o + i][o + j], x[j], acc);
                x[i] = acc;
            }
#pragma unroll
            for (int i = 0; i < 16; ++i)
                X[o + i][o + cl] = x[i];
            __syncwarp();
            int const lo = 32 * warp, hi = lo + 16;
            float t[2][4] = {};
            mmaBlock16Tf32(t, &L[hi][lo], LS, &X[lo][lo], LS, lane);
            storeBlock16(&R[0][0], RS, t, false, lane);
            __syncwarp();
            float y[2][4] = {};
            mmaBlock16Tf32(y, &X[hi][hi], LS, &R[0][0], RS, lane);
            storeBlock16(&X[hi][lo], LS, y, true, lane);
        }
        __syncthreads();  // the 32x32 diagonal halves A = X[0:32, 0:32] and B = X[32:64, 32:64]
        {
            // X[32:64, 0:32] = -B T with T = L[32:64, 0:32] A, by 16x16 blocks: warp w = 2r + c computes T_rc
            // (T_r0 = L_{2+r,0} X_00 + L_{2+r,1} X_10, T_r1 = L_{2+r,1} X_11), then X_{2+r,c} = -X_22 T_0c (r = 0)
            // or -(X_32 T_0c + X_33 T_1c) (r = 1), reading warp c's T_0c after a barrier of the warp pair (c, 2 + c).
            int const r = warp >> 1, c = warp & 1, row = 32 + 16 * r;
            float t[2][4] = {};
            if (c == 0)
                mmaBlock16Tf32(t, &L[row][0], LS, &X[0][0], LS, lane);
            mmaBlock16Tf32(t, &L[row][16], LS, &X[16][16 * c], LS, lane);
            storeBlock16(&R[0][0], RS, t, false, lane);
            float const(&T0)[16][RS] = sm.u.inv.R[c];  // T_0c
            float y[2][4] = {};
            __syncwarp();
            pairBarSync(c);
            if (r == 0)
                mmaBlock16Tf32(y, &X[32][32], LS, &T0[0][0], RS, lane);
            else
            {
                mmaBlock16Tf32(y, &X[48][32], LS, &T0[0][0], RS, lane);
                mmaBlock16Tf32(y, &X[48][48], LS, &R[0][0], RS, lane);
            }
            storeBlock16(&X[row][16 * c], LS, y, true, lane);
        }
        __syncthreads();  // X
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
                float4 const b0 = *reinterpret_cast<float4 const*>(&bw[c8]);
                float4 const b1 = *reinterpret_cast<float4 const*>(&bw[c8 + 4]);
                out = make_uint4(pack2<T>(x0.x * b0.x, x0.y * b0.y), pack2<T>(x0.z * b0.z, x0.w * b0.w),
                    pack2<T>(x1.x * b1.x, x1.y * b1.y), pack2<T>(x1.z * b1.z, x1.w * b1.w));
            }
            *reinterpret_cast<uint4*>(tmOut + i * kC + c8) = out;
        }
        if (tid < kC)
        {
            float const G = Gw[tid], GC = Gw[kC - 1], eg = exp2Ftz(G);  // (G in log2 units)
            *reinterpret_cast<float4*>(gqOut + 4 * tid)
                = make_float4(eg * sm.rk[tid], eg * sm.qs[tid], exp2Ftz(GC - G) * sm.rk[tid], exp2Ftz(GC));
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
            int* slot = ws.ctl + kCtlRoles + unit;
            if (atomicCAS(slot, kFree, kClaiming) == kFree)
            {
                int const r = atomicAdd(ws.ctl + kCtlClaims, 1);
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

// Beside the scan, the prep CTAs of slot s on an SM (blockIdx.x / SMs: the persistent grid fills the SMs slot by
// slot) take their first item s x kStaggerNs after the start, so that the first chunks' items share their SMs
// with fewer others and the scan's first block is ready sooner.
template <int K>
__device__ __forceinline__ void prepStaggeredStart()
{
    unsigned const slot = blockIdx.x / max(1u, gridDim.x / unsigned(kPrepCtasPerSmBeside<K>));
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
                bcast = atomicAdd(ws.ctl + kCtlNextItem, 1);
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
