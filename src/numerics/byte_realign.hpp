// Byte realignment of a run that lanes hold in registers, for aligned vector stores of a run that
// starts at an unaligned address (the columnwise codes of the quantize tile kernel,
// src/quantize/cuda/tile_store.cuh: each column's run in the expert's [K, m_g] block starts
// wherever col * m_g lands). Host + device so the CPU tests pin it down exhaustively.
#pragma once

#include <cstdint>
#include <cstring>

#include "groupmm/convert.hpp"

namespace groupmm::qnum {

// Bytes [b, b + 4N) of the 8N-byte sequence own ++ next (little-endian: byte 0 is the low byte
// of own[0]), for 0 <= b < 4N. Branch-free: the whole-word part of the shift in log steps of
// selects between registers of constant index (a select chain on a run-time word index is
// compiled back into an indexed local-memory array), then funnel shifts.
template <int N>
GROUPMM_HD void realign_bytes(const uint32_t (&own)[N], const uint32_t (&next)[N], int b,
                              uint32_t (&out)[N]) {
  static_assert(N == 2 || N == 4, "runs of 8 or 16 bytes");
  const int q = b >> 2;             // whole words skipped, 0 .. N - 1
  const uint32_t r = (b & 3) * 8u;  // bit shift within a word
  uint32_t c[2 * N];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < N; ++j) {
    c[j] = own[j];
    c[N + j] = next[j];
  }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int step = 1; step < N; step *= 2) {
    const bool sh = (q & step) != 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k + step < 2 * N; ++k) c[k] = sh ? c[k + step] : c[k];
  }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < N; ++j) {
#if defined(__CUDA_ARCH__)
    out[j] = __funnelshift_r(c[j], c[j + 1], r);
#else
    out[j] = static_cast<uint32_t>(((uint64_t(c[j + 1]) << 32) | c[j]) >> r);
#endif
  }
}

// A column run of len bytes at `run` (len <= 8 x 4N), held by 8 lanes: lane rg holds the bytes
// [4N rg, 4N rg + 4N) ("own"). Stored in kB = 4N-byte chunks aligned in memory: b head bytes up
// to the first boundary (col_run_head), then lane rg's realigned chunk at run + b + kB rg, whole
// chunks by one vector store each, the head and the last partial chunk by byte stores spread
// over the 8 lanes (store_col_run_edges): the store instructions of a partial chunk, not its
// bytes, are what an unaligned run costs (bench/RESULTS.md, round 11). No byte outside
// [run, run + len) is written: neighbouring runs belong to other tiles. The CPU tests run the 8
// lanes for every misalignment and length.

template <int N>
GROUPMM_HD int col_run_head(const uint8_t* run) {
  constexpr int kB = 4 * N;
  return static_cast<int>((kB - (reinterpret_cast<uintptr_t>(run) & (kB - 1))) & (kB - 1));
}

// The lane whose realigned chunk holds the run's last, partial chunk (when there is one).
template <int N>
GROUPMM_HD int col_run_tail_lane(int len, int b) {
  const int t = len > b ? (len - b) / (4 * N) : 0;
  return t < 7 ? t : 7;
}

// Lane rg's whole chunk: o = realign_bytes(own, lane rg + 1's own, b).
template <int N>
GROUPMM_HD void store_col_run_chunk(uint8_t* run, int len, int rg, int b, const uint32_t (&o)[N]) {
  constexpr int kB = 4 * N;
  const int start = b + kB * rg;
  if (start + kB > len) return;
#if defined(__CUDA_ARCH__)
  if constexpr (N == 4) {
    __stcs(reinterpret_cast<uint4*>(run + start), make_uint4(o[0], o[1], o[2], o[3]));
  } else {
    __stcs(reinterpret_cast<uint2*>(run + start), make_uint2(o[0], o[1]));
  }
#else
  std::memcpy(run + start, o, kB);  // little-endian, as the device's vector store
#endif
}

// Byte i of w (0 <= i < 4N), by selects on the bits of i (see realign_bytes).
template <int N>
GROUPMM_HD uint8_t byte_at(const uint32_t (&w)[N], int i) {
  uint32_t v;
  if constexpr (N == 4) {
    const uint32_t lo = (i & 8) ? w[2] : w[0], hi = (i & 8) ? w[3] : w[1];
    v = (i & 4) ? hi : lo;
  } else {
    v = (i & 4) ? w[1] : w[0];
  }
  return static_cast<uint8_t>(v >> (8 * (i & 3)));
}

// The run's edges: the head bytes [0, hb), hb = min(b, len), from head = lane 0's own, and the
// last partial chunk [tail_at, len) from tail = lane col_run_tail_lane's realigned chunk, as one
// list of byte slots (head, then tail) spread over the 8 lanes: lane rg writes slots rg + 8s.
// hb + (len - tail_at) is kB or 0 when len % kB == 0 (every full tile: its b head bytes and
// kB - b tail bytes), so a full tile's edges take kB / 8 byte-store instructions (a separate
// head and tail took twice as many); a partial tile takes up to twice that. kAligned (b == 0 for
// every lane) has no head.
template <int N, bool kAligned>
GROUPMM_HD void store_col_run_edges(uint8_t* run, int len, int rg, int b, const uint32_t (&head)[N],
                                    const uint32_t (&tail)[N]) {
  constexpr int kB = 4 * N;
  const int hb = kAligned ? 0 : (b < len ? b : len);
  const int tail_at = len > b ? b + (len - b) / kB * kB : len;  // = len: no partial chunk
  const int slots = hb + (len - tail_at);                       // < 2 kB
  const bool full = len % kB == 0;  // warp-uniform in the kernel (len: the tile's valid rows)
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int s = 0; s < kB / 4; ++s) {
    if (s >= kB / 8 && full) break;
    const int j = rg + 8 * s;  // slot
    if (j < slots) {
      const bool h = j < hb;
      run[h ? j : tail_at + j - hb] = h ? byte_at<N>(head, j) : byte_at<N>(tail, j - hb);
    }
  }
}

}  // namespace groupmm::qnum
