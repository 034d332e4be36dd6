// weft/attention/cuda/detail/wgmma.cuh — the Hopper (sm_90a) warpgroup tensor-core pieces of the
// wgmma flash kernels (forwards and backwards), and the mbarrier, TMA and setmaxnreg helpers of
// the warp-specialised forwards: shared-memory matrix descriptors for 128-byte-swizzled tiles, the
// cp.async load that writes that swizzle (TMA's SWIZZLE_128B writes the same), and
// wgmma.mma_async m64nNk16 (N 64 or 128) with A in registers or shared memory and B in shared
// memory, f32 accumulation on bf16 or f16 operands.
//
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
// - A in registers (per warp w of the warpgroup, rows 16w..16w+15): the m16n8k16 mma.sync A
//   fragment of mma.cuh, so the packed probabilities feed wgmma unchanged.
// - D (f32): d[j][e] is row 16w + g + 8·(e ≥ 2), column 8j + 2t + (e & 1), g = lane / 4,
//   t = lane % 4: per warp, the C fragments of n8 tiles j = 0..N/8-1 of mma.cuh.
// - B in shared memory, 128-byte swizzle: a tile of R rows and C = 64·c columns of 16-bit
//   elements is stored as c column blocks of R rows x 128 bytes (block b at b·R·128 bytes), and
//   the 16-byte chunk k of row r at chunk k ^ (r % 8) (TMA's SWIZZLE_128B; the base 1024-byte
//   aligned). Read K-major (rows = N, the contiguous columns = K: K of S = Q Kᵀ), the descriptor's
//   stride byte offset (SBO) is the 1024 bytes between 8-row groups, the leading byte offset
//   (LBO) is unused (0), and the k16 step adds 32 bytes to the start address within a block; read
//   MN-major (rows = K, columns = N: V of O += P V, imm-trans-b = 1), SBO is the 1024 bytes between
//   groups of 8 K rows and the leading byte offset (LBO) the R·128 bytes between 64-column blocks
//   along N.
//
// Only an sm_90a build (CMake architecture 90a) has these instructions; elsewhere the wrappers
// compile to a trap and the host never selects the kernel (flash_detail::wgmma_usable).
// The mma_rs bodies are generated (one operand per accumulator register), not hand-typed.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/detail/wgmma.cuh holds CUDA device code: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/cuda/detail/mma.cuh>

#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WEFT_WGMMA_DEVICE 1
#else
#define WEFT_WGMMA_DEVICE 0
#endif

namespace weft::attention::kernels::wgmma {

//! Byte offset of element (r, c) of a 16-bit R-row tile in the 128-byte swizzled layout.
template <int R>
__host__ __device__ constexpr std::uint32_t sw128_offset(int r, int c) {
  return std::uint32_t((c / 64) * R * 128 + r * 128 + ((((c % 64) / 8) ^ (r % 8)) << 4) +
                       (c % 8) * 2);
}

//! A 128-byte-swizzle shared-memory matrix descriptor: start address (shared window, 1024-byte
//! aligned atoms), LBO and SBO in bytes.
__host__ __device__ constexpr std::uint64_t sw128_desc(std::uint32_t smem_byte_addr,
                                                       std::uint32_t lbo, std::uint32_t sbo) {
  return std::uint64_t((smem_byte_addr & 0x3FFFFu) >> 4) |
         (std::uint64_t((lbo & 0x3FFFFu) >> 4) << 16) |
         (std::uint64_t((sbo & 0x3FFFFu) >> 4) << 32) | (std::uint64_t(1) << 62);
}

//! k16 step kk of a swizzled R-row tile at `base` read K-major (its rows are M or N, its columns
//! K): 4 steps of 32 bytes in a 64-column block, the blocks R·128 bytes apart.
template <int R>
__host__ __device__ constexpr std::uint64_t kmajor_step(std::uint32_t base, int kk) {
  return sw128_desc(base + std::uint32_t(kk / 4) * R * 128 + std::uint32_t(kk % 4) * 32, 0, 1024);
}

//! k16 step kk of a swizzled R-row tile at `base` read MN-major (its rows are K, its columns M or
//! N): 16 rows (2048 bytes) a step, the 64-column blocks along M or N R·128 bytes apart (LBO).
template <int R>
__host__ __device__ constexpr std::uint64_t mnmajor_step(std::uint32_t base, int kk) {
  return sw128_desc(base + std::uint32_t(kk) * 2048, R * 128, 1024);
}

//! Rows [0, R) x [0, C) of a tile into the swizzled layout at `dst` (shared byte address) by
//! 16-byte cp.async chunks; rows at or past `valid` are zero-filled (mma::load_rows_async).
template <int R, int C, int NT, class T>
__device__ __forceinline__ void load_tile_sw128(std::uint32_t dst, T const* base, std::int64_t ld,
                                                std::int64_t valid, T const* fallback,
                                                int tid = static_cast<int>(threadIdx.x)) {
  mma::load_rows_async<R, C, NT>([dst](int r, int c) { return dst + sw128_offset<R>(r, c); }, base,
                                 ld, valid, fallback, tid);
}

//! Makes this thread's generic-proxy writes to shared memory (cp.async included) visible to the
//! async proxy that wgmma reads through; before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async() {
#if WEFT_WGMMA_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fence() {
#if WEFT_WGMMA_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if WEFT_WGMMA_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait() {
#if WEFT_WGMMA_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
//! Pins accumulator registers across the asynchronous MMA (the compiler must neither move nor
//! reuse them between the issue and the wait).
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

//! The same for register A operands (the packed fragments must be final before wgmma.fence).
template <int N>
__device__ __forceinline__ void fence_operands(std::uint32_t (&a)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[j][e])::"memory");
}

//! mbarriers (64-bit, in shared memory, 8-byte aligned) for the warp-specialised kernels: a
//! producer's loads complete a barrier's phase, consumers wait for it by its parity, and their
//! arrivals on another barrier hand the buffer back.
__device__ __forceinline__ void mbar_init(std::uint32_t bar, unsigned count) {
#if WEFT_WGMMA_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#else
  __trap();
#endif
}
//! One arrival (release semantics at CTA scope: this thread's earlier writes are visible to a
//! thread whose wait sees the phase complete).
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
#if WEFT_WGMMA_DEVICE
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
               : "memory");
#else
  __trap();
#endif
}
//! Whether the phase of parity `parity` has completed (acquire semantics when it has).
__device__ __forceinline__ bool mbar_try_wait(std::uint32_t bar, unsigned parity) {
#if WEFT_WGMMA_DEVICE
  unsigned done = 0;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
#else
  __trap();
  return false;
#endif
}
//! Waits for the phase of parity `parity`; traps (a launch error, not a hang) if it has not
//! completed after about 2^32 clock cycles, which only a broken pipeline takes. For a producer
//! warpgroup, whose register budget setmaxnreg lowered.
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, unsigned parity) {
  long long const t0 = clock64();
  while (!mbar_try_wait(bar, parity))
    if (clock64() - t0 > (1LL << 32)) __trap();
}
//! The same wait without the trap, for the consumer warpgroups whose budget setmaxnreg raised: a
//! trap in such a region makes ptxas allocate the whole region within the launch's register count
//! (168 for 384 threads; measured with CUDA 13.0: the warp-specialised forwards at d = 128 spilled
//! 16 and 240 bytes with it, none without). A consumer's wait ends when its producer's loads
//! land, and the producer's own waits trap.
__device__ __forceinline__ void mbar_wait_spin(std::uint32_t bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {}
}
//! One arrival that also expects `bytes` more of transactions (TMA loads completing on this
//! barrier) in the current phase: the phase completes when both the arrivals and the bytes are in.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
#if WEFT_WGMMA_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}
//! Makes initialised mbarriers visible to the async proxy (TMA's complete_tx); before the
//! barrier that publishes them.
__device__ __forceinline__ void fence_mbarrier_init() {
#if WEFT_WGMMA_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
//! A TMA tile load: the box of the 4-D tensor map `map` (the address of a __grid_constant__
//! CUtensorMap kernel parameter) at coordinates c0..c3 (innermost first) into shared memory at
//! `dst`, completing `bytes` of mbarrier `bar`'s transactions when it lands. The map's swizzle
//! decides the layout in shared memory (128-byte swizzle: dst 1024-byte aligned).
__device__ __forceinline__ void tma_load_4d(std::uint32_t dst, void const* map, std::uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
#if WEFT_WGMMA_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#else
  __trap();
#endif
}
//! A 1-D bulk copy (TMA without a tensor map): `bytes` contiguous bytes of global memory at `src`
//! into shared memory at `dst` (both 16-byte aligned, bytes a multiple of 16), completing `bytes`
//! of mbarrier `bar`'s transactions when they land.
__device__ __forceinline__ void bulk_load(std::uint32_t dst, void const* src, std::uint32_t bytes,
                                          std::uint32_t bar) {
#if WEFT_WGMMA_DEVICE
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
#else
  __trap();
#endif
}
//! Brings a tensor map (a __grid_constant__ kernel parameter) into the TMA unit's cache.
__device__ __forceinline__ void prefetch_tensor_map(void const* map) {
#if WEFT_WGMMA_DEVICE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
#endif
}
//! Raises (inc) or lowers (dec) this warpgroup's register budget to N per thread (setmaxnreg;
//! every warp of the warpgroup executes it).
template <unsigned N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if WEFT_WGMMA_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <unsigned N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if WEFT_WGMMA_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

#if WEFT_WGMMA_DEVICE
// One asm statement per shape and operand source, the element type (a string literal) spliced
// in: one operand per accumulator register, as PTX requires (generated, not hand-typed). The
// accumulators' place in the instruction text (ACC) and their operand list (D) are shared by the
// register-A and shared-A forms; N128's operand list extends N64's.
#define WEFT_WGMMA_ACC_N64                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define WEFT_WGMMA_ACC_N128                                                         \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
#define WEFT_WGMMA_D_N64                                                                        \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])

#define WEFT_WGMMA_D_N128                                                                          \
  WEFT_WGMMA_D_N64, "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]),     \
      "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), \
      "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),              \
      "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]),              \
      "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]),              \
      "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]),              \
      "+f"(d[15][3])

#define WEFT_WGMMA_RS_N64(TY)                                                        \
  asm volatile(                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                   \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " WEFT_WGMMA_ACC_N64 \
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                \
      : WEFT_WGMMA_D_N64                                                             \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(TransB))

#define WEFT_WGMMA_RS_N128(TY)                                                         \
  asm volatile(                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                     \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " WEFT_WGMMA_ACC_N128 \
      "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"                                  \
      : WEFT_WGMMA_D_N128                                                              \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(TransB))

#define WEFT_WGMMA_SS_N64(TY)                                                        \
  asm volatile(                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                   \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " WEFT_WGMMA_ACC_N64 \
      "%32, %33, p, 1, 1, %35, %36;\n}\n"                                            \
      : WEFT_WGMMA_D_N64                                                             \
      : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(TransA), "n"(TransB))

#define WEFT_WGMMA_SS_N128(TY)                                                         \
  asm volatile(                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                     \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " WEFT_WGMMA_ACC_N128 \
      "%64, %65, p, 1, 1, %67, %68;\n}\n"                                              \
      : WEFT_WGMMA_D_N128                                                              \
      : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(TransA), "n"(TransB))

// d (+)= a · B: m64nNk16, A (bf16 or f16) from registers, B by descriptor (TransB 0: K-major,
// 1: MN-major), f32 accumulators; scale_d 0 overwrites d.
template <bool BF16, int TransB>
__device__ __forceinline__ void mma_rs(float (&d)[8][4], std::uint32_t const (&a)[4],
                                       std::uint64_t b_desc, int scale_d) {
  if constexpr (BF16)
    WEFT_WGMMA_RS_N64("bf16");
  else
    WEFT_WGMMA_RS_N64("f16");
}
template <bool BF16, int TransB>
__device__ __forceinline__ void mma_rs(float (&d)[16][4], std::uint32_t const (&a)[4],
                                       std::uint64_t b_desc, int scale_d) {
  if constexpr (BF16)
    WEFT_WGMMA_RS_N128("bf16");
  else
    WEFT_WGMMA_RS_N128("f16");
}
// d (+)= A · B: m64nNk16, A and B by descriptor (TransA / TransB 0: K-major, 1: MN-major).
template <bool BF16, int TransA, int TransB>
__device__ __forceinline__ void mma_ss(float (&d)[8][4], std::uint64_t a_desc, std::uint64_t b_desc,
                                       int scale_d) {
  if constexpr (BF16)
    WEFT_WGMMA_SS_N64("bf16");
  else
    WEFT_WGMMA_SS_N64("f16");
}
template <bool BF16, int TransA, int TransB>
__device__ __forceinline__ void mma_ss(float (&d)[16][4], std::uint64_t a_desc,
                                       std::uint64_t b_desc, int scale_d) {
  if constexpr (BF16)
    WEFT_WGMMA_SS_N128("bf16");
  else
    WEFT_WGMMA_SS_N128("f16");
}
#undef WEFT_WGMMA_RS_N64
#undef WEFT_WGMMA_RS_N128
#undef WEFT_WGMMA_SS_N64
#undef WEFT_WGMMA_SS_N128
#undef WEFT_WGMMA_D_N64
#undef WEFT_WGMMA_ACC_N64
#undef WEFT_WGMMA_ACC_N128
#undef WEFT_WGMMA_D_N128
#else
template <bool BF16, int TransA, int TransB, int N>
__device__ __forceinline__ void mma_ss(float (&)[N][4], std::uint64_t, std::uint64_t, int) {
  __trap();
}
template <bool BF16, int TransB, int N>
__device__ __forceinline__ void mma_rs(float (&)[N][4], std::uint32_t const (&)[4], std::uint64_t,
                                       int) {
  __trap();
}
#endif

}  // namespace weft::attention::kernels::wgmma
