// The runtime's ISA-dependent functions compiled for AVX-512 (-mavx512f -mavx512vl -mavx512bw -mavx512dq
// -mfma): see cpu_isa.inc.
#ifndef __AVX512F__
#error "this file is compiled with -mavx512f (cmake/deuteron_tests.cmake)"
#endif
#define DT_TEST_ISA testing_avx512
#include "cpu_isa.inc"
