include(CMakePackageConfigHelpers)

install(TARGETS railshard EXPORT railshardTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/railshard)

# Headers keep their repository paths under include/railshard, so user code includes them the
# way the project does ("core/communicator.h"), or everything through "railshard.h".
foreach(dir base core kernels transport launcher)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/railshard/${dir}
    FILES_MATCHING PATTERN "*.h")
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/railshard.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/railshard)

install(EXPORT railshardTargets NAMESPACE railshard::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/railshard)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/railshardConfig.cmake.in
  ${PROJECT_BINARY_DIR}/railshardConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/railshard)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/railshardConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/railshardConfig.cmake
  ${PROJECT_BINARY_DIR}/railshardConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/railshard)
