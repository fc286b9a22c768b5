# What `pip install .` installs (RAILSHARD_PYTHON_PACKAGE; scikit-build-core installs component
# "python" into the wheel's platlib): one directory, railshard/, holding the Python files and
# _C (python/CMakeLists.txt), lib/librailshard.so and bin/ with the tools, plus the shim module
# railshard_tools that the console commands railshard-launch, -store, -topo and -report call.
# Nothing outside site-packages and the venv's bin/, so `pip uninstall railshard` removes all
# of it; headers, CMake config and the NCCL plugin are `cmake --install`'s (cmake/install.cmake).
install(TARGETS railshard LIBRARY DESTINATION railshard/lib COMPONENT python)
foreach(tool railshard-launch railshard-store railshard-topo railshard-report)
  set_target_properties(${tool} PROPERTIES INSTALL_RPATH "$ORIGIN/../lib")
  install(TARGETS ${tool} RUNTIME DESTINATION railshard/bin COMPONENT python)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/python/railshard_tools.py DESTINATION . COMPONENT python)
