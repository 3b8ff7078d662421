/*************************************************************************
 * Host reduction kernels, instantiated per (operation, data type) like NCCL's
 * device kernels. Every rank holds the same data, so reducing over nRanks
 * contributions means folding each element with itself nRanks times.
 ************************************************************************/

#ifndef NCCL_REDUCE_H_
#define NCCL_REDUCE_H_

#include "core.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <type_traits>

struct ncclFp16Val { uint16_t bits; };
struct ncclBf16Val { uint16_t bits; };

static inline float halfToFloat(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) { mant <<= 1; exp--; }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

static inline uint16_t floatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
  const int32_t exp = (int32_t)((bits >> 23) & 0xffu) - 127 + 15;
  uint32_t mant = bits & 0x7fffffu;
  if (((bits >> 23) & 0xffu) == 0xffu) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  if (exp >= 0x1f) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return sign;
    mant |= 0x800000u;
    const uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = ((uint32_t)exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;
  return (uint16_t)(sign | half);
}

static inline float bf16ToFloat(uint16_t b) {
  const uint32_t bits = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

static inline uint16_t floatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)((bits + rounding) >> 16);
}

// How a stored element is widened for arithmetic and narrowed back.
template<typename T> struct Packed {
  typedef T Acc;
  static Acc load(const T& v) { return v; }
  static T store(const Acc& a) { return a; }
};
template<> struct Packed<ncclFp16Val> {
  typedef float Acc;
  static Acc load(const ncclFp16Val& v) { return halfToFloat(v.bits); }
  static ncclFp16Val store(const Acc& a) { ncclFp16Val h; h.bits = floatToHalf(a); return h; }
};
template<> struct Packed<ncclBf16Val> {
  typedef float Acc;
  static Acc load(const ncclBf16Val& v) { return bf16ToFloat(v.bits); }
  static ncclBf16Val store(const Acc& a) { ncclBf16Val b; b.bits = floatToBf16(a); return b; }
};

template<typename A> struct FuncSum {
  A operator()(const A& x, const A& y) const { return x + y; }
  A finish(const A& x, int) const { return x; }
};
template<typename A> struct FuncProd {
  A operator()(const A& x, const A& y) const { return x * y; }
  A finish(const A& x, int) const { return x; }
};
template<typename A> struct FuncMax {
  A operator()(const A& x, const A& y) const { return std::max(x, y); }
  A finish(const A& x, int) const { return x; }
};
template<typename A> struct FuncMin {
  A operator()(const A& x, const A& y) const { return std::min(x, y); }
  A finish(const A& x, int) const { return x; }
};
template<typename A> struct FuncAvg {
  A operator()(const A& x, const A& y) const { return x + y; }
  A finish(const A& x, int n) const { return n > 0 ? static_cast<A>(x / static_cast<A>(n)) : x; }
};

typedef void (*ncclKernelFn)(const void* src, void* dst, size_t count, int nRanks);

// Like NCCL's protocols, the loop shape depends on the message size: LL moves one element at
// a time, LL128 and Simple work on wider unrolled blocks.
enum { NCCL_PROTO_LL = 0, NCCL_PROTO_LL128 = 1, NCCL_PROTO_SIMPLE = 2 };

static inline int ncclProtoFor(size_t bytes) {
  if (bytes < 8192) return NCCL_PROTO_LL;
  return bytes < 262144 ? NCCL_PROTO_LL128 : NCCL_PROTO_SIMPLE;
}

template<int Proto, int TypeSize> struct ProtoUnroll {
  static const int value = Proto == NCCL_PROTO_LL ? 1 : Proto == NCCL_PROTO_LL128 ? 4
                         : (16 / TypeSize > 2 ? 16 / TypeSize : 2);
};

// Unrolled like NCCL's ReduceCopy: UNROLL independent accumulators per step.
template<typename T, template<typename> class Fn, int UNROLL>
void reduceCopy(const void* vsrc, void* vdst, size_t count, int nRanks) {
  typedef typename Packed<T>::Acc Acc;
  const T* src = static_cast<const T*>(vsrc);
  T* dst = static_cast<T*>(vdst);
  const Fn<Acc> fn;
  size_t i = 0;
  for (; i + UNROLL <= count; i += UNROLL) {
    std::array<Acc, UNROLL> acc;
    std::array<Acc, UNROLL> in;
    for (int u = 0; u < UNROLL; u++) in[u] = acc[u] = Packed<T>::load(src[i + u]);
    for (int r = 1; r < nRanks; r++)
      for (int u = 0; u < UNROLL; u++) acc[u] = fn(acc[u], in[u]);
    for (int u = 0; u < UNROLL; u++) dst[i + u] = Packed<T>::store(fn.finish(acc[u], nRanks));
  }
  for (; i < count; i++) {
    const Acc in = Packed<T>::load(src[i]);
    Acc acc = in;
    for (int r = 1; r < nRanks; r++) acc = fn(acc, in);
    dst[i] = Packed<T>::store(fn.finish(acc, nRanks));
  }
}

template<typename T, template<typename> class Fn>
ncclKernelFn kernelForProto(int proto) {
  switch (proto) {
    case NCCL_PROTO_LL: return reduceCopy<T, Fn, ProtoUnroll<NCCL_PROTO_LL, sizeof(T)>::value>;
    case NCCL_PROTO_LL128: return reduceCopy<T, Fn, ProtoUnroll<NCCL_PROTO_LL128, sizeof(T)>::value>;
    default: return reduceCopy<T, Fn, ProtoUnroll<NCCL_PROTO_SIMPLE, sizeof(T)>::value>;
  }
}

// Instantiated once per (collective, operation) in the generated device sources.
template<template<typename> class Fn>
ncclKernelFn kernelFor(ncclDataType_t type, size_t count) {
  const int proto = ncclProtoFor(count * ncclTypeSize(type));
  switch (type) {
    case ncclInt8:     return kernelForProto<int8_t, Fn>(proto);
    case ncclUint8:    return kernelForProto<uint8_t, Fn>(proto);
    case ncclInt32:    return kernelForProto<int32_t, Fn>(proto);
    case ncclUint32:   return kernelForProto<uint32_t, Fn>(proto);
    case ncclInt64:    return kernelForProto<int64_t, Fn>(proto);
    case ncclUint64:   return kernelForProto<uint64_t, Fn>(proto);
    case ncclFloat16:  return kernelForProto<ncclFp16Val, Fn>(proto);
    case ncclFloat32:  return kernelForProto<float, Fn>(proto);
    case ncclFloat64:  return kernelForProto<double, Fn>(proto);
    case ncclBfloat16: return kernelForProto<ncclBf16Val, Fn>(proto);
    default: return nullptr;
  }
}

#endif
