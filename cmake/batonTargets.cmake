# Defines baton::baton (standard library only) and one INTERFACE target per optional
# backend. Each backend target defines the BATON_ENABLE_* macro that baton/config.hpp
# turns into BATON_HAS_*(), so no flag other than that define reaches a consumer.
include(batonKokkosFix)

file(GLOB_RECURSE baton_headers CONFIGURE_DEPENDS
     RELATIVE "${PROJECT_SOURCE_DIR}/include"
     "${PROJECT_SOURCE_DIR}/include/baton/*.hpp" "${PROJECT_SOURCE_DIR}/include/baton/*.cuh")
list(TRANSFORM baton_headers PREPEND "${PROJECT_SOURCE_DIR}/include/" OUTPUT_VARIABLE baton_header_paths)

add_library(baton INTERFACE)
add_library(baton::baton ALIAS baton)
target_compile_features(baton INTERFACE cxx_std_20)
target_sources(baton INTERFACE
  FILE_SET HEADERS BASE_DIRS "${PROJECT_SOURCE_DIR}/include" FILES ${baton_header_paths})

# Threads: the local (in-process) world runs ranks as threads.
find_package(Threads REQUIRED)
target_link_libraries(baton INTERFACE Threads::Threads)

set(baton_components "")

function(baton_backend_wanted var name)
  string(TOUPPER "${name}" upper)
  set(mode "${BATON_WITH_${upper}}")
  if(mode STREQUAL "OFF")
    set(${var} OFF PARENT_SCOPE)
  else()
    set(${var} ON PARENT_SCOPE)
  endif()
endfunction()

# baton_add_backend(name "what was found" deps...): the INTERFACE target baton::<name>, linking
# deps and defining BATON_ENABLE_<NAME>=1, and its name appended to baton_components.
macro(baton_add_backend name found)
  add_library(baton_${name} INTERFACE)
  add_library(baton::${name} ALIAS baton_${name})
  set_target_properties(baton_${name} PROPERTIES EXPORT_NAME ${name})
  target_link_libraries(baton_${name} INTERFACE ${ARGN})
  string(TOUPPER "${name}" _baton_upper)
  target_compile_definitions(baton_${name} INTERFACE BATON_ENABLE_${_baton_upper}=1)
  list(APPEND baton_components ${name})
  message(STATUS "baton: ${found} found; baton::${name} is available")
endmacro()

# baton_available(var name...): the targets baton::<name> of this build, of the names given
# (for the targets that use an optional backend when it is there).
function(baton_available var)
  set(found "")
  foreach(name IN LISTS ARGN)
    if(TARGET baton::${name})
      list(APPEND found baton::${name})
    endif()
  endforeach()
  set(${var} ${found} PARENT_SCOPE)
endfunction()

function(baton_backend_missing name)
  string(TOUPPER "${name}" upper)
  if(BATON_WITH_${upper} STREQUAL "ON")
    message(FATAL_ERROR "baton: BATON_WITH_${upper}=ON but ${name} was not found. "
                        "Run scripts/install-deps.sh, or configure with -DBATON_WITH_${upper}=OFF.")
  endif()
  message(STATUS "baton: ${name} not found; baton::${name} is not built")
endfunction()

# --- Kokkos ----------------------------------------------------------------------
baton_backend_wanted(want Kokkos)
if(want)
  find_package(Kokkos QUIET)
  if(Kokkos_FOUND)
    baton_fix_kokkos_targets()
    baton_add_backend(kokkos "Kokkos ${Kokkos_VERSION}" baton Kokkos::kokkos)
  else()
    baton_backend_missing(kokkos)
  endif()
endif()

# --- MPI -------------------------------------------------------------------------
baton_backend_wanted(want MPI)
if(want)
  find_package(MPI QUIET COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    baton_add_backend(mpi "MPI ${MPI_CXX_VERSION}" baton MPI::MPI_CXX)
  else()
    baton_backend_missing(mpi)
  endif()
endif()

# --- BLAS (cblas from OpenBLAS) ----------------------------------------------------
# The model layer's matrix products (baton/nn/detail/gemm.hpp) call cblas_sgemm/dgemm when
# baton::blas is linked, and a blocked loop nest otherwise.
baton_backend_wanted(want BLAS)
if(want)
  set(_baton_saved_vendor "${BLA_VENDOR}")
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS QUIET)
  set(BLA_VENDOR "${_baton_saved_vendor}")
  find_path(BATON_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread)
  if(BLAS_FOUND AND BATON_CBLAS_INCLUDE_DIR)
    baton_add_backend(blas "OpenBLAS (cblas.h in ${BATON_CBLAS_INCLUDE_DIR})" baton BLAS::BLAS)
    target_include_directories(baton_blas SYSTEM INTERFACE "${BATON_CBLAS_INCLUDE_DIR}")
  else()
    baton_backend_missing(blas)
  endif()
endif()

# --- nlohmann-json -------------------------------------------------------------------
# Checkpoints (baton/train/json/): the JSON headers of safetensors files and the manifest.
baton_backend_wanted(want JSON)
if(want)
  find_package(nlohmann_json 3.2 QUIET)
  if(nlohmann_json_FOUND)
    baton_add_backend(json "nlohmann-json ${nlohmann_json_VERSION}" baton nlohmann_json::nlohmann_json)
  else()
    baton_backend_missing(json)
  endif()
endif()

# --- LibTorch ------------------------------------------------------------------------
# The LibTorch adapter (baton/torch.hpp): torch::Tensor payloads and torch::nn modules as
# stages. Debian's libtorch-dev 1.13 (CPU) provides TorchConfig.cmake.
baton_backend_wanted(want Torch)
if(want)
  find_package(Torch QUIET)
  if(Torch_FOUND)
    baton_add_backend(torch "LibTorch ${Torch_VERSION}" baton ${TORCH_LIBRARIES})
  else()
    baton_backend_missing(torch)
  endif()
endif()

# --- CUDA and NCCL ---------------------------------------------------------------
baton_backend_wanted(want CUDA)
if(want)
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    baton_add_backend(cuda "CUDA ${CUDAToolkit_VERSION}" baton CUDA::cudart)
    # A requirement of baton's device code, not a preference: its kernels index strided
    # layouts (baton/core/layout.hpp) whose std::array members are constexpr host functions,
    # which nvcc calls from device code only with this flag (CUTLASS and CuTe need it too).
    target_compile_options(baton_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
    find_package(NCCL QUIET)
    if(NCCL_FOUND)
      baton_add_backend(nccl "NCCL ${NCCL_VERSION}" baton_cuda NCCL::nccl)
    else()
      baton_backend_missing(nccl)
    endif()
  else()
    baton_backend_missing(cuda)
  endif()
endif()
