// Element loads that widen any stored dtype to float, shared by the portable CPU kernels.
#pragma once

#include <cstdint>

#include "edge/kernels/dtype.h"
#include "edge/kernels/numerics.h"

namespace edge::kernels::cpu {

template <dtype T>
struct storage;
template <>
struct storage<dtype::f32> { using type = float; };
template <>
struct storage<dtype::f16> { using type = fp16; };
template <>
struct storage<dtype::bf16> { using type = bf16; };
template <>
struct storage<dtype::fp8_e4m3> { using type = fp8_e4m3; };

template <dtype T>
inline float load_as_float(const void* base, std::int64_t index) {
  const auto* p = static_cast<const typename storage<T>::type*>(base) + index;
  if constexpr (T == dtype::f32) {
    return *p;
  } else {
    return p->to_float();
  }
}

template <dtype T>
inline void store_from_float(void* base, std::int64_t index, float value) {
  auto* p = static_cast<typename storage<T>::type*>(base) + index;
  if constexpr (T == dtype::f32) {
    *p = value;
  } else {
    *p = storage<T>::type::from_float(value);
  }
}

// Converts `count` elements of `type` starting at `src` to floats.
void convert_to_float(dtype type, const void* src, std::int64_t count, float* dst);

// Calls f.template operator()<T>() with the runtime dtype as a compile-time value.
template <class F>
decltype(auto) dispatch_dtype(dtype type, F&& f) {
  switch (type) {
    case dtype::f32: return f.template operator()<dtype::f32>();
    case dtype::f16: return f.template operator()<dtype::f16>();
    case dtype::bf16: return f.template operator()<dtype::bf16>();
    case dtype::fp8_e4m3: return f.template operator()<dtype::fp8_e4m3>();
  }
  __builtin_unreachable();
}

}  // namespace edge::kernels::cpu
