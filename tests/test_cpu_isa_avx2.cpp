// The runtime's ISA-dependent functions compiled for AVX2 (-mavx2 -mfma, no AVX-512): see cpu_isa.inc.
#ifndef __AVX2__
#error "this file is compiled with -mavx2 (cmake/deuteron_tests.cmake)"
#endif
#define DT_TEST_ISA testing_avx2
#include "cpu_isa.inc"
