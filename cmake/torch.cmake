# railshard_find_torch(): asks a Python interpreter for its torch's build facts and sets, in
# the caller's scope, RAILSHARD_TORCH_FOUND, RAILSHARD_PYTHON, RAILSHARD_TORCH_VERSION,
# RAILSHARD_TORCH_INCLUDE_DIRS, RAILSHARD_TORCH_LIBRARIES, RAILSHARD_TORCH_DEFINITIONS and
# RAILSHARD_PYTHON_INCLUDE_DIR / RAILSHARD_PYTHON_EXT_SUFFIX /
# RAILSHARD_PYTHON_VERSION (3.X).
#
# Why not find_package(Torch): the PyPI wheel's TorchConfig drags in CUDA and cuDNN checks,
# and neither it nor Debian's tells the pybind11 ABI tags the module must share with
# torch._C (without them init_process_group fails with "incompatible function arguments").
set(RAILSHARD_PYTHON "" CACHE FILEPATH "Python interpreter whose torch the extension is built for")

set(_railshard_torch_probe [=[
import sys, sysconfig
import torch, torch.utils.cpp_extension as ext
c = torch._C
print("version=" + torch.__version__.split("+")[0])
print("includes=" + "|".join(ext.include_paths()))
print("libdirs=" + "|".join(ext.library_paths()))
print("cxx11abi=" + str(int(bool(c._GLIBCXX_USE_CXX11_ABI))))
for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
    value = getattr(c, "_PYBIND11_" + name, None)
    if value is not None:
        print("pybind_" + name + "=" + value)
print("pyinclude=" + sysconfig.get_paths()["include"])
print("extsuffix=" + sysconfig.get_config_var("EXT_SUFFIX"))
print("pyversion=" + sysconfig.get_python_version())
print("cuda=" + str(int(torch.version.cuda is not None)))
]=])

function(_railshard_probe_torch python out_ok)
  # RAILSHARD_PROBE_ENV: set by the pip build (cmake/python_package_checks.cmake).
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${RAILSHARD_PROBE_ENV}
    ${python} -c "${_railshard_torch_probe}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    set(${out_ok} FALSE PARENT_SCOPE)
    return()
  endif()
  set(${out_ok} TRUE PARENT_SCOPE)
  string(REPLACE "\n" ";" lines "${out}")
  foreach(line IN LISTS lines)
    string(FIND "${line}" "=" eq)
    string(SUBSTRING "${line}" 0 ${eq} key)
    math(EXPR start "${eq} + 1")
    string(SUBSTRING "${line}" ${start} -1 value)
    # Lists come |-joined (a ";" would have split the line above): make them CMake lists.
    string(REPLACE "|" ";" value "${value}")
    set(_probe_${key} "${value}" PARENT_SCOPE)
  endforeach()
endfunction()

macro(railshard_find_torch)
  set(RAILSHARD_TORCH_FOUND FALSE)
  set(_candidates "${RAILSHARD_PYTHON}")
  if(NOT RAILSHARD_PYTHON)
    find_program(_railshard_path_python NAMES python3 NO_CACHE)
    set(_candidates ${_railshard_path_python} /usr/bin/python3)
  endif()
  foreach(_python IN LISTS _candidates)
    if(NOT _python OR RAILSHARD_TORCH_FOUND)
      continue()
    endif()
    _railshard_probe_torch("${_python}" _ok)
    if(_ok)
      set(RAILSHARD_TORCH_FOUND TRUE)
      # Kept in the cache: a later configure from another environment (build.sh run with a
      # venv activated) must not silently rebuild the extension for that venv's torch, while
      # what uses the build (quickstart.sh, the README's commands) runs the first one.
      set(RAILSHARD_PYTHON "${_python}" CACHE FILEPATH
        "Python interpreter whose torch the extension is built for" FORCE)
    endif()
  endforeach()
  if(RAILSHARD_TORCH_FOUND)
    set(RAILSHARD_TORCH_VERSION "${_probe_version}")
    set(RAILSHARD_TORCH_INCLUDE_DIRS "")
    foreach(_dir IN LISTS _probe_includes)
      if(EXISTS "${_dir}")
        list(APPEND RAILSHARD_TORCH_INCLUDE_DIRS "${_dir}")
      endif()
    endforeach()
    # Debian's python3-torch points include_paths() at dist-packages, but libtorch-dev puts
    # the C++ frontend headers (torch/version.h) under /usr/include/torch/csrc/api/include.
    # Only there: a wheel's build must never pick up Debian's headers.
    find_path(_railshard_torch_version_dir torch/version.h
      PATHS ${RAILSHARD_TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH NO_CACHE)
    if(NOT _railshard_torch_version_dir AND "${_probe_includes}" MATCHES "^/usr/lib/python3/")
      find_path(_railshard_torch_version_dir torch/version.h
        PATHS /usr/include/torch/csrc/api/include NO_DEFAULT_PATH NO_CACHE)
    endif()
    if(_railshard_torch_version_dir)
      list(APPEND RAILSHARD_TORCH_INCLUDE_DIRS "${_railshard_torch_version_dir}")
    else()
      message(WARNING "torch ${_probe_version} for ${RAILSHARD_PYTHON}: no torch/version.h "
                      "(apt-get install libtorch-dev)")
      set(RAILSHARD_TORCH_FOUND FALSE)
    endif()
    set(RAILSHARD_PYTHON_INCLUDE_DIR "${_probe_pyinclude}")
    set(RAILSHARD_PYTHON_EXT_SUFFIX "${_probe_extsuffix}")
    set(RAILSHARD_PYTHON_VERSION "${_probe_pyversion}")
    set(RAILSHARD_TORCH_CUDA "${_probe_cuda}")
    set(RAILSHARD_TORCH_LIBRARIES "")
    foreach(_lib c10 torch torch_cpu torch_python)
      find_library(_railshard_lib_${_lib} ${_lib} HINTS ${_probe_libdirs} NO_CACHE)
      if(NOT _railshard_lib_${_lib})
        message(WARNING "torch ${_probe_version} for ${RAILSHARD_PYTHON}: lib${_lib} not found")
        set(RAILSHARD_TORCH_FOUND FALSE)
      endif()
      list(APPEND RAILSHARD_TORCH_LIBRARIES ${_railshard_lib_${_lib}})
    endforeach()
    # Our own library crosses the module boundary with std::string: it must use torch's ABI.
    if(NOT _probe_cxx11abi EQUAL 1)
      message(WARNING "torch ${_probe_version} uses the pre-C++11 libstdc++ ABI; railshard "
                      "does not: the extension is not built")
      set(RAILSHARD_TORCH_FOUND FALSE)
    endif()
    set(RAILSHARD_TORCH_DEFINITIONS _GLIBCXX_USE_CXX11_ABI=1)
    foreach(_name COMPILER_TYPE STDLIB BUILD_ABI)
      if(DEFINED _probe_pybind_${_name})
        list(APPEND RAILSHARD_TORCH_DEFINITIONS PYBIND11_${_name}="${_probe_pybind_${_name}}")
      endif()
    endforeach()
  endif()
endmacro()
