# Checks for the pip build (RAILSHARD_PYTHON_PACKAGE), each failing with one line that names
# what is missing before anything compiles. Included before project(): a missing compiler
# would otherwise surface as CMake's own multi-line error about CMAKE_CXX_COMPILER.

function(railshard_package_fail text)
  # NOTICE prints the bare line (pip shows it as is); FATAL_ERROR then stops configure.
  message(NOTICE "railshard: ${text}")
  message(FATAL_ERROR "railshard: ${text}")
endfunction()

# The interpreter whose torch the extension is built for: the one pip runs (scikit-build-core
# passes it as Python_EXECUTABLE), unless RAILSHARD_PYTHON names another.
if(NOT RAILSHARD_PYTHON)
  if(Python_EXECUTABLE)
    set(RAILSHARD_PYTHON "${Python_EXECUTABLE}" CACHE FILEPATH "" FORCE)
  elseif(Python3_EXECUTABLE)
    set(RAILSHARD_PYTHON "${Python3_EXECUTABLE}" CACHE FILEPATH "" FORCE)
  else()
    railshard_package_fail("no Python interpreter given (Python_EXECUTABLE or RAILSHARD_PYTHON)")
  endif()
endif()
# pip's build isolation hides the environment's own site-packages behind PYTHONPATH (a
# sitecustomize of its own): the probes run without it, so that they see the torch that is
# installed where railshard will be, not a copy made for the build (see pyproject.toml).
set(RAILSHARD_PROBE_ENV --unset=PYTHONPATH --unset=PYTHONNOUSERSITE)

execute_process(
  COMMAND ${CMAKE_COMMAND} -E env ${RAILSHARD_PROBE_ENV} ${RAILSHARD_PYTHON} -c
    "import torch; print(torch.__version__.split('+')[0])"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _torch_version ERROR_VARIABLE _torch_error
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _rc EQUAL 0)
  string(REGEX MATCH "[A-Za-z]*Error: [^\n]*" _why "${_torch_error}")
  railshard_package_fail("torch is not importable by ${RAILSHARD_PYTHON} (${_why}): install torch >= 2 in this environment first (pip install torch); railshard's extension is compiled against the torch installed")
endif()
if(_torch_version VERSION_LESS 2.0)
  railshard_package_fail("torch ${_torch_version} is installed for ${RAILSHARD_PYTHON}; railshard's pip package needs torch >= 2.0 (pip install -U torch)")
endif()

# A C++ compiler, before project() looks for one.
if(NOT CMAKE_CXX_COMPILER AND NOT DEFINED ENV{CXX})
  find_program(_railshard_cxx NAMES c++ g++ clang++ NO_CACHE)
  if(NOT _railshard_cxx)
    railshard_package_fail("no C++ compiler (c++, g++ or clang++ on PATH, or CXX): apt-get install g++ (version 12 or newer; C++20)")
  endif()
endif()

# After project(): a compiler too old for C++20 as railshard uses it.
function(railshard_check_compiler_version)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 12)
    railshard_package_fail("g++ ${CMAKE_CXX_COMPILER_VERSION} (${CMAKE_CXX_COMPILER}) is too old: railshard needs g++ 12 or newer (C++20)")
  elseif(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 15)
    railshard_package_fail("clang ${CMAKE_CXX_COMPILER_VERSION} (${CMAKE_CXX_COMPILER}) is too old: railshard needs clang 15 or newer (C++20)")
  endif()
endfunction()
