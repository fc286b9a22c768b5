# Sanitizer and fuzzing builds.
#
# RAILSHARD_SANITIZE=ON builds everything (library, tools, tests, benchmarks) with
# AddressSanitizer + UndefinedBehaviorSanitizer. UBSan does not recover, so any undefined
# behaviour aborts the process and fails its test instead of scrolling past in a log.
#
# RAILSHARD_FUZZ=ON adds the libFuzzer targets of fuzz/ (needs clang: configure with
# -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang).
option(RAILSHARD_SANITIZE "Build everything with ASan+UBSan (fails on any report)" OFF)
option(RAILSHARD_FUZZ "Build the libFuzzer targets in fuzz/ (clang only)" OFF)

if(RAILSHARD_SANITIZE)
  # -fno-sanitize=alignment: the reduction kernels take buffers at any byte offset, as
  # NCCL's and Gloo's do (users slice tensors), and the tests check them at odd offsets; x86
  # permits unaligned scalar and vector (loadu/storeu) access, so UBSan's alignment check
  # would only report the contract the kernels are built for. Every other UBSan check is on.
  set(RAILSHARD_SANITIZE_FLAGS
    -fsanitize=address,undefined
    -fno-sanitize=alignment
    -fno-sanitize-recover=all
    -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${RAILSHARD_SANITIZE_FLAGS}>")
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "railshard: ASan+UBSan build (RAILSHARD_SANITIZE=ON)")
endif()

if(RAILSHARD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "RAILSHARD_FUZZ=ON needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang")
  endif()
endif()
