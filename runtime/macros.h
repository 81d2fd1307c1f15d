#pragma once
// Portability macros shared by host C++ and CUDA code.

#if defined(__CUDACC__)
#define TESSEL_HD __host__ __device__
#define TESSEL_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define TESSEL_HD
#define TESSEL_HOST_DEVICE_INLINE inline __attribute__((always_inline))
#endif

#define TESSEL_LIKELY(x) __builtin_expect(!!(x), 1)
#define TESSEL_UNLIKELY(x) __builtin_expect(!!(x), 0)
