# The tests (CMakeLists.txt with DEUTERON_BUILD_TESTS), with ctest labels:
#   unit      no generated kernel runs (tensors, plans, the runtime headers, the layer check)
#   e2e       kernels compiled and run, checked against references; the CLI
#   pallas    the Pallas target (its Python runner under TPU interpret mode)
#   triton    the Triton target (its Python runner under Triton's interpreter)
#   autotune  the autotuner
#   consumer  projects that use the library: find_package and add_subdirectory
#   python    the Python package (tests/python, pytest; needs `pip install .` into .venv)
# `ctest -L unit` runs one group, `ctest -LE consumer` all but one.
# A COST (seconds on the session-18 Zen 1) starts the long script tests first on a fresh clone,
# which has no timings of its own, so short tests fill the other core beside them.
find_package(GTest REQUIRED)
enable_testing()
include(GoogleTest)

file(GLOB DEUTERON_TEST_SOURCES CONFIGURE_DEPENDS tests/*.cpp)
add_executable(deuteron_tests ${DEUTERON_TEST_SOURCES})
target_link_libraries(deuteron_tests PRIVATE deuteron_examples GTest::gtest GTest::gtest_main)
target_include_directories(deuteron_tests PRIVATE src ${DLPACK_INCLUDE})
deuteron_warnings(deuteron_tests)
# The micro-kernel tests compile deuteron_gemm.h without -mavx; GCC then notes (unsuppressibly
# by pragma) that 32-byte vector arguments changed ABI in GCC 4.6. Nothing there crosses an ABI.
set_source_files_properties(tests/test_gemm_runtime.cpp tests/test_gemm_pairs.cpp tests/test_gemm_amx.cpp PROPERTIES COMPILE_OPTIONS -Wno-psabi)
# The cpu math header's fused path, as generated kernels compile it (-march=native has FMA on
# every CPU here); the tests call it only where the CPU has FMA.
set_source_files_properties(tests/test_cpu_math_fma.cpp PROPERTIES COMPILE_OPTIONS -mfma)
# The runtime's ISA-dependent functions as kernels compile them with AVX2 and with AVX-512
# (tests/cpu_isa.inc); the tests call each only where the CPU has its instructions.
set_source_files_properties(tests/test_cpu_isa_avx2.cpp PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-Wno-psabi")
set_source_files_properties(tests/test_cpu_isa_avx512.cpp PROPERTIES
                            COMPILE_OPTIONS "-mavx512f;-mavx512vl;-mavx512bw;-mavx512dq;-mfma;-Wno-psabi")

# Suites by label (gtest filter patterns); unit is everything else. AutotuneChild.* are run by
# the autotune tests as a separate process, never on their own.
set(DEUTERON_SUITES_e2e "*/KernelTest.*" "KernelStreamingStores.*" "Dot.*" "Language.*" "KernelErrors.*" "Fuzz.*" "Reliability.*"
    "Philox.*" "LangErrors.*" "Cpu/LangOps.*" "Dropout.*" "Cpu/Scans.*" "ScanErrors.*"
    "*/DotPairs.*" "*/NameInjection.*" "*/DamagedArtifact.*" "*/BadOption.*" "Cpu/DynamicLoops.*" "DynamicLoopErrors.*" "DynamicLoopSizes.*")
# PallasAutotune.* (the pallas target's tuning harness) carries both of its labels.
set(DEUTERON_SUITES_pallas "Pallas*.*" "*/PallasRun.*" "*/PallasLoop.*" "*/PallasDynamicLoops.*")
set(DEUTERON_SUITES_triton "Triton*.*" "*/TritonRun.*" "*/TritonLooped.*" "*/TritonDescriptors.*" "*/TritonDynamicLoops.*")
set(DEUTERON_SUITES_autotune "Autotune*.*")
set(DEUTERON_SUITES_pallas_autotune "PallasAutotune.*")
set(DEUTERON_NOT_UNIT "AutotuneChild.*")
foreach(label IN ITEMS e2e pallas triton autotune pallas_autotune)
  list(JOIN DEUTERON_SUITES_${label} ":" filter)
  set(exclude "AutotuneChild.*")
  if(NOT label STREQUAL "pallas_autotune")
    string(APPEND exclude ":PallasAutotune.*")
  endif()
  string(REPLACE "_" ";" labels ${label})
  gtest_discover_tests(deuteron_tests TEST_FILTER "${filter}-${exclude}" DISCOVERY_TIMEOUT 60
                       PROPERTIES TIMEOUT 600 LABELS "${labels}")
  list(APPEND DEUTERON_NOT_UNIT ${DEUTERON_SUITES_${label}})
endforeach()
list(JOIN DEUTERON_NOT_UNIT ":" filter)
gtest_discover_tests(deuteron_tests TEST_FILTER "-${filter}" DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 LABELS unit)

if(TARGET deuteron_cli)
  add_test(NAME cli COMMAND bash ${PROJECT_SOURCE_DIR}/tests/cli_test.sh $<TARGET_FILE:deuteron_cli>)
  set_tests_properties(cli PROPERTIES TIMEOUT 600 LABELS e2e COST 150)
  add_test(NAME cpu_isa_avx2 COMMAND bash ${PROJECT_SOURCE_DIR}/tests/cpu_isa_test.sh $<TARGET_FILE:deuteron_cli>)
  set_tests_properties(cpu_isa_avx2 PROPERTIES TIMEOUT 600 LABELS e2e)
  add_test(NAME pallas_catalogue COMMAND bash ${PROJECT_SOURCE_DIR}/tests/target_catalogue.sh $<TARGET_FILE:deuteron_cli> pallas)
  set_tests_properties(pallas_catalogue PROPERTIES TIMEOUT 1200 LABELS pallas COST 560)
  add_test(NAME pallas_flash_peer COMMAND bash ${PROJECT_SOURCE_DIR}/tests/pallas_flash_peer.sh $<TARGET_FILE:deuteron_cli>)
  set_tests_properties(pallas_flash_peer PROPERTIES TIMEOUT 600 LABELS pallas)
  add_test(NAME triton_catalogue COMMAND bash ${PROJECT_SOURCE_DIR}/tests/target_catalogue.sh $<TARGET_FILE:deuteron_cli> triton --interpret)
  set_tests_properties(triton_catalogue PROPERTIES TIMEOUT 1500 LABELS triton COST 740)
  # The prepared GPU benchmark, kept runnable: two kernels under the interpreter, tuned briefly.
  add_test(NAME triton_gpu_script COMMAND ${PROJECT_SOURCE_DIR}/.venv/bin/python ${PROJECT_SOURCE_DIR}/bench/triton_gpu.py
                                          --deuteron $<TARGET_FILE:deuteron_cli> --interpret --shapes small
                                          --kernels softmax,matmul --tune-budget 2 --fresh-cache
                                          --out ${PROJECT_BINARY_DIR}/triton_gpu_script)
  set_tests_properties(triton_gpu_script PROPERTIES TIMEOUT 900 LABELS triton COST 145)
  # deuteron aot: a build compiled by examples/aot (cpu), and the Python targets' modules.
  foreach(mode cpu pallas triton)
    add_test(NAME aot_${mode} COMMAND bash ${PROJECT_SOURCE_DIR}/tests/aot_test.sh $<TARGET_FILE:deuteron_cli>
                                      ${PROJECT_SOURCE_DIR} ${CMAKE_COMMAND} ${mode})
  endforeach()
  set_tests_properties(aot_cpu PROPERTIES TIMEOUT 600 LABELS "aot;consumer" COST 90)
  set_tests_properties(aot_pallas PROPERTIES TIMEOUT 600 LABELS "aot;pallas")
  set_tests_properties(aot_triton PROPERTIES TIMEOUT 600 LABELS "aot;triton")
endif()

deuteron_layer_files(tests DEPENDS api examples FILES ${DEUTERON_TEST_SOURCES})
deuteron_layer_map(${PROJECT_BINARY_DIR}/layers.txt)
add_test(NAME layers COMMAND bash ${PROJECT_SOURCE_DIR}/tests/layers_test.sh ${PROJECT_BINARY_DIR}/layers.txt
                             ${PROJECT_SOURCE_DIR})
set_tests_properties(layers PROPERTIES TIMEOUT 120 LABELS unit)

add_test(NAME consumers COMMAND bash ${PROJECT_SOURCE_DIR}/tests/consumers/consumers_test.sh ${PROJECT_BINARY_DIR}
                                ${PROJECT_SOURCE_DIR} ${CMAKE_COMMAND})
set_tests_properties(consumers PROPERTIES TIMEOUT 1500 LABELS consumer COST 390)

# The Python package's tests (tests/python, pytest) against the package installed in .venv
# (scripts/setup.sh --python runs `pip install .` before the tests). The user kernel library
# test installs this build into a fresh prefix and builds tests/python/kernel_library there.
add_test(NAME python COMMAND ${PROJECT_SOURCE_DIR}/.venv/bin/python -m pytest -q -p no:cacheprovider
                             ${PROJECT_SOURCE_DIR}/tests/python)
set_tests_properties(python PROPERTIES TIMEOUT 1200 LABELS python COST 90
                     ENVIRONMENT "DEUTERON_BUILD_DIR=${PROJECT_BINARY_DIR};DEUTERON_CMAKE=${CMAKE_COMMAND}")

