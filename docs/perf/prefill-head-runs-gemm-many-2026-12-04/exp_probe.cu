#include <cuda_bf16.h>
#include <cuda_fp16.h>
extern "C" __global__ void e_f32(const float* x, float* y) { int i = threadIdx.x; y[i] = __expf(x[i]); }
extern "C" __global__ void e_bf162(const __nv_bfloat162* x, __nv_bfloat162* y) { int i = threadIdx.x; y[i] = h2exp(x[i]); }
extern "C" __global__ void e_bf162_2(const __nv_bfloat162* x, __nv_bfloat162* y) { int i = threadIdx.x; y[i] = h2exp2(x[i]); }
extern "C" __global__ void e_bf16(const __nv_bfloat16* x, __nv_bfloat16* y) { int i = threadIdx.x; y[i] = hexp(x[i]); }
extern "C" __global__ void e_h2(const __half2* x, __half2* y) { int i = threadIdx.x; y[i] = h2exp(x[i]); }
extern "C" __global__ void e_h2_2(const __half2* x, __half2* y) { int i = threadIdx.x; y[i] = h2exp2(x[i]); }
extern "C" __global__ void e_f32_pack(const float2* x, __nv_bfloat162* y) { int i = threadIdx.x; y[i] = h2exp(__float22bfloat162_rn(x[i])); }
