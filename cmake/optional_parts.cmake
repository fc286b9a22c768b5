# Optional parts: each RAILSHARD_WITH_<X> is AUTO (use when found), ON (must be found, else a
# configure error) or OFF (never). The summary at the end of configure lists what was found.
set(_railshard_parts "")

macro(railshard_optional NAME)
  set(RAILSHARD_WITH_${NAME} AUTO CACHE STRING "Build ${NAME} support: AUTO, ON or OFF")
  set_property(CACHE RAILSHARD_WITH_${NAME} PROPERTY STRINGS AUTO ON OFF)
  list(APPEND _railshard_parts ${NAME})
endmacro()

# railshard_part_result(NAME FOUND DETAIL): records the outcome, enforcing ON.
function(railshard_part_result NAME FOUND DETAIL)
  if(RAILSHARD_WITH_${NAME} STREQUAL "OFF")
    set(RAILSHARD_HAVE_${NAME} OFF PARENT_SCOPE)
    set(RAILSHARD_DETAIL_${NAME} "disabled (RAILSHARD_WITH_${NAME}=OFF)" PARENT_SCOPE)
    return()
  endif()
  if(NOT FOUND AND RAILSHARD_WITH_${NAME} STREQUAL "ON")
    message(FATAL_ERROR "RAILSHARD_WITH_${NAME}=ON but ${NAME} was not found: ${DETAIL}")
  endif()
  set(RAILSHARD_HAVE_${NAME} ${FOUND} PARENT_SCOPE)
  set(RAILSHARD_DETAIL_${NAME} "${DETAIL}" PARENT_SCOPE)
endfunction()

railshard_optional(MPI)
railshard_optional(CUDA)
railshard_optional(NCCL)
railshard_optional(IBVERBS)
railshard_optional(HWLOC)
railshard_optional(TORCH)

# MPI: bootstrap under mpirun and the --backend mpi benchmark peer.
if(NOT RAILSHARD_WITH_MPI STREQUAL "OFF")
  find_package(MPI QUIET COMPONENTS C)
endif()
if(MPI_C_FOUND)
  railshard_part_result(MPI TRUE "MPI ${MPI_C_VERSION} (${MPI_C_LIB_NAMES})")
else()
  railshard_part_result(MPI FALSE "no MPI C library (apt-get install libopenmpi-dev)")
endif()

# CUDA toolkit (nvcc + runtime). Both are needed: the runtime for kernels/cuda/device_runtime.cc
# and a working nvcc for kernels/cuda/reduce_kernels.cu. check_language() compiles a test
# project, so an nvcc that exists but cannot build (e.g. an unsupported host compiler) counts as
# missing instead of failing the whole configure. /usr/local/cuda/bin/nvcc is tried when nothing
# else names a compiler, since it is rarely on PATH.
if(NOT RAILSHARD_WITH_CUDA STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
     AND EXISTS /usr/local/cuda/bin/nvcc)
    set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
endif()
if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER)
  railshard_part_result(CUDA TRUE
    "CUDA ${CUDAToolkit_VERSION} at ${CUDAToolkit_BIN_DIR} (nvcc ${CMAKE_CUDA_COMPILER})")
elseif(CUDAToolkit_FOUND)
  railshard_part_result(CUDA FALSE
    "CUDA ${CUDAToolkit_VERSION} runtime at ${CUDAToolkit_LIBRARY_DIR} but no working nvcc (set CUDACXX or CMAKE_CUDA_COMPILER; clear a cached CMAKE_CUDA_COMPILER-NOTFOUND)")
else()
  railshard_part_result(CUDA FALSE "no CUDA toolkit (nvcc + runtime)")
endif()
if(RAILSHARD_HAVE_CUDA)
  # sm_80 (A100) and sm_90 (H100/H200) machine code, plus compute_90 PTX that newer GPUs
  # compile at load time. Each entry adds a full set of kernels to librailshard.so.
  set(RAILSHARD_CUDA_ARCHITECTURES "80-real;90-real;90-virtual" CACHE STRING
    "CUDA architectures for railshard's kernels (CMake CUDA_ARCHITECTURES syntax)")
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # Only so that enable_language() does not probe for a default; targets use the above.
    set(CMAKE_CUDA_ARCHITECTURES ${RAILSHARD_CUDA_ARCHITECTURES})
  endif()
  # The .cu files are C++17: CMake 3.25 knows no C++20 flag for nvcc, and without this every
  # target holding CUDA objects would inherit CXX_STANDARD 20 as its CUDA dialect and fail.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  enable_language(CUDA)
endif()

# NCCL (inside CUDA's tree here). Its headers and library are only looked up: railshard opens
# libnccl.so.2 at run time (core/collectives/nccl_api.h); NCCL needs the CUDA part.
if(NOT RAILSHARD_WITH_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS /usr/local/cuda/include ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS /usr/local/cuda/lib64 ${CUDAToolkit_LIBRARY_DIR})
endif()
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND RAILSHARD_HAVE_CUDA)
  railshard_part_result(NCCL TRUE "${NCCL_LIBRARY}")
elseif(NOT RAILSHARD_HAVE_CUDA)
  railshard_part_result(NCCL FALSE "needs the CUDA part, which is off")
else()
  railshard_part_result(NCCL FALSE "no nccl.h/libnccl")
endif()

# ibverbs headers (the library itself is loaded at run time).
if(NOT RAILSHARD_WITH_IBVERBS STREQUAL "OFF")
  find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
endif()
if(IBVERBS_INCLUDE_DIR)
  railshard_part_result(IBVERBS TRUE "${IBVERBS_INCLUDE_DIR}/infiniband/verbs.h")
else()
  railshard_part_result(IBVERBS FALSE "no infiniband/verbs.h (apt-get install libibverbs-dev)")
endif()

# hwloc for host discovery.
if(NOT RAILSHARD_WITH_HWLOC STREQUAL "OFF")
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(HWLOC QUIET IMPORTED_TARGET hwloc)
  endif()
endif()
if(HWLOC_FOUND)
  railshard_part_result(HWLOC TRUE "hwloc ${HWLOC_VERSION}")
else()
  railshard_part_result(HWLOC FALSE "no hwloc (apt-get install libhwloc-dev)")
endif()

# PyTorch for the torch.distributed backend (python/). Found through a Python interpreter that
# imports torch, because the extension must match that interpreter's torch exactly (headers,
# libraries, C++ ABI, pybind11 ABI). RAILSHARD_PYTHON picks it; by default the first of
# python3 on PATH and /usr/bin/python3 (Debian's python3-torch) that has torch, then kept in
# the cache (cmake/torch.cmake says why).
if(NOT RAILSHARD_WITH_TORCH STREQUAL "OFF")
  include(cmake/torch.cmake)
  railshard_find_torch()
endif()
if(RAILSHARD_TORCH_FOUND)
  railshard_part_result(TORCH TRUE
    "torch ${RAILSHARD_TORCH_VERSION} for ${RAILSHARD_PYTHON} (python/ extension)")
else()
  railshard_part_result(TORCH FALSE
    "no Python with torch (apt-get install python3-torch libtorch-dev pybind11-dev, or set RAILSHARD_PYTHON)")
endif()

function(railshard_print_summary)
  message(STATUS "")
  message(STATUS "railshard ${PROJECT_VERSION} — optional parts")
  foreach(part ${_railshard_parts})
    if(RAILSHARD_HAVE_${part})
      set(state "yes")
    else()
      set(state "no ")
    endif()
    string(LENGTH "${part}" len)
    math(EXPR pad "8 - ${len}")
    string(REPEAT " " ${pad} spaces)
    message(STATUS "  ${part}${spaces} ${state}  ${RAILSHARD_DETAIL_${part}}")
  endforeach()
  message(STATUS "")
endfunction()
