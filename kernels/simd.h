#pragma once
// GEO_VECTOR_CLONES marks a hot loop function for function multi-versioning:
// GCC/Clang on x86-64 compile it for the baseline ISA, AVX2 and AVX-512 and
// pick the best at load time (ifunc), so one portable binary runs the wide
// vector code where the CPU has it. Elsewhere it expands to nothing and the
// baseline auto-vectorized code runs.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__CUDACC__)
#define GEO_VECTOR_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#else
#define GEO_VECTOR_CLONES
#endif
