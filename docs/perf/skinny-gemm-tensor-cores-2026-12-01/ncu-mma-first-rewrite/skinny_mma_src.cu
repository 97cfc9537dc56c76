

[START_KERNEL_COMPILATION]
name: dustin_kernels::cuda::kernels::skinny_mma_kernel::SkinnyMmaKernel<
    cubecl_cuda::runtime::CudaRuntime,
>
id: KernelId {
    type: dustin_kernels::cuda::kernels::skinny_mma_kernel::SkinnyMmaKernel<cubecl_cuda::runtime::CudaRuntime>,
    address_type: U32,
    cube_dim: CubeDim {
        x: 128,
        y: 1,
        z: 1,
    },
    mode: Checked,
    info: SkinnyMmaKernelInfo {
        n: 8,
        mt: 1,
        unroll: 4,
        dtype: Scalar(Float(BF16)),
        x: TensorCompilationArg {
            inplace: None,
        },
        w: TensorCompilationArg {
            inplace: None,
        },
        part: TensorCompilationArg {
            inplace: None,
        },
        m: (),
        r0: (),
        k: (),
        n: (),
        rows_per_split: (),
        ldp: (),
        col_off: (),
    },
}
source:
```cpp
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <mma.h>
typedef unsigned int uint;
typedef unsigned char uint8;
typedef unsigned short uint16;
typedef unsigned int uint32;
typedef unsigned long long int uint64;
typedef signed char int8;
typedef signed short int16;
typedef signed int int32;
typedef signed long long int int64;

struct __align__(4) __nv_bfloat16_2 {
    __nv_bfloat16 i_0;
    __nv_bfloat16 i_1;
};
struct __align__(16) __nv_bfloat162_4 {
    __nv_bfloat162 i_0;
    __nv_bfloat162 i_1;
    __nv_bfloat162 i_2;
    __nv_bfloat162 i_3;
};
struct __align__(8) float_2 {
    float i_0;
    float i_1;
};
struct __align__(16) __nv_bfloat16_8 {
    __nv_bfloat16 i_0;
    __nv_bfloat16 i_1;
    __nv_bfloat16 i_2;
    __nv_bfloat16 i_3;
    __nv_bfloat16 i_4;
    __nv_bfloat16 i_5;
    __nv_bfloat16 i_6;
    __nv_bfloat16 i_7;
};
struct info_st {
    uint32 scalars_uint32[8];uint32 static_meta[16];
};

inline __device__ void
__mma_m16n8k16___nv_bfloat16___nv_bfloat16_float(uint32 const &reg_a_0, uint32 const &reg_a_1, uint32 const &reg_a_2, uint32 const &reg_a_3, uint32 const &reg_b_0, uint32 const &reg_b_1, float const &reg_c_0, float const &reg_c_1, float const &reg_c_2, float const &reg_c_3, float &reg_d_0, float &reg_d_1, float &reg_d_2, float &reg_d_3) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
               " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
               : "=f"(reg_d_0), "=f"(reg_d_1), "=f"(reg_d_2), "=f"(reg_d_3)
               : "r"(reg_a_0), "r"(reg_a_1), "r"(reg_a_2), "r"(reg_a_3), "r"(reg_b_0), "r"(reg_b_1), "f"(reg_c_0), "f"(reg_c_1), "f"(reg_c_2), "f"(reg_c_3));
    }
    

extern "C" __global__ void __launch_bounds__(128)skinny_mma_kernel_f_bf16_n_8 (
    const __nv_bfloat16* __restrict__ buffer_0, const __nv_bfloat16_8* __restrict__ buffer_1, float* buffer_2, const uint32* __restrict__ dynamic_meta, const __grid_constant__ info_st info
) {
uint32 threadIdxGlobal = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * (blockDim.x * blockDim.y);
extern __shared__ __align__(4) uint8 dynamic_shared_mem[];
// Shared array size: 4352, 17408 bytes
float *shared_memory_989 = reinterpret_cast<float*>(&dynamic_shared_mem[0]);
float_2 l_arr_18[16];

__nv_bfloat16_8 l_arr_37[16];

__nv_bfloat16_2 l_arr_164[4];

__nv_bfloat16_2 l_arr_238[4];

__nv_bfloat16_2 l_arr_243[2];

float_2 l_arr_244[2];

__nv_bfloat16_2 l_arr_255[4];

__nv_bfloat16_2 l_arr_260[2];

float_2 l_arr_261[2];

__nv_bfloat16_2 l_arr_272[4];

__nv_bfloat16_2 l_arr_277[2];

float_2 l_arr_278[2];

__nv_bfloat16_2 l_arr_289[4];

__nv_bfloat16_2 l_arr_294[2];

float_2 l_arr_295[2];

__nv_bfloat16_2 l_arr_306[4];

__nv_bfloat16_2 l_arr_311[2];

float_2 l_arr_312[2];

__nv_bfloat16_2 l_arr_323[4];

__nv_bfloat16_2 l_arr_328[2];

float_2 l_arr_329[2];

__nv_bfloat16_2 l_arr_340[4];

__nv_bfloat16_2 l_arr_345[2];

float_2 l_arr_346[2];

__nv_bfloat16_2 l_arr_357[4];

__nv_bfloat16_2 l_arr_362[2];

float_2 l_arr_363[2];

__nv_bfloat16_2 l_arr_374[4];

__nv_bfloat16_2 l_arr_445[4];

__nv_bfloat16_2 l_arr_450[2];

float_2 l_arr_451[2];

__nv_bfloat16_2 l_arr_462[4];

__nv_bfloat16_2 l_arr_467[2];

float_2 l_arr_468[2];

__nv_bfloat16_2 l_arr_479[4];

__nv_bfloat16_2 l_arr_484[2];

float_2 l_arr_485[2];

__nv_bfloat16_2 l_arr_496[4];

__nv_bfloat16_2 l_arr_501[2];

float_2 l_arr_502[2];

__nv_bfloat16_2 l_arr_513[4];

__nv_bfloat16_2 l_arr_518[2];

float_2 l_arr_519[2];

__nv_bfloat16_2 l_arr_530[4];

__nv_bfloat16_2 l_arr_535[2];

float_2 l_arr_536[2];

__nv_bfloat16_2 l_arr_547[4];

__nv_bfloat16_2 l_arr_552[2];

float_2 l_arr_553[2];

__nv_bfloat16_2 l_arr_564[4];

__nv_bfloat16_2 l_arr_569[2];

float_2 l_arr_570[2];

__nv_bfloat16_2 l_arr_581[4];

__nv_bfloat16_2 l_arr_652[4];

__nv_bfloat16_2 l_arr_657[2];

float_2 l_arr_658[2];

__nv_bfloat16_2 l_arr_669[4];

__nv_bfloat16_2 l_arr_674[2];

float_2 l_arr_675[2];

__nv_bfloat16_2 l_arr_686[4];

__nv_bfloat16_2 l_arr_691[2];

float_2 l_arr_692[2];

__nv_bfloat16_2 l_arr_703[4];

__nv_bfloat16_2 l_arr_708[2];

float_2 l_arr_709[2];

__nv_bfloat16_2 l_arr_720[4];

__nv_bfloat16_2 l_arr_725[2];

float_2 l_arr_726[2];

__nv_bfloat16_2 l_arr_737[4];

__nv_bfloat16_2 l_arr_742[2];

float_2 l_arr_743[2];

__nv_bfloat16_2 l_arr_754[4];

__nv_bfloat16_2 l_arr_759[2];

float_2 l_arr_760[2];

__nv_bfloat16_2 l_arr_771[4];

__nv_bfloat16_2 l_arr_776[2];

float_2 l_arr_777[2];

__nv_bfloat16_2 l_arr_788[4];

__nv_bfloat16_2 l_arr_859[4];

__nv_bfloat16_2 l_arr_864[2];

float_2 l_arr_865[2];

__nv_bfloat16_2 l_arr_876[4];

__nv_bfloat16_2 l_arr_881[2];

float_2 l_arr_882[2];

__nv_bfloat16_2 l_arr_893[4];

__nv_bfloat16_2 l_arr_898[2];

float_2 l_arr_899[2];

__nv_bfloat16_2 l_arr_910[4];

__nv_bfloat16_2 l_arr_915[2];

float_2 l_arr_916[2];

__nv_bfloat16_2 l_arr_927[4];

__nv_bfloat16_2 l_arr_932[2];

float_2 l_arr_933[2];

__nv_bfloat16_2 l_arr_944[4];

__nv_bfloat16_2 l_arr_949[2];

float_2 l_arr_950[2];

__nv_bfloat16_2 l_arr_961[4];

__nv_bfloat16_2 l_arr_966[2];

float_2 l_arr_967[2];

__nv_bfloat16_2 l_arr_978[4];

__nv_bfloat16_2 l_arr_983[2];

float_2 l_arr_984[2];

uint32 l_mut_7;
uint32 l_mut_11;
__nv_bfloat16_2 l_mut_170;
__nv_bfloat16_2 l_mut_171;
__nv_bfloat16_2 l_mut_235;
float l_mut_1175;
const uint32 l_0 = threadIdxGlobal / uint32(32);
const uint32 l_1 = threadIdxGlobal % uint32(32);
const uint32 l_2 = l_1 / uint32(4);
const uint32 l_3 = l_1 % uint32(4);
const uint32 l_4 = blockIdx.x * uint32(64);
const uint32 l_5 = l_2 * uint32(8);
const uint32 l_6 = l_4 + l_5;
l_mut_7 = l_6;
const bool l_8 = l_6 >= info.scalars_uint32[3];
if (l_8) {
l_mut_7 = uint32(0);
}
const uint32 l_9 = blockIdx.y * info.scalars_uint32[4];
const uint32 l_10 = l_9 + info.scalars_uint32[4];
l_mut_11 = l_10;
const bool l_12 = l_mut_11 > info.scalars_uint32[2];
if (l_12) {
l_mut_11 = info.scalars_uint32[2];
}
const uint32 l_13 = l_mut_11 - l_9;
const uint32 l_14 = l_13 / uint32(16);
const uint32 l_15 = dynamic_meta[info.static_meta[uint32(13)] + uint32(0)];
const uint32 l_16 = dynamic_meta[info.static_meta[uint32(12)] + uint32(0)];
const uint32 l_17 = dynamic_meta[info.static_meta[uint32(12)] + uint32(1)];
const float_2 l_19 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(0)] = reinterpret_cast< float_2 const&>(l_19);
const float_2 l_20 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(1)] = reinterpret_cast< float_2 const&>(l_20);
const float_2 l_21 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(2)] = reinterpret_cast< float_2 const&>(l_21);
const float_2 l_22 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(3)] = reinterpret_cast< float_2 const&>(l_22);
const float_2 l_23 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(4)] = reinterpret_cast< float_2 const&>(l_23);
const float_2 l_24 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(5)] = reinterpret_cast< float_2 const&>(l_24);
const float_2 l_25 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(6)] = reinterpret_cast< float_2 const&>(l_25);
const float_2 l_26 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(7)] = reinterpret_cast< float_2 const&>(l_26);
const float_2 l_27 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(8)] = reinterpret_cast< float_2 const&>(l_27);
const float_2 l_28 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(9)] = reinterpret_cast< float_2 const&>(l_28);
const float_2 l_29 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(10)] = reinterpret_cast< float_2 const&>(l_29);
const float_2 l_30 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(11)] = reinterpret_cast< float_2 const&>(l_30);
const float_2 l_31 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(12)] = reinterpret_cast< float_2 const&>(l_31);
const float_2 l_32 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(13)] = reinterpret_cast< float_2 const&>(l_32);
const float_2 l_33 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(14)] = reinterpret_cast< float_2 const&>(l_33);
const float_2 l_34 = float_2{
float(0.0),float(0.0),};
l_arr_18[uint32(15)] = reinterpret_cast< float_2 const&>(l_34);
l_mut_11 = l_0;
while (true) {
const bool l_35 = l_mut_11 < l_14;
const bool l_36 = !l_35;
if (l_36) {
break;}
const uint32 l_38 = l_mut_11 + uint32(0);
const bool l_39 = l_38 < l_14;
if (l_39) {
const uint32 l_40 = l_38 * uint32(16);
const uint32 l_41 = l_9 + l_40;
const uint32 l_42 = l_3 * uint32(2);
const uint32 l_43 = l_41 + l_42;
const uint32 l_44 = l_43 + uint32(0);
const uint32 l_45 = l_44 + uint32(0);
const uint32 l_46 = l_45 * l_15;
const uint32 l_47 = l_46 + l_mut_7;
const uint32 l_48 = l_47 / uint32(8);
const uint32 l_1407 = info.static_meta[uint32(1)];
const uint32 l_1408 = l_1407 * uint32(1);
const bool l_1409 = l_48 < l_1408;
const uint32 l_1410 = l_1408 - uint32(1);
const uint32 l_1411 = min(l_48, l_1410);
const __nv_bfloat16_8 l_1412 = buffer_1[l_1411];
const __nv_bfloat16_8 l_1413 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1414 = __nv_bfloat16_8 {
(l_1409) ? l_1412.i_0 : l_1413.i_0,
(l_1409) ? l_1412.i_1 : l_1413.i_1,
(l_1409) ? l_1412.i_2 : l_1413.i_2,
(l_1409) ? l_1412.i_3 : l_1413.i_3,
(l_1409) ? l_1412.i_4 : l_1413.i_4,
(l_1409) ? l_1412.i_5 : l_1413.i_5,
(l_1409) ? l_1412.i_6 : l_1413.i_6,
(l_1409) ? l_1412.i_7 : l_1413.i_7,
};
const __nv_bfloat16_8 l_49 = l_1414;
l_arr_37[uint32(0)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_49);
const uint32 l_50 = l_43 + uint32(1);
const uint32 l_51 = l_50 + uint32(0);
const uint32 l_52 = l_51 * l_15;
const uint32 l_53 = l_52 + l_mut_7;
const uint32 l_54 = l_53 / uint32(8);
const uint32 l_1415 = info.static_meta[uint32(1)];
const uint32 l_1416 = l_1415 * uint32(1);
const bool l_1417 = l_54 < l_1416;
const uint32 l_1418 = l_1416 - uint32(1);
const uint32 l_1419 = min(l_54, l_1418);
const __nv_bfloat16_8 l_1420 = buffer_1[l_1419];
const __nv_bfloat16_8 l_1421 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1422 = __nv_bfloat16_8 {
(l_1417) ? l_1420.i_0 : l_1421.i_0,
(l_1417) ? l_1420.i_1 : l_1421.i_1,
(l_1417) ? l_1420.i_2 : l_1421.i_2,
(l_1417) ? l_1420.i_3 : l_1421.i_3,
(l_1417) ? l_1420.i_4 : l_1421.i_4,
(l_1417) ? l_1420.i_5 : l_1421.i_5,
(l_1417) ? l_1420.i_6 : l_1421.i_6,
(l_1417) ? l_1420.i_7 : l_1421.i_7,
};
const __nv_bfloat16_8 l_55 = l_1422;
l_arr_37[uint32(1)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_55);
const uint32 l_56 = l_43 + uint32(0);
const uint32 l_57 = l_56 + uint32(8);
const uint32 l_58 = l_57 * l_15;
const uint32 l_59 = l_58 + l_mut_7;
const uint32 l_60 = l_59 / uint32(8);
const uint32 l_1423 = info.static_meta[uint32(1)];
const uint32 l_1424 = l_1423 * uint32(1);
const bool l_1425 = l_60 < l_1424;
const uint32 l_1426 = l_1424 - uint32(1);
const uint32 l_1427 = min(l_60, l_1426);
const __nv_bfloat16_8 l_1428 = buffer_1[l_1427];
const __nv_bfloat16_8 l_1429 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1430 = __nv_bfloat16_8 {
(l_1425) ? l_1428.i_0 : l_1429.i_0,
(l_1425) ? l_1428.i_1 : l_1429.i_1,
(l_1425) ? l_1428.i_2 : l_1429.i_2,
(l_1425) ? l_1428.i_3 : l_1429.i_3,
(l_1425) ? l_1428.i_4 : l_1429.i_4,
(l_1425) ? l_1428.i_5 : l_1429.i_5,
(l_1425) ? l_1428.i_6 : l_1429.i_6,
(l_1425) ? l_1428.i_7 : l_1429.i_7,
};
const __nv_bfloat16_8 l_61 = l_1430;
l_arr_37[uint32(2)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_61);
const uint32 l_62 = l_43 + uint32(1);
const uint32 l_63 = l_62 + uint32(8);
const uint32 l_64 = l_63 * l_15;
const uint32 l_65 = l_64 + l_mut_7;
const uint32 l_66 = l_65 / uint32(8);
const uint32 l_1431 = info.static_meta[uint32(1)];
const uint32 l_1432 = l_1431 * uint32(1);
const bool l_1433 = l_66 < l_1432;
const uint32 l_1434 = l_1432 - uint32(1);
const uint32 l_1435 = min(l_66, l_1434);
const __nv_bfloat16_8 l_1436 = buffer_1[l_1435];
const __nv_bfloat16_8 l_1437 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1438 = __nv_bfloat16_8 {
(l_1433) ? l_1436.i_0 : l_1437.i_0,
(l_1433) ? l_1436.i_1 : l_1437.i_1,
(l_1433) ? l_1436.i_2 : l_1437.i_2,
(l_1433) ? l_1436.i_3 : l_1437.i_3,
(l_1433) ? l_1436.i_4 : l_1437.i_4,
(l_1433) ? l_1436.i_5 : l_1437.i_5,
(l_1433) ? l_1436.i_6 : l_1437.i_6,
(l_1433) ? l_1436.i_7 : l_1437.i_7,
};
const __nv_bfloat16_8 l_67 = l_1438;
l_arr_37[uint32(3)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_67);
}
const uint32 l_68 = l_mut_11 + uint32(4);
const bool l_69 = l_68 < l_14;
if (l_69) {
const uint32 l_70 = l_68 * uint32(16);
const uint32 l_71 = l_9 + l_70;
const uint32 l_72 = l_3 * uint32(2);
const uint32 l_73 = l_71 + l_72;
const uint32 l_74 = l_73 + uint32(0);
const uint32 l_75 = l_74 + uint32(0);
const uint32 l_76 = l_75 * l_15;
const uint32 l_77 = l_76 + l_mut_7;
const uint32 l_78 = l_77 / uint32(8);
const uint32 l_1439 = info.static_meta[uint32(1)];
const uint32 l_1440 = l_1439 * uint32(1);
const bool l_1441 = l_78 < l_1440;
const uint32 l_1442 = l_1440 - uint32(1);
const uint32 l_1443 = min(l_78, l_1442);
const __nv_bfloat16_8 l_1444 = buffer_1[l_1443];
const __nv_bfloat16_8 l_1445 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1446 = __nv_bfloat16_8 {
(l_1441) ? l_1444.i_0 : l_1445.i_0,
(l_1441) ? l_1444.i_1 : l_1445.i_1,
(l_1441) ? l_1444.i_2 : l_1445.i_2,
(l_1441) ? l_1444.i_3 : l_1445.i_3,
(l_1441) ? l_1444.i_4 : l_1445.i_4,
(l_1441) ? l_1444.i_5 : l_1445.i_5,
(l_1441) ? l_1444.i_6 : l_1445.i_6,
(l_1441) ? l_1444.i_7 : l_1445.i_7,
};
const __nv_bfloat16_8 l_79 = l_1446;
l_arr_37[uint32(4)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_79);
const uint32 l_80 = l_73 + uint32(1);
const uint32 l_81 = l_80 + uint32(0);
const uint32 l_82 = l_81 * l_15;
const uint32 l_83 = l_82 + l_mut_7;
const uint32 l_84 = l_83 / uint32(8);
const uint32 l_1447 = info.static_meta[uint32(1)];
const uint32 l_1448 = l_1447 * uint32(1);
const bool l_1449 = l_84 < l_1448;
const uint32 l_1450 = l_1448 - uint32(1);
const uint32 l_1451 = min(l_84, l_1450);
const __nv_bfloat16_8 l_1452 = buffer_1[l_1451];
const __nv_bfloat16_8 l_1453 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1454 = __nv_bfloat16_8 {
(l_1449) ? l_1452.i_0 : l_1453.i_0,
(l_1449) ? l_1452.i_1 : l_1453.i_1,
(l_1449) ? l_1452.i_2 : l_1453.i_2,
(l_1449) ? l_1452.i_3 : l_1453.i_3,
(l_1449) ? l_1452.i_4 : l_1453.i_4,
(l_1449) ? l_1452.i_5 : l_1453.i_5,
(l_1449) ? l_1452.i_6 : l_1453.i_6,
(l_1449) ? l_1452.i_7 : l_1453.i_7,
};
const __nv_bfloat16_8 l_85 = l_1454;
l_arr_37[uint32(5)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_85);
const uint32 l_86 = l_73 + uint32(0);
const uint32 l_87 = l_86 + uint32(8);
const uint32 l_88 = l_87 * l_15;
const uint32 l_89 = l_88 + l_mut_7;
const uint32 l_90 = l_89 / uint32(8);
const uint32 l_1455 = info.static_meta[uint32(1)];
const uint32 l_1456 = l_1455 * uint32(1);
const bool l_1457 = l_90 < l_1456;
const uint32 l_1458 = l_1456 - uint32(1);
const uint32 l_1459 = min(l_90, l_1458);
const __nv_bfloat16_8 l_1460 = buffer_1[l_1459];
const __nv_bfloat16_8 l_1461 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1462 = __nv_bfloat16_8 {
(l_1457) ? l_1460.i_0 : l_1461.i_0,
(l_1457) ? l_1460.i_1 : l_1461.i_1,
(l_1457) ? l_1460.i_2 : l_1461.i_2,
(l_1457) ? l_1460.i_3 : l_1461.i_3,
(l_1457) ? l_1460.i_4 : l_1461.i_4,
(l_1457) ? l_1460.i_5 : l_1461.i_5,
(l_1457) ? l_1460.i_6 : l_1461.i_6,
(l_1457) ? l_1460.i_7 : l_1461.i_7,
};
const __nv_bfloat16_8 l_91 = l_1462;
l_arr_37[uint32(6)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_91);
const uint32 l_92 = l_73 + uint32(1);
const uint32 l_93 = l_92 + uint32(8);
const uint32 l_94 = l_93 * l_15;
const uint32 l_95 = l_94 + l_mut_7;
const uint32 l_96 = l_95 / uint32(8);
const uint32 l_1463 = info.static_meta[uint32(1)];
const uint32 l_1464 = l_1463 * uint32(1);
const bool l_1465 = l_96 < l_1464;
const uint32 l_1466 = l_1464 - uint32(1);
const uint32 l_1467 = min(l_96, l_1466);
const __nv_bfloat16_8 l_1468 = buffer_1[l_1467];
const __nv_bfloat16_8 l_1469 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1470 = __nv_bfloat16_8 {
(l_1465) ? l_1468.i_0 : l_1469.i_0,
(l_1465) ? l_1468.i_1 : l_1469.i_1,
(l_1465) ? l_1468.i_2 : l_1469.i_2,
(l_1465) ? l_1468.i_3 : l_1469.i_3,
(l_1465) ? l_1468.i_4 : l_1469.i_4,
(l_1465) ? l_1468.i_5 : l_1469.i_5,
(l_1465) ? l_1468.i_6 : l_1469.i_6,
(l_1465) ? l_1468.i_7 : l_1469.i_7,
};
const __nv_bfloat16_8 l_97 = l_1470;
l_arr_37[uint32(7)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_97);
}
const uint32 l_98 = l_mut_11 + uint32(8);
const bool l_99 = l_98 < l_14;
if (l_99) {
const uint32 l_100 = l_98 * uint32(16);
const uint32 l_101 = l_9 + l_100;
const uint32 l_102 = l_3 * uint32(2);
const uint32 l_103 = l_101 + l_102;
const uint32 l_104 = l_103 + uint32(0);
const uint32 l_105 = l_104 + uint32(0);
const uint32 l_106 = l_105 * l_15;
const uint32 l_107 = l_106 + l_mut_7;
const uint32 l_108 = l_107 / uint32(8);
const uint32 l_1471 = info.static_meta[uint32(1)];
const uint32 l_1472 = l_1471 * uint32(1);
const bool l_1473 = l_108 < l_1472;
const uint32 l_1474 = l_1472 - uint32(1);
const uint32 l_1475 = min(l_108, l_1474);
const __nv_bfloat16_8 l_1476 = buffer_1[l_1475];
const __nv_bfloat16_8 l_1477 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1478 = __nv_bfloat16_8 {
(l_1473) ? l_1476.i_0 : l_1477.i_0,
(l_1473) ? l_1476.i_1 : l_1477.i_1,
(l_1473) ? l_1476.i_2 : l_1477.i_2,
(l_1473) ? l_1476.i_3 : l_1477.i_3,
(l_1473) ? l_1476.i_4 : l_1477.i_4,
(l_1473) ? l_1476.i_5 : l_1477.i_5,
(l_1473) ? l_1476.i_6 : l_1477.i_6,
(l_1473) ? l_1476.i_7 : l_1477.i_7,
};
const __nv_bfloat16_8 l_109 = l_1478;
l_arr_37[uint32(8)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_109);
const uint32 l_110 = l_103 + uint32(1);
const uint32 l_111 = l_110 + uint32(0);
const uint32 l_112 = l_111 * l_15;
const uint32 l_113 = l_112 + l_mut_7;
const uint32 l_114 = l_113 / uint32(8);
const uint32 l_1479 = info.static_meta[uint32(1)];
const uint32 l_1480 = l_1479 * uint32(1);
const bool l_1481 = l_114 < l_1480;
const uint32 l_1482 = l_1480 - uint32(1);
const uint32 l_1483 = min(l_114, l_1482);
const __nv_bfloat16_8 l_1484 = buffer_1[l_1483];
const __nv_bfloat16_8 l_1485 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1486 = __nv_bfloat16_8 {
(l_1481) ? l_1484.i_0 : l_1485.i_0,
(l_1481) ? l_1484.i_1 : l_1485.i_1,
(l_1481) ? l_1484.i_2 : l_1485.i_2,
(l_1481) ? l_1484.i_3 : l_1485.i_3,
(l_1481) ? l_1484.i_4 : l_1485.i_4,
(l_1481) ? l_1484.i_5 : l_1485.i_5,
(l_1481) ? l_1484.i_6 : l_1485.i_6,
(l_1481) ? l_1484.i_7 : l_1485.i_7,
};
const __nv_bfloat16_8 l_115 = l_1486;
l_arr_37[uint32(9)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_115);
const uint32 l_116 = l_103 + uint32(0);
const uint32 l_117 = l_116 + uint32(8);
const uint32 l_118 = l_117 * l_15;
const uint32 l_119 = l_118 + l_mut_7;
const uint32 l_120 = l_119 / uint32(8);
const uint32 l_1487 = info.static_meta[uint32(1)];
const uint32 l_1488 = l_1487 * uint32(1);
const bool l_1489 = l_120 < l_1488;
const uint32 l_1490 = l_1488 - uint32(1);
const uint32 l_1491 = min(l_120, l_1490);
const __nv_bfloat16_8 l_1492 = buffer_1[l_1491];
const __nv_bfloat16_8 l_1493 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1494 = __nv_bfloat16_8 {
(l_1489) ? l_1492.i_0 : l_1493.i_0,
(l_1489) ? l_1492.i_1 : l_1493.i_1,
(l_1489) ? l_1492.i_2 : l_1493.i_2,
(l_1489) ? l_1492.i_3 : l_1493.i_3,
(l_1489) ? l_1492.i_4 : l_1493.i_4,
(l_1489) ? l_1492.i_5 : l_1493.i_5,
(l_1489) ? l_1492.i_6 : l_1493.i_6,
(l_1489) ? l_1492.i_7 : l_1493.i_7,
};
const __nv_bfloat16_8 l_121 = l_1494;
l_arr_37[uint32(10)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_121);
const uint32 l_122 = l_103 + uint32(1);
const uint32 l_123 = l_122 + uint32(8);
const uint32 l_124 = l_123 * l_15;
const uint32 l_125 = l_124 + l_mut_7;
const uint32 l_126 = l_125 / uint32(8);
const uint32 l_1495 = info.static_meta[uint32(1)];
const uint32 l_1496 = l_1495 * uint32(1);
const bool l_1497 = l_126 < l_1496;
const uint32 l_1498 = l_1496 - uint32(1);
const uint32 l_1499 = min(l_126, l_1498);
const __nv_bfloat16_8 l_1500 = buffer_1[l_1499];
const __nv_bfloat16_8 l_1501 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1502 = __nv_bfloat16_8 {
(l_1497) ? l_1500.i_0 : l_1501.i_0,
(l_1497) ? l_1500.i_1 : l_1501.i_1,
(l_1497) ? l_1500.i_2 : l_1501.i_2,
(l_1497) ? l_1500.i_3 : l_1501.i_3,
(l_1497) ? l_1500.i_4 : l_1501.i_4,
(l_1497) ? l_1500.i_5 : l_1501.i_5,
(l_1497) ? l_1500.i_6 : l_1501.i_6,
(l_1497) ? l_1500.i_7 : l_1501.i_7,
};
const __nv_bfloat16_8 l_127 = l_1502;
l_arr_37[uint32(11)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_127);
}
const uint32 l_128 = l_mut_11 + uint32(12);
const bool l_129 = l_128 < l_14;
if (l_129) {
const uint32 l_130 = l_128 * uint32(16);
const uint32 l_131 = l_9 + l_130;
const uint32 l_132 = l_3 * uint32(2);
const uint32 l_133 = l_131 + l_132;
const uint32 l_134 = l_133 + uint32(0);
const uint32 l_135 = l_134 + uint32(0);
const uint32 l_136 = l_135 * l_15;
const uint32 l_137 = l_136 + l_mut_7;
const uint32 l_138 = l_137 / uint32(8);
const uint32 l_1503 = info.static_meta[uint32(1)];
const uint32 l_1504 = l_1503 * uint32(1);
const bool l_1505 = l_138 < l_1504;
const uint32 l_1506 = l_1504 - uint32(1);
const uint32 l_1507 = min(l_138, l_1506);
const __nv_bfloat16_8 l_1508 = buffer_1[l_1507];
const __nv_bfloat16_8 l_1509 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1510 = __nv_bfloat16_8 {
(l_1505) ? l_1508.i_0 : l_1509.i_0,
(l_1505) ? l_1508.i_1 : l_1509.i_1,
(l_1505) ? l_1508.i_2 : l_1509.i_2,
(l_1505) ? l_1508.i_3 : l_1509.i_3,
(l_1505) ? l_1508.i_4 : l_1509.i_4,
(l_1505) ? l_1508.i_5 : l_1509.i_5,
(l_1505) ? l_1508.i_6 : l_1509.i_6,
(l_1505) ? l_1508.i_7 : l_1509.i_7,
};
const __nv_bfloat16_8 l_139 = l_1510;
l_arr_37[uint32(12)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_139);
const uint32 l_140 = l_133 + uint32(1);
const uint32 l_141 = l_140 + uint32(0);
const uint32 l_142 = l_141 * l_15;
const uint32 l_143 = l_142 + l_mut_7;
const uint32 l_144 = l_143 / uint32(8);
const uint32 l_1511 = info.static_meta[uint32(1)];
const uint32 l_1512 = l_1511 * uint32(1);
const bool l_1513 = l_144 < l_1512;
const uint32 l_1514 = l_1512 - uint32(1);
const uint32 l_1515 = min(l_144, l_1514);
const __nv_bfloat16_8 l_1516 = buffer_1[l_1515];
const __nv_bfloat16_8 l_1517 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1518 = __nv_bfloat16_8 {
(l_1513) ? l_1516.i_0 : l_1517.i_0,
(l_1513) ? l_1516.i_1 : l_1517.i_1,
(l_1513) ? l_1516.i_2 : l_1517.i_2,
(l_1513) ? l_1516.i_3 : l_1517.i_3,
(l_1513) ? l_1516.i_4 : l_1517.i_4,
(l_1513) ? l_1516.i_5 : l_1517.i_5,
(l_1513) ? l_1516.i_6 : l_1517.i_6,
(l_1513) ? l_1516.i_7 : l_1517.i_7,
};
const __nv_bfloat16_8 l_145 = l_1518;
l_arr_37[uint32(13)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_145);
const uint32 l_146 = l_133 + uint32(0);
const uint32 l_147 = l_146 + uint32(8);
const uint32 l_148 = l_147 * l_15;
const uint32 l_149 = l_148 + l_mut_7;
const uint32 l_150 = l_149 / uint32(8);
const uint32 l_1519 = info.static_meta[uint32(1)];
const uint32 l_1520 = l_1519 * uint32(1);
const bool l_1521 = l_150 < l_1520;
const uint32 l_1522 = l_1520 - uint32(1);
const uint32 l_1523 = min(l_150, l_1522);
const __nv_bfloat16_8 l_1524 = buffer_1[l_1523];
const __nv_bfloat16_8 l_1525 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1526 = __nv_bfloat16_8 {
(l_1521) ? l_1524.i_0 : l_1525.i_0,
(l_1521) ? l_1524.i_1 : l_1525.i_1,
(l_1521) ? l_1524.i_2 : l_1525.i_2,
(l_1521) ? l_1524.i_3 : l_1525.i_3,
(l_1521) ? l_1524.i_4 : l_1525.i_4,
(l_1521) ? l_1524.i_5 : l_1525.i_5,
(l_1521) ? l_1524.i_6 : l_1525.i_6,
(l_1521) ? l_1524.i_7 : l_1525.i_7,
};
const __nv_bfloat16_8 l_151 = l_1526;
l_arr_37[uint32(14)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_151);
const uint32 l_152 = l_133 + uint32(1);
const uint32 l_153 = l_152 + uint32(8);
const uint32 l_154 = l_153 * l_15;
const uint32 l_155 = l_154 + l_mut_7;
const uint32 l_156 = l_155 / uint32(8);
const uint32 l_1527 = info.static_meta[uint32(1)];
const uint32 l_1528 = l_1527 * uint32(1);
const bool l_1529 = l_156 < l_1528;
const uint32 l_1530 = l_1528 - uint32(1);
const uint32 l_1531 = min(l_156, l_1530);
const __nv_bfloat16_8 l_1532 = buffer_1[l_1531];
const __nv_bfloat16_8 l_1533 = __nv_bfloat16_8{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
const __nv_bfloat16_8 l_1534 = __nv_bfloat16_8 {
(l_1529) ? l_1532.i_0 : l_1533.i_0,
(l_1529) ? l_1532.i_1 : l_1533.i_1,
(l_1529) ? l_1532.i_2 : l_1533.i_2,
(l_1529) ? l_1532.i_3 : l_1533.i_3,
(l_1529) ? l_1532.i_4 : l_1533.i_4,
(l_1529) ? l_1532.i_5 : l_1533.i_5,
(l_1529) ? l_1532.i_6 : l_1533.i_6,
(l_1529) ? l_1532.i_7 : l_1533.i_7,
};
const __nv_bfloat16_8 l_157 = l_1534;
l_arr_37[uint32(15)] = reinterpret_cast< __nv_bfloat16_8 const&>(l_157);
}
const uint32 l_158 = l_mut_11 + uint32(0);
const bool l_159 = l_158 < l_14;
if (l_159) {
const uint32 l_160 = l_158 * uint32(16);
const uint32 l_161 = l_9 + l_160;
const uint32 l_162 = l_3 * uint32(2);
const uint32 l_163 = l_161 + l_162;
const uint32 l_165 = info.scalars_uint32[1] + uint32(0);
const uint32 l_166 = l_165 + l_2;
const uint32 l_167 = l_166 + uint32(0);
const uint32 l_168 = l_163 + uint32(0);
const __nv_bfloat16_2 l_169 = __nv_bfloat16_2{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
l_mut_170 = l_169;
l_mut_171 = l_mut_170;
l_mut_171.i_0 = __nv_bfloat16(0.0);
l_mut_171.i_1 = __nv_bfloat16(0.0);
const bool l_172 = l_167 < info.scalars_uint32[0];
if (l_172) {
const uint32 l_173 = l_167 * l_16;
const uint32 l_174 = l_168 * l_17;
const uint32 l_175 = l_173 + l_174;
const uint32 l_1535 = info.static_meta[uint32(0)];
const uint32 l_1536 = l_1535 * uint32(1);
const bool l_1537 = l_175 < l_1536;
const uint32 l_1538 = l_1536 - uint32(1);
const uint32 l_1539 = min(l_175, l_1538);
const __nv_bfloat16 l_1540 = buffer_0[l_1539];
const __nv_bfloat16 l_1541 = (l_1537) ? l_1540 : __nv_bfloat16(0.0);
const __nv_bfloat16 l_176 = l_1541;
l_mut_171.i_0 = l_176;
const uint32 l_177 = l_167 * l_16;
const uint32 l_178 = l_168 + uint32(1);
const uint32 l_179 = l_178 * l_17;
const uint32 l_180 = l_177 + l_179;
const uint32 l_1542 = info.static_meta[uint32(0)];
const uint32 l_1543 = l_1542 * uint32(1);
const bool l_1544 = l_180 < l_1543;
const uint32 l_1545 = l_1543 - uint32(1);
const uint32 l_1546 = min(l_180, l_1545);
const __nv_bfloat16 l_1547 = buffer_0[l_1546];
const __nv_bfloat16 l_1548 = (l_1544) ? l_1547 : __nv_bfloat16(0.0);
const __nv_bfloat16 l_181 = l_1548;
l_mut_171.i_1 = l_181;
}
l_arr_164[uint32(0)] = l_mut_171;
const uint32 l_182 = info.scalars_uint32[1] + uint32(0);
const uint32 l_183 = l_182 + l_2;
const uint32 l_184 = l_183 + uint32(8);
const uint32 l_185 = l_163 + uint32(0);
const __nv_bfloat16_2 l_186 = __nv_bfloat16_2{
__nv_bfloat16(0.0),__nv_bfloat16(0.0),};
l_mut_171 = l_186;
l_mut_170 = l_mut_171;
l_mut_170.i_0 = __nv_bfloat16(0.0);
l_mut_170.i_1 = __nv_bfloat16(0.0);
const bool l_187 = l_184 < info.scalars_uint32[0];
if (l_187) {
const uint32 l_188 = l_184 * l_16;
const uint32 l_189 = l_185 * l_17;
const uint32 l_190 = l_188 + l_189;
const uint32 l_1549 = info.static_meta[uint32(0)];
const uint32 l_1550 = l_1549 * uint32(1);
const bool l_1551 = l_190 < l_1550;
const uint32 l_1552 = l_1550 - uint32(1)
