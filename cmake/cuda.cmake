# The CUDA backend (STRATA_CUDA=ON): strata_cuda_kernels and strata_cuda, the GPU tests
# (tests/gpu, ctest label `gpu`) and the GPU benchmarks (bench/cuda). Targets Hopper (sm_90)
# unless CMAKE_CUDA_ARCHITECTURES says otherwise. Builds without a GPU; the tests need one.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90-real)
endif()
if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)  # the .cu files need no more; CMake here knows no CUDA20 for nvcc
set(CMAKE_CUDA_STANDARD_REQUIRED ON)

# strata_cuda_kernels (src/backend/cuda): kernels, device memory, GEMM handles; on core and
# tensor only. strata_cuda (src/runtime/cuda): the GPU runtime, which runs model families on
# those kernels and implements the engine's StepExecutor (runtime/step_executor.h).
file(GLOB STRATA_CUDA_KERNEL_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cpp)
add_library(strata_cuda_kernels STATIC ${STRATA_CUDA_KERNEL_SOURCES})
target_include_directories(strata_cuda_kernels PUBLIC ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(strata_cuda_kernels PUBLIC strata_tensor CUDA::cudart CUDA::cublasLt)
# The host warnings flags are for g++; nvcc gets its own.
target_compile_options(strata_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr -Xcompiler=-Wall>)
set_target_properties(strata_cuda_kernels PROPERTIES CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE OFF)

file(GLOB STRATA_CUDA_RUNTIME_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/runtime/cuda/*.cpp)
add_library(strata_cuda STATIC ${STRATA_CUDA_RUNTIME_SOURCES})
target_link_libraries(strata_cuda PUBLIC strata_cuda_kernels strata_runtime)

if(STRATA_TESTS)
  find_package(GTest REQUIRED)
  file(GLOB gpu_tests CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/gpu/*_test.cpp)
  foreach(f ${gpu_tests})
    get_filename_component(stem ${f} NAME_WE)
    add_executable(${stem} ${f})
    target_link_libraries(${stem} PRIVATE strata_cuda strata_engine GTest::gtest GTest::gtest_main)
    # STRATA_SOURCE_DIR is the default; the environment variable of the same name overrides
    # it where the tree sits elsewhere (the GPU machine).
    target_compile_definitions(${stem} PRIVATE STRATA_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
    set_target_properties(${stem} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/gpu)
    add_test(NAME ${stem} COMMAND ${stem})
    set_tests_properties(${stem} PROPERTIES LABELS gpu ENVIRONMENT "STRATA_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  endforeach()
endif()

if(STRATA_BENCH)
  file(GLOB gpu_benches CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/bench/cuda/bench_*.cpp)
  foreach(f ${gpu_benches})
    get_filename_component(stem ${f} NAME_WE)
    add_executable(${stem} ${f})
    target_link_libraries(${stem} PRIVATE strata_cuda strata_engine)
    set_target_properties(${stem} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
  endforeach()
endif()
