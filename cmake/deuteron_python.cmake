# The Python package's native module, _deuteron (python/src/module.cpp), built by
# `pip install .` (scikit-build-core runs this project with DEUTERON_BUILD_PYTHON=ON) and
# installed next to the package's Python files (python/deuteron/). nanobind comes from the
# Python environment that builds it (python/requirements-package.txt).
find_package(Python 3.11 REQUIRED COMPONENTS Interpreter Development.Module)
execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir OUTPUT_VARIABLE nanobind_ROOT
                OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
find_package(nanobind CONFIG REQUIRED)
# NOMINSIZE: the call path is optimised for speed (-O3), not size.
nanobind_add_module(_deuteron NB_STATIC NOMINSIZE python/src/module.cpp)
# The catalogue's objects and the layers keep default visibility, so that kernel libraries
# opened by deuteron.load() bind their calls to this copy (include/deuteron/library.h).
target_link_libraries(_deuteron PRIVATE deuteron_examples ${CMAKE_DL_LIBS})
target_include_directories(_deuteron PRIVATE ${PROJECT_SOURCE_DIR}/src)
deuteron_warnings(_deuteron)
deuteron_layer_files(python DEPENDS api examples FILES ${PROJECT_SOURCE_DIR}/python/src/module.cpp
                     ${PROJECT_SOURCE_DIR}/python/src/jax_ffi.cpp)
# deuteron.jax.op's XLA FFI handler, when the building Python has jax (its headers come with
# jaxlib); without it deuteron.jax.op uses jax.pure_callback.
execute_process(COMMAND "${Python_EXECUTABLE}" -c "import jax.ffi; print(jax.ffi.include_dir())"
                OUTPUT_VARIABLE DEUTERON_JAX_FFI_INCLUDE OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(DEUTERON_JAX_FFI_INCLUDE)
  message(STATUS "deuteron.jax.op: the XLA FFI handler, headers from ${DEUTERON_JAX_FFI_INCLUDE}")
  target_sources(_deuteron PRIVATE python/src/jax_ffi.cpp)
  target_include_directories(_deuteron SYSTEM PRIVATE ${DEUTERON_JAX_FFI_INCLUDE})
  target_compile_definitions(_deuteron PRIVATE DEUTERON_JAX_FFI)
else()
  message(STATUS "deuteron.jax.op: no jax in ${Python_EXECUTABLE}, so jax.pure_callback only")
endif()
install(TARGETS _deuteron LIBRARY DESTINATION deuteron)
