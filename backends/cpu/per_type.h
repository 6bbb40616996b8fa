/* backends/cpu/per_type.h: includes the kernel bodies in PER_TYPE_FILE
 * twice, for float and for double, with T (the element type), DT (its
 * stoke_dtype), SFX (f32 / f64: the suffix of every function name) and
 * GEMM (cblas_sgemm / cblas_dgemm) defined; cpu.c, conv.c and seq.c each
 * include it once after defining PER_TYPE_FILE. Not include-guarded on
 * purpose. */
#define T float
#define DT STOKE_F32
#define SFX f32
#define GEMM cblas_sgemm
#include PER_TYPE_FILE
#undef T
#undef DT
#undef SFX
#undef GEMM

#define T double
#define DT STOKE_F64
#define SFX f64
#define GEMM cblas_dgemm
#include PER_TYPE_FILE
#undef T
#undef DT
#undef SFX
#undef GEMM
#undef PER_TYPE_FILE
